#include "daemon/chat_template.h"

#include "engine/error.h"

namespace kvpr {

bool known_chat_template(const std::string& name) { return name == "plain" || name == "opt" || name == "llama-2"; }

RenderedChat render_chat(const std::string& name, const std::vector<ChatMessage>& messages) {
  RenderedChat r;
  if (name == "plain" || name == "opt") {
    for (const auto& m : messages) {
      std::string who = m.role == "system" ? "System" : m.role == "assistant" ? "Assistant" : "User";
      r.prompt += who + ": " + m.content + "\n\n";
    }
    r.prompt += "Assistant:";
    r.stop = {"\n\nUser:"};
    return r;
  }
  if (name == "llama-2") {
    std::string system;
    size_t i = 0;
    if (!messages.empty() && messages[0].role == "system") {
      system = messages[0].content;
      i = 1;
    }
    bool first = true;
    for (; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.role == "user") {
        std::string content = m.content;
        if (first && !system.empty()) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
        r.prompt += "<s>[INST] " + content + " [/INST]";
        first = false;
      } else if (m.role == "assistant") {
        r.prompt += " " + m.content + " </s>";
      }
    }
    return r;
  }
  KVPR_THROW("unknown chat template '", name, "'");
}

}  // namespace kvpr
