#include "openai/chat_template.h"

#include <algorithm>
#include <ctime>
#include <optional>
#include <filesystem>
#include <fstream>

#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

namespace {

constexpr const char* kTemplateNames[] = {"plain",   "opt",     "llama-2", "mistral",   "mistral-nemo", "zephyr",
                                          "chatml",  "qwen2",   "qwen2.5", "qwen3",     "llama-3",      "llama-3.1",
                                          "llama-3.2", "gemma",   "harmony"};

const std::string kQwen2System = "You are a helpful assistant.";
const std::string kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The system message a ChatML template writes itself: a string literal
// '<|im_start|>system\n{text}<|im_end|>' (newline written as \n or as itself) whose text is
// plain (no quote, no Jinja); "" when it has none.
std::string chatml_default_system(const std::string& jinja) {
  const std::string open = "<|im_start|>system";
  for (size_t at = jinja.find(open); at != std::string::npos; at = jinja.find(open, at + 1)) {
    size_t b = at + open.size();
    if (jinja.compare(b, 2, "\\n") == 0) b += 2;
    else if (b < jinja.size() && jinja[b] == '\n') b += 1;
    else continue;
    const size_t e = jinja.find("<|im_end|>", b);
    if (e == std::string::npos) break;
    const std::string text = jinja.substr(b, e - b);
    if (!text.empty() && text.find_first_of("'\"{}+\\\n") == std::string::npos) return text;
  }
  return "";
}

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

// Today as strftime_now gives it: Llama-3.2's "%d %b %Y" ("05 Mar 2025"), or gpt-oss's "%Y-%m-%d".
std::string today(bool iso = false) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  if (iso) std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  else std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

// One ChatML message, and the opening of the assistant's answer with its end-of-turn stops.
std::string chatml_turn(const std::string& role, const std::string& content) {
  return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}
void open_chatml_answer(RenderedChat* r) {
  r->prompt += "<|im_start|>assistant\n";
  r->stop_tokens = {"<|im_end|>"};
  r->stop = {"<|im_end|>"};  // where the tokenizer lacks it as a token, as text
}

// Python's str.strip/lstrip/rstrip of newlines, as Qwen3's template uses them.
std::string strip_newlines(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && s[b] == '\n') ++b;
  while (right && e > b && s[e - 1] == '\n') --e;
  return s.substr(b, e - b);
}

// Qwen2.5's and Qwen3's tool section of the system turn: every tool as tojson (Python's
// json.dumps) on its own line between <tools> tags, then the format of a call.
std::string tools_section(const json::Array& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
      "function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& t : tools) out += "\n" + t.dump_python();
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>";
  return out;
}

std::string tool_call_block(const ChatToolCall& c) {
  // The name goes in as text (the templates concatenate it), the arguments through tojson.
  return "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + c.arguments.dump_python() + "}\n</tool_call>";
}

// A tool message: consecutive ones share one user turn of <tool_response> blocks.
void tool_response(const std::vector<ChatMessage>& messages, size_t i, RenderedChat* r) {
  if (i == 0 || messages[i - 1].role != "tool") r->prompt += "<|im_start|>user";
  r->prompt += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") r->prompt += "<|im_end|>\n";
}

// Qwen2.5's: ChatML after its default system turn, with Hermes-style tools.
void render_qwen25(const std::string& preset, const std::vector<ChatMessage>& messages, const ChatOptions& options,
                   RenderedChat* r) {
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!options.tools.empty())
    r->prompt += "<|im_start|>system\n" + (system_first ? messages[0].content : preset) + "\n\n" +
                 tools_section(options.tools) + "<|im_end|>\n";
  else if (!system_first)
    r->prompt += chatml_turn("system", preset);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" && i == 0 && !options.tools.empty()) continue;  // written with the tools
    if (m.role == "tool") {
      tool_response(messages, i, r);
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      r->prompt += "<|im_start|>assistant";
      if (!m.content.empty()) r->prompt += "\n" + m.content;
      for (const auto& c : m.tool_calls) r->prompt += "\n" + tool_call_block(c);
      r->prompt += "<|im_end|>\n";
    } else {
      r->prompt += chatml_turn(m.role, m.content);
    }
  }
  open_chatml_answer(r);
}

// Mistral-Nemo's (and Mistral's later v3 templates): "[INST]{user}[/INST]{assistant}</s>" with no
// spaces; the system message opens the last user turn, and only when that turn is the last
// message; tools go in an [AVAILABLE_TOOLS] block before the last user turn (the function's
// string fields written raw, the others as tojson), calls as "[TOOL_CALLS][{function as tojson,
// less its closing brace}, "id": "<9 characters>"}, ...]</s>", results as
// [TOOL_RESULTS]{"content": <content as text>, "call_id": "..."}[/TOOL_RESULTS].
void render_mistral_nemo(const std::vector<ChatMessage>& messages, const ChatOptions& options, RenderedChat* r) {
  size_t i = 0;
  std::optional<std::string> system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    i = 1;
  }
  const ChatMessage* last_user = nullptr;
  for (size_t j = i; j < messages.size(); ++j)
    if (messages[j].role == "user") last_user = &messages[j];
  auto check_id = [](const std::string& id) {
    KVPR_CHECK(id.size() == 9, "the chat template 'mistral-nemo' needs tool call ids of 9 characters, got '", id, "'");
  };
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      // (the template compares messages by value: a user turn equal to the last one gets the tools too)
      if (!options.tools.empty() && m.content == last_user->content) {
        r->prompt += "[AVAILABLE_TOOLS][";
        for (size_t t = 0; t < options.tools.size(); ++t) {
          r->prompt += "{\"type\": \"function\", \"function\": {";
          bool first = true;
          for (const auto& [k, v] : options.tools[t].find("function")->as_object()) {
            if (k == "return") continue;
            r->prompt += (first ? "\"" : ", \"") + k + "\": " + (v.is_string() ? "\"" + v.as_string() + "\"" : v.dump_python());
            first = false;
          }
          r->prompt += t + 1 < options.tools.size() ? "}}, " : "}}]";
        }
        r->prompt += "[/AVAILABLE_TOOLS]";
      }
      const bool last = i + 1 == messages.size();
      r->prompt += "[INST]" + (last && system ? *system + "\n\n" : std::string()) + m.content + "[/INST]";
    } else if (!m.tool_calls.empty()) {
      r->prompt += "[TOOL_CALLS][";
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        const ChatToolCall& call = m.tool_calls[c];
        check_id(call.id);
        const std::string fn =
            json::Value(json::Object{{"name", json::Value(call.name)}, {"arguments", call.arguments}}).dump_python();
        r->prompt += fn.substr(0, fn.size() - 1) + ", \"id\": \"" + call.id + "\"}" +
                     (c + 1 < m.tool_calls.size() ? ", " : "]</s>");
      }
    } else if (m.role == "assistant") {
      r->prompt += m.content + "</s>";
    } else if (m.role == "tool") {
      check_id(m.tool_call_id);
      r->prompt += "[TOOL_RESULTS]{\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id + "\"}[/TOOL_RESULTS]";
    } else {
      KVPR_THROW("the chat template 'mistral-nemo' takes a system message only first");
    }
  }
}

// Qwen3's: ChatML whose assistant turns split "<think>reasoning</think>answer". Reasoning is
// kept only after the last user message (the turns of the exchange in progress).
void render_qwen3(const std::vector<ChatMessage>& messages, const ChatOptions& options, RenderedChat* r) {
  size_t i = 0;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!options.tools.empty())
    r->prompt += "<|im_start|>system\n" + (system_first ? messages[0].content + "\n\n" : "") +
                 tools_section(options.tools) + "<|im_end|>\n";
  else if (system_first)
    r->prompt += chatml_turn("system", messages[0].content);
  if (system_first) i = 1;
  size_t last_query = messages.size() - 1;
  for (size_t j = messages.size(); j-- > 0;) {
    const std::string& c = messages[j].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (messages[j].role == "user" && !tool_response) {
      last_query = j;
      break;
    }
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      tool_response(messages, i, r);
      continue;
    }
    if (m.role != "assistant") {
      r->prompt += chatml_turn(m.role, m.content);
      continue;
    }
    std::string content = m.content, reasoning;
    if (m.reasoning) {
      reasoning = *m.reasoning;  // given apart: the content is taken as it is
    } else if (const size_t end = content.find("</think>"); end != std::string::npos) {
      reasoning = strip_newlines(content.substr(0, end), false, true);
      if (const size_t open = reasoning.rfind("<think>"); open != std::string::npos) reasoning = reasoning.substr(open + 7);
      reasoning = strip_newlines(reasoning, true, false);
      content = strip_newlines(content.substr(content.rfind("</think>") + 8), true, false);
    }
    const bool last = i + 1 == messages.size();
    std::string turn = content;
    if (i > last_query && (last || !reasoning.empty()))
      turn = "<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" + strip_newlines(content, true, false);
    r->prompt += "<|im_start|>assistant\n" + turn;
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      if (j > 0 || !content.empty()) r->prompt += "\n";  // (Qwen3's test is on the unstripped content)
      r->prompt += tool_call_block(m.tool_calls[j]);
    }
    r->prompt += "<|im_end|>\n";
  }
  open_chatml_answer(r);
  if (!options.enable_thinking) r->prompt += "<think>\n\n</think>\n\n";
}

void render_plain(const std::vector<ChatMessage>& messages, RenderedChat* r) {
  for (const auto& m : messages) {
    std::string who = m.role == "system" ? "System" : m.role == "assistant" ? "Assistant" : "User";
    r->prompt += who + ": " + m.content + "\n\n";
  }
  r->prompt += "Assistant:";
  r->stop = {"\n\nUser:"};
}

// Llama-2's and Mistral-7B-Instruct's [INST] turns.
void render_inst(const std::string& name, const std::vector<ChatMessage>& messages, RenderedChat* r) {
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
      if (llama) r->prompt += (first ? "" : "<s>") + std::string("[INST] ") + trim(content) + " [/INST]";
      else r->prompt += "[INST] " + content + " [/INST]";
      first = false;
    } else if (m.role == "assistant") {
      r->prompt += llama ? " " + trim(m.content) + " </s>" : m.content + "</s>";
    }
  }
}

// Llama-3's, and Llama-3.1's and 3.2's with their system header and tools.
void render_llama3(const std::string& name, const std::vector<ChatMessage>& messages, const ChatOptions& options,
                   RenderedChat* r) {
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
    const bool tools = !options.tools.empty();
    // Only the system message is trimmed, not the header lines before it.
    r->prompt += "<|start_header_id|>system<|end_header_id|>\n\n" + std::string(tools ? "Environment: ipython\n" : "") +
                "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" + trim(system) + "<|eot_id|>";
    if (tools) {
      // The tools go into the first message after the system one (its templates' default,
      // tools_in_user_message), each as json.dumps(indent=4) writes it.
      KVPR_CHECK(i < messages.size(), "the chat template '", name,
                 "' writes the tools into the first user message, and the conversation has none");
      r->prompt +=
          "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
          "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
          "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
          "variables.\n\n";
      for (const auto& t : options.tools) r->prompt += t.dump_python(4) + "\n\n";
      r->prompt += trim(messages[i++].content) + "<|eot_id|>";
    }
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      // A result is written as a JSON string (the template's tojson of the content).
      r->prompt += "<|start_header_id|>ipython<|end_header_id|>\n\n" + json::Value(m.content).dump_python() + "<|eot_id|>";
    } else if (!m.tool_calls.empty()) {
      KVPR_CHECK(m.tool_calls.size() == 1, "the chat template '", name,
                 "' takes one tool call per assistant message (as the model's own template)");
      r->prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + m.tool_calls[0].name +
                  "\", \"parameters\": " + m.tool_calls[0].arguments.dump_python() + "}<|eot_id|>";
    } else {
      r->prompt += llama3_turn(m.role, m.content);
    }
  }
  r->prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  r->stop_tokens = {"<|eot_id|>"};
}

// Gemma's turns, as Gemma 2's and 3's templates write them: "<start_of_turn>{user|model}\n{content,
// trimmed}<end_of_turn>\n", the answer opening with "<start_of_turn>model\n" (BOS is the
// tokenizer's); a system message opens the first user turn, followed by a blank line (Gemma 3's;
// Gemma 2's own template refuses a system message). <end_of_turn> ends the answer.
void render_gemma(const std::vector<ChatMessage>& messages, RenderedChat* r) {
  std::string system;
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = trim(messages[0].content) + "\n\n";
    i = 1;
  }
  for (bool first = true; i < messages.size(); ++i, first = false) {
    const ChatMessage& m = messages[i];
    const std::string role = m.role == "assistant" ? "model" : m.role;
    r->prompt += "<start_of_turn>" + role + "\n" + (first ? system : "") + trim(m.content) + "<end_of_turn>\n";
  }
  r->prompt += "<start_of_turn>model\n";
  r->stop_tokens = {"<end_of_turn>"};
}

// A JSON schema as the harmony format describes a function's parameter: TypeScript's type.
std::string typescript_type(const json::Value& spec, int depth = 0) {
  const json::Value* type = spec.is_object() ? spec.find("type") : nullptr;
  const std::string t = type && type->is_string() ? type->as_string() : "";
  if (const json::Value* e = spec.is_object() ? spec.find("enum") : nullptr; e && e->is_array() && t == "string") {
    std::string out;
    for (const json::Value& v : e->as_array()) out += (out.empty() ? "" : " | ") + v.dump();
    return out;
  }
  if (t == "string") return "string";
  if (t == "number" || t == "integer") return "number";
  if (t == "boolean") return "boolean";
  if (t == "array") {
    const json::Value* items = spec.find("items");
    return depth < 4 && items ? typescript_type(*items, depth + 1) + "[]" : "any[]";
  }
  if (t == "object") {
    const json::Value* props = spec.find("properties");
    if (depth >= 4 || !props || !props->is_object() || props->as_object().empty()) return "object";
    std::string out = "{\n";
    for (const auto& [name, p] : props->as_object()) out += name + ": " + typescript_type(p, depth + 1) + ",\n";
    return out + "}";
  }
  return "any";
}

// gpt-oss's harmony format, as its model card and chat template describe it: a system message
// (identity, knowledge cutoff, today's date, reasoning effort from chat_template_kwargs'
// reasoning_effort, "medium" by default, and the channels), a developer message with the
// instructions (the conversation's system message), the tools as a TypeScript namespace
// `functions` and a response format's schema ("# Response Formats"), then each message "<|start|>{role}<|message|>{content}<|end|>"; an assistant's
// answer in the final channel (earlier reasoning dropped), its calls each a commentary message
// "to=functions.NAME" ending <|call|> (its reasoning, when no later answer follows, before them
// in the analysis channel), a tool's result a message from functions.NAME to the assistant
// (arguments and results as its template's tojson writes them: json.dumps).
// The answer opens with "<|start|>assistant"; <|return|> and <|call|> end it.
void render_harmony(const std::vector<ChatMessage>& messages, const ChatOptions& options, RenderedChat* r) {
  std::string effort = "medium";
  if (auto it = std::find_if(options.template_kwargs.begin(), options.template_kwargs.end(),
                             [](const auto& kv) { return kv.first == "reasoning_effort"; });
      it != options.template_kwargs.end() && it->second.is_string())
    effort = it->second.as_string();
  const bool tools = !options.tools.empty();
  r->prompt += "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
               "Knowledge cutoff: 2024-06\nCurrent date: " + today(true) + "\n\nReasoning: " + effort +
               "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message." +
               (tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "") + "<|end|>";
  size_t i = 0;
  std::string instructions;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    instructions = messages[0].content;
    i = 1;
  }
  const json::Value* format_schema =
      options.response_format.is_object() ? options.response_format.find("schema") : nullptr;
  if (!instructions.empty() || tools || format_schema) {
    r->prompt += "<|start|>developer<|message|>";
    if (!instructions.empty()) r->prompt += "# Instructions\n\n" + instructions + "\n\n";
    if (tools) {
      r->prompt += "# Tools\n\n## functions\n\nnamespace functions {\n\n";
      for (const json::Value& t : options.tools) {
        const json::Value& fn = *t.find("function");
        const json::Value* desc = fn.find("description");
        if (desc && desc->is_string()) r->prompt += "// " + desc->as_string() + "\n";
        r->prompt += "type " + fn.find("name")->as_string() + " = ";
        const json::Value* params = fn.find("parameters");
        const json::Value* props = params && params->is_object() ? params->find("properties") : nullptr;
        if (!props || !props->is_object() || props->as_object().empty()) {
          r->prompt += "() => any;\n\n";
          continue;
        }
        const json::Value* required = params->find("required");
        auto is_required = [&](const std::string& name) {
          if (!required || !required->is_array()) return false;
          for (const json::Value& n : required->as_array())
            if (n.is_string() && n.as_string() == name) return true;
          return false;
        };
        r->prompt += "(_: {\n";
        for (const auto& [name, p] : props->as_object()) {
          if (const json::Value* d = p.is_object() ? p.find("description") : nullptr; d && d->is_string())
            r->prompt += "// " + d->as_string() + "\n";
          r->prompt += name + (is_required(name) ? ": " : "?: ") + typescript_type(p);
          if (const json::Value* d = p.is_object() ? p.find("default") : nullptr) r->prompt += ", // default: " + d->dump();
          r->prompt += ",\n";
        }
        r->prompt += "}) => any;\n\n";
      }
      r->prompt += "} // namespace functions";
    }
    if (format_schema) {  // what the constraint will hold the final message to, told to the model
      const json::Value* name = options.response_format.find("name");
      const json::Value* desc = options.response_format.find("description");
      if (tools) r->prompt += "\n\n";
      r->prompt += "# Response Formats\n\n## " + (name && name->is_string() ? name->as_string() : "response") + "\n\n";
      if (desc && desc->is_string() && !desc->as_string().empty()) r->prompt += "// " + desc->as_string() + "\n";
      r->prompt += format_schema->dump();
    }
    r->prompt += "<|end|>";
  }
  std::string last_call;  // whose result a tool message is, when its id names no call
  std::vector<std::pair<std::string, std::string>> call_names;  // id -> name
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      bool answered_later = false;
      for (size_t j = i + 1; j < messages.size(); ++j)
        answered_later = answered_later || (messages[j].role == "assistant" && messages[j].tool_calls.empty());
      const std::string thought = m.reasoning ? *m.reasoning : m.content;
      if (!thought.empty() && !answered_later)
        r->prompt += "<|start|>assistant<|channel|>analysis<|message|>" + thought + "<|end|>";
      for (const ChatToolCall& c : m.tool_calls) {
        r->prompt += "<|start|>assistant to=functions." + c.name + "<|channel|>commentary json<|message|>" +
                     c.arguments.dump_python() + "<|call|>";
        call_names.emplace_back(c.id, c.name);
        last_call = c.name;
      }
    } else if (m.role == "assistant") {
      r->prompt += "<|start|>assistant<|channel|>final<|message|>" + m.content + "<|end|>";
    } else if (m.role == "tool") {
      std::string name = last_call;
      for (const auto& [id, n] : call_names)
        if (!m.tool_call_id.empty() && id == m.tool_call_id) name = n;
      KVPR_CHECK(!name.empty(), "the chat template 'harmony' writes a tool result after the call it answers");
      r->prompt += "<|start|>functions." + name + " to=assistant<|channel|>commentary<|message|>" +
                   json::Value(m.content).dump_python() + "<|end|>";  // its template's content|tojson
    } else {
      r->prompt += "<|start|>" + m.role + "<|message|>" + m.content + "<|end|>";
    }
  }
  r->prompt += "<|start|>assistant";
  r->stop_tokens = {"<|return|>", "<|call|>"};
}

}  // namespace

std::string chat_template_names() {
  std::string out;
  for (const char* n : kTemplateNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

bool known_chat_template(const std::string& name) {
  for (const char* n : kTemplateNames)
    if (name == n) return true;
  return false;
}

bool chat_template_has_tools(const std::string& name) { return !chat_tool_call_parser(name).empty(); }

std::string chat_tool_call_parser(const std::string& name) {
  if (name == "qwen2.5" || name == "qwen3") return "hermes";
  if (name == "mistral-nemo") return "mistral";
  if (name == "llama-3.1" || name == "llama-3.2") return "llama3_json";
  if (name == "harmony") return "harmony";
  return "";
}

RenderedChat render_chat(const std::string& name, const std::vector<ChatMessage>& messages,
                         const ChatOptions& options) {
  RenderedChat r;
  if (!chat_template_has_tools(name)) {
    const char* what = !options.tools.empty() ? "tools" : nullptr;
    for (const auto& m : messages) {
      if (m.role == "tool") what = "tool messages";
      if (!m.tool_calls.empty()) what = "tool calls";
    }
    KVPR_CHECK(what == nullptr, "the chat template '", name, "' has no ", what,
               " (qwen2.5, qwen3, mistral-nemo, llama-3.1, llama-3.2 and harmony have)");
  }
  if (name == "qwen3") {
    render_qwen3(messages, options, &r);
    return r;
  }
  if (name == "qwen2.5") {
    render_qwen25(kQwen25System, messages, options, &r);
    return r;
  }
  if (name == "mistral-nemo") {
    render_mistral_nemo(messages, options, &r);
    return r;
  }
  if (name == "plain" || name == "opt") {
    render_plain(messages, &r);
    return r;
  }
  if (name == "llama-2" || name == "mistral") {
    render_inst(name, messages, &r);
    return r;
  }
  if (name == "zephyr") {
    // Zephyr's, which TinyLlama-Chat uses: "<|role|>\n{content}</s>\n" per message, then
    // "<|assistant|>\n" (as Hugging Face renders it with trim_blocks).
    for (const auto& m : messages) r.prompt += "<|" + m.role + "|>\n" + m.content + "</s>\n";
    r.prompt += "<|assistant|>\n";
    return r;
  }
  if (name == "chatml" || name == "qwen2") {
    // ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then the assistant's
    // opening; its turn ends at <|im_end|>. Qwen2's template puts its default system message
    // first when the conversation does not open with one (Qwen2.5's too, above).
    const std::string& preset = name == "qwen2" ? kQwen2System : options.default_system;
    if (!preset.empty() && (messages.empty() || messages[0].role != "system")) r.prompt += chatml_turn("system", preset);
    for (const auto& m : messages) r.prompt += chatml_turn(m.role, m.content);
    open_chatml_answer(&r);
    return r;
  }
  if (name == "llama-3" || name == "llama-3.1" || name == "llama-3.2") {
    render_llama3(name, messages, options, &r);
    return r;
  }
  if (name == "harmony") {
    render_harmony(messages, options, &r);
    return r;
  }
  if (name == "gemma") {
    render_gemma(messages, &r);
    return r;
  }
  KVPR_THROW("unknown chat template '", name, "'");
}

std::string model_chat_template_text(const std::string& model_dir, const std::string& name, std::string* origin) {
  // transformers saves the template as chat_template.jinja beside tokenizer_config.json, which
  // then has none; a file there wins over the config's.
  const std::string file = model_dir + "/" + (name == "default" ? std::string("chat_template") : name) + ".jinja";
  if (std::filesystem::exists(file)) {
    std::ifstream f(file, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    KVPR_CHECK(f.good() || f.eof(), file, ": cannot read");
    *origin = std::filesystem::path(file).filename().string();
    return text;
  }
  const std::string path = model_dir + "/tokenizer_config.json";
  *origin = "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return "";
  const json::Value cfg = json::parse_file(path);
  const json::Value* t = cfg.find("chat_template");
  if (t && t->is_string()) return name == "default" ? t->as_string() : "";
  if (t && t->is_array()) {  // named templates: [{"name": "default", "template": "..."}, ...]
    std::string first;
    for (const auto& e : t->as_array()) {
      const json::Value* n = e.find("name");
      const json::Value* body = e.find("template");
      if (!body || !body->is_string()) continue;
      if (n && n->is_string() && n->as_string() == name) {
        *origin = "tokenizer_config.json (" + name + ")";
        return body->as_string();
      }
      if (first.empty()) first = body->as_string();
    }
    if (name == "default") return first;  // no "default": the first, as transformers takes it
  }
  return "";
}

std::string chat_template_family(const std::string& jinja, std::string* why, std::string* default_system) {
  if (default_system) default_system->clear();
  auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  if (has("[INST]") && has("<<SYS>>")) {
    *why = "Llama-2's";
    return "llama-2";
  }
  if (has("[INST]") && has("[AVAILABLE_TOOLS]") && has("\"[INST]\" + system_message")) {
    *why = "Mistral-Nemo's ([INST] without spaces, tools)";
    return "mistral-nemo";
  }
  if (has("[INST]")) {
    *why = "Mistral's ([INST] without <<SYS>>)";
    return "mistral";
  }
  if (has("<|im_start|>") && has("<|im_end|>") && has("enable_thinking") && has("<think>")) {
    *why = "Qwen3's (ChatML with think blocks)";
    return "qwen3";
  }
  if (has("<|im_start|>") && has("<|im_end|>")) {
    const std::string system = chatml_default_system(jinja);
    if (system == kQwen25System) {
      *why = "Qwen2.5's (ChatML with its default system message)";
      return "qwen2.5";
    }
    if (system == kQwen2System) {
      *why = "Qwen2's (ChatML with a default system message)";
      return "qwen2";
    }
    *why = "ChatML";
    if (!system.empty()) {
      *why += ", with the default system message \"" + system + "\"";
      if (default_system) *default_system = system;
    }
    return "chatml";
  }
  if (has("<|user|>") && has("<|assistant|>")) {
    *why = "Zephyr's (TinyLlama-Chat)";
    return "zephyr";
  }
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    if (!has("Cutting Knowledge Date")) {
      *why = "Llama-3's";
      return "llama-3";
    }
    if (has("strftime_now")) {
      *why = "Llama-3.2's (today's date in the system header)";
      return "llama-3.2";
    }
    *why = "Llama-3.1's";
    return "llama-3.1";
  }
  if (has("<start_of_turn>") && has("<end_of_turn>")) {
    *why = "Gemma's (<start_of_turn>)";
    return "gemma";
  }
  if (has("<|channel|>") && has("<|message|>") && has("<|start|>")) {
    *why = "gpt-oss's harmony format";
    return "harmony";
  }
  *why = "not one kvpr has built in";
  return "";
}

std::string auto_chat_template(const std::string& model_dir, std::string* why, std::string* default_system) {
  if (default_system) default_system->clear();
  std::string origin;
  const std::string jinja = model_chat_template_text(model_dir, "default", &origin);
  if (jinja.empty()) {
    *why = std::filesystem::exists(model_dir + "/tokenizer_config.json") ? "tokenizer_config.json has no chat_template"
                                                                        : "no tokenizer_config.json";
    return "plain";
  }
  std::string family = chat_template_family(jinja, why, default_system);
  *why = origin + "'s chat_template is " + *why;
  return family.empty() ? "plain" : family;
}

RenderedChat chat_template_stops(const std::string& name) {
  RenderedChat r = render_chat(name, {ChatMessage("user", "x")});
  r.prompt.clear();
  return r;
}

}  // namespace kvpr
