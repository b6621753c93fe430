#include "openai/responses.h"

#include <algorithm>

#include "engine/base/error.h"

namespace kvpr {

namespace {

const json::Value* field(const json::Value& o, std::string_view k) {
  const json::Value* v = o.find(k);
  return v && !v->is_null() ? v : nullptr;
}

std::string type_of(const json::Value& item) {
  if (const json::Value* t = field(item, "type"); t && t->is_string()) return t->as_string();
  return field(item, "role") ? "message" : "";
}

ApiError input_error(const std::string& where, const std::string& what) { return bad_request(where + " " + what, "input"); }

// A message item's content: a string, or parts (input_text; output_text and refusal in an
// assistant's earlier answer).
std::string content_text(const json::Value& item, const std::string& where) {
  const json::Value* content = field(item, "content");
  if (!content) throw input_error(where, "needs 'content' (a string or text parts)");
  if (content->is_string()) return content->as_string();
  if (!content->is_array()) throw input_error(where, "'content' must be a string or a list of parts");
  std::string text;
  for (const auto& part : content->as_array()) {
    const std::string t = part.is_object() ? type_of(part) : "";
    const json::Value* s = part.is_object() ? field(part, t == "refusal" ? "refusal" : "text") : nullptr;
    if ((t != "input_text" && t != "output_text" && t != "text" && t != "refusal") || !s || !s->is_string())
      throw input_error(where, "has a content part of type '" + t + "': only text parts are supported (input_text, "
                               "output_text)");
    text += s->as_string();
  }
  return text;
}

// A reasoning item's text (its content's reasoning_text parts, else its summary's).
std::string reasoning_text(const json::Value& item) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    if (const json::Value* parts = field(item, key); parts && parts->is_array())
      for (const auto& p : parts->as_array())
        if (const json::Value* t = p.is_object() ? field(p, "text") : nullptr; t && t->is_string()) text += t->as_string();
    if (!text.empty()) break;
  }
  return text;
}

const std::string& string_field(const json::Value& item, const char* key, const std::string& where) {
  const json::Value* v = field(item, key);
  if (!v || !v->is_string()) throw input_error(where, std::string("needs a string '") + key + "'");
  return v->as_string();
}

// The items as chat messages: a function_call joins the assistant message before it (or makes
// one), its output is a tool message, a reasoning item's text goes to the next assistant message.
json::Array chat_messages(const json::Array& items) {
  json::Array messages;
  std::string reasoning;
  auto assistant = [&](json::Object m) {
    if (!reasoning.empty()) m.emplace_back("reasoning_content", std::move(reasoning));
    reasoning.clear();
    messages.push_back(std::move(m));
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const json::Value& item = items[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) throw input_error(where, "must be an object");
    const std::string type = type_of(item);
    if (type == "message") {
      const std::string& role = string_field(item, "role", where);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        throw input_error(where, "has role '" + role + "' (user, system, developer or assistant)");
      json::Object m{{"role", role}, {"content", content_text(item, where)}};
      if (role == "assistant") {
        assistant(std::move(m));
      } else {
        reasoning.clear();  // (reasoning that no answer followed belongs to no later turn)
        messages.push_back(std::move(m));
      }
    } else if (type == "function_call") {
      json::Object call{{"id", string_field(item, "call_id", where)},
                        {"type", "function"},
                        {"function", json::Object{{"name", string_field(item, "name", where)},
                                                  {"arguments", string_field(item, "arguments", where)}}}};
      json::Value* last = messages.empty() ? nullptr : &messages.back();
      if (last && last->find("role")->as_string() == "assistant" && reasoning.empty()) {
        if (const json::Value* calls = last->find("tool_calls")) {
          json::Array list = calls->as_array();
          list.push_back(std::move(call));
          last->set("tool_calls", std::move(list));
        } else {
          last->set("tool_calls", json::Array{std::move(call)});
        }
      } else {
        assistant(json::Object{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::Array{std::move(call)}}});
      }
    } else if (type == "function_call_output") {
      const json::Value* out = field(item, "output");
      std::string text;
      if (out && out->is_string()) text = out->as_string();
      else if (out && out->is_array()) text = content_text(json::Object{{"content", *out}}, where + ".output");
      else throw input_error(where, "needs 'output' (a string or text parts)");
      reasoning.clear();
      messages.push_back(json::Object{{"role", "tool"}, {"tool_call_id", string_field(item, "call_id", where)},
                                      {"content", std::move(text)}});
    } else if (type == "reasoning") {
      reasoning += reasoning_text(item);
    } else {
      throw input_error(where, "has type '" + type + "', which this server does not take (message, function_call, "
                               "function_call_output, reasoning)");
    }
  }
  return messages;
}

// `v` (an object) with only the keys this server reads; a content list's parts likewise.
json::Value known_fields(const json::Value& v) {
  if (!v.is_object()) return v;
  static const char* const kKeys[] = {"type", "id", "role", "content", "status", "call_id", "name", "arguments",
                                      "output", "summary", "text", "refusal"};
  json::Object out;
  for (const auto& [k, e] : v.as_object()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), k) == std::end(kKeys)) continue;
    if ((k == "content" || k == "summary" || k == "output") && e.is_array()) {
      json::Array parts;
      for (const auto& p : e.as_array()) parts.push_back(known_fields(p));
      out.emplace_back(k, std::move(parts));
    } else {
      out.emplace_back(k, e);
    }
  }
  return out;
}

// The request's input as items, with the fields this server reads: a string is one user message.
json::Array input_items(const json::Value& body) {
  const json::Value* input = field(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  if (input->is_string())
    return json::Array{json::Object{{"type", "message"}, {"role", "user"}, {"content", input->as_string()}}};
  if (!input->is_array()) throw bad_request("'input' must be a string or a list of items", "input");
  json::Array items;
  for (const auto& item : input->as_array()) items.push_back(known_fields(item));
  return items;
}

// Responses tools ({"type": "function", "name", "description", "parameters", "strict"}) as chat
// tools; the built-in ones are refused by name.
json::Array chat_tools(const json::Value& tools) {
  if (!tools.is_array()) throw bad_request("'tools' must be a list", "tools");
  json::Array out;
  for (size_t i = 0; i < tools.as_array().size(); ++i) {
    const json::Value& t = tools.as_array()[i];
    const std::string type = t.is_object() ? type_of(t) : "";
    if (type != "function")
      throw bad_request("tools[" + std::to_string(i) + "] is of type '" + type + "': this server runs function tools "
                        "only (built-in tools such as web_search, file_search, code_interpreter, computer use or "
                        "MCP are not available)", "tools");
    json::Object fn;
    for (const char* key : {"name", "description", "parameters"})
      if (const json::Value* v = field(t, key)) fn.emplace_back(key, *v);
    out.push_back(json::Object{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

json::Value chat_tool_choice(const json::Value& c) {
  if (c.is_string()) return c;
  const json::Value* type = c.is_object() ? field(c, "type") : nullptr;
  const json::Value* name = c.is_object() ? field(c, "name") : nullptr;
  if (type && type->is_string() && type->as_string() == "function" && name && name->is_string())
    return json::Object{{"type", "function"}, {"function", json::Object{{"name", *name}}}};
  throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...} "
                    "(built-in tools and allowed_tools are not available)", "tool_choice");
}

// text.format as a chat response_format.
json::Value chat_response_format(const json::Value& text) {
  const json::Value* format = text.is_object() ? field(text, "format") : nullptr;
  if (!text.is_object()) throw bad_request("'text' must be an object", "text");
  if (!format) return json::Value();
  const std::string type = format->is_object() ? type_of(*format) : "";
  if (type == "text" || type == "json_object") return json::Object{{"type", type}};
  if (type != "json_schema") throw bad_request("'text.format.type' must be text, json_object or json_schema", "text.format");
  json::Object js;
  for (const char* key : {"name", "schema", "strict"})
    if (const json::Value* v = field(*format, key)) js.emplace_back(key, *v);
  return json::Object{{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

void check_metadata(const json::Value& m) {
  if (!m.is_object() || m.as_object().size() > 16)
    throw bad_request("'metadata' must be an object of at most 16 string values", "metadata");
  for (const auto& [k, v] : m.as_object())
    if (k.size() > 64 || !v.is_string() || v.as_string().size() > 512)
      throw bad_request("'metadata' keys are at most 64 characters, values strings of at most 512", "metadata");
}

// Fields that change what a response is and that this server does not have: refused, not ignored.
void refuse_unsupported(const json::Value& body) {
  auto unsupported = [](const char* name, const char* what) {
    return bad_request(std::string("'") + name + "' is not supported by this server (" + what + ")", name);
  };
  if (const json::Value* v = field(body, "background"); v && !(v->is_bool() && !v->as_bool()))
    throw unsupported("background", "responses run while their request is open");
  if (field(body, "conversation")) throw unsupported("conversation", "use previous_response_id");
  if (field(body, "prompt")) throw unsupported("prompt", "reusable prompts");
  if (const json::Value* v = field(body, "truncation"); v && !(v->is_string() && v->as_string() == "disabled"))
    throw unsupported("truncation", "a conversation past the context is a 400, never cut");
  if (const json::Value* v = field(body, "include")) {
    if (!v->is_array()) throw bad_request("'include' must be a list of strings", "include");
    for (const auto& e : v->as_array())
      if (!e.is_string()) throw bad_request("'include' must be a list of strings", "include");
  }
}

bool includes(const json::Value& body, std::string_view what) {
  if (const json::Value* v = field(body, "include"))
    for (const auto& e : v->as_array())
      if (e.as_string() == what) return true;
  return false;
}

// The chat completion request the Responses request is.
json::Value chat_body(const json::Value& body, const json::Array& conversation) {
  json::Array messages;
  if (const json::Value* ins = field(body, "instructions")) {
    if (!ins->is_string()) throw bad_request("'instructions' must be a string", "instructions");
    messages.push_back(json::Object{{"role", "system"}, {"content", ins->as_string()}});
  }
  for (auto& m : chat_messages(conversation)) messages.push_back(std::move(m));
  json::Object chat{{"model", *body.find("model")}, {"messages", std::move(messages)}};
  // The sampling fields both APIs share, and vLLM's extensions, as they are.
  for (const char* key : {"temperature", "top_p", "top_logprobs", "stream", "parallel_tool_calls", "user", "top_k",
                          "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                          "stop_token_ids", "logit_bias", "min_tokens", "chat_template_kwargs"})
    if (const json::Value* v = field(body, key)) chat.emplace_back(key, *v);
  if (const json::Value* v = field(body, "max_output_tokens")) chat.emplace_back("max_completion_tokens", *v);
  if (includes(body, "message.output_text.logprobs") || field(body, "top_logprobs")) chat.emplace_back("logprobs", true);
  if (const json::Value* v = field(body, "tools")) chat.emplace_back("tools", chat_tools(*v));
  if (const json::Value* v = field(body, "tool_choice")) chat.emplace_back("tool_choice", chat_tool_choice(*v));
  if (const json::Value* v = field(body, "text"))
    if (json::Value f = chat_response_format(*v); !f.is_null()) chat.emplace_back("response_format", std::move(f));
  return chat;
}

// The request's fields as the Response object repeats them.
json::Object echo_fields(const json::Value& body, const GenerateRequest& chat, const std::string& previous, bool store) {
  auto given = [&](const char* key, json::Value otherwise) {
    const json::Value* v = field(body, key);
    return v ? *v : otherwise;
  };
  json::Value reasoning = json::Object{{"effort", nullptr}, {"summary", nullptr}};
  if (const json::Value* r = field(body, "reasoning"); r && r->is_object())
    for (const char* key : {"effort", "summary"})
      if (const json::Value* v = field(*r, key)) reasoning.set(key, *v);
  return json::Object{{"instructions", given("instructions", nullptr)},
                      {"max_output_tokens", given("max_output_tokens", nullptr)},
                      {"max_tool_calls", nullptr},
                      {"metadata", given("metadata", json::Object{})},
                      {"parallel_tool_calls", chat.tools.parallel},
                      {"previous_response_id", previous.empty() ? json::Value() : json::Value(previous)},
                      {"reasoning", std::move(reasoning)},
                      {"store", store},
                      {"temperature", chat.sampling.temperature},
                      {"text", given("text", json::Object{{"format", json::Object{{"type", "text"}}}})},
                      {"tool_choice", given("tool_choice", "auto")},
                      {"tools", given("tools", json::Array{})},
                      {"top_p", chat.sampling.top_p},
                      {"truncation", "disabled"},
                      {"user", given("user", nullptr)}};
}

}  // namespace

std::string previous_response_id_of(const json::Value& body) {
  const json::Value* v = field(body, "previous_response_id");
  if (!v) return "";
  if (!v->is_string()) throw bad_request("'previous_response_id' must be a string", "previous_response_id");
  return v->as_string();
}

ApiError as_responses_error(ApiError e) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"messages", "input"}, {"max_completion_tokens", "max_output_tokens"}, {"max_tokens", "max_output_tokens"},
      {"response_format.json_schema.schema", "text.format.schema"}, {"response_format", "text.format"}};
  for (const auto& [chat, responses] : kNames) {
    if (e.param == chat) e.param = responses;
    for (size_t at; (at = e.message.find(std::string("'") + chat)) != std::string::npos;)
      e.message.replace(at + 1, std::string_view(chat).size(), responses);
  }
  // A chat message's index is not the input item's (instructions, merged calls, the stored
  // conversation): the place is named without it. A Responses tool has no "function" level.
  for (size_t at; (at = e.message.find("messages[")) != std::string::npos;) {
    const size_t end = e.message.find(']', at);
    e.message.replace(at, end == std::string::npos ? e.message.size() - at : end + 1 - at, "a message of the input");
  }
  for (size_t at; (at = e.message.find(".function.")) != std::string::npos;) e.message.replace(at, 10, ".");
  return e;
}

ResponsesRequest parse_responses_request(const json::Value& body, const ServedModel& served, const Tokenizer& tok,
                                         const json::Array* previous) {
  refuse_unsupported(body);
  ResponsesRequest r;
  r.previous_response_id = previous_response_id_of(body);
  if (const json::Value* v = field(body, "store")) {
    if (!v->is_bool()) throw bad_request("'store' must be a boolean", "store");
    r.store = v->as_bool();
  }
  if (const json::Value* v = field(body, "metadata")) check_metadata(*v);
  r.input = input_items(body);
  if (previous) r.conversation = *previous;
  for (const auto& item : r.input) r.conversation.push_back(item);
  try {
    r.chat = parse_generate_request(chat_body(body, r.conversation), true, served, tok);
  } catch (const ApiError& e) {
    throw as_responses_error(e);
  }
  r.echo = echo_fields(body, r.chat, r.previous_response_id, r.store);
  return r;
}

json::Value responses_usage(const json::Value& u) {
  const int64_t in = u.find("prompt_tokens")->as_int(), out = u.find("completion_tokens")->as_int();
  const json::Value* details = u.find("prompt_tokens_details");
  return json::Object{{"input_tokens", in},
                      {"input_tokens_details", json::Object{{"cached_tokens", details ? *details->find("cached_tokens") : json::Value(0)}}},
                      {"output_tokens", out},
                      {"output_tokens_details", json::Object{{"reasoning_tokens", 0}}},
                      {"total_tokens", in + out}};
}

ResponsesTurn::ResponsesTurn(ResponsesRequest req, std::string id, int64_t created_at, std::string model, IdMaker& ids)
    : req_(std::move(req)), id_(std::move(id)), created_at_(created_at), model_(std::move(model)), ids_(ids) {
  // Input items get ids where they have none, as OpenAI lists them (input_items).
  const size_t first = req_.conversation.size() - req_.input.size();
  for (size_t i = 0; i < req_.input.size(); ++i) {
    json::Value& item = req_.input[i];
    if (item.find("id")) continue;
    const std::string type = type_of(item);
    item.set("id", ids_.id(type == "function_call" ? "fc_" : type == "function_call_output" ? "fco_"
                           : type == "reasoning"   ? "rs_"
                                                   : "msg_"));
    req_.conversation[first + i] = item;
  }
}

json::Value ResponsesTurn::object() const {
  json::Object o{{"id", id_},
                 {"object", "response"},
                 {"created_at", created_at_},
                 {"status", status_},
                 {"background", false},
                 {"error", error_},
                 {"incomplete_details", incomplete_details_},
                 {"model", model_},
                 {"output", output_}};
  for (const auto& [k, v] : req_.echo) o.emplace_back(k, v);
  o.emplace_back("usage", usage_);
  return o;
}

void ResponsesTurn::set_status(const std::string& finish_reason, const json::Value& chat_usage) {
  status_ = finish_reason == "length" ? "incomplete" : "completed";
  if (finish_reason == "length") incomplete_details_ = json::Object{{"reason", "max_output_tokens"}};
  usage_ = responses_usage(chat_usage);
}

void ResponsesTurn::finish_whole(const json::Value& chat_completion) {
  const json::Value& choice = chat_completion.find("choices")->as_array().at(0);
  const json::Value& msg = *choice.find("message");
  set_status(choice.find("finish_reason")->as_string(), *chat_completion.find("usage"));
  const std::string item_status = status_ == "incomplete" ? "incomplete" : "completed";
  if (const json::Value* r = field(msg, "reasoning_content"); r && !r->as_string().empty())
    output_.push_back(json::Object{{"id", ids_.id("rs_")},
                                   {"type", "reasoning"},
                                   {"summary", json::Array{}},
                                   {"status", item_status},
                                   {"content", json::Array{json::Object{{"type", "reasoning_text"}, {"text", *r}}}}});
  const json::Value* calls = field(msg, "tool_calls");
  const json::Value* content = field(msg, "content");
  if (content || (!calls && output_.empty())) {  // (an answer of reasoning alone has no message, as streamed)
    json::Object part{{"type", "output_text"}, {"text", content ? *content : json::Value("")}, {"annotations", json::Array{}}};
    if (const json::Value* lp = field(choice, "logprobs")) part.emplace_back("logprobs", *lp->find("content"));
    output_.push_back(json::Object{{"id", ids_.id("msg_")},
                                   {"type", "message"},
                                   {"role", "assistant"},
                                   {"status", item_status},
                                   {"content", json::Array{std::move(part)}}});
  }
  if (calls)
    for (const auto& c : calls->as_array())
      output_.push_back(json::Object{{"id", ids_.id("fc_")},
                                     {"type", "function_call"},
                                     {"status", "completed"},
                                     {"call_id", *c.find("id")},
                                     {"name", *c.find("function")->find("name")},
                                     {"arguments", *c.find("function")->find("arguments")}});
}

ResponsesTurn::Event ResponsesTurn::event(std::string type, json::Object fields) {
  json::Object e{{"type", type}};
  for (auto& f : fields) e.push_back(std::move(f));
  e.emplace_back("sequence_number", sequence_++);
  return {std::move(type), std::move(e)};
}

std::vector<ResponsesTurn::Event> ResponsesTurn::start_events() {
  std::vector<Event> out;
  out.push_back(event("response.created", {{"response", object()}}));
  out.push_back(event("response.in_progress", {{"response", object()}}));
  return out;
}

void ResponsesTurn::open_item(std::vector<Event>& out, json::Object item, bool with_part) {
  close_open(out);
  open_ = static_cast<int64_t>(output_.size());
  for (const auto& [k, v] : item)
    if (k == "type") open_type_ = v.as_string();
  if (with_part) item.emplace_back("content", json::Array{});  // (the part is added next, as its own event)
  output_.push_back(item);
  out.push_back(event("response.output_item.added", {{"output_index", open_}, {"item", std::move(item)}}));
  if (!with_part) return;
  json::Object part{{"type", open_type_ == "reasoning" ? "reasoning_text" : "output_text"}, {"text", ""}};
  if (open_type_ == "message") part.emplace_back("annotations", json::Array{});
  json::Value& it = output_[static_cast<size_t>(open_)];
  it.set("content", json::Array{part});
  out.push_back(event("response.content_part.added", {{"item_id", *it.find("id")}, {"output_index", open_},
                                                      {"content_index", 0}, {"part", std::move(part)}}));
}

void ResponsesTurn::close_open(std::vector<Event>& out) {
  if (open_ < 0) return;
  json::Value& item = output_[static_cast<size_t>(open_)];
  const json::Value id = *item.find("id");
  if (open_type_ == "function_call") {
    out.push_back(event("response.function_call_arguments.done", {{"item_id", id}, {"output_index", open_},
                                                                  {"name", *item.find("name")},
                                                                  {"arguments", *item.find("arguments")}}));
    item.set("status", "completed");
  } else {
    const json::Value part = item.find("content")->as_array().at(0);
    const char* done = open_type_ == "reasoning" ? "response.reasoning_text.done" : "response.output_text.done";
    json::Object fields{{"item_id", id}, {"output_index", open_}, {"content_index", 0}, {"text", *part.find("text")}};
    if (const json::Value* lp = part.find("logprobs")) fields.emplace_back("logprobs", *lp);
    out.push_back(event(done, std::move(fields)));
    out.push_back(event("response.content_part.done",
                        {{"item_id", id}, {"output_index", open_}, {"content_index", 0}, {"part", part}}));
    item.set("status", status_ == "incomplete" ? "incomplete" : "completed");
  }
  out.push_back(event("response.output_item.done", {{"output_index", open_}, {"item", item}}));
  open_ = -1;
  open_type_.clear();
  open_call_index_ = -1;
}

std::vector<ResponsesTurn::Event> ResponsesTurn::chunk_events(const json::Value& chat_chunk) {
  std::vector<Event> out;
  const json::Value* choices = chat_chunk.find("choices");
  if (!choices || choices->as_array().empty()) return out;
  const json::Value& choice = choices->as_array()[0];
  const json::Value* delta = field(choice, "delta");
  if (!delta) return out;
  auto append_text = [&](const char* kind, const std::string& text, const json::Value* logprobs) {
    if (open_type_ != kind) {
      json::Object item{{"id", ids_.id(std::string_view(kind) == "reasoning" ? "rs_" : "msg_")}, {"type", kind}};
      if (std::string_view(kind) == "reasoning") item.emplace_back("summary", json::Array{});
      else item.emplace_back("role", "assistant");
      item.emplace_back("status", "in_progress");
      open_item(out, std::move(item), true);
    }
    json::Value& it = output_[static_cast<size_t>(open_)];
    json::Array content = it.find("content")->as_array();
    json::Value& part = content[0];
    part.set("text", part.find("text")->as_string() + text);
    json::Object fields{{"item_id", *it.find("id")}, {"output_index", open_}, {"content_index", 0}, {"delta", text}};
    if (std::string_view(kind) == "message") {
      json::Array lps = part.find("logprobs") ? part.find("logprobs")->as_array() : json::Array{};
      json::Array now = logprobs ? logprobs->as_array() : json::Array{};
      for (const auto& l : now) lps.push_back(l);
      if (logprobs) part.set("logprobs", std::move(lps));
      fields.emplace_back("logprobs", std::move(now));
    }
    it.set("content", std::move(content));
    out.push_back(event(std::string_view(kind) == "reasoning" ? "response.reasoning_text.delta"
                                                               : "response.output_text.delta",
                        std::move(fields)));
  };
  if (const json::Value* r = field(*delta, "reasoning_content"); r && !r->as_string().empty())
    append_text("reasoning", r->as_string(), nullptr);
  const json::Value* lp = field(choice, "logprobs");
  if (const json::Value* c = field(*delta, "content"); c && !c->as_string().empty())
    append_text("message", c->as_string(), lp ? lp->find("content") : nullptr);
  if (const json::Value* calls = field(*delta, "tool_calls"))
    for (const auto& call : calls->as_array()) {
      const int64_t index = call.find("index")->as_int();
      const json::Value& fn = *call.find("function");
      if (open_type_ != "function_call" || open_call_index_ != index) {
        open_item(out, json::Object{{"id", ids_.id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                                    {"call_id", *call.find("id")}, {"name", *fn.find("name")}, {"arguments", ""}},
                  false);
        open_call_index_ = index;
      }
      const std::string& args = fn.find("arguments")->as_string();
      if (args.empty()) continue;
      json::Value& it = output_[static_cast<size_t>(open_)];
      it.set("arguments", it.find("arguments")->as_string() + args);
      out.push_back(event("response.function_call_arguments.delta",
                          {{"item_id", *it.find("id")}, {"output_index", open_}, {"delta", args}}));
    }
  return out;
}

std::vector<ResponsesTurn::Event> ResponsesTurn::finish_events(const std::string& finish_reason,
                                                               const json::Value& chat_usage) {
  std::vector<Event> out;
  set_status(finish_reason, chat_usage);
  if (output_.empty())  // an empty answer is still a message
    open_item(out, json::Object{{"id", ids_.id("msg_")}, {"type", "message"}, {"role", "assistant"},
                                {"status", "in_progress"}},
              true);
  close_open(out);
  out.push_back(event(status_ == "incomplete" ? "response.incomplete" : "response.completed", {{"response", object()}}));
  return out;
}

std::vector<ResponsesTurn::Event> ResponsesTurn::error_events(const ApiError& e) {
  std::vector<Event> out;
  out.push_back(event("error", {{"code", e.type}, {"message", e.message},
                                {"param", e.param.empty() ? json::Value() : json::Value(e.param)}}));
  status_ = "failed";
  error_ = json::Object{{"code", e.type}, {"message", e.message}};
  out.push_back(event("response.failed", {{"response", object()}}));
  return out;
}

json::Array ResponsesTurn::stored_conversation() const {
  json::Array c = req_.conversation;
  for (const auto& item : output_) c.push_back(item);
  return c;
}

void ResponseStore::put(const std::string& id, const json::Value& response, const json::Array& conversation,
                        const json::Array& input, Clock::time_point now) {
  if (!enabled()) return;
  erase(id);
  Entry e;
  e.response = response.dump();
  e.conversation = json::Value(conversation).dump();
  e.input = json::Value(input).dump();
  e.bytes = e.response.size() + e.conversation.size() + e.input.size() + id.size();
  if (e.bytes > max_bytes_) return;  // larger than the whole store: not kept
  e.stored = now;
  bytes_ += e.bytes;
  order_.push_back(id);
  entries_.emplace(id, std::make_pair(std::move(e), std::prev(order_.end())));
  evict(now);
}

void ResponseStore::evict(Clock::time_point now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    const bool expired = now - it->second.first.stored > ttl_;
    if (!expired && entries_.size() <= max_entries_ && bytes_ <= max_bytes_) break;
    erase(order_.front());
  }
}

const ResponseStore::Entry* ResponseStore::find(const std::string& id, Clock::time_point now) {
  evict(now);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.first.bytes;
  order_.erase(it->second.second);
  entries_.erase(it);
  return true;
}

}  // namespace kvpr
