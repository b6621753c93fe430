// kvpr-bench with its "cuda" backend on the emulated device (cuda_backend_emu.h): CI runs the
// device check's benchmark code paths (event timing, traces, the profile, every mode) the
// way the H200 will, so a first device run is not spent finding a crash in them.
#include "tests/simt/cuda_backend_emu.h"

#define create_backend emulated_create_backend
#include "bench/kvpr_bench.cc"
