// The CUDA kernels of engine/backend/cuda/sampling.cu, compiled by the host compiler for the SIMT emulator.
#include "tests/simt/simt_emu.h"
// clang-format off
#include "engine/backend/cuda/sampling.cu"
