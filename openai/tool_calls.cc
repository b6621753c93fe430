#include "openai/tool_calls.h"

#include <algorithm>

#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

// An object {"name": string, "arguments": ...} as a call (with `or_parameters`, "parameters"
// where there are no "arguments"; with `object_arguments`, only arguments that are an object);
// nullopt when it is not one. A key given twice counts with its last value, as in the dict
// json.loads makes.
std::optional<ToolCallText> call_of(const json::Value& v, bool or_parameters, bool object_arguments = false) {
  if (!v.is_object()) return std::nullopt;
  const json::Value *name = nullptr, *args = nullptr, *params = nullptr;
  for (const auto& [k, e] : v.as_object()) {
    if (k == "name") name = &e;
    if (k == "arguments") args = &e;
    if (k == "parameters") params = &e;
  }
  if (!args && or_parameters) args = params;
  if (!name || !name->is_string() || !args || (object_arguments && !args->is_object())) return std::nullopt;
  return ToolCallText{name->as_string(), args->dump_python()};
}

// One block's JSON as a call; nullopt when it is not one.
std::optional<ToolCallText> parse_call(std::string_view body) {
  try {
    return call_of(json::parse(body), false);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

ToolCallParse parse_hermes_tool_calls(std::string_view answer) {
  ToolCallParse out;
  const size_t first = answer.find(kOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(answer);
    return out;
  }
  for (size_t at = first; at != std::string_view::npos; at = answer.find(kOpen, at)) {
    const size_t body = at + kOpen.size();
    const size_t close = answer.find(kClose, body);
    const size_t end = close == std::string_view::npos ? answer.size() : close;
    std::optional<ToolCallText> call = parse_call(answer.substr(body, end - body));
    if (!call) return ToolCallParse{std::string(answer), {}};
    out.calls.push_back(std::move(*call));
    at = close == std::string_view::npos ? std::string_view::npos : close + kClose.size();
  }
  if (first > 0) out.content = std::string(answer.substr(0, first));
  return out;
}

ToolCallParse parse_llama3_json_tool_calls(std::string_view answer) {
  ToolCallParse out;
  const size_t first = answer.find('{');
  if (first == std::string_view::npos) {
    out.content = std::string(answer);
    return out;
  }
  // Braces inside an object already parsed are not calls, nor (as in vLLM's loop) one right
  // after it.
  size_t end = 0;
  for (size_t at = first; at != std::string_view::npos; at = answer.find('{', std::max(at, end) + 1)) {
    json::Value obj;
    size_t len = 0;
    try {
      obj = json::parse_leading(answer.substr(at), &len);
    } catch (const Error&) {
      return ToolCallParse{std::string(answer), {}};
    }
    end = at + len;
    std::optional<ToolCallText> call = call_of(obj, true);
    if (!call) return ToolCallParse{std::string(answer), {}};
    out.calls.push_back(std::move(*call));
  }
  std::string before(answer.substr(0, first));
  if (before.starts_with("<|python_tag|>")) before.erase(0, 14);
  if (!before.empty()) out.content = std::move(before);
  return out;
}

ToolCallParse parse_mistral_tool_calls(std::string_view answer) {
  constexpr std::string_view kMark = "[TOOL_CALLS]";
  const size_t at = answer.find(kMark);
  if (at == std::string_view::npos) return ToolCallParse{std::string(answer), {}};
  // Everything after the first marker (later markers dropped) is the calls' JSON.
  std::string rest;
  for (size_t from = at; from != std::string_view::npos;) {
    const size_t next = answer.find(kMark, from + kMark.size());
    rest += answer.substr(from + kMark.size(), next == std::string_view::npos ? std::string_view::npos : next - from - kMark.size());
    from = next;
  }
  auto fail = [&] {
    std::string text(answer.substr(0, at));
    return ToolCallParse{text + rest, {}};
  };
  json::Value v;
  try {
    v = json::parse(rest);
  } catch (const Error&) {
    return fail();
  }
  json::Array list = v.is_array() ? v.as_array() : json::Array{v};
  ToolCallParse out;
  for (const auto& c : list) {
    std::optional<ToolCallText> call = call_of(c, false);
    if (!call) return fail();
    out.calls.push_back(std::move(*call));
  }
  if (out.calls.empty()) return fail();
  if (at > 0) out.content = std::string(answer.substr(0, at));
  return out;
}

namespace {

// The answer less surrounding whitespace and a Markdown code fence (``` or ```json), as models
// trained on chat data often wrap JSON.
std::string_view unfenced(std::string_view a) {
  auto trim = [](std::string_view v) {
    const size_t b = v.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return std::string_view();
    return v.substr(b, v.find_last_not_of(" \t\r\n") - b + 1);
  };
  a = trim(a);
  if (a.size() >= 6 && a.starts_with("```") && a.ends_with("```")) {
    a = a.substr(3, a.size() - 6);
    if (a.starts_with("json")) a.remove_prefix(4);
    a = trim(a);
  }
  return a;
}

}  // namespace

ToolCallParse parse_generic_tool_calls(std::string_view answer) {
  const std::string_view body = unfenced(answer);
  ToolCallParse text{std::string(answer), {}};
  if (body.empty() || (body[0] != '[' && body[0] != '{')) return text;
  json::Value v;
  try {
    v = json::parse(body);
  } catch (const Error&) {
    return text;
  }
  const json::Array list = v.is_array() ? v.as_array() : json::Array{v};
  ToolCallParse out;
  for (const auto& c : list) {
    std::optional<ToolCallText> call = call_of(c, true, true);
    if (!call) return text;
    out.calls.push_back(std::move(*call));
  }
  if (out.calls.empty()) return text;
  return out;
}

ToolCallParse parse_tool_calls(std::string_view parser, std::string_view answer) {
  if (parser == "hermes") return parse_hermes_tool_calls(answer);
  if (parser == "llama3_json") return parse_llama3_json_tool_calls(answer);
  if (parser == "mistral") return parse_mistral_tool_calls(answer);
  if (parser == "generic") return parse_generic_tool_calls(answer);
  KVPR_THROW("unknown tool-call parser '", parser, "' (hermes, llama3_json, mistral, generic)");
}

ToolCallStream::ToolCallStream(std::string parser) : parser_(std::move(parser)) {
  if (parser_ == "hermes") marker_ = std::string(kOpen);
  else if (parser_ == "llama3_json") marker_ = "{";
  else if (parser_ == "mistral") marker_ = "[TOOL_CALLS]";
  else if (parser_ != "generic") KVPR_THROW("unknown tool-call parser '", parser_, "' (hermes, llama3_json, mistral, generic)");
}

ToolCallStream::Delta ToolCallStream::feed(std::string_view text) {
  Delta d;
  if (in_calls_) {
    held_ += text;
    return d;
  }
  if (plain_) {
    d.content = std::string(text);
    return d;
  }
  pending_ += text;
  if (parser_ == "generic") {
    // Calls only at the answer's start: held once it opens with '[', '{' or a fence; any other
    // first character makes the whole answer content.
    const size_t b = pending_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return d;
    // (A fence is held only as ```json or a bare ``` on its line: ```python is prose with code.)
    const std::string_view start = std::string_view(pending_).substr(b);
    const bool json_fence = start.starts_with("```json") || start.starts_with("```\n") || start.starts_with("```\r");
    if (!json_fence && start.size() < 7 && std::string_view("```json").starts_with(start)) return d;
    if (start[0] == '[' || start[0] == '{' || json_fence) {
      held_ = std::move(pending_);
      pending_.clear();
      in_calls_ = true;
      return d;
    }
    plain_ = true;
    d.content = std::move(pending_);
    pending_.clear();
    return d;
  }
  if (parser_ == "llama3_json" && !emitted_) {
    // An answer that opens with <|python_tag|> (where the tokenizer writes it as text) is a
    // call's opening: held like the call, which drops it.
    constexpr std::string_view tag = "<|python_tag|>";
    if (pending_.size() < tag.size() && tag.starts_with(pending_)) return d;
    if (pending_.starts_with(tag)) {
      held_ = std::move(pending_);
      pending_.clear();
      in_calls_ = true;
      return d;
    }
  }
  if (const size_t at = pending_.find(marker_); at != std::string::npos) {
    d.content = pending_.substr(0, at);
    held_ = pending_.substr(at);
    pending_.clear();
    in_calls_ = true;
    return d;
  }
  // Hold the longest tail that is a proper prefix of the tag.
  size_t keep = 0;
  for (size_t n = std::min(pending_.size(), marker_.size() - 1); n > 0; --n)
    if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(marker_).substr(0, n)) {
      keep = n;
      break;
    }
  d.content = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  emitted_ = emitted_ || !d.content.empty();
  return d;
}

ToolCallStream::Delta ToolCallStream::finish() {
  Delta d;
  d.content = std::move(pending_);
  pending_.clear();
  if (in_calls_) {
    ToolCallParse p = parse_tool_calls(parser_, held_);
    if (p.calls.empty()) d.content += p.content.value_or(held_);  // calls that do not parse: text
    else d.calls = std::move(p.calls);
    held_.clear();
    in_calls_ = false;
  }
  return d;
}

}  // namespace kvpr
