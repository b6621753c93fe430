// Chooses the split l: how many of the cached tokens get their K/V recomputed on the device
// from the layer input X (moved over the link at x_bytes per token) instead of moving their
// K and V (kv_bytes per token). See docs/design.md §1 and the KVPR paper §3.
//
// Quantities are per layer and per step, summed over the batch: S cached tokens, split L,
//   link(L)   = L·x/v + (S−L)·kv/v                         (bytes over bandwidth)
//   recomp(L) = c0 + c1·L  for L > 0, 0 for L = 0          (GEMM [L,h]·[h,2·h_kv])
// Paper model:    t(L) = L·x/v + max(recomp(L), (S−L)·kv/v)
// Pipeline model: t(L) = max(link(L), other + recomp(L)), where `other` is the rest of the
//                 layer's device work, which the next layer's copies overlap (prefetch).
// With the weights streamed (weight_stream.h) the link also carries W bytes of weights per
// layer: link(L) gains W/v, and so does the paper model's t(L) (its optimum does not move;
// the pipeline model's moves towards more recomputation, since the link is busier).
// Each is piecewise linear, so the optimum is at L = 0, at a clamp, or where the two branches
// meet; choose() evaluates those few candidates: O(1) per decision.
//
// Tiers (kv mode auto): R of the S cached tokens have their K/V on the device, read in place;
// the other S − R are staged, L of them recomputed. Both models are then t(S − R, L): for
// every L they do not increase with R (resident tokens take nothing from the link, and the
// device reads every token's K/V whichever tier holds it), so the optimum over R is at an end
// of [0, R_max]; choose_tiers() compares choose() at the two ends: still O(1).
#pragma once

#include <cstdint>
#include <string>

#include "engine/kv/kv_options.h"
#include "engine/kv/link_profile.h"

namespace kvpr {


struct SplitDecision {
  int64_t split = 0;        // L, total over the batch
  SplitModel model = SplitModel::Paper;
  double predicted_s = 0;   // model time per layer at `split`
  double baseline_s = 0;    // model time per layer at L = 0 (full transfer)
};

struct TierDecision {
  int64_t resident = 0;  // R: cached tokens read in place on the device
  SplitDecision split;   // L of the S − R staged ones
};

class SplitScheduler {
 public:
  // x_bytes / kv_bytes: bytes per token per layer of X and of K+V. granularity: L (and each
  // sequence's l) is a multiple of it, except when capped by what is available.
  SplitScheduler(LinkProfile profile, int64_t x_bytes, int64_t kv_bytes, int64_t granularity = 16,
                 SplitModel preferred = SplitModel::Pipeline);

  // S cached tokens in the batch, at most max_split of them with X stored. `other_s` is the
  // layer's other device time; when unknown (< 0) the paper model is used.
  SplitDecision choose(int64_t cached, int64_t max_split, double other_s) const;
  // S cached tokens of which up to resident_max can be on the device, max_split with X stored
  // (the first ones: a staged token's).
  TierDecision choose_tiers(int64_t cached, int64_t resident_max, int64_t max_split, double other_s) const;

  // Bytes the link carries per layer besides X and KV (streamed weights).
  void set_fixed_link_bytes(double bytes) { fixed_bytes_ = bytes; }
  double fixed_link_bytes() const { return fixed_bytes_; }

  // Online adaptation: exponential moving averages of what each step measured.
  void observe_link(double bytes, double seconds);
  void observe_recompute(int64_t rows, double seconds);
  void observe_other(double seconds);

  const LinkProfile& profile() const { return profile_; }
  double other_s() const { return other_s_; }
  double link_bytes_per_s() const { return profile_.h2d_gbps * 1e9; }
  int64_t granularity() const { return granularity_; }
  bool recompute_can_help() const { return x_bytes_ < kv_bytes_; }

  // Model times, exposed for tests and reports.
  double paper_time(int64_t cached, int64_t split) const;
  double pipeline_time(int64_t cached, int64_t split, double other_s) const;

 private:
  double recompute_time(int64_t split) const;
  LinkProfile profile_;
  int64_t x_bytes_, kv_bytes_, granularity_;
  SplitModel preferred_;
  double other_s_ = -1;
  double fixed_bytes_ = 0;
  double alpha_ = 0.3;  // weight of a new measurement
};

}  // namespace kvpr
