// Token selection from logits: greedy, temperature, top-k, top-p, with a seeded generator
// so the same seed gives the same tokens on every machine.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend/argmax_lse.h"
#include "engine/base/rng.h"

namespace kvpr {

// repetition_penalty's range: wide enough for any use, narrow enough that a logit divided or
// multiplied by it stays finite in fp32.
constexpr double kMinRepetitionPenalty = 0.01, kMaxRepetitionPenalty = 100;

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;            // 0 = all
  float top_p = 1.f;        // 1 = all
  float min_p = 0.f;        // 0 = all; else only ids at least min_p times as likely as the most likely (vLLM's)
  std::optional<uint64_t> seed;
  // Logit adjustments, applied before the choice (greedy or sampled), in this order:
  // repetition_penalty (Hugging Face's and vLLM's): every id of the prompt or the output so far
  // has its logit divided by it where positive and multiplied where negative; then OpenAI's:
  // each generated token t lowers logits[t] by frequency_penalty per occurrence so far and
  // presence_penalty once; logit_bias adds its value to its id's logit. Reported
  // log-probabilities stay the model's own.
  float repetition_penalty = 1.f;  // in [kMinRepetitionPenalty, kMaxRepetitionPenalty]; 1 = off
  float presence_penalty = 0.f;    // [-2, 2]
  float frequency_penalty = 0.f;   // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias in [-100, 100])
  bool adjusts_logits() const {
    return repetition_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f || !logit_bias.empty();
  }
};

// Throws kvpr::Error with a one-line message when a value is out of range.
void validate(const SamplingParams& p);

// logits (a copy the caller owns) adjusted by p's penalties for the `prompt` and `generated`
// tokens and its bias.
void adjust_logits(float* logits, int32_t valid, const SamplingParams& p, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& generated);

// The n most likely ids among [0, valid) (descending logit, ties to the lower id) with their
// log-probabilities logits[id] - lse. `scratch` is reused between calls.
using TokenLogprob = std::pair<int32_t, float>;
std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t valid, int n, double lse,
                                       std::vector<std::pair<float, int32_t>>& scratch);

struct Sampled {
  int32_t token;
  float logprob;  // log-softmax of the raw logits at `token` (temperature 1)
};

// Picks a token among ids [0, valid) of `logits` (ids >= valid are never chosen).
// `scratch` is reused between calls.
Sampled sample_token(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                     std::vector<std::pair<float, int32_t>>& scratch);

// Speculative sampling of one row against a proposed `draft` id (a draft distribution that is a
// point mass, as prompt lookup proposes): the draft is accepted with its probability q(draft)
// under sample_token's distribution (temperature, top-k, top-p, min-p), else a token is drawn
// from that distribution without the draft, renormalised; either way the token is distributed
// exactly as sample_token's (Leviathan et al., 2023). Greedy params accept iff the draft is the
// argmax. The draws differ from sample_token's, so a seed gives other (equally likely) tokens.
struct Speculated {
  Sampled pick;
  bool accepted;
};
Speculated speculative_sample(const float* logits, int32_t valid, const SamplingParams& p, Rng& rng,
                              std::vector<std::pair<float, int32_t>>& scratch, int32_t draft);

}  // namespace kvpr
