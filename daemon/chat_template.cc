#include "daemon/chat_template.h"

#include <filesystem>

#include "engine/error.h"
#include "engine/json.h"

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
        // Every turn opens with BOS; the first one is the tokenizer's own.
        r.prompt += (first ? "" : "<s>") + std::string("[INST] ") + content + " [/INST]";
        first = false;
      } else if (m.role == "assistant") {
        r.prompt += " " + m.content + " </s>";
      }
    }
    return r;
  }
  KVPR_THROW("unknown chat template '", name, "'");
}

std::string auto_chat_template(const std::string& model_dir, std::string* why) {
  const std::string path = model_dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    *why = "no tokenizer_config.json";
    return "plain";
  }
  const json::Value cfg = json::parse_file(path);
  const json::Value* t = cfg.find("chat_template");
  std::string jinja;
  if (t && t->is_string()) {
    jinja = t->as_string();
  } else if (t && t->is_array()) {  // named templates: [{"name": "default", "template": "..."}, ...]
    for (const auto& e : t->as_array()) {
      const json::Value* name = e.find("name");
      const json::Value* body = e.find("template");
      if (body && body->is_string() && (jinja.empty() || (name && name->is_string() && name->as_string() == "default")))
        jinja = body->as_string();
    }
  }
  if (jinja.empty()) {
    *why = "tokenizer_config.json has no chat_template";
    return "plain";
  }
  if (jinja.find("[INST]") != std::string::npos && jinja.find("<<SYS>>") != std::string::npos) {
    *why = "tokenizer_config.json's chat_template is Llama-2's";
    return "llama-2";
  }
  *why = "tokenizer_config.json's chat_template is not one kvprd has built in";
  return "plain";
}

}  // namespace kvpr
