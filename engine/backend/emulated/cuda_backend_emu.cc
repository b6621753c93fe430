// The CUDA backend (engine/backend/cuda/cuda_backend.cu), unchanged, built by the host compiler
// against the emulated CUDA runtime and cuBLAS (cuda_runtime_emu.h), its kernels run by the SIMT
// emulator: what -DKVPR_EMULATED_CUDA=ON builds into the engine in place of the nvcc-built one,
// so that every binary's GPU path runs on emulated devices (KVPR_EMULATED_GPUS).
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on

#include "engine/backend/cuda/cuda_backend.cu"
