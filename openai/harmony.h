// gpt-oss's answers in OpenAI's harmony format, split into the API's fields as vLLM serves them.
//
// After the prompt's "<|start|>assistant" the model writes messages, each a header, then
// <|message|>, the body, and an end: <|end|> (more follows: <|start|>assistant ...), <|call|> (a
// tool call: generation stops) or <|return|> (the last message: generation stops). The header
// names the channel, "<|channel|>analysis", "<|channel|>commentary" or "<|channel|>final", and,
// for a tool call, the recipient "to=functions.NAME" (before or after the channel), optionally
// with a content type ("json", "<|constrain|>json"). The worker's text leaves special tokens out,
// so the caller writes their text where the model emitted them (GenerateRequest::markers).
//   analysis                          -> reasoning_content
//   final, and commentary to no one   -> content (commentary without a recipient is a preamble
//                                        the model shows the user before its calls)
//   commentary to=functions.NAME      -> a tool call NAME whose arguments are the body
// Text before any header (a model that did not follow the format) is content. A message cut off
// (max_tokens) counts as what it was: a cut-off call is still a call, its arguments as written.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "openai/tool_calls.h"

namespace kvpr {

// The harmony format's special tokens, whose text the parser reads.
const std::vector<std::string>& harmony_special_tokens();

class HarmonyStream {
 public:
  // answer_only: content is the final channel's alone (a constrained answer, whose final
  // message is the JSON); a preamble (commentary to no one) goes to reasoning then.
  explicit HarmonyStream(bool answer_only = false) : answer_only_(answer_only) {}
  struct Delta {
    std::string reasoning, content;
    std::vector<ToolCallText> calls;
  };
  // Streaming: reasoning and content as they come (a tail that may be the start of a special
  // token's text held until decided), each call when its message ends.
  Delta feed(std::string_view text);
  // End of the output: what is held, and the message in progress.
  Delta finish();
  // A whole answer at once.
  static Delta parse(std::string_view text, bool answer_only = false);

 private:
  void close_message(Delta& out);
  void route(Delta& out, const std::string& body);
  enum class State { Body, Header };
  // The answer opens inside the first message's header (the prompt wrote "<|start|>assistant"):
  // "<|channel|>final", or " to=functions.NAME<|channel|>commentary json".
  State state_ = State::Header;
  bool opened_ = false;        // a message has begun (<|message|>)
  std::string raw_;            // until then, the answer as written: its content if none begins
  std::string header_;         // the header so far
  std::string channel_, recipient_;
  std::string body_;           // a call's arguments, held whole
  std::string pending_;        // a tail that may be a special token's start
  bool answer_only_ = false;
};

}  // namespace kvpr
