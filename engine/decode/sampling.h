// Token selection from logits: greedy, temperature, top-k, top-p, with a seeded generator
// so the same seed gives the same tokens on every machine.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend/argmax_lse.h"
#include "engine/base/rng.h"
#include "engine/contract/contract.h"

namespace kvpr {

// Throws kvpr::Error with a one-line message when a value is out of range.
void validate(const SamplingParams& p);

// logits (a copy the caller owns) adjusted by p's penalties for the `prompt` and `generated`
// tokens and its bias.
void adjust_logits(float* logits, int32_t valid, const SamplingParams& p, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& generated);

// The n most likely ids among [0, valid) (descending logit, ties to the lower id) with their
// log-probabilities logits[id] - lse. `scratch` is reused between calls.
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
