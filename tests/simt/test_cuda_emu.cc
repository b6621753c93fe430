// The emulated device itself (cuda_runtime_emu.h): it has to catch the bugs it exists for
// (host access to device memory, missing waits between streams or before the host reads,
// bad cuBLAS arguments, pageable or freed pointers handed to kernels), compute what cuBLAS
// computes, and under a random schedule still give the CPU's greedy tokens in every KV mode.
#include <gtest/gtest.h>

#include <cmath>
#include <chrono>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/decode/generator.h"
#include "engine/model/opt_model.h"
#include "tests/simt/emulated_backend.h"
#if defined(KVPR_HAVE_HWLOC)
#include "numa/numa_memory.h"
#include "numa/placement.h"
#include "numa/topology.h"
#endif
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/test_util.h"

using kvpr_emu::DeviceFault;

namespace {

template <typename T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
T* pinned_alloc(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocPortable), cudaSuccess);
  return static_cast<T*>(p);
}
cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

// Each test runs on the lazy schedule (what it checks depends on it), whatever
// KVPR_EMU_SCHEDULE chose for the suite, and gives the suite's schedule back after.
class EmulatedDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    suite_schedule_ = kvpr_emu::schedule();
    kvpr_emu::set_schedule(kvpr_emu::Schedule::Lazy);
  }
  void TearDown() override { kvpr_emu::set_schedule(suite_schedule_, 1); }

 private:
  kvpr_emu::Schedule suite_schedule_ = kvpr_emu::Schedule::Lazy;
};
using EmulatedDeviceDeathTest = EmulatedDevice;

}  // namespace

TEST_F(EmulatedDevice, MemoryKindsAndAllocationRules) {
  float* d = device_alloc<float>(100);
  float* h = pinned_alloc<float>(100);
  std::vector<float> pageable(100);
  EXPECT_EQ(kvpr_emu::classify(d), kvpr_emu::Memory::Device);
  EXPECT_EQ(kvpr_emu::classify(d + 99), kvpr_emu::Memory::Device);
  EXPECT_EQ(kvpr_emu::classify(h), kvpr_emu::Memory::Pinned);
  EXPECT_EQ(kvpr_emu::classify(pageable.data()), kvpr_emu::Memory::Pageable);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, size_t{1} << 42), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);  // not the start of an allocation
  EXPECT_EQ(cudaHostRegister(h, 64, 0), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaHostUnregister(pageable.data()), cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostRegister(pageable.data(), pageable.size() * sizeof(float), cudaHostRegisterPortable), cudaSuccess);
  EXPECT_EQ(kvpr_emu::classify(pageable.data() + 50), kvpr_emu::Memory::Pinned);
  EXPECT_EQ(cudaHostUnregister(pageable.data()), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(h), cudaSuccess);
}

TEST_F(EmulatedDeviceDeathTest, HostCodeTouchingDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = device_alloc<float>(16);
  // Our SIGSEGV note, or AddressSanitizer's report of the fault.
  EXPECT_DEATH({ *reinterpret_cast<volatile float*>(d) = 1.f; }, "touched device memory|SEGV");
  EXPECT_EQ(cudaMemsetAsync(d, 0, 16 * sizeof(float), nullptr), cudaSuccess);  // through the device: fine
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d);
}

// KVPR_EMULATED_GPUS=2 with a memory cap, bus ids and a link rate per device (the ctest entry
// emulated_gpu_two_devices sets them; with one device this skips): each device has its own
// memory, bus id and link, the calling thread's device takes the allocations, a kernel handed the
// other device's memory faults, and a copy over a link takes at least bytes / its rate.
TEST_F(EmulatedDevice, SeveralDevicesEachWithItsMemoryBusIdAndLink) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  if (n < 2) GTEST_SKIP() << "one emulated device (emulated_gpu_two_devices runs this with two)";
  const size_t cap = size_t{64} << 20;
  for (int d = 0; d < 2; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    EXPECT_EQ(prop.totalGlobalMem, cap);
    char bus[32];
    ASSERT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, d), cudaSuccess);
    EXPECT_STREQ(bus, d == 0 ? "0000:17:00.0" : "0000:65:00.0");
  }
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  cudaGetLastError();
  // Allocations go to the calling thread's device, within its memory.
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* on1 = device_alloc<float>(1 << 20);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(total, cap);
  EXPECT_LE(free1, cap - (4u << 20));
  void* past = nullptr;
  EXPECT_EQ(cudaMalloc(&past, cap), cudaErrorMemoryAllocation);  // more than device 1 has left
  cudaGetLastError();
  cudaStream_t s1 = new_stream();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  EXPECT_GT(free0, free1);  // device 0's memory is untouched by device 1's allocation
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  std::thread([] {  // another thread starts on device 0 whatever this one chose
    int d = -1;
    cudaSetDevice(1);
    cudaGetDevice(&d);
    EXPECT_EQ(d, 1);
  }).join();
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  float* on0 = device_alloc<float>(1 << 20);
  cudaStream_t s0 = new_stream();
  // A kernel on device 0 handed device 1's memory: no peer access.
  EXPECT_THROW(kvpr::cuda::add(on0, on0, on1, 16, s0), DeviceFault);
  kvpr::cuda::add(on0, on0, on0, 16, s0);  // its own: fine
  // Each link at its own rate (1 and 2 GB/s): 4 MiB over each takes at least 4.2 and 2.1 ms.
  float* h = pinned_alloc<float>(1 << 20);
  for (auto [dev, dst, st, gbps] : {std::tuple{0, on0, s0, 1.0}, {1, on1, s1, 2.0}}) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(cudaMemcpyAsync(dst, h, 4u << 20, cudaMemcpyHostToDevice, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(ms, (4u << 20) / (gbps * 1e6)) << "device " << dev;
  }
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
  cudaFree(on0);
  cudaFree(on1);  // any device's memory is freed from any current device, as with CUDA's unified addresses
  cudaFreeHost(h);
  size_t after = 0;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&after, &total), cudaSuccess);
  EXPECT_EQ(after, cap);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(EmulatedDevice, StreamsRunLazilySoMissingWaitsShow) {
  const size_t n = 64;
  float* src = pinned_alloc<float>(n);
  float* out = pinned_alloc<float>(n);
  float* d = device_alloc<float>(n);
  cudaStream_t copy = new_stream(), compute = new_stream();
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i);

  // The compute stream reads what the copy stream writes, without an event: stale.
  ASSERT_EQ(cudaMemcpyAsync(d, src, n * sizeof(float), cudaMemcpyHostToDevice, copy), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, d, n * sizeof(float), cudaMemcpyDeviceToHost, compute), cudaSuccess);
  EXPECT_TRUE(std::isnan(out[3])) << "nothing ran before the host waited";
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_TRUE(std::isnan(out[3])) << "the copy stream's write was not waited for";

  // With the event, the same work is ordered.
  cudaEvent_t ev = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, copy), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(compute, ev, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, d, n * sizeof(float), cudaMemcpyDeviceToHost, compute), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(out[3], 3.f);

  // A wait holds the record made before it, even when the event is recorded again.
  for (size_t i = 0; i < n; ++i) src[i] = 100.f;
  ASSERT_EQ(cudaEventRecord(ev, compute), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(copy, ev, 0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, copy), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(ev), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);

  // A pageable source is taken at the call; a pageable destination is written before it returns.
  std::vector<float> page(n, 7.f), back(n, 0.f);
  ASSERT_EQ(cudaMemcpyAsync(d, page.data(), n * sizeof(float), cudaMemcpyDefault, copy), cudaSuccess);
  page.assign(n, -1.f);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, n * sizeof(float), cudaMemcpyDefault, copy), cudaSuccess);
  EXPECT_EQ(back[5], 7.f);

  // A copy must lie inside one allocation and match its declared direction.
  EXPECT_THROW(cudaMemcpyAsync(d + 1, src, n * sizeof(float), cudaMemcpyHostToDevice, copy), DeviceFault);
  EXPECT_EQ(cudaMemcpyAsync(src, out, 4, cudaMemcpyHostToDevice, copy), cudaErrorInvalidValue);
  cudaEventDestroy(ev);
  cudaStreamDestroy(copy);
  cudaStreamDestroy(compute);
  cudaFree(d);
  cudaFreeHost(src);
  cudaFreeHost(out);
}

// Stream capture as CUDA does it: captured work runs only when the graph is launched, reading
// its buffers then (so one graph serves every step whose inputs are rewritten in place), and
// calls that would wait, allocate or tie the graph to outside work fail and invalidate it.
TEST_F(EmulatedDevice, StreamCaptureRecordsGraphsThatReadTheirBuffersAtLaunch) {
  const size_t n = 16;
  float* in = pinned_alloc<float>(n);
  float* out = pinned_alloc<float>(n);
  float* d = device_alloc<float>(n);
  cudaStream_t s = new_stream(), other = new_stream();
  for (size_t i = 0; i < n; ++i) in[i] = out[i] = 0.f;

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemcpyAsync(d, in, n * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, d, n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(g), cudaSuccess);  // the executable graph stands alone
  for (float step : {1.f, 2.f}) {
    for (size_t i = 0; i < n; ++i) in[i] = step * 10.f + static_cast<float>(i);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_EQ(out[3], step == 1.f ? 0.f : 13.f) << "nothing runs before the host waits";
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(out[3], step * 10.f + 3.f) << "a launch reads the inputs as they are then";
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);

  // Waiting, allocating or synchronizing during a capture fails and invalidates it.
  cudaGraph_t bad = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(bad, nullptr);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  // Pageable memory cannot be in a graph.
  std::vector<float> page(n, 1.f);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, page.data(), n * sizeof(float), cudaMemcpyDefault, s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  // A captured stream may not wait on work outside the capture; an event recorded inside is
  // no point in time the host can query.
  cudaEvent_t outside = nullptr, inside = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&inside, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(outside, other), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(inside, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(inside), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  // Not on the legacy stream, not twice, and no end without a beginning.
  EXPECT_EQ(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeThreadLocal),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorIllegalState);
  cudaGetLastError();
  cudaEventDestroy(outside);
  cudaEventDestroy(inside);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
  cudaFree(d);
  cudaFreeHost(in);
  cudaFreeHost(out);
}

TEST_F(EmulatedDevice, EventTimingFollowsCudaRules) {
  cudaStream_t s = new_stream();
  cudaEvent_t a = nullptr, b = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1.f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);  // never recorded
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorNotReady);  // not reached yet
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 0.f);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
  cudaEventDestroy(a);
  EXPECT_EQ(cudaEventRecord(a, s), cudaErrorInvalidResourceHandle);  // destroyed handle
  cudaEventDestroy(b);
  cudaEventDestroy(untimed);
  cudaStreamDestroy(s);
}

TEST_F(EmulatedDevice, KernelsGetDeviceOrPinnedPointersOnly) {
  const int64_t n = 300;
  float* d = device_alloc<float>(n);
  float* h = pinned_alloc<float>(n);
  std::vector<float> pageable(n, 1.f);
  cudaStream_t s = new_stream();
  ASSERT_EQ(cudaMemsetAsync(d, 0, n * sizeof(float), s), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) h[i] = 2.f;
  kvpr::cuda::add(d, d, h, n, s);  // pinned memory is mapped for the device: allowed
  EXPECT_THROW(kvpr::cuda::add(d, d, pageable.data(), n, s), DeviceFault);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  const uint64_t before = kvpr_emu::kernels_run();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(kvpr_emu::kernels_run(), before + 1);
  EXPECT_EQ(h[n - 1], 2.f);
  float* gone = device_alloc<float>(n);
  cudaFree(gone);
  EXPECT_THROW(kvpr::cuda::add(d, d, gone, n, s), DeviceFault);  // freed memory
  cudaStreamDestroy(s);
  cudaFree(d);
  cudaFreeHost(h);
}

TEST_F(EmulatedDevice, CublasGemmComputesAndChecksLikeCublas) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  cudaStream_t s = new_stream();
  ASSERT_EQ(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  // Column-major C (2x2, ldc 3) = Aᵀ · B, A stored 3x2 (lda 3), B 3x2 (ldb 4): hand-checked.
  const float A[6] = {1, 2, 3, 4, 5, 6};              // A = [[1,4],[2,5],[3,6]]
  const float B[8] = {1, 0, -1, 9, 2, 1, 0, 9};       // B = [[1,2],[0,1],[-1,0]] (+ ld padding)
  float* dA = device_alloc<float>(6);
  float* dB = device_alloc<float>(8);
  float* dC = device_alloc<float>(6);
  ASSERT_EQ(cudaMemcpyAsync(dA, A, sizeof A, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dB, B, sizeof B, cudaMemcpyHostToDevice, s), cudaSuccess);
  const float one = 1.f, zero = 0.f;
  // beta = 0: C's old contents (NaNs from a fresh allocation) are not read.
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dA, CUDA_R_32F, 3, dB, CUDA_R_32F, 4, &zero, dC,
                         CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  float C[6] = {};
  ASSERT_EQ(cudaMemcpyAsync(C, dC, sizeof C, cudaMemcpyDeviceToHost, s), cudaSuccess);
  // Aᵀ = [[1,2,3],[4,5,6]]; Aᵀ·B = [[1-3, 2+2], [4-6, 8+5]] = [[-2,4],[-2,13]].
  EXPECT_EQ(C[0], -2.f);
  EXPECT_EQ(C[1], -2.f);
  EXPECT_EQ(C[3], 4.f);
  EXPECT_EQ(C[4], 13.f);
  EXPECT_TRUE(std::isnan(C[2])) << "the ldc padding row is not written";
  // cuBLAS's argument rules: lda >= k for a transposed A, ldc >= m.
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dA, CUDA_R_32F, 2, dB, CUDA_R_32F, 4, &zero, dC,
                         CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dA, CUDA_R_32F, 3, dB, CUDA_R_16F, 4, &zero, dC,
                         CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // A matrix reaching past its allocation, or in host memory, is an illegal address.
  EXPECT_THROW(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 3, &one, dA, CUDA_R_32F, 3, dB, CUDA_R_32F, 4, &zero,
                            dC, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               DeviceFault);
  EXPECT_THROW(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, A, CUDA_R_32F, 3, dB, CUDA_R_32F, 4, &zero, dC,
                            CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               DeviceFault);
  // Strided batches: stride 0 shares B; batches of C must not overlap.
  float* dC2 = device_alloc<float>(12);
  ASSERT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dA, CUDA_R_32F, 3, 0, dB,
                                       CUDA_R_32F, 4, 0, &zero, dC2, CUDA_R_32F, 2, 4, 3, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  float C2[12] = {};
  ASSERT_EQ(cudaMemcpyAsync(C2, dC2, sizeof C2, cudaMemcpyDeviceToHost, s), cudaSuccess);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(C2[4 * b + 3], 13.f) << "batch " << b;
  EXPECT_THROW(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dA, CUDA_R_32F, 3, 0, dB,
                                          CUDA_R_32F, 4, 0, &zero, dC2, CUDA_R_32F, 2, 2, 3, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
               DeviceFault);
  EXPECT_EQ(kvpr_emu::gemms_run() > 0, true);
  cublasDestroy(h);
  cudaStreamDestroy(s);
  for (float* p : {dA, dB, dC, dC2}) cudaFree(p);
}

// The model's whole step on the emulated device under random schedules (queued work runs at
// random API calls, as on a device partly caught up): every KV mode still gives the CPU's
// greedy tokens, so no result depends on a stream happening to be late or early.
TEST_F(EmulatedDevice, EveryKvModeUnderRandomSchedules) {
  using namespace kvpr;
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (uint64_t seed : {1, 2}) {
    kvpr_emu::set_schedule(kvpr_emu::Schedule::Random, seed);
    auto gpu = emulated_create_backend("cuda");
    test::expect_every_kv_mode_gives_cpu_tokens(*gpu, test::data_path("opt/post_ln_proj_sharded"), tok,
                                                {{5, 17, 33, 2, 80, 41, 9}, {60, 61}}, 6, 3,
                                                "seed " + std::to_string(seed));
  }
}

#if defined(KVPR_HAVE_HWLOC)
// A GPU worker's pinned memory: allocated on its NUMA node by hwloc (NumaHostAllocator), then
// page-locked with cudaHostRegister and released with cudaHostUnregister; the host KV store of
// every mode lives there.
TEST_F(EmulatedDevice, NumaPlacedPinnedMemoryIsRegisteredAndServesEveryKvMode) {
  using namespace kvpr;
  auto topo = std::make_shared<Topology>(Topology::from_system());
  auto gpu = emulated_create_backend("cuda");
  gpu->set_host_allocator(std::make_shared<NumaHostAllocator>(topo, 0));
  void* where = nullptr;
  {
    Tensor t = gpu->alloc_pinned(DType::F16, {1000, 3});
    where = t.data();
    EXPECT_EQ(kvpr_emu::classify(t.data()), kvpr_emu::Memory::Pinned);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4096, 0u);
  }
  EXPECT_EQ(kvpr_emu::classify(where), kvpr_emu::Memory::Pageable) << "unregistered when released";
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  test::expect_every_kv_mode_gives_cpu_tokens(*gpu, test::data_path("opt/pre_ln_safetensors"), tok,
                                              {{3, 1, 4, 1, 5, 9, 2, 6}, {40}}, 5, 5, "NUMA-placed pinned memory");
}
#endif

// The host should wait for the device once per decode step (for the step's tokens), plus
// once per layer in cpu-attn mode (for Q before host attention): any other wait inside the
// layer loop stops the host from queueing ahead and the copy streams from overlapping. Counted
// on a warmed generator (buffers already grown), as the difference between 30 and 10 steps,
// on a fixture and on a random 7-layer model (deep enough that double-buffered KV staging
// is reused several times a step).
TEST_F(EmulatedDevice, HostWaitsOncePerDecodeStep) {
  using namespace kvpr;
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = emulated_create_backend("cuda");
  OptConfig deep = OptConfig::load(test::data_path("opt/pre_ln_safetensors"));
  deep.num_layers = 7;
  std::vector<std::unique_ptr<OptModel>> models;
  models.push_back(std::make_unique<OptModel>(*gpu, test::data_path("opt/pre_ln_safetensors")));
  models.push_back(std::make_unique<OptModel>(*gpu, deep, DType::F16, 5));
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {40}};
  for (auto& mg : models) {
    const int64_t layers = mg->config().num_layers;
    for (KvMode m : kAllKvModes) {
      GeneratorOptions og;
      og.max_batch = 2;
      og.kv_dtype = DType::F32;
      og = test::in_mode(og, m, 3, *mg);
      Generator g(*mg, tok, og);
      auto waits = [&](int n) {
        GenerationParams p;
        p.max_new_tokens = n;
        p.ignore_eos = true;
        const uint64_t before = kvpr_emu::host_waits();
        g.generate_all(prompts, p);
        return static_cast<double>(kvpr_emu::host_waits() - before);
      };
      waits(30);  // grows every buffer to its size
      const double per_step = (waits(30) - waits(10)) / 20.0;
      const double want = 1.0 + (m == KvMode::CpuAttn ? static_cast<double>(layers) : 0.0);
      EXPECT_EQ(per_step, want) << kv_mode_name(m) << ", " << layers << " layers";
    }
  }
}

// A decode step's copies are one call per tensor and layer, whatever the batch: the host's
// calls per step (kernels, GEMMs, copies) with 2 and with 6 sequences are the same in offload
// and KVPR (one per sequence for X, K and V each, and for every store, before copy_spans).
TEST_F(EmulatedDevice, DecodeStepCallsDoNotGrowWithTheBatch) {
  using namespace kvpr;
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = emulated_create_backend("cuda");
  OptConfig c = OptConfig::load(test::data_path("opt/pre_ln_safetensors"));
  c.num_layers = 3;
  OptModel model(*gpu, c, DType::F16, 11);
  for (KvMode m : {KvMode::Offload, KvMode::Kvpr}) {
    std::map<int, double> calls;
    for (int batch : {2, 6}) {
      GeneratorOptions og;
      og.max_batch = batch;
      og.kv_dtype = DType::F16;
      og.kv.mode = m;
      if (m == KvMode::Kvpr) og.kv.forced_split = 4;
      std::vector<std::vector<int32_t>> prompts;
      for (int i = 0; i < batch; ++i) prompts.push_back({10 + i, 3, 1, 4, 1, 5, 9, 2});
      Generator g(model, tok, og);
      auto run = [&](int n) {
        GenerationParams p;
        p.max_new_tokens = n;
        p.ignore_eos = true;
        const uint64_t c0 = kvpr_emu::host_submissions();
        g.generate_all(prompts, p);
        return static_cast<double>(kvpr_emu::host_submissions() - c0);
      };
      run(12);
      const double c12 = run(12), c4 = run(4);
      calls[batch] = (c12 - c4) / 8.0;
    }
    EXPECT_EQ(calls[6], calls[2]) << kv_mode_name(m);
    EXPECT_GT(calls[2], 0.0);
  }
}

// What CUDA graphs are for: a replayed resident decode step costs the host two calls (its
// parameter upload and the graph launch) instead of one per op, with the same tokens and still
// one wait per step. Counted on a warmed generator as the difference between 30 and 10 steps.
TEST_F(EmulatedDevice, GraphReplayedDecodeStepCostsTheHostTwoCalls) {
  using namespace kvpr;
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = emulated_create_backend("cuda");
  OptConfig c = OptConfig::load(test::data_path("opt/pre_ln_safetensors"));
  c.num_layers = 5;
  OptModel model(*gpu, c, DType::F16, 11);
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {40}, {7, 8}};
  std::map<bool, std::vector<std::vector<int32_t>>> tokens;
  std::map<bool, double> calls, waits;
  for (bool graphs : {false, true}) {
    GeneratorOptions og;
    og.max_batch = 3;
    og.kv_dtype = DType::F16;
    og.cuda_graphs = graphs;
    Generator g(model, tok, og);
    auto run = [&](int n) {
      GenerationParams p;
      p.max_new_tokens = n;
      p.ignore_eos = true;
      const uint64_t c0 = kvpr_emu::host_submissions(), w0 = kvpr_emu::host_waits();
      auto r = g.generate_all(prompts, p);
      tokens[graphs].clear();
      for (auto& s : r) tokens[graphs].push_back(s.tokens);
      return std::pair<double, double>(static_cast<double>(kvpr_emu::host_submissions() - c0),
                                       static_cast<double>(kvpr_emu::host_waits() - w0));
    };
    run(30);
    const GraphCounters before = gpu->graph_counters();
    auto [c30, w30] = run(30);
    auto [c10, w10] = run(10);
    calls[graphs] = (c30 - c10) / 20.0;
    waits[graphs] = (w30 - w10) / 20.0;
    const GraphCounters after = gpu->graph_counters();
    if (graphs) {
      EXPECT_EQ(after.captured - before.captured, 0) << "the warm-up run captured the step already";
      // Every step after each run's first: the prompts (shorter than a 16-token KV block, so
      // nothing of them is cached) are prefilled in the first, which is no graph step.
      EXPECT_EQ(after.replayed - before.replayed, (30 - 1) + (10 - 1));
      EXPECT_EQ(after.interrupted, 0);
      EXPECT_EQ(after.capture_failed, 0);
    }
  }
  EXPECT_EQ(tokens[true], tokens[false]);
  EXPECT_EQ(calls[true], 2.0);
  EXPECT_GE(calls[false], 10.0 * c.num_layers) << "op by op: every kernel, GEMM and copy is a call";
  EXPECT_EQ(waits[true], 1.0);
  EXPECT_EQ(waits[false], 1.0);
}
