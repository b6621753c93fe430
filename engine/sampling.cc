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
  KVPR_CHECK(std::isfinite(p.min_p) && p.min_p >= 0.f && p.min_p <= 1.f, "min_p must be in [0, 1], got ", p.min_p);
  KVPR_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.f,
             "repetition_penalty must be > 0, got ", p.repetition_penalty);
  KVPR_CHECK(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f, "presence_penalty must be in [-2, 2], got ",
             p.presence_penalty);
  KVPR_CHECK(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f, "frequency_penalty must be in [-2, 2], got ",
             p.frequency_penalty);
  for (const auto& [id, b] : p.logit_bias)
    KVPR_CHECK(id >= 0 && b >= -100.f && b <= 100.f, "logit_bias needs ids >= 0 and values in [-100, 100], got ", id,
               ": ", b);
}

void adjust_logits(float* logits, int32_t valid, const SamplingParams& p, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& generated) {
  if (p.repetition_penalty != 1.f) {
    // Once per distinct id, however often it occurs (as Hugging Face's gather/scatter does).
    std::vector<int32_t> ids(prompt);
    ids.insert(ids.end(), generated.begin(), generated.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t t : ids)
      if (t >= 0 && t < valid) logits[t] = logits[t] < 0.f ? logits[t] * p.repetition_penalty : logits[t] / p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::vector<int32_t> seen(generated);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      const int32_t t = seen[i];
      if (t >= 0 && t < valid)
        logits[t] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
  for (const auto& [id, b] : p.logit_bias)
    if (id < valid) logits[id] += b;
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

std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t valid, int n, double lse,
                                       std::vector<std::pair<float, int32_t>>& scratch) {
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(n, 0)), static_cast<size_t>(std::max(valid, 0)));
  scratch.clear();
  for (int32_t i = 0; i < valid; ++i) scratch.emplace_back(logits[i], i);
  auto desc = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k), scratch.end(), desc);
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < k; ++i)
    out.emplace_back(scratch[i].second, static_cast<float>(static_cast<double>(scratch[i].first) - lse));
  return out;
}

Sampled sample_token(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  // log-sum-exp of the raw logits for the reported log-probability.
  const RowStats st = row_argmax_lse(logits, valid);
  const int32_t arg = st.token;
  const double lse = st.lse;
  auto logprob = [&](int32_t t) { return static_cast<float>(logits[t] - lse); };

  if (p.temperature == 0.f || p.top_k == 1) return {arg, logprob(arg)};

  // Candidates: the top-k by logit (all ids when k = 0). Their order is descending logit,
  // ties to the lower id; only as much of it is sorted as the draw needs (a heavy head
  // usually holds the mass, so a full vocabulary is not sorted per token).
  scratch.clear();
  for (int32_t i = 0; i < valid; ++i) scratch.emplace_back(logits[i], i);
  auto desc = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, scratch.size()) : scratch.size();
  if (k < scratch.size()) {
    std::nth_element(scratch.begin(), scratch.begin() + k, scratch.end(), desc);
    scratch.resize(k);
  }
  // Softmax at the temperature over the candidates; z sums them all (any order).
  const double inv_t = 1.0 / p.temperature;
  const double top = st.max;  // the row's maximum is always a candidate
  auto weight = [&](size_t i) { return std::exp((static_cast<double>(scratch[i].first) - top) * inv_t); };
  double z = 0;
  for (size_t i = 0; i < k; ++i) z += weight(i);
  // Sorts the prefix [0, need) (the rest keeps following it in order), growing it 4x at a time.
  size_t sorted = 0;
  auto sort_to = [&](size_t need) {
    need = std::min(need, k);
    if (need <= sorted) return;
    std::partial_sort(scratch.begin() + sorted, scratch.begin() + need, scratch.end(), desc);
    sorted = need;
  };
  // Nucleus: the smallest prefix whose mass reaches top_p (all candidates when top_p = 1).
  size_t keep = k;
  double mass = z;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      if (i == sorted) sort_to(std::max<size_t>(256, 4 * sorted));
      cum += weight(i);
      if (cum / z >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    mass = keep == k ? z : cum;
  }
  // min_p: the candidates at least min_p times as likely as the top one (weight is that ratio),
  // a prefix of the order; it applies where it is tighter than the nucleus.
  if (p.min_p > 0.f) {
    size_t m = 0;
    double m_mass = 0;
    for (size_t i = 0; i < k; ++i)
      if (const double w = weight(i); w >= p.min_p) ++m, m_mass += w;
    if (m < keep) keep = m, mass = m_mass;
  }
  double u = rng.uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    if (i == sorted) sort_to(std::max<size_t>(256, 4 * sorted));
    u -= weight(i);
    if (u < 0) return {scratch[i].second, logprob(scratch[i].second)};
  }
  sort_to(keep);
  return {scratch[keep - 1].second, logprob(scratch[keep - 1].second)};
}

}  // namespace kvpr
