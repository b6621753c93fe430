// Measures what the split scheduler needs, on the backend's real memory at start-up:
// pinned H2D bandwidth alone and with a D2H copy running at the same time (the condition
// during decoding, when new K/V are stored back), D2H bandwidth, and the time to recompute
// K/V at the recompute shapes across l (fitted as fixed + per-row cost).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_runtime.h"
#include "engine/kv/link_profile.h"

namespace kvpr {

struct ProfileOptions {
  int64_t transfer_bytes = 64ll << 20;  // per timed copy
  int reps = 5;                          // median of
  std::vector<int64_t> rows = {16, 64, 256, 1024, 4096};
  // The short profile a worker takes at start (16 MiB copies, 3 repeats, up to 1024 rows):
  // kvpr-worker, `kvpr profile --quick` and the benchmarks that stand in for a worker.
  static ProfileOptions quick() { return ProfileOptions{16ll << 20, 3, {16, 64, 256, 1024}}; }
};

// `projector` and `layer` give the real K/V projection to time; x is fed in `dtype` as the
// runtime stores it.
LinkProfile profile_backend(Backend& be, KvProjector& projector, const KvShape& shape, DType dtype,
                            const ProfileOptions& opts = {});

}  // namespace kvpr
