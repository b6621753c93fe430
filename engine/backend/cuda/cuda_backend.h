// The CUDA backend (one device): cuBLAS GEMMs with fp16/bf16 inputs and fp32 accumulation,
// kernels for the other ops (kernels.cu, attention.cu), pinned host memory, and three
// non-blocking streams (compute, H2D, D2H) ordered by CUDA events.
#pragma once

#include <memory>

#include "engine/backend/backend.h"

namespace kvpr {

int cuda_device_count();  // 0 when no driver or device is present
std::unique_ptr<Backend> make_cuda_backend(int device);
std::string cuda_pci_bus_id(int device);  // "0000:17:00.0"

}  // namespace kvpr
