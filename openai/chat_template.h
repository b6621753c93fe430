// Chat templates: turn OpenAI chat messages into one prompt. Built in, documented:
//   plain (also "opt"): "System: ...\n\nUser: ...\n\nAssistant: ...\n\n" ... "Assistant:"
//                       and "\n\nUser:" is added as a stop string so the model does not
//                       write the user's next turn.
//   llama-2:            "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..." (turns stripped)
//                       (the first <s> is the BOS the tokenizer adds, as apply_chat_template's
//                       text tokenized without special tokens gives it once)
//   mistral:            "[INST] {system}\n\n{user} [/INST]{assistant}</s>[INST] ..." (after the
//                       tokenizer's BOS; the system message, if any, opens the first user turn)
//   mistral-nemo:       "[INST]{user}[/INST]{assistant}</s>" (Mistral-Nemo's; no spaces, after the
//                       tokenizer's BOS), the system message opening the last user turn when that
//                       turn is the last message; tools in [AVAILABLE_TOOLS], calls in [TOOL_CALLS],
//                       results in [TOOL_RESULTS] as its template writes them (ids of 9 characters)
//   zephyr:             "<|system|>\n{system}</s>\n<|user|>\n{user}</s>\n<|assistant|>\n" (TinyLlama-Chat)
//   chatml:             "<|im_start|>{role}\n{content}<|im_end|>\n" ... "<|im_start|>assistant\n";
//                       <|im_end|> ends the turn
//   qwen3:              chatml; assistant turns after the last user message keep their reasoning
//                       as "<think>\n{reasoning}\n</think>\n\n{answer}", earlier ones only the
//                       answer (text after "</think>"); with enable_thinking false the assistant's
//                       opening is followed by an empty "<think>\n\n</think>\n\n"
//                       With tools (qwen2.5 and qwen3): a system turn "# Tools ... <tools>\n{tool as
//                       json.dumps}...</tools> ... <tool_call>...", after the system message (Qwen2.5:
//                       or its default one); assistant tool calls as "<tool_call>\n{"name": ...,
//                       "arguments": {...}}\n</tool_call>" blocks; consecutive tool messages as one
//                       user turn of "<tool_response>\n{content}\n</tool_response>" blocks
//   qwen2, qwen2.5:     chatml after a default system turn when the first message is not a system
//                       one ("You are a helpful assistant." / "You are Qwen, created by Alibaba
//                       Cloud. You are a helpful assistant.", as their templates write it); chatml
//                       with ChatOptions::default_system does the same with any message
//   gemma:              "<start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n" per message
//                       (a system message opening the first user turn), then
//                       "<start_of_turn>model\n"; <end_of_turn> is a stop token (Gemma 2, 3)
//   harmony:            gpt-oss's (openai/harmony.h): system and developer messages, tools as a
//                       TypeScript namespace, "<|start|>{role}<|message|>...<|end|>"; <|return|>
//                       and <|call|> end the answer
//   llama-3:            "<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>" per
//                       message, then "<|start_header_id|>assistant<|end_header_id|>\n\n" (BOS is the
//                       tokenizer's); <|eot_id|> is a stop token
//   llama-3.1/3.2:      the same after a system turn "Cutting Knowledge Date: December 2023\nToday
//                       Date: {date}\n\n{system message}" ({date}: 26 Jul 2024 for 3.1, today for 3.2,
//                       as their templates write it without builtin tools). With tools: "Environment:
//                       ipython\n" opens the system turn and the tools (json.dumps, indent 4) go into the
//                       first user message after an instruction to answer {"name", "parameters"}; a call
//                       is written as that JSON, a tool result as an "ipython" turn holding its
//                       content as a JSON string
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/json.h"

namespace kvpr {

// A call an assistant message made (OpenAI's tool_calls[i].function), with its arguments
// parsed from their JSON text, as vLLM hands them to a template.
struct ChatToolCall {
  std::string name;
  json::Value arguments;
  std::string id;  // the call's id (mistral-nemo writes it)
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;  // system, user, assistant, tool
  std::string content;  // a null content is ""
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::optional<std::string> reasoning;  // assistant: reasoning_content (qwen3 renders it instead of
                                         // splitting the content at </think>)
  std::string tool_call_id;              // tool: the call it answers (mistral-nemo writes it)
};

// What a template renders with besides the messages.
struct ChatOptions {
  bool enable_thinking = true;  // qwen3: false opens the answer with an empty think block (a request's
                                // chat_template_kwargs)
  std::string default_system;   // chatml: the system turn put first when the conversation has none
                                // (the model's template's, found by auto_chat_template)
  json::Object template_kwargs; // the request's chat_template_kwargs, all of them (a model's own template
                                // reads any; the built-in ones only enable_thinking)
  json::Array tools;            // the request's tools ({"type": "function", "function": {...}}),
                                // written into the system turn by templates that take tools
  json::Value response_format;  // harmony: response_format's json_schema ({name, description, schema}),
                                // written into the developer message as its "# Response Formats"
};

struct RenderedChat {
  std::string prompt;
  // Whether the tokenizer adds its special tokens (BOS) to the prompt: a built-in template's
  // text leaves them to it; a model's own template writes them itself (apply_chat_template then
  // tokenizes without them).
  bool add_special_tokens = true;
  std::vector<std::string> stop;  // stop strings the template implies
  std::vector<std::string> stop_tokens;  // special tokens that end the assistant's turn
};

// `name`: plain, opt, llama-2, mistral, zephyr, chatml, qwen2, qwen2.5, qwen3, llama-3, llama-3.1, llama-3.2 (auto
// resolves to the model family's template before this).
RenderedChat render_chat(const std::string& name, const std::vector<ChatMessage>& messages,
                         const ChatOptions& options = {});
bool known_chat_template(const std::string& name);
// Whether the template writes tools, assistant tool calls and tool results (qwen2.5 and qwen3:
// Hermes-style <tool_call> blocks; llama-3.1 and llama-3.2: JSON {"name", "parameters"}).
// render_chat refuses tools, tool calls and "tool" messages for the others.
bool chat_template_has_tools(const std::string& name);
// How the template's model writes a call, as the name of vLLM's parser for it: "hermes",
// "llama3_json", or "" for templates without tools.
std::string chat_tool_call_parser(const std::string& name);
std::string chat_template_names();  // "plain, opt, llama-2, ...": every name render_chat takes
// What "auto" means for the model in `model_dir`: llama-2 when its tokenizer_config.json has a
// chat_template written for Llama-2 chat (with [INST] and <<SYS>>), mistral for [INST] without
// <<SYS>>, qwen3 for <|im_start|> with enable_thinking, qwen2.5 / qwen2 for <|im_start|> with
// Qwen's default system message, chatml for other
// <|im_start|> ones, zephyr for <|user|> and <|assistant|>, llama-3/3.1/3.2 for Llama-3's
// headers (3.1 with its "Cutting Knowledge Date" system header, 3.2 when that takes today's date
// from strftime_now), else plain. `why` gets a few words on how it was decided. A ChatML
// template that opens with a system message of its own when the conversation has none
// (Qwen1.5's "You are a helpful assistant", Qwen2.5-Math's) gives chatml and that message in
// `default_system` (qwen2 and qwen2.5 are those of Qwen2 and Qwen2.5).
std::string auto_chat_template(const std::string& model_dir, std::string* why, std::string* default_system = nullptr);
// The model's own Jinja chat template of this name ("default", or one of the named list, e.g.
// "tool_use"): `<model_dir>/<name>.jinja` (chat_template.jinja for the default) when there is
// one, else tokenizer_config.json's chat_template (a string; or a list of {name, template}, whose
// first one stands in for a missing "default"); "" when there is none. *origin says where from.
std::string model_chat_template_text(const std::string& model_dir, const std::string& name, std::string* origin);
// Which built-in template a Jinja chat template's text writes (the names auto_chat_template
// returns), or "" when it is none of them; `why` a few words.
std::string chat_template_family(const std::string& jinja, std::string* why, std::string* default_system = nullptr);
// The stop strings and tokens the built-in template `name` implies (its prompt left empty).
RenderedChat chat_template_stops(const std::string& name);

}  // namespace kvpr
