// Force-included (-include) into every kvpr-bench source of kvpr-bench-emu: their "cuda" backend
// and GPU list become the emulated device's (cuda_backend_emu.h), so CI runs the device checks'
// benchmark code paths (event timing, traces, the profile, every mode, scale's workers) the way
// the H200 will, and a device run is not spent finding a crash in them.
#pragma once

#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "tests/simt/cuda_backend_emu.h"

namespace kvpr {
std::vector<std::string> emulated_cuda_pci_bus_ids();  // the emulated device's bus id (bench_emulated.cc)
}  // namespace kvpr

#define create_backend emulated_create_backend
#define cuda_pci_bus_ids emulated_cuda_pci_bus_ids
