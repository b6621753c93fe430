// The ids of responses and tool calls, as OpenAI and vLLM make them: a prefix and 24 hex digits
// (chatcmpl-..., cmpl-..., chatcmpl-tool-...), or for chat templates that take only ids of 9
// letters and digits (Mistral-Nemo's), 9 of them.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace kvpr {

class IdMaker {
 public:
  std::string id(const char* prefix);
  // A tool call's: "chatcmpl-tool-<hex>", or 9 letters and digits when `nine_alnum`.
  std::string tool_call_id(bool nine_alnum);

 private:
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace kvpr
