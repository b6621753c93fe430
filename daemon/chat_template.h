// Chat templates: turn OpenAI chat messages into one prompt. Built in, documented:
//   plain (also "opt"): "System: ...\n\nUser: ...\n\nAssistant: ...\n\n" ... "Assistant:"
//                       and "\n\nUser:" is added as a stop string so the model does not
//                       write the user's next turn.
//   llama-2:            "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>..."
#pragma once

#include <string>
#include <vector>

namespace kvpr {

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

struct RenderedChat {
  std::string prompt;
  std::vector<std::string> stop;  // stop strings the template implies
};

// `name`: plain, opt, llama-2 (auto resolves to the model family's template before this).
RenderedChat render_chat(const std::string& name, const std::vector<ChatMessage>& messages);
bool known_chat_template(const std::string& name);

}  // namespace kvpr
