// The emulated cuBLAS of cuda_runtime_emu.h: handles, and GEMMs (cublasGemmEx and its strided
// batched form) checked as cuBLAS checks its arguments and run in fp32 on the emulated device's
// streams, in the order the runtime (cuda_runtime_emu.cc) runs their work.
#define KVPR_EMU_RUNTIME_IMPL 1
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on
#include "engine/backend/emulated/cuda_runtime_emu_internal.h"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace kvpr_emu {

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  internal::Api call;
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  auto c = std::make_unique<cublasContext>();
  *h = c.get();
  internal::add_handle(std::move(c));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  internal::Api call;
  return internal::remove_handle(h) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t stream) {
  internal::Api call;
  if (!internal::handle_known(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!internal::stream_known(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  h->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* workspace, size_t bytes) {
  internal::Api call;
  if (!internal::handle_known(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && (!workspace || !internal::in_one_allocation(workspace, bytes))) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = workspace;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) {
  internal::Api call;
  return internal::handle_known(h) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
const char* cublasGetStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

namespace {

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}
float load(const void* p, cudaDataType_t t, size_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}
void store(void* p, cudaDataType_t t, size_t i, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = v; break;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
  }
}

// Bytes from a matrix's first element to one past its last, over the batch.
size_t extent_bytes(int rows, int cols, int ld, long long stride, int batch, size_t es) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  const long long last = static_cast<long long>(batch - 1) * std::max(stride, 0LL) +
                         static_cast<long long>(cols - 1) * ld + (rows - 1);
  return static_cast<size_t>(last + 1) * es;
}

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return na && nb && x < y + nb && y < x + na;
}

}  // namespace

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m,
                                          int n, int k, const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType_t c_type,
                                          int ldc, long long stride_c, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  internal::Api call;
  if (!internal::handle_known(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto is_op = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  // cuBLAS's argument rules (cublasGemmEx, cublas<t>gemmStridedBatched).
  if (!is_op(transa) || !is_op(transb) || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
      lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  // The combinations used for fp32 accumulation (cublasGemmEx's table, CUBLAS_COMPUTE_32F; with
  // FAST_TF32, F32 inputs on tensor cores, whose rounding of the inputs to TF32 is not modeled).
  const bool types_ok = a_type == b_type && type_size(a_type) && (c_type == CUDA_R_32F || c_type == a_type) &&
                        (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                         (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a_type == CUDA_R_32F));
  if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const size_t ea = type_size(a_type), ec = type_size(c_type);
  const size_t na = k ? extent_bytes(ta ? k : m, ta ? m : k, lda, stride_a, batch, ea) : 0;
  const size_t nb = k ? extent_bytes(tb ? n : k, tb ? k : n, ldb, stride_b, batch, ea) : 0;
  const size_t nc = extent_bytes(m, n, ldc, stride_c, batch, ec);
  for (auto [p, bytes, what] : {std::tuple{A, na, "A"}, {B, nb, "B"}, {static_cast<const void*>(C), nc, "C"}})
    internal::check_device_operand(p, bytes, std::string("cuBLAS GEMM: matrix ") + what);
  if (overlap(C, nc, A, na) || overlap(C, nc, B, nb)) throw DeviceFault("cuBLAS GEMM: C overlaps A or B");
  if (batch > 1 && stride_c < static_cast<long long>(ldc) * n) throw DeviceFault("cuBLAS GEMM: batches of C overlap");
  internal::enqueue_gemm(h->stream, [=] {
    // op(A) as rows i (contiguous in l) and op(B) as columns j, in fp32; fp32 accumulation.
    std::vector<float> ar(static_cast<size_t>(m) * k), bc(static_cast<size_t>(n) * k);
    for (int b = 0; b < batch; ++b) {
      const void* Ab = static_cast<const char*>(A) + static_cast<long long>(b) * stride_a * static_cast<long long>(ea);
      const void* Bb = static_cast<const char*>(B) + static_cast<long long>(b) * stride_b * static_cast<long long>(ea);
      void* Cb = static_cast<char*>(C) + static_cast<long long>(b) * stride_c * static_cast<long long>(ec);
      for (int i = 0; i < m; ++i)
        for (int l = 0; l < k; ++l)
          ar[static_cast<size_t>(i) * k + l] =
              load(Ab, a_type, ta ? static_cast<size_t>(l) + static_cast<size_t>(i) * lda
                                  : static_cast<size_t>(i) + static_cast<size_t>(l) * lda);
      for (int j = 0; j < n; ++j)
        for (int l = 0; l < k; ++l)
          bc[static_cast<size_t>(j) * k + l] =
              load(Bb, b_type, tb ? static_cast<size_t>(j) + static_cast<size_t>(l) * ldb
                                  : static_cast<size_t>(l) + static_cast<size_t>(j) * ldb);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          const float* x = &ar[static_cast<size_t>(i) * k];
          const float* y = &bc[static_cast<size_t>(j) * k];
          float acc[8] = {};
          int l = 0;
          for (; l + 8 <= k; l += 8)
            for (int u = 0; u < 8; ++u) acc[u] += x[l + u] * y[l + u];
          for (; l < k; ++l) acc[0] += x[l] * y[l];
          const float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
          const size_t ci = static_cast<size_t>(i) + static_cast<size_t>(j) * ldc;
          // beta == 0: C is not read (it may hold NaNs), as cuBLAS documents.
          store(Cb, c_type, ci, be == 0.f ? al * dot : al * dot + be * load(Cb, c_type, ci));
        }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return kvpr_emu::cublasGemmStridedBatchedEx(h, transa, transb, m, n, k, alpha, A, a_type, lda, 0, B, b_type, ldb, 0,
                                              beta, C, c_type, ldc, 0, 1, compute, algo);
}

}  // namespace kvpr_emu
