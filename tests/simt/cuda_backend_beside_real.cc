// The unchanged CUDA backend (engine/backend/cuda/cuda_backend.cu) built by the host compiler against
// the emulated CUDA runtime and cuBLAS (cuda_runtime_emu.h), its kernels run by the SIMT
// emulator. Its entry points are renamed so that it can live next to a real CUDA build.
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on

#define cuda_device_count emulated_cuda_device_count
#define make_cuda_backend make_emulated_cuda_backend
#define cuda_pci_bus_id emulated_cuda_pci_bus_id
#include "engine/backend/cuda/cuda_backend.cu"
#undef cuda_device_count
#undef make_cuda_backend
#undef cuda_pci_bus_id

#include "tests/simt/emulated_backend.h"

namespace kvpr {

std::unique_ptr<Backend> emulated_create_backend(const std::string& name, int device) {
  if (name == "cuda" || name == "auto") return make_emulated_cuda_backend(device);
  return create_backend(name, device);
}
bool emulated_cuda_available() { return emulated_cuda_device_count() > 0; }

}  // namespace kvpr
