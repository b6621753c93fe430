#include "openai/generic_tools.h"

#include <algorithm>
#include <utility>

namespace kvpr {

namespace {

// Calls as the model is asked to write them.
std::string calls_text(const std::vector<ChatToolCall>& calls) {
  json::Array list;
  for (const auto& c : calls) list.push_back(json::Object{{"name", c.name}, {"parameters", c.arguments}});
  return json::Value(std::move(list)).dump();
}

void append(std::string& to, const std::string& text) {
  if (!to.empty() && !text.empty()) to += "\n\n";
  to += text;
}

}  // namespace

std::string generic_tools_prompt(const GenericToolChoice& choice) {
  std::string p = "# Tools\n\nYou can call these functions, each given as a JSON Schema of its parameters:\n";
  for (const auto& tool : choice.tools)
    if (const json::Value* fn = tool.find("function")) p += fn->dump() + "\n";
  if (!choice.named.empty()) {  // (the answer is constrained to its arguments alone)
    p += "\nNow call the function " + choice.named + ": answer with only its arguments, one JSON object, and "
         "nothing else.\n";
  } else {
    p += "\nTo call functions, answer with only a JSON list of the calls and nothing else:\n"
         "[{\"name\": \"<function name>\", \"parameters\": {<its arguments>}}]\n";
    p += choice.required ? "Now call at least one of the functions.\n" : "Otherwise answer in plain text.\n";
    if (!choice.parallel) p += "Call at most one function at a time.\n";
  }
  p += "Each call's result comes back in a message that starts with \"Tool result\".";
  return p;
}

std::vector<ChatMessage> generic_tool_messages(std::vector<ChatMessage> messages, const GenericToolChoice& choice,
                                               bool writes_system) {
  std::vector<ChatMessage> out;
  bool last_from_tool = false;  // out.back() holds a tool result
  for (auto& m : messages) {
    const bool from_tool = m.role == "tool";
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      append(m.content, calls_text(m.tool_calls));
      m.tool_calls.clear();
    } else if (from_tool) {
      m.role = "user";
      m.content = "Tool result" + (m.tool_call_id.empty() ? "" : " (" + m.tool_call_id + ")") + ":\n" + m.content;
      m.tool_call_id.clear();
    }
    // A result joins the user message next to it (templates that want turns to alternate); two
    // user messages the client sent stay two, as the template takes them.
    if (m.role == "user" && !out.empty() && out.back().role == "user" && (from_tool || last_from_tool)) {
      append(out.back().content, m.content);
      last_from_tool = true;
    } else {
      out.push_back(std::move(m));
      last_from_tool = from_tool;
    }
  }
  if (choice.tools.empty()) return out;
  const std::string tools = generic_tools_prompt(choice);
  if (!out.empty() && out.front().role == "system") {
    append(out.front().content, tools);
  } else if (writes_system) {
    out.insert(out.begin(), ChatMessage("system", tools));
  } else {
    auto user = std::find_if(out.begin(), out.end(), [](const ChatMessage& m) { return m.role == "user"; });
    if (user == out.end()) out.insert(out.begin(), ChatMessage("user", tools));
    else user->content = tools + "\n\n" + user->content;
  }
  return out;
}

}  // namespace kvpr
