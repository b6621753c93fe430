// Tools for a model whose chat template writes none (the tool-call parser "generic"; llama.cpp
// serves such models the same way): the tools are described in a system message the template
// does render, asking for the calls as a JSON list of {"name", "parameters"} and nothing else
// (what tool_choice "required" is constrained to; a named function's answer is its arguments
// alone, and the instruction says so);
// the conversation's earlier calls are written as that list and their results as user messages,
// so that a template that knows no tool calls or "tool" role renders the whole conversation.
// The answer is parsed back by parse_generic_tool_calls (openai/tool_calls.h).
#pragma once

#include <string>
#include <vector>

#include "engine/base/json.h"
#include "openai/chat_template.h"

namespace kvpr {

// What the request asks of the tools (ToolRequest's fields, below openai/request.h).
struct GenericToolChoice {
  const json::Array& tools;  // {"type": "function", "function": {...}}; empty: none in the prompt
  bool required = false;     // tool_choice "required"
  std::string named;         // tool_choice naming a function
  bool parallel = true;
};

// The system message's text describing `choice`'s tools.
std::string generic_tools_prompt(const GenericToolChoice& choice);

// `messages` as a template without tools renders them: the tools' description first (in the
// system message, after its own text; in the first user message when `writes_system` is false),
// assistant tool calls as the JSON list after the message's text, "tool" messages as user
// messages "Tool result (<id>):\n<content>", each joined by a blank line to a user message beside it.
std::vector<ChatMessage> generic_tool_messages(std::vector<ChatMessage> messages, const GenericToolChoice& choice,
                                               bool writes_system);

}  // namespace kvpr
