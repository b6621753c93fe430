// kvpr-bench with its "cuda" backend on the emulated device (cuda_backend_emu.h): CI runs the
// device check's benchmark code paths (event timing, traces, the profile, every mode) the
// way the H200 will, so a first device run is not spent finding a crash in them.
#include "tests/simt/cuda_backend_emu.h"
#include "tests/simt/cuda_runtime_emu.h"

// The emulated device's bus id (kvpr-bench scale's GPU list), from its runtime.
namespace kvpr {
std::vector<std::string> emulated_cuda_pci_bus_ids() {
  char id[32];
  return cudaDeviceGetPCIBusId(id, sizeof id, 0) == cudaSuccess ? std::vector<std::string>{id}
                                                                 : std::vector<std::string>{};
}
}  // namespace kvpr

#define create_backend emulated_create_backend
#define cuda_pci_bus_ids emulated_cuda_pci_bus_ids
#include "bench/kvpr_bench.cc"
#include "bench/scale.cc"
