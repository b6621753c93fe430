// Tool calls in a model's answer, as vLLM's `hermes` tool parser finds them (Qwen2.5, Qwen3 and
// other Hermes-style models): each call is a <tool_call>{"name": ..., "arguments": ...}</tool_call>
// block (the last may be cut off before its closing tag). The answer's content is the text
// before the first block; the text between and after blocks is dropped. When any block is not
// a JSON object with a string "name" and an "arguments" value, nothing is a call and the whole
// answer is content. Arguments are given back as Python's json.dumps writes them.
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

// The same, streamed: text before the first "<tool_call>" goes out as it comes (a tail that may
// be the start of the tag is held until decided); from the tag on everything is held and
// parsed at the end, so that the calls, or the text as content when a block does not parse, are
// what parse_hermes_tool_calls gives for the whole answer.
class HermesToolStream {
 public:
  struct Delta {
    std::string content;
    std::vector<ToolCallText> calls;
  };
  Delta feed(std::string_view text);
  Delta finish();

 private:
  std::string pending_;  // a tail that may be the start of the tag
  std::string held_;     // from the first tag on
  bool in_calls_ = false;
};

}  // namespace kvpr
