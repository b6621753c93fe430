// In the emulated build (-DKVPR_EMULATED_CUDA=ON) the engine's own CUDA backend runs on the
// emulated device: what the emulated suites call it by (emulated_backend.h) is the engine's.
#include "engine/backend/backend.h"
#include "tests/simt/emulated_backend.h"

namespace kvpr {

std::unique_ptr<Backend> emulated_create_backend(const std::string& name, int device) {
  return create_backend(name == "auto" ? "cuda" : name, device);
}
bool emulated_cuda_available() { return cuda_available(); }

}  // namespace kvpr
