// The CUDA backend on the emulated device (cuda_backend_emu.cc): what tests/engine/backend/test_cuda.cc
// gets for create_backend("cuda") and cuda_available() when built as the emulated suite.
#pragma once

#include <memory>
#include <string>

#include "engine/backend/backend.h"

namespace kvpr {

// "cuda" or "auto": the CUDA backend on the emulated device; other names as create_backend.
std::unique_ptr<Backend> emulated_create_backend(const std::string& name, int device = 0);
bool emulated_cuda_available();

}  // namespace kvpr
