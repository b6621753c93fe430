#include "openai/request.h"

#include <charconv>
#include <cmath>

#include "engine/base/error.h"
#include "openai/generic_tools.h"
#include "openai/harmony.h"

namespace kvpr {

namespace {

// A member that is there and not null.
const json::Value* field(const json::Value& o, std::string_view k) {
  const json::Value* v = o.find(k);
  return v && !v->is_null() ? v : nullptr;
}

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

double number_of(const json::Value& v, const char* name) {
  if (!v.is_number()) throw bad_request(quoted(name) + " must be a number", name);
  return v.as_double();
}

// An integer field (an integral double too, as JavaScript clients send 5.0): within int64, else
// a 400 (a number beyond it cannot be converted at all).
int64_t int_of(const json::Value& v, const char* name) {
  if (v.is_int()) return v.as_int();
  if (!v.is_number()) throw bad_request(quoted(name) + " must be an integer", name);
  const double d = v.as_double();
  if (!(std::abs(d) < 0x1p62)) throw bad_request(quoted(name) + " is out of range", name);
  if (d != std::floor(d)) throw bad_request(quoted(name) + " must be an integer", name);
  return static_cast<int64_t>(d);
}

bool bool_of(const json::Value& v, const char* name) {
  if (!v.is_bool()) throw bad_request(quoted(name) + " must be a boolean", name);
  return v.as_bool();
}

const std::string& string_of(const json::Value& v, const char* name) {
  if (!v.is_string()) throw bad_request(quoted(name) + " must be a string", name);
  return v.as_string();
}

// Token ids of a prompt or a list: each within the tokenizer.
std::vector<int32_t> token_ids_of(const json::Value& v, const Tokenizer& tok, const char* name) {
  std::vector<int32_t> ids;
  for (const auto& e : v.as_array()) {
    const int64_t id = int_of(e, name);
    if (id < 0 || id >= tok.size()) throw bad_request("token id " + std::to_string(id) + " is out of range", name);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// The model-independent defaults first, then generation_config.json's, then the request's.
void parse_limits(const json::Value& o, bool chat, Sampling& s) {
  if (auto v = field(o, "max_tokens")) s.max_tokens = int_of(*v, "max_tokens"), s.max_tokens_given = true;
  if (chat)
    if (auto v = field(o, "max_completion_tokens"))
      s.max_tokens = int_of(*v, "max_completion_tokens"), s.max_tokens_given = true;
  if (s.max_tokens < 0) throw bad_request("'max_tokens' must be >= 0", "max_tokens");
  // vLLM's min_tokens: no end (EOS, stop ids, stop strings) before this many tokens.
  if (auto v = field(o, "min_tokens")) s.min_tokens = int_of(*v, "min_tokens");
  if (s.min_tokens < 0) throw bad_request("'min_tokens' must be >= 0", "min_tokens");
  if ((s.max_tokens_given || !chat) && s.min_tokens > s.max_tokens)
    throw bad_request("'min_tokens' (" + std::to_string(s.min_tokens) + ") must not exceed 'max_tokens' (" +
                          std::to_string(s.max_tokens) + ")", "min_tokens");
  if (auto v = field(o, "temperature")) s.temperature = number_of(*v, "temperature");
  if (!(s.temperature >= 0 && s.temperature <= 2)) throw bad_request("'temperature' must be in [0, 2]", "temperature");
  if (auto v = field(o, "top_p")) s.top_p = number_of(*v, "top_p");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw bad_request("'top_p' must be in (0, 1]", "top_p");
  if (auto v = field(o, "top_k")) s.top_k = int_of(*v, "top_k");
  if (s.top_k < -1) throw bad_request("'top_k' must be -1 (off), 0 (off) or positive", "top_k");
  if (s.top_k < 0) s.top_k = 0;
  if (auto v = field(o, "min_p")) s.min_p = number_of(*v, "min_p");
  if (!(s.min_p >= 0 && s.min_p <= 1)) throw bad_request("'min_p' must be in [0, 1]", "min_p");
  if (auto v = field(o, "seed")) s.seed = int_of(*v, "seed");
  if (auto v = field(o, "n")) s.n = int_of(*v, "n");
  if (s.n < 1 || s.n > 16) throw bad_request("'n' must be in 1..16", "n");
  if (auto v = field(o, "stream")) s.stream = bool_of(*v, "stream");
  if (auto v = field(o, "stream_options")) {
    if (!v->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (!s.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (auto u = field(*v, "include_usage")) s.include_usage = bool_of(*u, "stream_options.include_usage");
  }
}

void parse_stops(const json::Value& o, Sampling& s) {
  if (auto v = field(o, "stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->as_string());
    } else if (v->is_array()) {
      for (const auto& e : v->as_array()) {
        if (!e.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        s.stop.push_back(e.as_string());
      }
      if (s.stop.size() > 4) throw bad_request("'stop' holds at most 4 strings", "stop");
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& st : s.stop)
      if (st.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (auto v = field(o, "stop_token_ids")) {
    if (!v->is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    for (const auto& e : v->as_array()) s.stop_token_ids.push_back(int_of(e, "stop_token_ids"));
    if (s.stop_token_ids.size() > 16) throw bad_request("'stop_token_ids' holds at most 16 ids", "stop_token_ids");
  }
}

void parse_logprobs_and_penalties(const json::Value& o, bool chat, Sampling& s) {
  if (auto v = field(o, "logprobs")) {
    if (chat) {
      s.logprobs = bool_of(*v, "logprobs");
    } else {
      const int64_t k = int_of(*v, "logprobs");
      if (k < 0 || k > 5) throw bad_request("'logprobs' must be in 0..5", "logprobs");
      s.logprobs = true;
      s.top_logprobs = k;
    }
  }
  if (chat)
    if (auto v = field(o, "top_logprobs")) {
      s.top_logprobs = int_of(*v, "top_logprobs");
      if (s.top_logprobs < 0 || s.top_logprobs > 20) throw bad_request("'top_logprobs' must be in 0..20", "top_logprobs");
      if (!s.logprobs) throw bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    }
  if (!chat)
    if (auto v = field(o, "echo")) s.echo = bool_of(*v, "echo");
  if (auto v = field(o, "ignore_eos")) s.ignore_eos = bool_of(*v, "ignore_eos");
  if (auto v = field(o, "repetition_penalty")) {
    s.repetition_penalty = number_of(*v, "repetition_penalty");
    if (!(s.repetition_penalty >= kMinRepetitionPenalty && s.repetition_penalty <= kMaxRepetitionPenalty))
      throw bad_request("'repetition_penalty' must be in [0.01, 100]", "repetition_penalty");
  }
  for (auto [name, dst] : {std::pair{"presence_penalty", &s.presence_penalty}, {"frequency_penalty", &s.frequency_penalty}})
    if (auto v = field(o, name)) {
      *dst = number_of(*v, name);
      if (!(*dst >= -2 && *dst <= 2)) throw bad_request(quoted(name) + " must be in [-2, 2]", name);
    }
  if (auto v = field(o, "logit_bias")) {
    if (!v->is_object()) throw bad_request("'logit_bias' must map token ids to numbers", "logit_bias");
    for (const auto& [key, value] : v->as_object()) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0)
        throw bad_request("'logit_bias' keys must be token ids, got '" + key + "'", "logit_bias");
      const double b = number_of(value, "logit_bias");
      if (!(b >= -100 && b <= 100)) throw bad_request("'logit_bias' values must be in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(id, b);
    }
    if (s.logit_bias.size() > 300) throw bad_request("'logit_bias' holds at most 300 tokens", "logit_bias");
  }
}

// Features this server does not have are refused, not silently ignored (their neutral values,
// which some clients always send, are accepted).
void refuse_unsupported(const json::Value& o, bool chat, const Sampling& s) {
  if (auto v = field(o, "user"); v && !v->is_string()) throw bad_request("'user' must be a string", "user");
  auto unsupported = [](const char* name, const char* what) {
    return bad_request(quoted(name) + " is not supported by this server (" + what + ")", name);
  };
  if (!chat) {
    if (auto v = field(o, "suffix"); v && !(v->is_string() && v->as_string().empty()))
      throw unsupported("suffix", "insertion");
    if (auto v = field(o, "best_of")) {
      if (!v->is_int() || v->as_int() < 1 || v->as_int() < s.n)
        throw bad_request("'best_of' must be an integer >= 1 and >= n (" + std::to_string(s.n) + ")", "best_of");
      if (v->as_int() > s.n) throw unsupported("best_of", "server-side best-of ranking");
    }
  } else {
    if (auto v = field(o, "functions"); v && !(v->is_array() && v->as_array().empty()))
      throw unsupported("functions", "the deprecated function calling; use tools");
  }
  // vLLM's and OpenAI's other fields that change the output: accepted at their neutral values
  // (a boolean or a number; none: only null or absent), else refused by name.
  struct Neutral {
    const char* name;
    std::optional<double> number;
    std::optional<bool> flag;
    bool chat_only;
    const char* what;
  };
  static const Neutral kNeutral[] = {
      {"use_beam_search", {}, false, false, "beam search"},
      {"length_penalty", 1.0, {}, false, "beam search's length penalty"},
      {"include_stop_str_in_output", {}, false, false, "the stop string is never in the output"},
      {"skip_special_tokens", {}, true, false, "special tokens are never in the text"},
      {"spaces_between_special_tokens", {}, true, false, "special tokens are never in the text"},
      {"truncate_prompt_tokens", {}, {}, false, "a prompt past the context is a 400, never cut"},
      {"prompt_logprobs", {}, {}, false, "completions score the prompt with echo and logprobs"},
      {"guided_json", {}, {}, false, "use response_format json_schema"},
      {"guided_regex", {}, {}, false, "no regular-expression output"},
      {"guided_choice", {}, {}, false, "use response_format json_schema with an enum"},
      {"guided_grammar", {}, {}, false, "no grammar output"},
      {"prediction", {}, {}, false, "predicted outputs"},
      {"audio", {}, {}, true, "audio output"},
      {"add_generation_prompt", {}, true, true, "the assistant's turn is always opened"},
      {"continue_final_message", {}, false, true, "the assistant's turn is always a new one"},
      {"echo", {}, false, true, "echo is a completions field"},
  };
  for (const Neutral& f : kNeutral) {
    if (f.chat_only && !chat) continue;
    const json::Value* v = field(o, f.name);
    if (!v) continue;
    const bool neutral = (f.flag && v->is_bool() && v->as_bool() == *f.flag) ||
                         (f.number && v->is_number() && v->as_double() == *f.number);
    if (!neutral) throw unsupported(f.name, f.what);
  }
}

// Structured output, for chat and (as vLLM takes it) completions alike.
void parse_response_format(const json::Value& o, Sampling& s) {
  const json::Value* v = field(o, "response_format");
  if (!v) return;
  const json::Value* type = v->is_object() ? v->find("type") : nullptr;
  const std::string t = type && type->is_string() ? type->as_string() : "";
  if (t == "json_object") {
    // llama.cpp's and Together's form carries a schema (instructor's JSON_SCHEMA mode sends it).
    if (const json::Value* schema = field(*v, "schema")) {
      if (!schema->is_object()) throw bad_request("'response_format.schema' must be a JSON Schema object", "response_format");
      s.json_schema = *schema;
    } else {
      s.json_object = true;
    }
  } else if (t == "json_schema") {
    const json::Value* js = field(*v, "json_schema");
    const json::Value* schema = js && js->is_object() ? field(*js, "schema") : nullptr;
    if (!schema) throw bad_request("'response_format.json_schema.schema' is required", "response_format");
    s.json_schema = *schema;  // compiled by the engine, which refuses what it cannot compile
  } else if (t != "text") {
    throw bad_request("'response_format' type must be text, json_object or json_schema", "response_format");
  }
}

Sampling parse_sampling(const json::Value& o, bool chat, const SamplingDefaults& d) {
  Sampling s;
  s.temperature = d.temperature.value_or(s.temperature);
  s.top_p = d.top_p.value_or(s.top_p);
  s.top_k = std::max<int64_t>(d.top_k.value_or(s.top_k), 0);
  s.min_p = d.min_p.value_or(s.min_p);
  s.repetition_penalty = d.repetition_penalty.value_or(s.repetition_penalty);
  parse_limits(o, chat, s);
  parse_stops(o, s);
  parse_logprobs_and_penalties(o, chat, s);
  refuse_unsupported(o, chat, s);
  parse_response_format(o, s);
  return s;
}

// One tool of 'tools', checked: {"type": "function", "function": {name, description, parameters}}.
void check_tool(const json::Value& tool, size_t i) {
  const std::string where = "tools[" + std::to_string(i) + "]";
  const json::Value* type = tool.is_object() ? field(tool, "type") : nullptr;
  const json::Value* fn = tool.is_object() ? field(tool, "function") : nullptr;
  if (!type || !type->is_string() || type->as_string() != "function" || !fn || !fn->is_object())
    throw bad_request(where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
  const json::Value* name = field(*fn, "name");
  bool ok = name && name->is_string() && !name->as_string().empty() && name->as_string().size() <= 64;
  for (char ch : ok ? name->as_string() : std::string())
    ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-');
  if (!ok) throw bad_request(where + ".function.name must be 1 to 64 letters, digits, '_' or '-'", "tools");
  if (const json::Value* d = field(*fn, "description"); d && !d->is_string())
    throw bad_request(where + ".function.description must be a string", "tools");
  if (const json::Value* ps = field(*fn, "parameters"); ps && !ps->is_object())
    throw bad_request(where + ".function.parameters must be a JSON Schema object", "tools");
}

// tool_choice "none", "auto", "required" or a named function; the name goes to t.named.
std::string parse_tool_choice(const json::Value& o, bool have_tools, ToolRequest& t) {
  std::string choice = have_tools ? "auto" : "none";
  const json::Value* c = field(o, "tool_choice");
  if (!c) return choice;
  const json::Value* fn = c->is_object() ? field(*c, "function") : nullptr;
  const json::Value* fname = fn && fn->is_object() ? field(*fn, "name") : nullptr;
  if (c->is_string() && (c->as_string() == "none" || c->as_string() == "auto" || c->as_string() == "required")) {
    choice = c->as_string();
  } else if (fname && fname->is_string()) {
    choice = "named";
    t.named = fname->as_string();
  } else {
    throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                      "tool_choice");
  }
  if ((choice == "required" || choice == "named") && !have_tools)
    throw bad_request("'tool_choice' " + choice + " needs 'tools'", "tool_choice");
  return choice;
}

// A tool's parameters schema moved into the $defs of a schema around it: its own $defs and
// definitions become "<prefix>.$defs/<name>" and "<prefix>.definitions/<name>" there, and its
// $refs, which are relative to its root ("#", "#/$defs/X"), are rewritten to point where those
// went ("#/$defs/<prefix>", "#/$defs/<prefix>.$defs~1X"); const, enum, default and examples are
// data, left as they are.
json::Value rebased(const json::Value& s, const std::string& prefix) {
  if (s.is_array()) {
    json::Array out;
    for (const auto& e : s.as_array()) out.push_back(rebased(e, prefix));
    return out;
  }
  if (!s.is_object()) return s;
  json::Object out;
  for (const auto& [k, v] : s.as_object()) {
    if (k == "const" || k == "enum" || k == "default" || k == "examples") {  // data, not schemas
      out.emplace_back(k, v);
    } else if (k == "$ref" && v.is_string()) {
      const std::string& ref = v.as_string();
      std::string to = ref;
      if (ref == "#") to = "#/$defs/" + prefix;
      for (const char* base : {"#/$defs/", "#/definitions/"})
        if (ref.starts_with(base))
          to = "#/$defs/" + prefix + "." + std::string(base).substr(2, std::string_view(base).size() - 3) + "~1" +
               ref.substr(std::string_view(base).size());  // (the key's "/" escaped, as JSON pointers do)
      out.emplace_back(k, to);
    } else {
      out.emplace_back(k, rebased(v, prefix));
    }
  }
  return out;
}

void hoist(const json::Value& params, const std::string& prefix, json::Object& defs) {
  json::Object root;
  for (const auto& [k, v] : params.as_object()) {
    if ((k == "$defs" || k == "definitions") && v.is_object()) {
      for (const auto& [name, d] : v.as_object()) defs.emplace_back(prefix + "." + k + "/" + name, rebased(d, prefix));
    } else {
      root.emplace_back(k, v);
    }
  }
  defs.emplace_back(prefix, rebased(json::Value(std::move(root)), prefix));
}

// Decoding constrained to the tools' schemas (as vLLM does it): a named function's arguments,
// or a list of calls of the tools, each tool's parameters in $defs (so that its own $refs, which
// are relative to its root, still mean what they meant).
void constrain_to_tools(const std::string& choice, ToolRequest& t) {
  json::Array calls;
  json::Object defs;
  for (size_t i = 0; i < t.tools.size(); ++i) {
    const json::Value& fn = *t.tools[i].find("function");
    const json::Value* ps = fn.find("parameters");
    const json::Value params = ps ? *ps : json::Value(json::Object{{"type", "object"}});
    if (choice == "named" && fn.find("name")->as_string() == t.named) t.schema = params;
    if (choice != "required") continue;
    const std::string prefix = "tool" + std::to_string(i);
    hoist(params, prefix, defs);
    calls.push_back(json::Object{
        {"type", "object"},
        {"properties", json::Object{{"name", json::Object{{"const", *fn.find("name")}}},
                                    {"parameters", json::Object{{"$ref", "#/$defs/" + prefix}}}}},
        {"required", json::Array{"name", "parameters"}},
        {"additionalProperties", false}});
  }
  if (choice == "named" && t.schema.is_null())
    throw bad_request("'tool_choice' names '" + t.named + "', which is not among the tools", "tool_choice");
  if (choice == "required") {
    t.required = true;
    json::Object list{{"$defs", std::move(defs)}, {"type", "array"}, {"minItems", 1},
                      {"items", json::Object{{"anyOf", std::move(calls)}}}};
    if (!t.parallel) list.emplace_back("maxItems", 1);
    t.schema = std::move(list);
  }
}

ToolRequest parse_tools(const json::Value& o, const ServedModel& served) {
  ToolRequest t;
  const json::Value* tools = field(o, "tools");
  if (tools && !tools->is_array()) throw bad_request("'tools' must be a list", "tools");
  const bool have_tools = tools && !tools->as_array().empty();
  const std::string choice = parse_tool_choice(o, have_tools, t);
  if (const json::Value* p = field(o, "parallel_tool_calls")) {
    t.parallel = bool_of(*p, "parallel_tool_calls");
    // Without tools only its default (true) means nothing to contradict; false asks for what
    // cannot apply (OpenAI refuses both; some clients send the default regardless).
    if (!have_tools && !t.parallel)
      throw bad_request("'parallel_tool_calls' false is only allowed when 'tools' are given", "parallel_tool_calls");
  }
  // Without a parser of the template's own format, the conversation's calls and results are
  // written as text, tools or not (openai/generic_tools.h).
  t.generic = served.tool_call_parser == "generic";
  if (!have_tools) return t;
  if (tools->as_array().size() > 128) throw bad_request("'tools' holds at most 128 tools", "tools");
  for (size_t i = 0; i < tools->as_array().size(); ++i) {
    const json::Value& tool = tools->as_array()[i];
    check_tool(tool, i);
    // The template sees {"type": "function", "function": {...as sent...}}.
    if (choice != "none") t.tools.push_back(json::Object{{"type", "function"}, {"function", *tool.find("function")}});
  }
  if (choice == "none") return t;
  if (choice == "required" || choice == "named") constrain_to_tools(choice, t);
  if (served.tool_call_parser == "none")
    throw bad_request("'tools' are off: kvprd was started with --tool-call-parser none", "tools");
  if (choice != "auto") return t;
  t.parse = true;
  t.parser = served.tool_call_parser;
  return t;
}

// An assistant message's tool_calls, their arguments parsed from JSON text (vLLM's json.loads).
std::vector<ChatToolCall> tool_calls_of(const json::Value& m, size_t index) {
  std::vector<ChatToolCall> out;
  const json::Value* calls = field(m, "tool_calls");
  if (!calls) return out;
  const std::string where = "messages[" + std::to_string(index) + "].tool_calls";
  if (!calls->is_array()) throw bad_request(where + " must be a list", "messages");
  for (size_t j = 0; j < calls->as_array().size(); ++j) {
    const json::Value& c = calls->as_array()[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    const json::Value* fn = c.is_object() ? field(c, "function") : nullptr;
    const json::Value* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    const json::Value* args = fn && fn->is_object() ? field(*fn, "arguments") : nullptr;
    if (!name || !name->is_string() || !args || !args->is_string())
      throw bad_request(at + " must have function.name and function.arguments (a JSON string)", "messages");
    ChatToolCall call;
    call.name = name->as_string();
    if (const json::Value* id = field(c, "id"); id && id->is_string()) call.id = id->as_string();
    try {
      call.arguments = json::parse(args->as_string());
    } catch (const Error& e) {
      throw bad_request(at + ".function.arguments is not JSON: " + e.what(), "messages");
    }
    out.push_back(std::move(call));
  }
  return out;
}

// A message's text: a string, or text parts [{"type": "text", "text": ...}]; none for an
// assistant message that only calls tools.
std::string content_of(const json::Value& m, bool only_calls) {
  const json::Value* content = field(m, "content");
  if (!content && only_calls) return "";
  if (content && content->is_string()) return content->as_string();
  if (!content || !content->is_array()) throw bad_request("each message needs 'content' (a string or text parts)", "messages");
  std::string text;
  for (const auto& part : content->as_array()) {
    // An image or audio part (a multimodal wrapper's checkpoint is served as its text model) is
    // refused by its type.
    const json::Value* type = part.is_object() ? field(part, "type") : nullptr;
    if (type && type->is_string() && type->as_string() != "text")
      throw bad_request("content parts of type '" + type->as_string() + "' are not supported (kvprd serves text: "
                        "parts of type 'text')", "messages");
    const json::Value* t = part.is_object() ? field(part, "text") : nullptr;
    if (!t || !t->is_string()) throw bad_request("only text content parts are supported", "messages");
    text += t->as_string();
  }
  return text;
}

ChatMessage parse_message(const json::Value& m, size_t index, const ServedModel& served) {
  if (!m.is_object()) throw bad_request("each message must be an object", "messages");
  const json::Value* role = field(m, "role");
  if (!role || !role->is_string()) throw bad_request("each message needs a string 'role'", "messages");
  const std::string& r = role->as_string();
  if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool")
    throw bad_request("unknown message role '" + r + "'", "messages");
  ChatMessage msg;
  if (r == "assistant") msg.tool_calls = tool_calls_of(m, index);
  if (r == "tool")
    if (const json::Value* id = field(m, "tool_call_id")) {
      if (!id->is_string()) throw bad_request("a tool message's 'tool_call_id' must be a string", "messages");
      msg.tool_call_id = id->as_string();
    }
  // Mistral's template takes ids of 9 characters: longer ones are cut to their last 9, as vLLM does.
  if (served.chat_template == "mistral-nemo") {
    auto last9 = [](std::string& id) {
      if (id.size() > 9) id = id.substr(id.size() - 9);
    };
    last9(msg.tool_call_id);
    for (auto& c : msg.tool_calls) last9(c.id);
  }
  if (r == "assistant")
    if (const json::Value* rc = field(m, "reasoning_content")) {
      if (!rc->is_string()) throw bad_request("'reasoning_content' must be a string", "messages");
      msg.reasoning = rc->as_string();
    }
  msg.content = content_of(m, !msg.tool_calls.empty());
  msg.role = r == "developer" ? "system" : r;
  return msg;
}

void parse_chat(const json::Value& o, const ServedModel& served, const Tokenizer& tok, GenerateRequest& req) {
  const json::Value* msgs = field(o, "messages");
  if (!msgs || !msgs->is_array() || msgs->as_array().empty()) throw bad_request("'messages' must be a non-empty list", "messages");
  for (const auto& m : msgs->as_array()) req.messages.push_back(parse_message(m, req.messages.size(), served));
  req.tools = parse_tools(o, served);
  req.harmony = served.chat_template == "harmony";
  if (req.harmony) {
    // Its channels hold the reasoning before the answer: response_format JSON constrains the final
    // channel's message, after its header. Its tool calls go to the commentary channel and end
    // the answer (<|call|>), which a constraint on the final message holds back: a JSON format
    // beside tools it may call is refused. A forced call skips the reasoning: the prompt opens
    // the call's message (named: "<|channel|>commentary to=functions.NAME <|constrain|>json
    // <|message|>", the message the model writes for a call), or, for required, a final message
    // holding the list of calls (the name is a choice among the tools, which the JSON list's schema
    // makes); the answer is that message's body, constrained from its first token.
    const bool forced = req.tools.required || !req.tools.named.empty();
    const bool constrained = req.sampling.json_object || !req.sampling.json_schema.is_null();
    if (constrained && req.tools.parse)
      throw bad_request("'response_format' json_object and json_schema are not supported beside tools with gpt-oss's "
                        "harmony format (the answer could not end with a call)", "response_format");
    const auto channel = tok.token_to_id("<|channel|>"), message = tok.token_to_id("<|message|>");
    if ((constrained || forced) && (!channel || !message))
      throw bad_request("a constrained answer needs the harmony format's <|channel|> and <|message|> tokens, which "
                        "this tokenizer lacks", forced ? "tool_choice" : "response_format");
    if (forced) {
      req.answer_opening = !req.tools.named.empty()
                               ? "<|channel|>commentary to=functions." + req.tools.named + " <|constrain|>json<|message|>"
                               : "<|channel|>final<|message|>";
    } else if (constrained) {
      const json::Value* rf = field(o, "response_format");  // json_schema's: the developer message shows it
      const json::Value* type = rf ? field(*rf, "type") : nullptr;
      if (type && type->is_string() && type->as_string() == "json_schema")
        req.chat_options.response_format = *field(*rf, "json_schema");
      req.final_header.push_back(*channel);
      for (int32_t id : tok.encode_ordinary("final")) req.final_header.push_back(id);
      req.final_header.push_back(*message);
    }
    for (const std::string& s : harmony_special_tokens())
      if (auto id = tok.token_to_id(s)) req.markers.emplace_back(*id, s);
  } else if (req.tools.parse && req.tools.parser == "mistral") {
    if (auto id = tok.token_to_id("[TOOL_CALLS]")) req.markers.emplace_back(*id, "[TOOL_CALLS]");
  }
  req.chat_options.default_system = served.default_system;
  if (const json::Value* kw = field(o, "chat_template_kwargs")) {  // vLLM's extension
    if (!kw->is_object()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [key, value] : kw->as_object()) {
      // The model's own template reads any; a built-in one only enable_thinking.
      const bool built_in = key == "enable_thinking" || (key == "reasoning_effort" && served.chat_template == "harmony");
      if (!built_in && !served.model_template)
        throw bad_request("'chat_template_kwargs." + key + "' is not supported by this server (enable_thinking is" +
                              (served.chat_template == "harmony" ? ", and reasoning_effort)" : ")"),
                          "chat_template_kwargs");
      if (key == "enable_thinking")
        req.chat_options.enable_thinking = bool_of(value, "chat_template_kwargs.enable_thinking");
      req.chat_options.template_kwargs.emplace_back(key, value);
    }
  }
  if (!req.tools.generic) req.chat_options.tools = req.tools.tools;
}

// 'prompt': a string, a list of strings, a list of token ids, or a list of such lists.
void parse_completion_prompts(const json::Value& o, const Tokenizer& tok, GenerateRequest& req) {
  const json::Value* p = field(o, "prompt");
  if (!p) throw bad_request("'prompt' is required", "prompt");
  const bool list = p->is_array() && !p->as_array().empty();
  if (p->is_string()) {
    req.prompt_texts.push_back(p->as_string());
  } else if (list && p->as_array()[0].is_string()) {
    for (const auto& e : p->as_array()) {
      if (!e.is_string()) throw bad_request("'prompt' list must hold only strings", "prompt");
      req.prompt_texts.push_back(e.as_string());
    }
  } else if (list && p->as_array()[0].is_array()) {
    for (const auto& e : p->as_array()) {
      if (!e.is_array()) throw bad_request("'prompt' must be a list of token-id lists", "prompt");
      req.prompt_ids.push_back(token_ids_of(e, tok, "prompt"));
    }
  } else if (list) {
    req.prompt_ids.push_back(token_ids_of(*p, tok, "prompt"));
  } else {
    throw bad_request("'prompt' must be a string, a list of strings, or token ids", "prompt");
  }
  if (req.prompt_texts.size() + req.prompt_ids.size() > 64) throw bad_request("at most 64 prompts per request", "prompt");
}

// The deepest nesting of arrays and objects in a JSON text (strings skipped).
int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json::Value parse_body(std::string_view body) {
  // What kvprd hands a worker wraps a request's schemas a few levels deeper (a forced tool
  // call's list of calls, the frame around the parameters), and a worker's frames may nest 256
  // levels: a request stays well inside that.
  if (nesting_depth(body) > kMaxRequestDepth)
    throw bad_request("request body is not valid JSON: nested deeper than " + std::to_string(kMaxRequestDepth) + " levels");
  json::Value v;
  try {
    v = json::parse_strict(body);
  } catch (const Error& e) {
    throw bad_request(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!v.is_object()) throw bad_request("request body must be a JSON object");
  return v;
}

void check_model(const json::Value& body, const ServedModel& served) {
  const json::Value* m = field(body, "model");
  if (!m) throw bad_request("'model' is required", "model");
  if (string_of(*m, "model") != served.name)
    throw ApiError{404, "model '" + m->as_string() + "' does not exist; this server serves '" + served.name + "'",
                   "invalid_request_error", "model"};
}

GenerateRequest parse_generate_request(const json::Value& body, bool chat, const ServedModel& served,
                                       const Tokenizer& tok) {
  GenerateRequest req;
  req.chat = chat;
  req.sampling = parse_sampling(body, chat, served.defaults);
  if (chat) parse_chat(body, served, tok, req);
  else parse_completion_prompts(body, tok, req);
  return req;
}

Prompts make_prompts(GenerateRequest& req, const ServedModel& served, const Tokenizer& tok) {
  Prompts p;
  Sampling& s = req.sampling;
  if (req.chat) {
    RenderedChat rc;
    if (req.tools.generic) {
      const ToolRequest& t = req.tools;
      req.messages = generic_tool_messages(std::move(req.messages), {t.tools, t.required, t.named, t.parallel},
                                           !served.model_template || served.model_template->writes_system());
    }
    try {
      rc = served.model_template ? served.model_template->render(req.messages, req.chat_options)
                                 : render_chat(served.chat_template, req.messages, req.chat_options);
    } catch (const Error& e) {  // what the template refuses (its raise_exception), or tools it has none for
      throw bad_request(e.what(), "messages");
    }
    rc.prompt += req.answer_opening;
    for (auto& st : rc.stop) s.stop.push_back(st);
    for (const auto& t : rc.stop_tokens)
      if (auto id = tok.token_to_id(t)) s.stop_token_ids.push_back(*id);
    p.ids.push_back(encode_prompt(tok, rc.prompt, rc.add_special_tokens, "messages"));
    p.texts.push_back(std::move(rc.prompt));
  } else {
    for (const auto& text : req.prompt_texts) {
      p.ids.push_back(encode_prompt(tok, text, true, "prompt"));
      p.texts.push_back(text);
    }
    for (const auto& ids : req.prompt_ids) {
      p.ids.push_back(ids);
      p.texts.push_back(tok.decode(ids, false));
    }
  }
  const char* param = req.chat ? "messages" : "prompt";
  for (const auto& pr : p.ids) {
    if (pr.empty()) throw bad_request("the prompt is empty", param);
    // A tokenizer larger than the model's embedding (a mismatched checkpoint) yields ids the
    // model cannot take: refused here, not failed in the worker.
    for (int32_t id : pr)
      if (id >= served.vocab_size)
        throw bad_request("prompt token id " + std::to_string(id) + " is beyond the model's vocabulary of " +
                              std::to_string(served.vocab_size) + " tokens (the tokenizer has " +
                              std::to_string(tok.size()) + ")",
                          param);
    const int64_t len = static_cast<int64_t>(pr.size());
    if (req.chat && !s.max_tokens_given) {  // the rest of the context, at least min_tokens (else the 400 below)
      s.max_tokens = std::max(served.max_model_len - len, s.min_tokens);
      if (len >= served.max_model_len) s.max_tokens = std::max<int64_t>(s.min_tokens, 1);
    }
    if (s.max_tokens > served.max_model_len - len)  // (a sum could overflow)
      throw bad_request("this model's maximum context length is " + std::to_string(served.max_model_len) +
                            " tokens, but " + std::to_string(len) + " in the prompt and " +
                            std::to_string(s.max_tokens) + " for the completion were requested",
                        param);
  }
  return p;
}

EngineRequest engine_request(const GenerateRequest& req, const Tokenizer& tok, int64_t index) {
  const Sampling& s = req.sampling;
  EngineRequest m;
  GenerationParams& g = m.params;
  g.max_new_tokens = static_cast<int>(s.max_tokens);  // (within the context, checked by make_prompts)
  g.sampling.temperature = static_cast<float>(s.temperature);
  g.sampling.top_p = static_cast<float>(s.top_p);
  g.sampling.top_k = static_cast<int>(s.top_k);
  g.sampling.min_p = static_cast<float>(s.min_p);
  g.ignore_eos = s.ignore_eos;
  g.min_new_tokens = static_cast<int>(s.min_tokens);  // (<= max_tokens)
  g.top_logprobs = static_cast<int>(s.top_logprobs);
  // echo + logprobs: the prompt's tokens are scored too (OpenAI's legacy completions).
  if (!req.chat && s.echo && s.logprobs) g.prompt_logprobs = static_cast<int>(s.top_logprobs);
  g.sampling.repetition_penalty = static_cast<float>(s.repetition_penalty);
  g.sampling.presence_penalty = static_cast<float>(s.presence_penalty);
  g.sampling.frequency_penalty = static_cast<float>(s.frequency_penalty);
  for (const auto& [id, b] : s.logit_bias) {
    if (id >= tok.size())
      throw bad_request("'logit_bias' token id " + std::to_string(id) + " is not in the vocabulary", "logit_bias");
    g.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  g.json_object = s.json_object;
  g.json_schema = !req.tools.schema.is_null() ? req.tools.schema : s.json_schema;  // forced tool calls, or the format
  if (g.json_object || !g.json_schema.is_null()) g.constrain_after = req.final_header;  // harmony: the final channel
  g.stop = s.stop;
  for (int64_t id : s.stop_token_ids) {
    if (id < 0 || id >= tok.size())
      throw bad_request("'stop_token_ids' id " + std::to_string(id) + " is not in the vocabulary", "stop_token_ids");
    g.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  // n > 1 with a seed: each choice gets its own stream of random numbers (wrapping, not
  // overflowing, at the ends of int64).
  if (s.seed) g.sampling.seed = static_cast<uint64_t>(*s.seed) + static_cast<uint64_t>(index);
  return m;
}

ApiError refusal_error(const ToolRequest& tools, const EngineEvent& refused) {
  if (refused.refused_part == "json_schema") {
    if (!tools.schema.is_null()) return bad_request("the tools' parameters: " + refused.error, "tools");
    return bad_request("'response_format.json_schema.schema': " + refused.error, "response_format");
  }
  return bad_request(refused.error);
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, bool add_special, const std::string& param) {
  try {
    return tok.encode(text, add_special);
  } catch (const Error& e) {
    throw bad_request(std::string("the prompt cannot be tokenized: ") + e.what(), param);
  }
}

TokenizeRequest parse_tokenize_request(const json::Value& body) {
  TokenizeRequest r;
  const json::Value* p = field(body, "prompt");
  if (!p) p = field(body, "text");
  if (!p || !p->is_string()) throw bad_request("'prompt' must be a string", "prompt");
  r.text = p->as_string();
  if (auto v = field(body, "add_special_tokens")) r.add_special_tokens = bool_of(*v, "add_special_tokens");
  return r;
}

std::vector<int32_t> parse_detokenize_request(const json::Value& body, const Tokenizer& tok) {
  const json::Value* t = field(body, "tokens");
  if (!t || !t->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  return token_ids_of(*t, tok, "tokens");
}

}  // namespace kvpr
