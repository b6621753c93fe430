// kvpr-bench-emu's device: kvpr-bench's objects linked with this file instead of
// bench/device.cc, so their "cuda" backend and GPU list are the emulated device's.
#include "bench/bench_common.h"
#include "tests/simt/emulated_backend.h"
#include "engine/backend/emulated/cuda_runtime_emu.h"

namespace kvpr::bench {

std::unique_ptr<Backend> bench_backend(const std::string& name, int device) {
  return emulated_create_backend(name, device);
}

// The emulated device's bus id (kvpr-bench scale's GPU list), from its runtime.
std::vector<std::string> bench_gpu_bus_ids() {
  char id[32];
  return cudaDeviceGetPCIBusId(id, sizeof id, 0) == cudaSuccess ? std::vector<std::string>{id}
                                                                 : std::vector<std::string>{};
}

}  // namespace kvpr::bench
