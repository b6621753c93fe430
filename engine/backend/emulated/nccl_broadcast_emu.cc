// The NCCL weight broadcast (engine/backend/cuda/nccl_broadcast.cu), unchanged, on the emulated
// device and the NCCL stand-in (nccl_emu.h): the emulated build's workers broadcast their
// weights as a multi-GPU host's do.
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
#include "engine/backend/emulated/nccl_emu.h"
// clang-format on

#include "engine/backend/cuda/nccl_broadcast.cu"
