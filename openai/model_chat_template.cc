#include "openai/model_chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

namespace {

// bos_token and the others as tokenizer_config.json gives them: a string, or an AddedToken
// object whose "content" is the text.
jinja::Dict special_tokens_of(const std::string& model_dir) {
  jinja::Dict out;
  const std::string path = model_dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return out;
  const json::Value cfg = json::parse_file(path);
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const json::Value* v = cfg.find(name);
    if (v && v->is_object()) v = v->find("content");
    if (v && v->is_string()) out.emplace_back(name, jinja::Value(v->as_string()));
  }
  return out;
}

std::shared_ptr<const jinja::Template> parse(const std::string& text, const std::string& origin) {
  try {
    return std::make_shared<const jinja::Template>(text);
  } catch (const Error& e) {
    KVPR_THROW("chat template (", origin, "): ", e.what());
  }
}

// A message as transformers' templates take it (vLLM's shape): role and content, an assistant's
// tool_calls with their arguments as an object, its reasoning_content, a tool result's
// tool_call_id.
jinja::Value message_value(const ChatMessage& m) {
  jinja::Dict d{{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}};
  if (!m.tool_calls.empty()) {
    jinja::List calls;
    for (const auto& c : m.tool_calls) {
      jinja::Dict fn{{"name", jinja::Value(c.name)}, {"arguments", jinja::Value::from_json(c.arguments)}};
      jinja::Dict call{{"type", jinja::Value("function")}, {"function", jinja::Value(std::move(fn))}};
      if (!c.id.empty()) call.insert(call.begin(), {"id", jinja::Value(c.id)});
      calls.emplace_back(std::move(call));
    }
    d.emplace_back("tool_calls", jinja::Value(std::move(calls)));
  }
  if (m.reasoning) {
    d.emplace_back("reasoning_content", jinja::Value(*m.reasoning));
    d.emplace_back("thinking", jinja::Value(*m.reasoning));  // gpt-oss's template's name for it
  }
  if (!m.tool_call_id.empty()) d.emplace_back("tool_call_id", jinja::Value(m.tool_call_id));
  return jinja::Value(std::move(d));
}

}  // namespace

ModelChatTemplate::ModelChatTemplate(std::string text, std::string origin, const std::string& model_dir)
    : text_(std::move(text)), origin_(std::move(origin)) {
  default_ = parse(text_, origin_);
  special_tokens_ = special_tokens_of(model_dir);
  family_ = chat_template_family(text_, &family_why_);
  // Whether it writes a system message (Gemma's and some Mistral templates refuse one): tools
  // described for a template without tools go there, else into the first user message.
  try {
    const RenderedChat r = render({ChatMessage("system", "kvpr-probe-system"), ChatMessage("user", "kvpr-probe-user")}, {});
    writes_system_ = r.prompt.find("kvpr-probe-system") != std::string::npos;
  } catch (const std::exception&) {  // (it refused the probe: no system message, then)
    writes_system_ = false;
  }
}

std::optional<ModelChatTemplate> ModelChatTemplate::load(const std::string& model_dir) {
  std::string origin;
  std::string text = model_chat_template_text(model_dir, "default", &origin);
  if (text.empty()) return std::nullopt;
  ModelChatTemplate t(std::move(text), origin, model_dir);
  std::string tool_origin;
  const std::string tool_use = model_chat_template_text(model_dir, "tool_use", &tool_origin);
  if (!tool_use.empty()) t.tool_use_ = parse(tool_use, tool_origin);
  return t;
}

ModelChatTemplate ModelChatTemplate::from_file(const std::string& path, const std::string& model_dir) {
  std::ifstream f(path, std::ios::binary);
  KVPR_CHECK(f, path, ": cannot read the chat template");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  KVPR_CHECK(!text.empty(), path, ": the chat template is empty");
  return ModelChatTemplate(std::move(text), path, model_dir);
}

RenderedChat ModelChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const {
  jinja::List msgs;
  for (const auto& m : messages) msgs.push_back(message_value(m));
  jinja::Dict vars = special_tokens_;
  vars.emplace_back("messages", jinja::Value(std::move(msgs)));
  vars.emplace_back("tools", options.tools.empty() ? jinja::Value::none()
                                                   : jinja::Value::from_json(json::Value(options.tools)));
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value(true));
  for (const auto& [k, v] : options.template_kwargs) {  // the request's, over the others (as transformers)
    auto it = std::find_if(vars.begin(), vars.end(), [&](const auto& p) { return p.first == k; });
    if (it != vars.end()) it->second = jinja::Value::from_json(v);
    else vars.emplace_back(k, jinja::Value::from_json(v));
  }
  const jinja::Template& t = !options.tools.empty() && tool_use_ ? *tool_use_ : *default_;
  RenderedChat r = family_.empty() ? RenderedChat() : chat_template_stops(family_);
  try {
    r.prompt = t.render(jinja::Value(std::move(vars)));
  } catch (const Error& e) {
    KVPR_THROW("chat template (", origin_, "): ", e.what());
  }
  r.add_special_tokens = false;
  return r;
}

bool is_chat_template_file(const std::string& choice) {
  return choice.find('/') != std::string::npos ||
         (choice.size() > 6 && choice.compare(choice.size() - 6, 6, ".jinja") == 0);
}

ChatTemplateChoice choose_chat_template(const std::string& model_dir, const std::string& choice) {
  ChatTemplateChoice c;
  if (is_chat_template_file(choice)) {
    c.model = std::make_shared<const ModelChatTemplate>(ModelChatTemplate::from_file(choice, model_dir));
    std::string why;
    c.family = chat_template_family(c.model->text(), &why, &c.default_system);
    c.why = choice + (c.family.empty() ? " (stops: the tokenizer's end of sequence)" : " (" + why + ")");
    if (c.family.empty()) c.family = "plain";
    return c;
  }
  if (choice != "auto") {
    KVPR_CHECK(known_chat_template(choice), "unknown chat template '", choice, "' (auto, ", chat_template_names(),
               ", or a FILE.jinja)");
    c.family = choice;
    c.why = "built in, as asked";
    return c;
  }
  c.family = auto_chat_template(model_dir, &c.why, &c.default_system);
  if (auto t = ModelChatTemplate::load(model_dir)) {
    c.model = std::make_shared<const ModelChatTemplate>(std::move(*t));
    c.why = "the model's own from " + c.model->origin() + "; " + c.why;
  }
  return c;
}

}  // namespace kvpr
