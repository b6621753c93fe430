#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/error.h"

namespace kvpr {

void validate(const SamplingParams& p) {
  KVPR_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f, "temperature must be >= 0, got ",
             p.temperature);
  KVPR_CHECK(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
  KVPR_CHECK(std::isfinite(p.top_p) && p.top_p > 0.f && p.top_p <= 1.f, "top_p must be in (0, 1], got ",
             p.top_p);
}

RowStats row_argmax_lse(const float* logits, int32_t valid) {
  KVPR_CHECK(valid > 0, "no valid token ids to sample from");
  float mx = -std::numeric_limits<float>::infinity();
  int32_t arg = 0;
  for (int32_t i = 0; i < valid; ++i)
    if (logits[i] > mx) mx = logits[i], arg = i;
  double sum = 0;
  for (int32_t i = 0; i < valid; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return {arg, mx, mx + std::log(sum)};
}

Sampled sample_token(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  // log-sum-exp of the raw logits for the reported log-probability.
  const RowStats st = row_argmax_lse(logits, valid);
  const int32_t arg = st.token;
  const double lse = st.lse;
  auto logprob = [&](int32_t t) { return static_cast<float>(logits[t] - lse); };

  if (p.temperature == 0.f || p.top_k == 1) return {arg, logprob(arg)};

  // Candidates: top-k by logit (all when k = 0), in descending order.
  scratch.clear();
  for (int32_t i = 0; i < valid; ++i) scratch.emplace_back(logits[i], i);
  auto desc = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, scratch.size()) : scratch.size();
  if (k < scratch.size()) {
    std::nth_element(scratch.begin(), scratch.begin() + k, scratch.end(), desc);
    scratch.resize(k);
  }
  std::sort(scratch.begin(), scratch.end(), desc);
  // Softmax at the temperature over the candidates.
  const double inv_t = 1.0 / p.temperature;
  const double top = scratch.front().first;
  std::vector<double> prob(scratch.size());
  double z = 0;
  for (size_t i = 0; i < scratch.size(); ++i) z += prob[i] = std::exp((scratch[i].first - top) * inv_t);
  // Nucleus: the smallest prefix whose mass reaches top_p.
  size_t keep = scratch.size();
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < scratch.size(); ++i) {
      cum += prob[i] / z;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  double u = rng.uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0) return {scratch[i].second, logprob(scratch[i].second)};
  }
  return {scratch[keep - 1].second, logprob(scratch[keep - 1].second)};
}

}  // namespace kvpr
