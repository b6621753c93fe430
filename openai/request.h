// The OpenAI API's requests as typed values (as vLLM's protocol.py): a body is parsed once
// (json::parse_strict), every field is checked once, and each problem is a 400 naming its
// field. Then a generation request's prompts are made (the chat rendered with the model's
// template, or the completion's texts encoded) and checked against the context, and its
// sampling fields translated, in one place, into the engine's generation parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/base/json.h"
#include "engine/contract/contract.h"
#include "openai/generation_config.h"
#include "engine/text/tokenizer.h"
#include "openai/api_error.h"
#include "openai/chat_template.h"
#include "openai/model_chat_template.h"

namespace kvpr {

// What kvprd serves, as decided at start from the model and the flags.
struct ServedModel {
  std::string name;           // --served-model-name: what requests' "model" must say
  int64_t max_model_len = 0;  // context: prompt + max_tokens
  int64_t vocab_size = 0;     // the model's: prompt ids at or beyond it cannot be embedded
  std::string chat_template;  // a name of render_chat's: the family whose stops and tool calls apply
  std::string default_system; // chatml: the template's own system message, if any
  // The model's own template (or --chat-template FILE.jinja), which prompts are rendered with;
  // null: the built-in chat_template renders them.
  std::shared_ptr<const ModelChatTemplate> model_template;
  SamplingDefaults defaults;  // generation_config.json's, for fields a request leaves out
  std::string tool_call_parser = "none";  // none, hermes, llama3_json, mistral, harmony or generic (auto resolved)
  bool reasoning = false;     // --reasoning-parser: <think> text goes to reasoning_content
};

// A request's sampling and output fields; those it leaves out take generation_config.json's
// where set, else OpenAI's defaults.
struct Sampling {
  // Completions' default is OpenAI's 16; a chat's (and a response's) is the rest of the context,
  // as OpenAI's and vLLM's (make_prompts sets it once the prompt's length is known).
  int64_t max_tokens = 16;
  bool max_tokens_given = false;
  int64_t min_tokens = 0;  // vLLM's extension: no end before this many tokens
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0;  // vLLM's extension
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;  // vLLM's extension; chat templates add their end-of-turn id
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int64_t top_logprobs = 0;  // alternatives per token: completions' logprobs=k, chat's top_logprobs
  double repetition_penalty = 1;  // vLLM's extension
  double presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int64_t, double>> logit_bias;
  bool echo = false;
  bool ignore_eos = false;
  bool json_object = false;  // response_format json_object (without a schema)
  // response_format json_schema's schema, or json_object's "schema" (llama.cpp's and Together's
  // form); the engine compiles it, or refuses it.
  json::Value json_schema;
};

// What a chat request asks of tools: the tools written into the prompt, and whether the answer
// is searched for calls. tool_choice "none" (or no tools) leaves both out; "auto" (the default
// with tools) needs a tool-call parser; "required" and a named function constrain the answer to
// the tools' schemas.
struct ToolRequest {
  json::Array tools;
  // The model's template writes no tools: they are described in a system message and the
  // conversation's calls and results written as text (openai/generic_tools.h).
  bool generic = false;
  bool parse = false;
  std::string parser;   // hermes, llama3_json, mistral, harmony or generic, when parse
  bool parallel = true;
  // tool_choice "required" or naming a function: the answer is constrained to `schema` (a list
  // of {"name", "parameters"} calls, or the named function's arguments) and is the calls.
  bool required = false;
  std::string named;
  json::Value schema;
};

// POST /v1/completions or /v1/chat/completions, parsed.
struct GenerateRequest {
  bool chat = false;
  Sampling sampling;
  // chat
  std::vector<ChatMessage> messages;
  ChatOptions chat_options;  // tools, enable_thinking, the template's default system message
  ToolRequest tools;
  // The answer is in gpt-oss's harmony format (openai/harmony.h): reasoning, content and calls
  // come from its channels.
  bool harmony = false;
  // harmony: the ids of "<|channel|>final<|message|>", after which its answer (the final channel's
  // message) begins: a response_format constrains that message alone
  // (GenerationParams::constrain_after).
  std::vector<int32_t> final_header;
  // harmony with a forced call (tool_choice required or named): the assistant message the prompt
  // opens, whose body the answer is (then constrained from its first token, and read as the
  // arguments or the list of calls, as other templates' forced calls are): the named function's
  // commentary call, or a final message holding the list.
  std::string answer_opening;
  // Special tokens the worker's text leaves out that the answer's parsers read, with their text
  // (mistral's [TOOL_CALLS], harmony's): written into the text where the model emitted them.
  std::vector<std::pair<int32_t, std::string>> markers;
  // completions: the prompts as texts, or as token ids (then prompt_texts is empty)
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;
};

// A generation request's prompts as the engine takes them.
struct Prompts {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> texts;  // what echo shows: the text, or the ids decoded
};

// The body as a JSON object, or a 400 (also past kMaxRequestDepth levels of nesting).
constexpr int kMaxRequestDepth = 64;
json::Value parse_body(std::string_view body);
// The request's "model" is the served one, else a 400 (missing, not a string) or a 404.
void check_model(const json::Value& body, const ServedModel& served);

GenerateRequest parse_generate_request(const json::Value& body, bool chat, const ServedModel& served,
                                       const Tokenizer& tok);
// The chat rendered (its stop strings and end-of-turn ids added to the request's) or the texts
// encoded; each prompt checked: not empty, within the model's vocabulary and context.
Prompts make_prompts(GenerateRequest& req, const ServedModel& served, const Tokenizer& tok);
// The one translation of a request's fields into the engine's: choice `index` (of n) as a
// worker's generate message, its id and prompt left for the caller. Its seed is the request's
// + index, so each choice has its own stream of random numbers.
EngineRequest engine_request(const GenerateRequest& req, const Tokenizer& tok, int64_t index);
// The engine refused a choice's request: a 400 naming the field of `req` that part came from
// (its JSON Schema: the response_format's, or the tools' for a forced tool call).
ApiError refusal_error(const ToolRequest& tools, const EngineEvent& refused);

// POST /tokenize and /detokenize.
struct TokenizeRequest {
  std::string text;
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(const json::Value& body);
// The ids of a prompt; a text the tokenizer cannot split (a pattern past its matching budget)
// is a 400 naming `param`.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, bool add_special, const std::string& param);
std::vector<int32_t> parse_detokenize_request(const json::Value& body, const Tokenizer& tok);

}  // namespace kvpr
