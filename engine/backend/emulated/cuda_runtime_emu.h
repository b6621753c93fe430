// An emulated CUDA device for CI (which has the CUDA headers but no GPU): the part of the CUDA
// runtime and cuBLAS that engine/backend/cuda/cuda_backend.cu calls, so that the unchanged backend,
// with its kernels run by the SIMT emulator (simt_emu.h), is tested end to end on the CPU:
// tests/engine/backend/test_cuda.cc (the GPU test suite) runs against it in CI on every change, and
// with -DKVPR_EMULATED_CUDA=ON the real binaries (kvprd, kvpr-worker, kvpr, kvpr-bench) are
// built against it, so the daemon runs its GPU path on emulated GPUs.
//
// What it models, so that the bugs a first run on a real GPU would show are found here:
// - Device memory is an arena the host cannot touch: it is PROT_NONE except while the
//   emulated device runs work, so host code dereferencing a device pointer faults. Every
//   allocation is 256-byte aligned and followed by a poisoned red zone, freed memory is
//   poisoned (under AddressSanitizer), so kernels reading past a buffer or after a free fail.
// - Streams are queues the device runs lazily: work runs only when the host waits for it
//   (stream/event/device synchronize, a copy to pageable memory, cudaFree) or when another
//   stream's work waits on an event of it. A host read of results without the right wait, or
//   a stream that reads another stream's output without an event, sees stale data. A random
//   schedule (run_random) additionally runs queued work at random points, as a GPU may.
// - Copies follow CUDA's rules for pageable memory (an async copy from pageable memory takes
//   the data at the call; to pageable memory returns once it is done) and must lie inside one
//   allocation; kernels may be handed device or pinned pointers only; cuBLAS checks its
//   arguments as cuBLAS documents them and each matrix's extent against its allocation, and
//   computes with fp32 accumulation (column-major, as cuBLAS).
// - Events record when the device reached them; elapsed time needs timing-enabled, completed
//   events, as CUDA requires.
// Environment: KVPR_EMU_SCHEDULE=lazy (default) | eager | random:SEED picks the schedule of a
// whole run; KVPR_EMU_TRACE_WAITS=1 prints a backtrace wherever the host waits for the device
// (how the extra waits of the decode step were found).
// - Stream capture and graphs: work issued on a capturing stream becomes the graph's nodes
//   (run only when an instantiated graph is launched, reading its buffers then); calls that
//   would wait or allocate during a capture fail and invalidate it, as do waits on events
//   recorded outside it and host queries of events recorded inside it.
// - Several devices (KVPR_EMULATED_GPUS=N; without it, none in the emulated build of the
//   binaries, one in the test suites' device): each its own arena, legacy stream and memory
//   (KVPR_EMULATED_GPU_MEMORY, e.g. 512MiB: cudaMemGetInfo and the allocation limit), a PCI bus
//   id (KVPR_EMULATED_PCI_BUS_IDS, a comma list, so that placement finds it in a topology XML;
//   else 0000:<index>:00.0) and a PCIe link (KVPR_EMULATED_LINK_GBPS, one rate or a list, in
//   GB/s: a copy to or from the device takes bytes / rate, one copy at a time, as every queued
//   op runs on the waiting host thread; without it copies take no time). cudaSetDevice picks the calling thread's device; streams
//   belong to the device current when they were made; a kernel handed another device's memory
//   faults (no peer access).
// Not modelled: compute time, the legacy stream's implicit synchronisation with blocking
// streams (the backend creates non-blocking streams only), relaxed capture, captures that fork
// across streams, graph updates.
//
// Include after the CUDA headers (simt_emu.h includes them): the macros at the end send the
// backend's CUDA calls here.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvpr_emu {

// A fault the real device would report asynchronously (an illegal address): thrown at once.
struct DeviceFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How queued work is run. Lazy: only when something waits for it. Eager: at once (a device
// that is never behind). Random: lazy, plus queued work run at random API calls.
enum class Schedule { Lazy, Eager, Random };
void set_schedule(Schedule s, uint64_t seed = 0);
Schedule schedule();

// Waits as long as `bytes` take over the PCIe link of the device whose memory `device_ptr` is
// in (KVPR_EMULATED_LINK_GBPS; nothing without it): the NCCL stand-in's transfers through host
// memory cross it, as NCCL's shared-memory transport does.
void cross_device_link(const void* device_ptr, size_t bytes);

// The number of kernels and GEMMs run so far.
uint64_t kernels_run();
uint64_t gemms_run();
// Calls that made the host wait for queued device work (synchronizes, copies into pageable
// memory, and the implicit waits of cudaFree and friends).
uint64_t host_waits();
// Work the host handed to streams: kernel launches, GEMMs, copies and memsets (captured ones
// too), and graph launches, each counting once: what a step costs the host in launch calls.
uint64_t host_submissions();
// Where a pointer points: device memory, pinned (page-locked, registered) host memory, or
// other (pageable) host memory.
enum class Memory { Device, Pinned, Pageable };
Memory classify(const void* p);

// ---- the runtime API (names as CUDA's; the macros below send the backend's calls here) ----
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device);
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                                 cudaMemcpyAttributes* attrs, size_t* attrs_idxs, size_t num_attrs, cudaStream_t s);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cublasStatus_t cublasCreate_v2(cublasHandle_t* h);
cublasStatus_t cublasDestroy_v2(cublasHandle_t h);
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* workspace, size_t bytes);
const char* cublasGetStatusName(cublasStatus_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m,
                                          int n, int k, const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType_t c_type,
                                          int ldc, long long stride_c, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo);

}  // namespace kvpr_emu

#if !defined(KVPR_EMU_RUNTIME_IMPL)
#define KVPR_EMU_REDIRECT(name) ::kvpr_emu::name
#undef cudaGetDeviceProperties
#undef cublasCreate_v2
#undef cublasDestroy_v2
#undef cublasSetStream_v2
#undef cublasSetWorkspace_v2
#define cudaGetDeviceCount KVPR_EMU_REDIRECT(cudaGetDeviceCount)
#define cudaSetDevice KVPR_EMU_REDIRECT(cudaSetDevice)
#define cudaGetDevice KVPR_EMU_REDIRECT(cudaGetDevice)
#define cudaGetDeviceProperties KVPR_EMU_REDIRECT(cudaGetDeviceProperties)
#define cudaDeviceGetPCIBusId KVPR_EMU_REDIRECT(cudaDeviceGetPCIBusId)
#define cudaGetLastError KVPR_EMU_REDIRECT(cudaGetLastError)
#define cudaGetErrorName KVPR_EMU_REDIRECT(cudaGetErrorName)
#define cudaGetErrorString KVPR_EMU_REDIRECT(cudaGetErrorString)
#define cudaMalloc KVPR_EMU_REDIRECT(cudaMalloc)
#define cudaFree KVPR_EMU_REDIRECT(cudaFree)
#define cudaMemGetInfo KVPR_EMU_REDIRECT(cudaMemGetInfo)
#define cudaHostAlloc KVPR_EMU_REDIRECT(cudaHostAlloc)
#define cudaFreeHost KVPR_EMU_REDIRECT(cudaFreeHost)
#define cudaHostRegister KVPR_EMU_REDIRECT(cudaHostRegister)
#define cudaHostUnregister KVPR_EMU_REDIRECT(cudaHostUnregister)
#define cudaMemcpyAsync KVPR_EMU_REDIRECT(cudaMemcpyAsync)
#define cudaMemcpy KVPR_EMU_REDIRECT(cudaMemcpy)
#define cudaMemcpy2DAsync KVPR_EMU_REDIRECT(cudaMemcpy2DAsync)
#define cudaMemcpyBatchAsync KVPR_EMU_REDIRECT(cudaMemcpyBatchAsync)
#define cudaMemsetAsync KVPR_EMU_REDIRECT(cudaMemsetAsync)
#define cudaMemset KVPR_EMU_REDIRECT(cudaMemset)
#define cudaStreamCreateWithFlags KVPR_EMU_REDIRECT(cudaStreamCreateWithFlags)
#define cudaStreamDestroy KVPR_EMU_REDIRECT(cudaStreamDestroy)
#define cudaStreamSynchronize KVPR_EMU_REDIRECT(cudaStreamSynchronize)
#define cudaStreamWaitEvent KVPR_EMU_REDIRECT(cudaStreamWaitEvent)
#define cudaDeviceSynchronize KVPR_EMU_REDIRECT(cudaDeviceSynchronize)
#define cudaEventCreate KVPR_EMU_REDIRECT(cudaEventCreate)
#define cudaEventCreateWithFlags KVPR_EMU_REDIRECT(cudaEventCreateWithFlags)
#define cudaEventDestroy KVPR_EMU_REDIRECT(cudaEventDestroy)
#define cudaEventRecord KVPR_EMU_REDIRECT(cudaEventRecord)
#define cudaEventSynchronize KVPR_EMU_REDIRECT(cudaEventSynchronize)
#define cudaEventQuery KVPR_EMU_REDIRECT(cudaEventQuery)
#define cudaEventElapsedTime KVPR_EMU_REDIRECT(cudaEventElapsedTime)
#define cudaStreamBeginCapture KVPR_EMU_REDIRECT(cudaStreamBeginCapture)
#define cudaStreamEndCapture KVPR_EMU_REDIRECT(cudaStreamEndCapture)
#define cudaStreamIsCapturing KVPR_EMU_REDIRECT(cudaStreamIsCapturing)
#define cudaGraphInstantiate KVPR_EMU_REDIRECT(cudaGraphInstantiate)
#define cudaGraphLaunch KVPR_EMU_REDIRECT(cudaGraphLaunch)
#define cudaGraphExecDestroy KVPR_EMU_REDIRECT(cudaGraphExecDestroy)
#define cudaGraphDestroy KVPR_EMU_REDIRECT(cudaGraphDestroy)
#define cublasCreate_v2 KVPR_EMU_REDIRECT(cublasCreate_v2)
#define cublasDestroy_v2 KVPR_EMU_REDIRECT(cublasDestroy_v2)
#define cublasSetStream_v2 KVPR_EMU_REDIRECT(cublasSetStream_v2)
#define cublasSetMathMode KVPR_EMU_REDIRECT(cublasSetMathMode)
#define cublasSetWorkspace_v2 KVPR_EMU_REDIRECT(cublasSetWorkspace_v2)
#define cublasGetStatusName KVPR_EMU_REDIRECT(cublasGetStatusName)
#define cublasGemmEx KVPR_EMU_REDIRECT(cublasGemmEx)
#define cublasGemmStridedBatchedEx KVPR_EMU_REDIRECT(cublasGemmStridedBatchedEx)
#endif
