// kvpr-bench's device: the engine's own backends and CUDA devices (kvpr-bench-emu links
// tests/simt/bench_emulated.cc instead).
#include "bench/bench_common.h"

namespace kvpr::bench {

std::unique_ptr<Backend> bench_backend(const std::string& name, int device) { return create_backend(name, device); }
std::vector<std::string> bench_gpu_bus_ids() { return cuda_pci_bus_ids(); }

}  // namespace kvpr::bench
