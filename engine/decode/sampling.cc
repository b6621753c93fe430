#include "engine/decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/base/error.h"

namespace kvpr {

void validate(const SamplingParams& p) {
  KVPR_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f, "temperature must be >= 0, got ",
             p.temperature);
  KVPR_CHECK(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
  KVPR_CHECK(std::isfinite(p.top_p) && p.top_p > 0.f && p.top_p <= 1.f, "top_p must be in (0, 1], got ",
             p.top_p);
  KVPR_CHECK(std::isfinite(p.min_p) && p.min_p >= 0.f && p.min_p <= 1.f, "min_p must be in [0, 1], got ", p.min_p);
  KVPR_CHECK(p.repetition_penalty >= kMinRepetitionPenalty && p.repetition_penalty <= kMaxRepetitionPenalty,
             "repetition_penalty must be in [", kMinRepetitionPenalty, ", ", kMaxRepetitionPenalty, "], got ",
             p.repetition_penalty);
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

namespace {

// The distribution a sampled token is drawn from: the top-k candidates by logit (all ids when
// k = 0) in descending order, ties to the lower id, only as much of it sorted as a walk needs (a
// heavy head usually holds the mass, so a full vocabulary is not sorted per token); softmax
// weights at the temperature, relative to the row's maximum; kept: the nucleus (the smallest
// prefix whose mass reaches top_p) or, where tighter, the candidates at least min_p times as
// likely as the top one (a prefix of the order too).
class Candidates {
 public:
  Candidates(const float* logits, int32_t valid, const SamplingParams& p, float max,
             std::vector<std::pair<float, int32_t>>& scratch)
      : c_(scratch), inv_t_(1.0 / p.temperature), top_(max) {
    // Ids masked to -infinity (a JSON constraint's) weigh nothing: left out, so a constrained
    // row's draw costs its allowed ids, not the vocabulary.
    c_.clear();
    constexpr float kOff = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < valid; ++i)
      if (logits[i] > kOff) c_.emplace_back(logits[i], i);
    if (c_.empty())
      for (int32_t i = 0; i < valid; ++i) c_.emplace_back(logits[i], i);
    k_ = p.top_k > 0 ? std::min<size_t>(p.top_k, c_.size()) : c_.size();
    if (k_ < c_.size()) {
      std::nth_element(c_.begin(), c_.begin() + static_cast<std::ptrdiff_t>(k_), c_.end(), desc);
      c_.resize(k_);
    }
    double z = 0;  // sums every candidate (any order)
    for (size_t i = 0; i < k_; ++i) z += weight(i);
    keep_ = k_;
    mass_ = z;
    if (p.top_p < 1.f) {
      double cum = 0;
      for (size_t i = 0; i < k_; ++i) {
        if (i == sorted_) sort_to(std::max<size_t>(256, 4 * sorted_));
        cum += weight(i);
        if (cum / z >= p.top_p) {
          keep_ = i + 1;
          break;
        }
      }
      mass_ = keep_ == k_ ? z : cum;
    }
    if (p.min_p > 0.f) {
      size_t m = 0;
      double m_mass = 0;
      for (size_t i = 0; i < k_; ++i)
        if (const double w = weight(i); w >= p.min_p) ++m, m_mass += w;
      if (m < keep_) keep_ = m, mass_ = m_mass, min_p_cut_ = p.min_p;
    }
  }
  double mass() const { return mass_; }
  // The kept weight of `id`: 0 when it is not kept.
  double kept_weight(int32_t id) {
    size_t at = k_;
    for (size_t i = 0; i < k_; ++i)
      if (c_[i].second == id) at = i;
    if (at == k_) return 0;  // not among the top-k
    const double w = weight(at);
    if (keep_ == k_) return w;
    if (min_p_cut_ > 0) return w >= min_p_cut_ ? w : 0;
    const std::pair<float, int32_t> mine = c_[at];
    sort_to(keep_);  // the nucleus is the first keep_ of the order (sorting moves the candidates)
    return desc(c_[keep_ - 1], mine) ? 0 : w;
  }
  // Walks the kept candidates in order, taking u (in [0, mass)) down by each weight, `skip`
  // left out; the id where it falls below 0 (the last kept one, for rounding).
  int32_t draw(double u, int32_t skip = -1) {
    int32_t last = -1;
    for (size_t i = 0; i < keep_; ++i) {
      if (i == sorted_ && i > 0 && keep_ == k_ && k_ - i > 4096) return select(i, u, skip, last);
      if (i == sorted_) sort_to(std::max<size_t>(256, 4 * sorted_));
      if (c_[i].second == skip) continue;
      last = c_[i].second;
      u -= weight(i);
      if (u < 0) return last;
    }
    return last;
  }

 private:
  static bool desc(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
  double weight(size_t i) const { return std::exp((static_cast<double>(c_[i].first) - top_) * inv_t_); }
  // draw's walk past the sorted prefix when every candidate is kept (a flat distribution walks
  // deep): the same id, found by selection instead of sorting what is left. The range left is
  // split around a pivot: the candidates before it in the order, the pivot, those after it. u
  // falls among the first (whose weights it sums), or on the pivot, or goes on after it taken
  // down by both; a short range is sorted and walked. `last`: the last id walked so far.
  int32_t select(size_t from, double u, int32_t skip, int32_t last) {
    size_t lo = from, hi = k_;
    uint64_t pick = 0x9e3779b97f4a7c15ull;  // (pivots: any choice gives the same id, up to rounding)
    while (hi - lo > 256) {
      pick = pick * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(c_[lo + (pick >> 33) % (hi - lo)], c_[hi - 1]);
      const std::pair<float, int32_t> pivot = c_[hi - 1];
      const auto mid = std::partition(c_.begin() + static_cast<std::ptrdiff_t>(lo),
                                      c_.begin() + static_cast<std::ptrdiff_t>(hi - 1),
                                      [&](const std::pair<float, int32_t>& x) { return desc(x, pivot); });
      const size_t m = static_cast<size_t>(mid - c_.begin());
      std::swap(c_[m], c_[hi - 1]);  // the pivot between the two
      double before = 0;
      size_t latest = m;  // the last of [lo, m) in the order, skip aside
      for (size_t i = lo; i < m; ++i) {
        if (c_[i].second == skip) continue;
        before += weight(i);
        if (latest == m || desc(c_[latest], c_[i])) latest = i;
      }
      if (u < before) {
        hi = m;
        continue;
      }
      u -= before;
      if (latest != m) last = c_[latest].second;
      if (pivot.second != skip) {
        last = pivot.second;
        u -= weight(m);
        if (u < 0) return last;
      }
      lo = m + 1;
    }
    std::sort(c_.begin() + static_cast<std::ptrdiff_t>(lo), c_.begin() + static_cast<std::ptrdiff_t>(hi), desc);
    for (size_t i = lo; i < hi; ++i) {
      if (c_[i].second == skip) continue;
      last = c_[i].second;
      u -= weight(i);
      if (u < 0) return last;
    }
    return last;
  }
  // Sorts the prefix [0, need) (the rest keeps following it in order).
  void sort_to(size_t need) {
    need = std::min(need, k_);
    if (need <= sorted_) return;
    std::partial_sort(c_.begin() + static_cast<std::ptrdiff_t>(sorted_), c_.begin() + static_cast<std::ptrdiff_t>(need),
                      c_.end(), desc);
    sorted_ = need;
  }
  std::vector<std::pair<float, int32_t>>& c_;
  double inv_t_, top_;
  size_t k_ = 0, keep_ = 0, sorted_ = 0;
  double mass_ = 0, min_p_cut_ = 0;
};

}  // namespace

Sampled sample_token(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  // log-sum-exp of the raw logits for the reported log-probability.
  const RowStats st = row_argmax_lse(logits, valid);
  auto logprob = [&](int32_t t) { return static_cast<float>(logits[t] - st.lse); };
  if (p.temperature == 0.f || p.top_k == 1) return {st.token, logprob(st.token)};
  Candidates c(logits, valid, p, st.max, scratch);
  const int32_t t = c.draw(rng.uniform() * c.mass());
  return {t, logprob(t)};
}

Speculated speculative_sample(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                              std::vector<std::pair<float, int32_t>>& scratch, int32_t draft) {
  const RowStats st = row_argmax_lse(logits, valid);
  auto logprob = [&](int32_t t) { return static_cast<float>(logits[t] - st.lse); };
  if (p.temperature == 0.f || p.top_k == 1) return {{st.token, logprob(st.token)}, st.token == draft};
  Candidates c(logits, valid, p, st.max, scratch);
  const double w = draft >= 0 && draft < valid ? c.kept_weight(draft) : 0.0;
  if (w > 0 && rng.uniform() * c.mass() < w) return {{draft, logprob(draft)}, true};
  // Rejected: a draw from the distribution without the draft.
  const int32_t t = c.draw(rng.uniform() * (c.mass() - w), w > 0 ? draft : -1);
  return {{t, logprob(t)}, false};
}

}  // namespace kvpr
