// gpt-oss's harmony format: answers split by channel into reasoning, content and tool calls
// (whole and streamed in any pieces, which agree), responses built from the worker's events
// whose text leaves the format's special tokens out, and the built-in harmony chat template.
#include <gtest/gtest.h>

#include <random>

#include "openai/chat_template.h"
#include "openai/harmony.h"
#include "openai/response.h"
#include "tests/openai/openai_fixtures.h"
#include "tests/test_util.h"

namespace kvpr {
namespace {

using test::finish_event;
using test::qwen_tokenizer;
using test::token_event;

HarmonyStream::Delta streamed(const std::string& text, std::mt19937& rng) {
  HarmonyStream s;
  HarmonyStream::Delta all;
  auto add = [&](HarmonyStream::Delta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.calls) all.calls.push_back(std::move(c));
  };
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(text.size() - at, size_t{1} + rng() % 7);
    add(s.feed(std::string_view(text).substr(at, n)));
    at += n;
  }
  add(s.finish());
  return all;
}

// A harmony response's state with its markers at ids 1000.. (harmony_special_tokens' order), and
// an event of one of them.
ResponseState harmony_response() {
  ResponseState r;
  r.chat = true;
  r.harmony = true;
  int32_t id = 1000;
  for (const std::string& s : harmony_special_tokens()) r.markers.emplace_back(id++, s);
  r.choices.resize(1);
  return r;
}
EngineEvent special(const ResponseState& r, const std::string& s) {
  for (const auto& [i, t] : r.markers)
    if (t == s) return token_event(i, "");
  ADD_FAILURE() << s;
  return token_event(0, "");
}

// `events` into r whole and into a copy as a stream: what the stream's deltas said.
struct StreamedChat {
  std::string reasoning, content, finish;
  json::Array calls;
};
StreamedChat add_and_stream(ResponseState& r, const std::vector<EngineEvent>& events, const ResponseContext& ctx) {
  ResponseState s = r;
  StreamedChat out;
  for (const EngineEvent& ev : events) {
    add_event(r, 0, ev);
    add_event(s, 0, ev);
    for (const json::Value& chunk : stream_chunks(s, 0, ev, ctx)) {
      const json::Value& ch = chunk.find("choices")->as_array().at(0);
      if (const json::Value* d = ch.find("delta")) {
        if (const json::Value* x = d->find("reasoning_content")) out.reasoning += x->as_string();
        if (const json::Value* x = d->find("content")) out.content += x->as_string();
        if (const json::Value* x = d->find("tool_calls"))
          for (const auto& c : x->as_array()) out.calls.push_back(c);
      }
      if (!ch.find("finish_reason")->is_null()) out.finish = ch.find("finish_reason")->as_string();
    }
  }
  return out;
}

TEST(Harmony, ChannelsBecomeReasoningContentAndCalls) {
  struct Case {
    const char* text;
    const char* reasoning;
    const char* content;
    std::vector<ToolCallText> calls;
  };
  const Case cases[] = {
      // Reasoning, then the answer (after the prompt's "<|start|>assistant").
      {"<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
       "The user greets.", "Hello!", {}},
      // A call: the recipient after the channel, the content type with <|constrain|>.
      {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
       "Need weather.", "", {{"get_weather", "{\"city\": \"Oslo\"}"}}},
      // The recipient in the header before the channel; a preamble to no one is content.
      {"<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.a<|channel|>commentary "
       "json<|message|>{}<|call|>",
       "", "Checking both.", {{"a", "{}"}}},
      // The first message's recipient before its channel (the prompt wrote "<|start|>assistant"), as
      // the template writes earlier calls.
      {" to=functions.get_weather<|channel|>commentary json<|message|>{\"a\": 1}<|call|>", "", "",
       {{"get_weather", "{\"a\": 1}"}}},
      // A model that wrote no header: all content; "<|" that opens none of the format's tokens is text.
      {"plain <|x|> text", "", "plain <|x|> text", {}},
      // Cut off (max_tokens) in the reasoning, and in a call's arguments.
      {"<|channel|>analysis<|message|>Thinking abo", "Thinking abo", "", {}},
      {"<|channel|>commentary to=functions.f<|message|>{\"a\": 1", "", "", {{"f", "{\"a\": 1"}}},
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    const HarmonyStream::Delta whole = HarmonyStream::parse(c.text);
    EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(whole.content, c.content) << c.text;
    ASSERT_EQ(whole.calls.size(), c.calls.size()) << c.text;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(whole.calls[i].name, c.calls[i].name);
      EXPECT_EQ(whole.calls[i].arguments, c.calls[i].arguments);
    }
    for (int trial = 0; trial < 20; ++trial) {  // any split of the text streams to the same
      const HarmonyStream::Delta s = streamed(c.text, rng);
      EXPECT_EQ(s.reasoning, whole.reasoning) << c.text;
      EXPECT_EQ(s.content, whole.content) << c.text;
      EXPECT_EQ(s.calls.size(), whole.calls.size()) << c.text;
    }
  }
}

// The worker's events carry the special tokens' ids with no text; the response puts their text
// back (GenerateRequest::markers) and splits the channels, whole and streamed alike.
TEST(Harmony, ResponsesFromEventsWhoseTextLeavesTheFormatOut) {
  ResponseState r = harmony_response();
  r.tools.parse = true;
  r.tools.parser = "harmony";
  std::vector<EngineEvent> events = {special(r, "<|channel|>"), token_event(5, "analysis"), special(r, "<|message|>"),
                                     token_event(6, "Look it up."), special(r, "<|end|>"), special(r, "<|start|>"),
                                     token_event(7, "assistant"), special(r, "<|channel|>"),
                                     token_event(8, "commentary to=functions.get"), special(r, "<|message|>"),
                                     token_event(9, "{\"q\": 1}"), special(r, "<|call|>"), finish_event("stop")};
  IdMaker ids;
  const ResponseContext ctx{qwen_tokenizer(), false, ids};
  const StreamedChat st = add_and_stream(r, events, ctx);
  EXPECT_EQ(st.reasoning, "Look it up.");
  EXPECT_EQ(st.content, "");
  EXPECT_EQ(st.finish, "tool_calls");
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls.at(0).find("function")->find("name")->as_string(), "get");
  EXPECT_EQ(st.calls.at(0).find("function")->find("arguments")->as_string(), "{\"q\": 1}");
  const json::Value body = response_json(r, ctx);
  const json::Value& choice = body.find("choices")->as_array().at(0);
  EXPECT_EQ(choice.find("finish_reason")->as_string(), "tool_calls");
  EXPECT_TRUE(choice.find("message")->find("content")->is_null());
  EXPECT_EQ(choice.find("message")->find("reasoning_content")->as_string(), "Look it up.");
  EXPECT_EQ(choice.find("message")->find("tool_calls")->as_array().at(0).find("function")->find("name")->as_string(),
            "get");
}

// A JSON response format constrains the final channel's message: content is that message alone
// (a preamble, commentary to no one, goes to reasoning then), whole and streamed; without one a
// preamble is content, as before.
TEST(Harmony, AJsonFormatsContentIsTheFinalMessageAlone) {
  for (bool json_format : {true, false}) {
    ResponseState r = harmony_response();
    if (json_format) r.sampling.json_object = true;
    r.choices[0].harmony = HarmonyStream(json_format);  // (as start_response sets it)
    std::vector<EngineEvent> events = {special(r, "<|channel|>"), token_event(5, "analysis"), special(r, "<|message|>"),
                                       token_event(6, "Check."), special(r, "<|end|>"), special(r, "<|start|>"),
                                       token_event(7, "assistant"), special(r, "<|channel|>"),
                                       token_event(8, "commentary"), special(r, "<|message|>"),
                                       token_event(9, "Formatting."), special(r, "<|end|>"), special(r, "<|start|>"),
                                       token_event(7, "assistant"), special(r, "<|channel|>"), token_event(10, "final"),
                                       special(r, "<|message|>"), token_event(11, "{\"a\":"), token_event(12, "1}"),
                                       special(r, "<|return|>"), finish_event("stop")};
    IdMaker ids;
    const ResponseContext ctx{qwen_tokenizer(), false, ids};
    const StreamedChat st = add_and_stream(r, events, ctx);
    const json::Value body = response_json(r, ctx);
    const json::Value& msg = *body.find("choices")->as_array().at(0).find("message");
    const std::string content = json_format ? "{\"a\":1}" : "Formatting.{\"a\":1}";
    const std::string reasoning = json_format ? "Check.Formatting." : "Check.";
    EXPECT_EQ(st.content, content);
    EXPECT_EQ(msg.find("content")->as_string(), content);
    EXPECT_EQ(st.reasoning, reasoning);
    EXPECT_EQ(msg.find("reasoning_content")->as_string(), reasoning);
    EXPECT_EQ(st.finish, "stop");
    EXPECT_TRUE(st.calls.empty());
  }
}

// A forced call (tool_choice named or required): the prompt opened the message, so the answer is
// its body alone, read as other templates' forced calls are: the named function's arguments, or
// the list of calls (finish reason tool_calls), whole and streamed alike.
TEST(Harmony, AForcedCallIsTheBodyOfTheMessageThePromptOpened) {
  for (bool named : {true, false}) {
    GenerateRequest req;
    req.chat = true;
    req.harmony = true;
    int32_t id = 1000;
    for (const std::string& s : harmony_special_tokens()) req.markers.emplace_back(id++, s);
    if (named) {
      req.tools.named = "get_weather";
      req.answer_opening = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
    } else {
      req.tools.required = true;
      req.answer_opening = "<|channel|>final<|message|>";
    }
    ResponseState r = start_response(req, Prompts{{{1}}, {""}}, "chatcmpl-1", 0, "o");
    EXPECT_FALSE(r.harmony);
    std::vector<EngineEvent> events = {
        token_event(5, named ? "{\"city\":" : "[{\"name\":\"get_weather\",\"parameters\":{\"city\":"),
        token_event(6, named ? "\"Oslo\"}" : "\"Oslo\"}}]"), special(r, named ? "<|call|>" : "<|return|>"),
        finish_event("stop")};
    IdMaker ids;
    const ResponseContext ctx{qwen_tokenizer(), false, ids};
    const StreamedChat st = add_and_stream(r, events, ctx);
    const json::Value body = response_json(r, ctx);
    const json::Value& choice = body.find("choices")->as_array().at(0);
    const json::Value& msg = *choice.find("message");
    const std::string arguments = named ? "{\"city\":\"Oslo\"}" : "{\"city\": \"Oslo\"}";
    ASSERT_EQ(msg.find("tool_calls")->as_array().size(), 1u) << body.dump();
    const json::Value& fn = *msg.find("tool_calls")->as_array().at(0).find("function");
    EXPECT_EQ(fn.find("name")->as_string(), "get_weather");
    EXPECT_EQ(fn.find("arguments")->as_string(), arguments);
    EXPECT_TRUE(msg.find("content")->is_null());
    EXPECT_EQ(choice.find("finish_reason")->as_string(), named ? "stop" : "tool_calls");  // (as OpenAI's)
    std::string streamed_arguments;
    for (const json::Value& c : st.calls) {
      const json::Value& f = *c.find("function");
      if (const json::Value* n = f.find("name")) {
        EXPECT_EQ(n->as_string(), "get_weather");
      }
      streamed_arguments += f.find("arguments")->as_string();
    }
    EXPECT_EQ(streamed_arguments, arguments);
    EXPECT_EQ(st.content, "");
    EXPECT_EQ(st.reasoning, "");
    EXPECT_EQ(st.finish, named ? "stop" : "tool_calls");
  }
}

// The built-in template writes the format as gpt-oss's card describes it: system and developer
// messages, the tools as a TypeScript namespace, earlier calls and results, reasoning kept only
// for calls no answer has followed yet.
TEST(Harmony, BuiltInTemplateWritesTheFormat) {
  ChatOptions o;
  o.template_kwargs.emplace_back("reasoning_effort", "high");
  o.tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Where"},
      "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}, "days": {"type": "array",
      "items": {"type": "integer"}}}, "required": ["city"]}}}])").as_array();
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Weather in Oslo?"}};
  ChatMessage call("assistant", "");
  call.reasoning = "Need the tool.";
  call.tool_calls.push_back(ChatToolCall{"get_weather", json::parse(R"({"city": "Oslo"})"), "c1"});
  m.push_back(call);
  ChatMessage result("tool", "{\"temp\": 3}");
  result.tool_call_id = "c1";
  m.push_back(result);
  const RenderedChat r = render_chat("harmony", m, o);
  EXPECT_EQ(r.prompt.rfind("<|start|>system<|message|>You are ChatGPT", 0), 0u);
  EXPECT_HAS(r.prompt, "Reasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
                       "every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>");
  EXPECT_HAS(r.prompt, "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
                       "namespace functions {\n\n// Weather now.\ntype get_weather = (_: {\n// Where\ncity: string,\n"
                       "unit?: \"c\" | \"f\", // default: \"c\",\ndays?: number[],\n}) => any;\n\n} // namespace "
                       "functions<|end|>");
  EXPECT_HAS(r.prompt, "<|start|>user<|message|>Weather in Oslo?<|end|>"
                       "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
                       "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                       "{\"city\": \"Oslo\"}<|call|>"
                       "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                       "\"{\\\"temp\\\": 3}\"<|end|>"
                       "<|start|>assistant");
  EXPECT_EQ(r.stop_tokens, (std::vector<std::string>{"<|return|>", "<|call|>"}));
  // Once an answer follows, the reasoning before the call is dropped.
  m.push_back(ChatMessage("assistant", "3 degrees."));
  m.push_back(ChatMessage("user", "Thanks"));
  const RenderedChat later = render_chat("harmony", m, o);
  EXPECT_EQ(later.prompt.find("Need the tool."), std::string::npos);
  EXPECT_HAS(later.prompt, "<|start|>assistant<|channel|>final<|message|>3 degrees.<|end|>");
  std::string why;
  EXPECT_EQ(chat_template_family("{{ '<|start|>' }}{{ '<|channel|>final<|message|>' }}", &why), "harmony");
  EXPECT_EQ(chat_tool_call_parser("harmony"), "harmony");
}

// A response_format json_schema is told to the model as the format's guide writes it: a
// "# Response Formats" section last in the developer message (its name, description, schema).
TEST(Harmony, BuiltInTemplateWritesTheResponseFormat) {
  ChatOptions o;
  o.response_format = json::parse(R"({"name": "shopping_list", "description": "What to buy.", "schema":
      {"properties": {"items": {"type": "array", "items": {"type": "string"}}}, "type": "object"}})");
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Coffee and eggs"}};
  EXPECT_HAS(render_chat("harmony", m, o).prompt,
             "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Response Formats\n\n## shopping_list\n\n"
             "// What to buy.\n{\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
             "\"type\":\"object\"}<|end|><|start|>user<|message|>Coffee and eggs<|end|><|start|>assistant");
  o.response_format = json::parse(R"({"schema": {"type": "object"}})");  // no name, no description; no system message
  const std::string p = render_chat("harmony", {{"user", "Hi"}}, o).prompt;
  EXPECT_HAS(p, "<|start|>developer<|message|># Response Formats\n\n## response\n\n{\"type\":\"object\"}<|end|>");
}

}  // namespace
}  // namespace kvpr
