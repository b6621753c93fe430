// What the emulated cuBLAS (cublas_emu.cc) takes from the emulated runtime (cuda_runtime_emu.cc),
// which owns the devices, the streams and the lock every API call holds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

// A cuBLAS handle (opaque to the CUDA headers).
struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // cublasSetWorkspace (the emulated GEMMs need none)
};

namespace kvpr_emu::internal {

// The runtime's lock for one API call (under the random schedule the device may run some queued
// work first, as at every call).
class ApiCall {
 public:
  ApiCall();
  ~ApiCall();
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;

 private:
  void* api_;
};

void add_handle(std::unique_ptr<cublasContext> h);
bool remove_handle(cublasHandle_t h);  // false: not a live handle
bool handle_known(cublasHandle_t h);
bool stream_known(cudaStream_t stream);
bool in_one_allocation(const void* p, std::size_t bytes);  // [p, p + bytes) inside one live device allocation
// Throws DeviceFault ("<what> [p, +bytes) is not device memory", or outside one allocation).
void check_device_operand(const void* p, std::size_t bytes, const std::string& what);
// Queues a GEMM's work on `stream` (counted in gemms_run once it ran).
void enqueue_gemm(cudaStream_t stream, std::function<void()> op);

}  // namespace kvpr_emu::internal
