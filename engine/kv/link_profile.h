// A link profile: the link's bandwidths and the recompute GEMM's cost, as the profiler
// (profiler.h) measured them on a device and the split scheduler (split_scheduler.h) reads them;
// saved and loaded as JSON (kvpr profile --save, --profile FILE).
#pragma once

#include <cstdint>
#include <string>

#include "engine/base/json.h"

namespace kvpr {

// What the profiler measured, and what the runtime keeps updating.
struct LinkProfile {
  double h2d_gbps = 0;            // pinned H2D while D2H runs (the real condition)
  double h2d_alone_gbps = 0;      // pinned H2D with the link otherwise idle
  double d2h_gbps = 0;            // pinned D2H alone
  double recompute_fixed_s = 0;   // c0: per-layer fixed cost of a recompute (launches, small GEMMs)
  double recompute_per_row_s = 0; // c1: seconds per recomputed token (K and V of one layer)
  json::Value gemm_points;        // measured [{rows, seconds}] at the recompute shape
  std::string device;             // what it was measured on
  int64_t hidden = 0;             // the shape it was measured for

  json::Value to_json() const;
  static LinkProfile from_json(const json::Value& v);
  void save(const std::string& path) const;
  static LinkProfile load(const std::string& path);
};

}  // namespace kvpr
