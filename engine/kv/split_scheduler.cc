#include "engine/kv/split_scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/base/error.h"

namespace kvpr {

SplitScheduler::SplitScheduler(LinkProfile profile, int64_t x_bytes, int64_t kv_bytes, int64_t granularity,
                               SplitModel preferred)
    : profile_(std::move(profile)),
      x_bytes_(x_bytes),
      kv_bytes_(kv_bytes),
      granularity_(std::max<int64_t>(1, granularity)),
      preferred_(preferred) {
  KVPR_CHECK(profile_.h2d_gbps > 0, "link profile has no H2D bandwidth");
  KVPR_CHECK(x_bytes > 0 && kv_bytes > 0, "bytes per token must be positive");
}

double SplitScheduler::recompute_time(int64_t split) const {
  if (split <= 0) return 0;
  return profile_.recompute_fixed_s + profile_.recompute_per_row_s * static_cast<double>(split);
}

double SplitScheduler::paper_time(int64_t cached, int64_t split) const {
  const double v = link_bytes_per_s();
  double x = (fixed_bytes_ + static_cast<double>(split) * x_bytes_) / v;
  double kv = static_cast<double>(cached - split) * kv_bytes_ / v;
  return x + std::max(recompute_time(split), kv);
}

double SplitScheduler::pipeline_time(int64_t cached, int64_t split, double other_s) const {
  const double v = link_bytes_per_s();
  double link =
      (fixed_bytes_ + static_cast<double>(split) * x_bytes_ + static_cast<double>(cached - split) * kv_bytes_) / v;
  return std::max(link, std::max(0.0, other_s) + recompute_time(split));
}

SplitDecision SplitScheduler::choose(int64_t cached, int64_t max_split, double other_s) const {
  SplitDecision d;
  const bool pipeline = preferred_ == SplitModel::Pipeline && other_s >= 0;
  d.model = pipeline ? SplitModel::Pipeline : SplitModel::Paper;
  auto t = [&](int64_t l) { return pipeline ? pipeline_time(cached, l, other_s) : paper_time(cached, l); };
  d.baseline_s = t(0);
  d.predicted_s = d.baseline_s;
  const int64_t hi = std::clamp<int64_t>(max_split, 0, cached);
  if (cached <= 0 || hi == 0 || !recompute_can_help()) return d;  // GQA: X is not smaller than K+V

  // Where the increasing and decreasing branches meet (continuous).
  const double v = link_bytes_per_s();
  const double c0 = profile_.recompute_fixed_s, c1 = profile_.recompute_per_row_s;
  const double kvv = kv_bytes_ / v, xv = x_bytes_ / v;
  double meet;
  if (pipeline) meet = (fixed_bytes_ / v + cached * kvv - std::max(0.0, other_s) - c0) / (c1 + kvv - xv);
  else meet = (cached * kvv - c0) / (c1 + kvv);
  const int64_t g = granularity_;
  int64_t candidates[6] = {0, hi, hi / g * g, 0, 0, 0};
  if (std::isfinite(meet)) {
    int64_t m = static_cast<int64_t>(std::clamp(meet, 0.0, static_cast<double>(hi)));
    candidates[3] = m / g * g;
    candidates[4] = std::min(hi, (m + g - 1) / g * g);
    candidates[5] = std::min(hi, candidates[4] + g);
  }
  for (int64_t l : candidates) {
    double tl = t(l);
    if (tl < d.predicted_s - 1e-15) {
      d.predicted_s = tl;
      d.split = l;
    }
  }
  return d;
}

TierDecision SplitScheduler::choose_tiers(int64_t cached, int64_t resident_max, int64_t max_split, double other_s) const {
  const int64_t r = std::clamp<int64_t>(resident_max, 0, std::max<int64_t>(cached, 0));
  TierDecision most{r, choose(cached - r, std::min(max_split, cached - r), other_s)};
  if (r == 0) return most;
  TierDecision none{0, choose(cached, max_split, other_s)};
  return none.split.predicted_s < most.split.predicted_s ? none : most;  // ties: the device tier
}

void SplitScheduler::observe_link(double bytes, double seconds) {
  if (bytes <= 0 || seconds <= 0) return;
  // Average time per byte (not bytes per second) so a slowdown shows at once.
  double s_per_byte = (1 - alpha_) / (profile_.h2d_gbps * 1e9) + alpha_ * seconds / bytes;
  profile_.h2d_gbps = 1.0 / s_per_byte / 1e9;
}

void SplitScheduler::observe_recompute(int64_t rows, double seconds) {
  if (rows <= 0 || seconds <= 0) return;
  double per_row = std::max(0.0, seconds - profile_.recompute_fixed_s) / static_cast<double>(rows);
  profile_.recompute_per_row_s = (1 - alpha_) * profile_.recompute_per_row_s + alpha_ * per_row;
}

void SplitScheduler::observe_other(double seconds) {
  if (seconds < 0) return;
  other_s_ = other_s_ < 0 ? seconds : (1 - alpha_) * other_s_ + alpha_ * seconds;
}

}  // namespace kvpr
