// kvpr-bench-emu: kvpr-bench's sources built again with bench_emu_prelude.h force-included, so
// their "cuda" backend is the emulated device. This file adds what the prelude declares.
#include "tests/simt/cuda_runtime_emu.h"

namespace kvpr {
// The emulated device's bus id (kvpr-bench scale's GPU list), from its runtime.
std::vector<std::string> emulated_cuda_pci_bus_ids() {
  char id[32];
  return cudaDeviceGetPCIBusId(id, sizeof id, 0) == cudaSuccess ? std::vector<std::string>{id}
                                                                 : std::vector<std::string>{};
}
}  // namespace kvpr
