// CUDA_CHECK / CUBLAS_CHECK: turn a failed status into a kvpr::Error naming the call,
// the status and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/base/error.h"

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t kvpr_status_ = (expr);                                                          \
    if (kvpr_status_ != cudaSuccess)                                                            \
      KVPR_THROW("CUDA error ", cudaGetErrorName(kvpr_status_), " (", cudaGetErrorString(kvpr_status_), \
                 ") in ", #expr, " at ", __FILE__, ":", __LINE__);                              \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                          \
    cublasStatus_t kvpr_status_ = (expr);                                                       \
    if (kvpr_status_ != CUBLAS_STATUS_SUCCESS)                                                  \
      KVPR_THROW("cuBLAS error ", cublasGetStatusName(kvpr_status_), " in ", #expr, " at ", __FILE__, ":", \
                 __LINE__);                                                                     \
  } while (0)

// After a kernel launch: launch-configuration errors surface here. (The SIMT emulator of
// the tests throws on a bad launch itself.)
#if defined(KVPR_SIMT_EMULATION)
#define CUDA_CHECK_LAUNCH() ((void)0)
#else
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#endif
