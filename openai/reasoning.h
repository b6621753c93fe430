// A thinking model's output split into its reasoning and its answer, as vLLM's qwen3
// reasoning parser splits it: text that opens with "<think>" is reasoning up to "</think>" and
// the answer after it; text that does not open with "<think>" is all answer (Qwen3 with
// enable_thinking false). The tags themselves belong to neither.
#pragma once

#include <string>
#include <string_view>

namespace kvpr {

class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  // Streaming: each delta's share of reasoning and answer. Text that may still turn out to be
  // a tag ("<thi" at the start, "</th" inside the reasoning) is held until it is decided.
  Parts feed(std::string_view delta);
  // End of the output: what is still held goes out as what it turned out to be.
  Parts finish();
  // A whole output at once.
  static Parts split(std::string_view text);
  bool in_reasoning() const { return state_ == State::Reasoning; }

 private:
  enum class State { Start, Reasoning, Content };
  State state_ = State::Start;
  std::string held_;
};

}  // namespace kvpr
