// What the OpenAI layer's tests share: Qwen2.5's real tokenizer (tests/data/qwen2-tokenizer), a
// served model on its chat template, and engine events as a worker sends them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "engine/contract/contract.h"
#include "engine/text/tokenizer.h"
#include "openai/request.h"
#include "tests/test_util.h"

namespace kvpr::test {

inline const Tokenizer& qwen_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(data_path("qwen2-tokenizer"));
  return tok;
}

inline ServedModel qwen_served() {
  ServedModel s;
  s.name = "demo";
  s.max_model_len = 4096;
  s.vocab_size = qwen_tokenizer().size();
  s.chat_template = "qwen2.5";
  s.tool_call_parser = "hermes";
  return s;
}

inline EngineEvent token_event(int32_t token, std::string text, double logprob = -0.5) {
  EngineEvent ev;
  ev.token = token;
  ev.text = std::move(text);
  ev.logprob = logprob;
  return ev;
}

inline EngineEvent finish_event(std::string reason, int64_t cached = 0) {
  EngineEvent ev;
  ev.finish_reason = std::move(reason);
  ev.cached_tokens = cached;
  return ev;
}

}  // namespace kvpr::test
