// The engine's contract with its front ends (kvprd through the worker protocol, the kvpr CLI,
// kvpr-bench): what a request asks for, what the engine answers as it runs, and how it refuses
// one. Plain values on top of engine/base only, so the controller, which never links the engine,
// speaks it too (docs/design.md §5). worker/protocol.h is its one encoding on the wire.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/json.h"

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

// An id and its log-probability: a chosen token's alternatives, a prompt token's score.
using TokenLogprob = std::pair<int32_t, float>;

// What a request asks of the engine beyond its prompt: sampling, limits, stops, logprobs and a
// constraint on the text.
struct GenerationParams {
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings; the text ends before the first match
  bool ignore_eos = false;
  // vLLM's min_tokens: before this many tokens, EOS and the stop ids are masked out of the choice
  // and stop strings are not matched, so the sequence ends no earlier (max_new_tokens, the
  // context, a JSON text with nothing allowed after it, and cancellation still end it).
  int min_new_tokens = 0;
  // Ids that end the sequence when sampled (finish reason stop), whatever ignore_eos says; the
  // id is kept in the tokens and adds no text.
  std::vector<int32_t> stop_token_ids;
  int top_logprobs = 0;           // alternatives reported per generated token (0..20)
  // >= 0: also the log-probability of every prompt token after the first, with this many
  // alternatives each (0..20). With max_new_tokens = 0 the prompt is only scored.
  int prompt_logprobs = -1;
  // The text must be one JSON object (OpenAI's response_format json_object): each token is
  // chosen among those that continue it (engine/constrain/json_object.h), and EOS or a stop id only once
  // it is complete; a complete object that nothing may follow ends the sequence (stop).
  bool json_object = false;
  // The text must be valid against this JSON Schema (response_format json_schema, forced tool
  // calls; null: none): the same masking, by the schema's recognizer (engine/constrain/json_schema.h).
  // It travels as the request gave it and is compiled once, by the engine that runs it (a
  // compiled recognizer is the engine's own data, which the controller neither builds nor links;
  // a schema is checked where it is used, not first in the controller and again in the engine);
  // a schema it cannot compile is refused as part "json_schema".
  json::Value json_schema;
  // The constraint above holds from the token after the generated ids first contain these, in
  // order (gpt-oss's "<|channel|>final<|message|>": its answer, after the reasoning); before them
  // the text is free, but the end ids are held back until the constrained text is complete.
  // Empty: from the first token.
  std::vector<int32_t> constrain_after;
};

// Why a sequence ended. Error: this sequence alone failed (its constraint, sampling, detokenizing
// or stop matching threw), and the rest of the batch goes on.
enum class FinishReason { None, Stop, Length, Cancelled, Error };
// "stop", "length", "cancelled", "error" (as OpenAI's finish_reason where it has one).
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

// One request: its front end's id, its prompt, what it asks for.
struct EngineRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  GenerationParams params;
};

// One event of a request: new text and its token, the end, or an error.
struct EngineEvent {
  int32_t token = -1;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // most likely ids at this position (top_logprobs)
  std::vector<double> prompt_logprobs;         // first event when the prompt is scored
  std::vector<std::vector<std::pair<int32_t, double>>> prompt_top;
  std::string text;
  std::string finish_reason;  // set on the last event: finish_reason_name's
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the engine's prefix cache
  std::string error;          // set when the request failed
  bool refused = false;       // with error: the engine refused the request (a client's error)
  std::string refused_part;   // with refused: the part of the request at fault, when one is ("json_schema")
};

// The engine refuses a request (a client's error, not a fault): why, and which part of it, for
// a front end to name the field it came from.
class RequestRefused : public Error {
 public:
  RequestRefused(std::string part, const std::string& why) : Error(why), part_(std::move(part)) {}
  const std::string& part() const { return part_; }

 private:
  std::string part_;
};

// [[id, logprob], ...]: how the worker protocol and the CLI's JSON carry alternatives.
template <class T>
json::Value logprob_pairs_json(const std::vector<std::pair<int32_t, T>>& v) {
  json::Array a;
  for (const auto& [id, lp] : v) a.push_back(json::Array{static_cast<int64_t>(id), static_cast<double>(lp)});
  return a;
}

}  // namespace kvpr
