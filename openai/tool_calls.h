// Tool calls in a model's answer, as vLLM's tool parsers of the same names find them; the
// arguments are given back as Python's json.dumps writes them.
//   hermes (Qwen2.5, Qwen3 and other Hermes-style models): each call is a
//     <tool_call>{"name": ..., "arguments": ...}</tool_call> block (the last may be cut off before
//     its closing tag). The content is the text before the first block; the text between and
//     after blocks is dropped. When any block is not a JSON object with a string "name" and an
//     "arguments" value, nothing is a call and the whole answer is content.
//   llama3_json (Llama-3.1, 3.2): every JSON object in the answer that is not inside an earlier
//     one is a call {"name": ..., "parameters" (or "arguments"): ...}; several are written
//     separated by "; ". When any "{" does not open such an object, the whole answer is content.
//     The content is the text before the first object (vLLM drops it), less a <|python_tag|>.
//   mistral (Mistral-Nemo, Mistral v3 models): the text after "[TOOL_CALLS]" (a special token:
//     the caller writes it into the text where the model emitted it) is a JSON list of
//     {"name", "arguments"} (or one such object); the content is the text before it. When it is
//     not such JSON, the whole answer less the markers is content.
//   generic (any other model: kvprd describes the tools in a system message, openai/generic_tools.h,
//     asking for a JSON list of {"name", "parameters"} and nothing else): an answer that is, but
//     for surrounding whitespace and a ``` or ```json fence, such a list (or one such object;
//     "arguments" for "parameters" too) is the calls; anything else is all content.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvpr {

struct ToolCallText {
  std::string name;
  std::string arguments;  // JSON text
};

struct ToolCallParse {
  std::optional<std::string> content;  // nullopt: calls and no text before them
  std::vector<ToolCallText> calls;
};

// A whole answer at once.
ToolCallParse parse_hermes_tool_calls(std::string_view answer);
ToolCallParse parse_llama3_json_tool_calls(std::string_view answer);
ToolCallParse parse_mistral_tool_calls(std::string_view answer);
ToolCallParse parse_generic_tool_calls(std::string_view answer);
// By parser name (hermes, llama3_json, mistral or generic; throws for others).
ToolCallParse parse_tool_calls(std::string_view parser, std::string_view answer);

// The same, streamed: text before where a call may start ("<tool_call>"; "{"; for generic, only
// the answer's start) goes out as it comes (a tail that may be the start of the tag is held
// until decided); from there on
// everything is held and parsed at the end, so that the calls, or the text as content when
// they do not parse, are what parse_tool_calls gives for the whole answer.
class ToolCallStream {
 public:
  explicit ToolCallStream(std::string parser = "hermes");
  struct Delta {
    std::string content;
    std::vector<ToolCallText> calls;
  };
  Delta feed(std::string_view text);
  Delta finish();

 private:
  std::string parser_;
  std::string marker_;   // where calls may start
  std::string pending_;  // a tail that may be the start of the marker
  std::string held_;     // from the first marker on
  bool in_calls_ = false;
  bool emitted_ = false;  // some text went out
  bool plain_ = false;    // generic: the answer is not calls, so all of it is content
};

}  // namespace kvpr
