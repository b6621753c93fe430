#include "engine/chat_template.h"

#include <ctime>
#include <filesystem>

#include "engine/error.h"
#include "engine/json.h"

namespace kvpr {

bool known_chat_template(const std::string& name) {
  for (const char* n : {"plain", "opt", "llama-2", "mistral", "llama-3", "llama-3.1", "llama-3.2", "zephyr", "chatml", "qwen2", "qwen2.5"})
    if (name == n) return true;
  return false;
}

namespace {

// Jinja's trim: leading and trailing whitespace off.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string llama3_turn(const std::string& role, const std::string& content) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>";
}

// Today as Llama-3.2's template writes it with strftime_now("%d %b %Y"): "05 Mar 2025".
std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

}  // namespace

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
  if (name == "llama-2" || name == "mistral") {
    // Both have [INST] turns and no system turn: a system message opens the first user turn
    // (Llama-2 in <<SYS>> tags, Mistral followed by a blank line).
    std::string system;
    size_t i = 0;
    if (!messages.empty() && messages[0].role == "system") {
      system = messages[0].content;
      i = 1;
    }
    const bool llama = name == "llama-2";
    bool first = true;
    for (; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.role == "user") {
        std::string content = m.content;
        if (first && !system.empty())
          content = llama ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content : system + "\n\n" + content;
        // Llama-2: every turn opens with BOS (the first is the tokenizer's own) and is stripped.
        // Mistral-7B-Instruct: "[INST] {user} [/INST]{assistant}</s>" after the one BOS.
        if (llama) r.prompt += (first ? "" : "<s>") + std::string("[INST] ") + trim(content) + " [/INST]";
        else r.prompt += "[INST] " + content + " [/INST]";
        first = false;
      } else if (m.role == "assistant") {
        r.prompt += llama ? " " + trim(m.content) + " </s>" : m.content + "</s>";
      }
    }
    return r;
  }
  if (name == "zephyr") {
    // Zephyr's, which TinyLlama-Chat uses: "<|role|>\n{content}</s>\n" per message, then
    // "<|assistant|>\n" (as Hugging Face renders it with trim_blocks).
    for (const auto& m : messages) r.prompt += "<|" + m.role + "|>\n" + m.content + "</s>\n";
    r.prompt += "<|assistant|>\n";
    return r;
  }
  if (name == "chatml" || name == "qwen2" || name == "qwen2.5") {
    // ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then the assistant's
    // opening; its turn ends at <|im_end|>. Qwen2's and Qwen2.5's templates put their default
    // system message first when the conversation does not open with one.
    if (name != "chatml" && (messages.empty() || messages[0].role != "system"))
      r.prompt += std::string("<|im_start|>system\n") +
                  (name == "qwen2" ? "You are a helpful assistant."
                                   : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") +
                  "<|im_end|>\n";
    for (const auto& m : messages) r.prompt += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    r.prompt += "<|im_start|>assistant\n";
    r.stop_tokens = {"<|im_end|>"};
    r.stop = {"<|im_end|>"};  // where the tokenizer lacks it as a token, as text
    return r;
  }
  if (name == "llama-3" || name == "llama-3.1" || name == "llama-3.2") {
    // The BOS before the first header is the tokenizer's own; the model ends its turn with
    // <|eot_id|>, a special token (no text), so it is a stop token, not a stop string.
    size_t i = 0;
    if (name != "llama-3") {
      std::string system;
      if (!messages.empty() && messages[0].role == "system") {
        system = messages[0].content;
        i = 1;
      }
      const std::string date = name == "llama-3.1" ? "26 Jul 2024" : today();
      // Only the system message is trimmed, not the header lines before it.
      r.prompt += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " +
                  date + "\n\n" + trim(system) + "<|eot_id|>";
    }
    for (; i < messages.size(); ++i) r.prompt += llama3_turn(messages[i].role, messages[i].content);
    r.prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    r.stop_tokens = {"<|eot_id|>"};
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
  auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  if (has("[INST]") && has("<<SYS>>")) {
    *why = "tokenizer_config.json's chat_template is Llama-2's";
    return "llama-2";
  }
  if (has("[INST]")) {
    *why = "tokenizer_config.json's chat_template is Mistral's ([INST] without <<SYS>>)";
    return "mistral";
  }
  if (has("<|im_start|>") && has("<|im_end|>") && has("You are Qwen, created by Alibaba Cloud.")) {
    *why = "tokenizer_config.json's chat_template is Qwen2.5's (ChatML with its default system message)";
    return "qwen2.5";
  }
  if (has("<|im_start|>") && has("<|im_end|>") && has("You are a helpful assistant.")) {
    *why = "tokenizer_config.json's chat_template is Qwen2's (ChatML with a default system message)";
    return "qwen2";
  }
  if (has("<|im_start|>") && has("<|im_end|>")) {
    *why = "tokenizer_config.json's chat_template is ChatML";
    return "chatml";
  }
  if (has("<|user|>") && has("<|assistant|>")) {
    *why = "tokenizer_config.json's chat_template is Zephyr's (TinyLlama-Chat)";
    return "zephyr";
  }
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    if (!has("Cutting Knowledge Date")) {
      *why = "tokenizer_config.json's chat_template is Llama-3's";
      return "llama-3";
    }
    if (has("strftime_now")) {
      *why = "tokenizer_config.json's chat_template is Llama-3.2's (today's date in the system header)";
      return "llama-3.2";
    }
    *why = "tokenizer_config.json's chat_template is Llama-3.1's";
    return "llama-3.1";
  }
  *why = "tokenizer_config.json's chat_template is not one kvprd has built in";
  return "plain";
}

}  // namespace kvpr
