// The OpenAI API's responses, built from the engine's events (engine/contract/contract.h): a request's
// choices accumulate as their events arrive; then either the whole response (chat.completion
// or text_completion, with usage, logprobs, reasoning_content and tool_calls), or, streamed,
// each event's chunks (chat.completion.chunk deltas, text_completion pieces) with the state a
// stream keeps per choice (the role sent, the reasoning and tool-call text held back, the
// logprobs already sent).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/json.h"
#include "engine/text/tokenizer.h"
#include "openai/harmony.h"
#include "openai/ids.h"
#include "openai/request.h"
#include "openai/reasoning.h"
#include "openai/tool_calls.h"

namespace kvpr {

// One choice: the engine's events so far, and what a stream has sent of them.
struct ChoiceState {
  std::vector<int32_t> prompt;
  std::string echo_text;  // echo: the prompt's text, shown before the completion
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<int32_t, double>>> tops;  // per token, when asked for
  std::vector<double> prompt_logprobs;  // echo + logprobs: prompt tokens 1..P-1
  std::vector<std::vector<std::pair<int32_t, double>>> prompt_tops;
  std::string marked_text;  // the text with the request's markers where the model wrote them
  std::string finish;     // stop, length, cancelled, error
  int64_t cached_tokens = 0;  // of the prompt's, found in the worker's prefix cache
  bool done = false;
  // streaming
  bool sent_role = false;
  bool echo_sent = false;
  bool tool_call_sent = false;  // a named tool choice: its id and name went out
  ReasoningSplitter reasoning;  // with a reasoning parser
  ToolCallStream tool_stream;   // with tools
  HarmonyStream harmony;        // the harmony format's (gpt-oss)
  size_t calls_sent = 0;        // harmony: the calls streamed so far
  size_t lp_sent = 0;     // tokens whose logprobs went out
  int64_t lp_offset = 0;  // text offset of the next token (completions)
};

// One request's response: n choices for each prompt, in that order.
struct ResponseState {
  bool chat = false;
  Sampling sampling;
  ToolRequest tools;
  bool harmony = false;
  std::vector<std::pair<int32_t, std::string>> markers;  // GenerateRequest::markers
  std::string id;
  int64_t created = 0;
  std::string model;
  std::vector<ChoiceState> choices;
  std::string error;  // a choice failed: the whole response is this error
  // ... as the API answers it: a 400 naming the field when the engine refused the choice's
  // request (too large for its KV cache, a schema it cannot compile), else a 500.
  ApiError failure{500, "", "server_error", ""};
};

// The request's choices, before any event: n per prompt.
ResponseState start_response(const GenerateRequest& req, const Prompts& prompts, std::string id, int64_t created,
                             std::string model);

// What building a response needs beyond the state: token texts, whether <think> text is
// split off, and fresh tool-call ids (9 letters and digits for the chat templates that take
// only those: Mistral-Nemo's).
struct ResponseContext {
  const Tokenizer& tok;
  bool reasoning = false;
  IdMaker& ids;
  bool nine_alnum_tool_call_ids = false;
};

// Adds an event to choice i. Returns whether it ended the choice (the last event, or an error).
bool add_event(ResponseState& r, size_t i, const EngineEvent& ev);

// OpenAI's usage: a prompt counts once whatever its n, its cached tokens those of its choice
// that found the most in the prefix cache.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
Usage usage_of(const ResponseState& r);
json::Value usage_json(const Usage& u);

// The whole response (every choice done, no error).
json::Value response_json(const ResponseState& r, const ResponseContext& ctx);

// Streaming: the chunks event `ev` of choice i makes (after add_event), in order; an error
// event makes one error object.
std::vector<json::Value> stream_chunks(ResponseState& r, size_t i, const EngineEvent& ev, const ResponseContext& ctx);
// The last chunk of a stream with include_usage: no choices, the usage.
json::Value usage_chunk(const ResponseState& r);

}  // namespace kvpr
