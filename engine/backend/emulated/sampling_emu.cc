// The CUDA kernels of engine/backend/cuda/sampling.cu, compiled by the host compiler for the SIMT emulator.
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/cuda/sampling.cu"
