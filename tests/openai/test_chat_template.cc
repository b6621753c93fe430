// Chat templates (openai/chat_template.h): each renders the text its model's Jinja template
// gives for the same messages, and auto picks a template from tokenizer_config.json; and the
// split of a thinking model's output into reasoning and answer (openai/reasoning.h); tools,
// tool calls and tool results in Qwen's templates, and tool calls found in an answer
// (openai/tool_calls.h).
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "openai/chat_template.h"
#include "openai/model_chat_template.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "openai/reasoning.h"
#include "openai/tool_calls.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {
// Today as Llama-3.2's template writes it (strftime_now("%d %b %Y")).
std::string today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", " Hi\n"}, {"assistant", "Hello"}, {"user", "More"}};
}  // namespace

TEST(ChatTemplate, RendersEachFormat) {
  EXPECT_EQ(render_chat("plain", kChat).prompt,
            "System: Be brief.\n\nUser:  Hi\n\n\nAssistant: Hello\n\nUser: More\n\nAssistant:");
  EXPECT_EQ(render_chat("llama-2", kChat).prompt,
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] More [/INST]");
  EXPECT_EQ(render_chat("mistral", kChat).prompt, "[INST] Be brief.\n\n Hi\n [/INST]Hello</s>[INST] More [/INST]");
  EXPECT_EQ(render_chat("zephyr", kChat).prompt,
            "<|system|>\nBe brief.</s>\n<|user|>\n Hi\n</s>\n<|assistant|>\nHello</s>\n<|user|>\nMore</s>\n<|assistant|>\n");
  RenderedChat ml = render_chat("chatml", kChat);
  EXPECT_EQ(ml.prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\nHello"
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ml.stop_tokens, std::vector<std::string>{"<|im_end|>"});
  // Qwen2 and Qwen2.5: ChatML, with their default system turn only when none is given.
  EXPECT_EQ(render_chat("qwen2.5", kChat).prompt, ml.prompt);
  EXPECT_EQ(render_chat("qwen2.5", kChat).stop_tokens, std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(render_chat("qwen2.5", {{"user", "Hi"}}).prompt,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat("qwen2", {{"user", "Hi"}, {"assistant", "Yo"}, {"system", "late"}}).prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n<|im_start|>assistant\n");
  // Llama-3 trims every message; 3.1 and 3.2 open with Meta's system header.
  RenderedChat l3 = render_chat("llama-3", kChat);
  EXPECT_EQ(l3.prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nMore<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(l3.stop_tokens, std::vector<std::string>{"<|eot_id|>"});
  EXPECT_EQ(render_chat("llama-3.1", {{"user", "Hi"}}).prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_NE(render_chat("llama-3.2", kChat).prompt.find("\n\nBe brief.<|eot_id|>"), std::string::npos);
  // Gemma's turns: the system message opens the first user turn, contents trimmed, "model" for
  // the assistant, <end_of_turn> its stop token; recognised in a model's own template.
  const RenderedChat gemma = render_chat("gemma", kChat);
  EXPECT_EQ(gemma.prompt, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
                          "<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma.stop_tokens, std::vector<std::string>{"<end_of_turn>"});
  std::string why;
  EXPECT_EQ(chat_template_family("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + "
                                 "m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}", &why),
            "gemma");
  EXPECT_THROW(render_chat("vicuna", kChat), Error);
  EXPECT_FALSE(known_chat_template("vicuna"));
}

TEST(ChatTemplate, AutoReadsTokenizerConfig) {
  test::TempDir dir;
  std::string why;
  EXPECT_EQ(auto_chat_template(dir.path(), &why), "plain");
  EXPECT_EQ(why, "no tokenizer_config.json");
  auto with = [&](const std::string& jinja) {
    json::Value cfg(json::Object{});
    cfg.set("chat_template", jinja);
    std::ofstream(dir.file("tokenizer_config.json")) << cfg.dump();
    return auto_chat_template(dir.path(), &why);
  };
  EXPECT_EQ(with("{{ bos_token }}[INST] <<SYS>>\\n{{ system }}"), "llama-2");
  EXPECT_EQ(with("{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            "mistral");
  EXPECT_EQ(with("{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}"), "zephyr");
  EXPECT_EQ(with("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}"), "chatml");
  EXPECT_EQ(with("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}{{ '<|eot_id|>' }}"),
            "llama-3");
  EXPECT_EQ(with("<|start_header_id|><|eot_id|>Cutting Knowledge Date: December 2023 {{ date_string }}"), "llama-3.1");
  EXPECT_EQ(with("<|start_header_id|><|eot_id|>Cutting Knowledge Date {{ strftime_now('%d %b %Y') }}"), "llama-3.2");
  // Qwen2-Instruct's template, verbatim; Qwen2.5-Instruct's is the fixture's.
  EXPECT_EQ(with("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                 "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
                 "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
            "qwen2");
  EXPECT_EQ(auto_chat_template(test::data_path("qwen2-tokenizer"), &why), "qwen2.5");
  EXPECT_EQ(with("{{ messages }}"), "plain");
  EXPECT_NE(why.find("not one kvpr has built in"), std::string::npos);
}

// The real templates of Qwen3, Qwen2.5, Qwen1.5, Llama-3 and Llama-3.2 (their
// tokenizer_config.json's chat_template) rendered by Hugging Face's JavaScript Jinja
// (tests/scripts/make_chat_template_fixtures.mjs): auto picks kvpr's template for each, and
// kvpr renders every conversation to the same text (less the BOS the tokenizer adds).
TEST(ChatTemplate, MatchesTheModelsJinjaTemplates) {
  const std::string dir = test::data_path("chat-templates");
  const json::Value templates = json::parse_file(dir + "/templates.json");
  const json::Value cases = json::parse_file(dir + "/cases.json");
  std::map<std::string, std::pair<std::string, ChatOptions>> picked;  // source -> (template, options)
  for (const auto& [source, t] : templates.as_object()) {
    test::TempDir tmp;
    json::Value cfg(json::Object{});
    cfg.set("chat_template", t.find("chat_template")->as_string());
    std::ofstream(tmp.file("tokenizer_config.json")) << cfg.dump();
    std::string why;
    ChatOptions o;
    const std::string name = auto_chat_template(tmp.path(), &why, &o.default_system);
    EXPECT_EQ(name, t.find("kvpr_template")->as_string()) << source << ": " << why;
    picked[source] = {name, o};
  }
  EXPECT_EQ(picked.at("qwen1.5").second.default_system, "You are a helpful assistant");  // no full stop
  ASSERT_GE(cases.as_array().size(), 48u);
  for (const auto& c : cases.as_array()) {
    const std::string source = c.find("source")->as_string();
    auto [name, options] = picked.at(source);
    options.enable_thinking = c.find("enable_thinking")->as_bool();
    std::vector<ChatMessage> messages;
    for (const auto& m : c.find("messages")->as_array())
      messages.push_back({m.find("role")->as_string(), m.find("content")->as_string()});
    std::string want = c.find("prompt")->as_string();
    const std::string bos = templates.find(source)->find("bos_token")->as_string();
    ASSERT_EQ(want.compare(0, bos.size(), bos), 0) << source;
    want = want.substr(bos.size());
    if (const size_t at = want.find("__TODAY__"); at != std::string::npos) want.replace(at, 9, today());
    EXPECT_EQ(render_chat(name, messages, options).prompt, want) << source << " with " << messages.size() << " messages";
  }
}

// Reasoning and answer of a thinking model's output, whole and streamed in any pieces.
TEST(ReasoningSplitter, SplitsAtTheThinkTags) {
  using P = ReasoningSplitter::Parts;
  auto split = [](const std::string& s) {
    P p = ReasoningSplitter::split(s);
    return std::pair{p.reasoning, p.content};
  };
  using S = std::pair<std::string, std::string>;
  EXPECT_EQ(split("<think>\nWhy? Rayleigh.\n</think>\n\nBlue."), S("\nWhy? Rayleigh.\n", "\n\nBlue."));
  EXPECT_EQ(split("Blue."), S("", "Blue."));                           // thinking off: all answer
  EXPECT_EQ(split("<think>\nstill going"), S("\nstill going", ""));   // cut off mid-thought
  EXPECT_EQ(split("<thi"), S("", "<thi"));                             // not a tag after all
  EXPECT_EQ(split("<think>a</th"), S("a</th", ""));
  EXPECT_EQ(split("x<think>a</think>b"), S("", "x<think>a</think>b"));  // tags only count at the start
  EXPECT_EQ(split("<think></think>b</think>"), S("", "b</think>"));
  EXPECT_EQ(split(""), S("", ""));
  // Streamed in every two pieces and byte by byte, the parts add up to the whole's.
  for (const std::string text : {"<think>\nr1 </ r2 </thin\n</think>\n\nA </think>", "<think", "plain </think>",
                                 "<think>x</think>"}) {
    const P whole = ReasoningSplitter::split(text);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      ReasoningSplitter s;
      P a = s.feed(text.substr(0, cut)), b = s.feed(text.substr(cut)), c = s.finish();
      EXPECT_EQ(a.reasoning + b.reasoning + c.reasoning, whole.reasoning) << text << " cut " << cut;
      EXPECT_EQ(a.content + b.content + c.content, whole.content) << text << " cut " << cut;
    }
    ReasoningSplitter s;
    std::string r, c;
    for (char ch : text) {
      P p = s.feed(std::string(1, ch));
      r += p.reasoning;
      c += p.content;
    }
    P end = s.finish();
    EXPECT_EQ(r + end.reasoning, whole.reasoning) << text;
    EXPECT_EQ(c + end.content, whole.content) << text;
  }
}

namespace {
void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// A fixture message (OpenAI's shape, arguments already objects) as the renderer takes it.
ChatMessage chat_message(const json::Value& m) {
  ChatMessage out{m.find("role")->as_string(), m.find("content")->as_string()};
  if (const json::Value* calls = m.find("tool_calls"))
    for (const auto& c : calls->as_array())
      out.tool_calls.push_back({c.find("function")->find("name")->as_string(), *c.find("function")->find("arguments"),
                                c.find("id")->as_string()});
  if (const json::Value* r = m.find("reasoning_content"); r && r->is_string()) out.reasoning = r->as_string();
  if (const json::Value* id = m.find("tool_call_id")) out.tool_call_id = id->as_string();
  return out;
}
}  // namespace

// Conversations with tools, assistant tool calls (with and without text, several at once) and
// tool results (one and several in a row), rendered by Qwen2.5's and Qwen3's real templates
// under Jinja2 as transformers sets it up (tests/scripts/make_tool_chat_fixtures.py): kvpr's
// text is the same, tools and arguments written as Python's json.dumps writes them.
TEST(ChatTemplate, ToolsMatchTheModelsJinjaTemplates) {
  const json::Value fixture = json::parse_file(test::data_path("chat-templates") + "/tool_cases.json");
  size_t n = 0;
  for (const auto& c : fixture.find("renders")->as_array()) {
    const std::string source = c.find("source")->as_string();
    ChatOptions options;
    options.enable_thinking = c.find("enable_thinking")->as_bool();
    if (const json::Value* tools = c.find("tools"); tools->is_array()) options.tools = tools->as_array();
    std::vector<ChatMessage> messages;
    for (const auto& m : c.find("messages")->as_array()) messages.push_back(chat_message(m));
    std::string want = c.find("prompt")->as_string();
    if (const size_t at = want.find("__TODAY__"); at != std::string::npos) want.replace(at, 9, today());
    EXPECT_EQ(render_chat(source, messages, options).prompt, want)
        << source << " case " << n << " with " << messages.size() << " messages";
    ++n;
  }
  EXPECT_GE(n, 43u);
}

TEST(ChatTemplate, RefusesToolsWhereTheTemplateHasNone) {
  ChatOptions with_tools;
  with_tools.tools.push_back(json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"f", json::parse("{}"), "abcdefghi"});
  const std::vector<ChatMessage> with_call = {{"user", "Hi"}, call};
  const std::vector<ChatMessage> with_result = {{"user", "Hi"}, {"tool", "42"}};
  for (const char* name : {"plain", "llama-2", "mistral", "zephyr", "chatml", "qwen2", "llama-3"}) {  // not mistral-nemo
    EXPECT_FALSE(chat_template_has_tools(name));
    EXPECT_EQ(chat_tool_call_parser(name), "");
    expect_error([&] { render_chat(name, user, with_tools); }, "has no tools (qwen2.5, qwen3, mistral-nemo, llama-3.1, llama-3.2 and harmony have)");
    expect_error([&] { render_chat(name, with_call); }, "has no tool calls");
    expect_error([&] { render_chat(name, with_result); }, "has no tool messages");
  }
  EXPECT_EQ(chat_tool_call_parser("qwen2.5"), "hermes");
  EXPECT_EQ(chat_tool_call_parser("qwen3"), "hermes");
  EXPECT_EQ(chat_tool_call_parser("llama-3.1"), "llama3_json");
  EXPECT_EQ(chat_tool_call_parser("llama-3.2"), "llama3_json");
  EXPECT_EQ(chat_tool_call_parser("mistral-nemo"), "mistral");
  ChatMessage short_id = call;
  short_id.tool_calls[0].id = "call_1";
  expect_error([&] { render_chat("mistral-nemo", {{"user", "Hi"}, short_id}); }, "ids of 9 characters");
  // Llama's templates: the tools go into the first user message (so there must be one), and one
  // call per assistant message.
  expect_error([&] { render_chat("llama-3.1", {{"system", "S"}}, with_tools); }, "the conversation has none");
  ChatMessage two = call;
  two.tool_calls.push_back(call.tool_calls[0]);
  expect_error([&] { render_chat("llama-3.2", {{"user", "Hi"}, two}); }, "one tool call per assistant message");
}

// Model outputs parsed as vLLM's hermes and llama3_json parsers parse them (the fixture's
// reference is a Python implementation of them: regex, json.loads / raw_decode, json.dumps);
// streamed in any two pieces and byte by byte, the content and calls add up to the whole's.
TEST(ToolCalls, ParseAsVllmsParsers) {
  const json::Value fixture = json::parse_file(test::data_path("chat-templates") + "/tool_cases.json");
  std::map<std::string, size_t> n, with_calls;
  for (const auto& c : fixture.find("parsed")->as_array()) {
    const std::string parser = c.find("parser")->as_string();
    const std::string output = c.find("output")->as_string();
    const ToolCallParse p = parse_tool_calls(parser, output);
    const json::Value* content = c.find("content");
    EXPECT_EQ(p.content.has_value(), !content->is_null()) << output;
    if (p.content && content->is_string()) {
      EXPECT_EQ(*p.content, content->as_string()) << output;
    }
    const json::Array& calls = c.find("tool_calls")->as_array();
    ASSERT_EQ(p.calls.size(), calls.size()) << output;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, calls[i].find("name")->as_string()) << output;
      EXPECT_EQ(p.calls[i].arguments, calls[i].find("arguments")->as_string()) << output;
    }
    with_calls[parser] += !calls.empty();
    const std::string whole_content = p.content.value_or("");
    auto same = [&](const std::string& got, const std::vector<ToolCallText>& got_calls, const std::string& how) {
      EXPECT_EQ(got, whole_content) << output << " " << how;
      ASSERT_EQ(got_calls.size(), p.calls.size()) << output << " " << how;
      for (size_t i = 0; i < got_calls.size(); ++i) EXPECT_EQ(got_calls[i].arguments, p.calls[i].arguments);
    };
    for (size_t cut = 0; cut <= output.size(); ++cut) {
      ToolCallStream s(parser);
      ToolCallStream::Delta a = s.feed(output.substr(0, cut)), b = s.feed(output.substr(cut)), e = s.finish();
      EXPECT_TRUE(a.calls.empty() && b.calls.empty()) << "calls come out only at the end";
      same(a.content + b.content + e.content, e.calls, "cut at " + std::to_string(cut));
    }
    ToolCallStream s(parser);
    std::string text;
    for (char ch : output) text += s.feed(std::string(1, ch)).content;
    ToolCallStream::Delta e = s.finish();
    same(text + e.content, e.calls, "byte by byte");
    ++n[parser];
  }
  EXPECT_GE(n["hermes"], 15u);
  EXPECT_GE(with_calls["hermes"], 8u);
  EXPECT_GE(n["llama3_json"], 16u);
  EXPECT_GE(with_calls["llama3_json"], 8u);
  EXPECT_GE(n["mistral"], 12u);
  EXPECT_GE(with_calls["mistral"], 5u);
  EXPECT_THROW(ToolCallStream("pythonic"), Error);
}

// Tool-call parsing is a per-sequence stage kvprd runs on whatever a model writes: no output may
// make it throw (a throw there would end the request), whole or streamed in pieces. Random texts
// from the parsers' own fragments, nesting past the JSON parser's depth limit, numbers past
// double, invalid UTF-8 and truncations; the streamed result still equals the whole one.
TEST(ToolCalls, NoModelOutputMakesAParserThrow) {
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "{", "}", "[", "]", "\"name\"", "\"arguments\"",
      "\"parameters\"", ":", ",", "\"f\"", "\"x\"", "1", "1e999", "-", "null", "true", "\"", "\\", "\n", " ",
      "\xff\xfe", "\xe2\x82", "<tool", "_call>", "{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
      "[{\"name\": \"g\", \"arguments\": {}}]", std::string(300, '['), std::string(300, '{'), "\\u0000", "\\ud800"};
  std::mt19937 rng(20261206);
  std::map<std::string, int> calls_seen;
  for (const char* parser : {"hermes", "llama3_json", "mistral", "generic"}) {
    for (int n = 0; n < 1500; ++n) {
      std::string output;
      const int len = 1 + static_cast<int>(rng() % 24);
      for (int k = 0; k < len; ++k) output += pieces[rng() % pieces.size()];
      if (rng() % 4 == 0) output.resize(rng() % (output.size() + 1));  // cut anywhere, mid-character too
      ToolCallParse whole;
      ASSERT_NO_THROW(whole = parse_tool_calls(parser, output)) << parser << ": " << output;
      calls_seen[parser] += !whole.calls.empty();
      ToolCallStream s(parser);
      std::string text;
      ToolCallStream::Delta e;
      ASSERT_NO_THROW({
        const size_t cut = rng() % (output.size() + 1);
        text += s.feed(output.substr(0, cut)).content;
        text += s.feed(output.substr(cut)).content;
        e = s.finish();
      }) << parser << ": " << output;
      EXPECT_EQ(text + e.content, whole.content.value_or("")) << parser << ": " << output;
      EXPECT_EQ(e.calls.size(), whole.calls.size()) << parser << ": " << output;
    }
  }
  for (const char* parser : {"hermes", "llama3_json", "mistral", "generic"})
    EXPECT_GT(calls_seen[parser], 0) << parser << ": the random texts never held a call";
}

TEST(ToolCalls, StreamsTextBeforeTheFirstBlockAsItComes) {
  ToolCallStream s;
  EXPECT_EQ(s.feed("Let me check").content, "Let me check");
  EXPECT_EQ(s.feed(".\n<tool").content, ".\n");  // "<tool" may be the tag: held
  EXPECT_EQ(s.feed("box>").content, "<toolbox>");   // it was not
  ToolCallStream::Delta d = s.feed(" <tool_call>\n{\"name\": \"f\", ");
  EXPECT_EQ(d.content, " ");
  EXPECT_TRUE(s.feed("\"arguments\": {\"x\": 1}}\n</tool_call>").content.empty());
  d = s.finish();
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  EXPECT_EQ(d.calls[0].arguments, "{\"x\": 1}");
  EXPECT_TRUE(d.content.empty());
}

// The generic format (any model, openai/generic_tools.h): an answer that is only a JSON list of
// calls (or one call), fenced or not, is the calls; anything else is all of it content, whole or
// streamed; text goes out as it comes once the answer's start shows it is no call.
TEST(ToolCalls, GenericFormatIsAnAnswerOfOnlyCalls) {
  struct Case {
    std::string output;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const Case cases[] = {
      {R"([{"name": "get_weather", "parameters": {"city": "Paris"}}])", {{"get_weather", R"({"city": "Paris"})"}}},
      {"  \n```json\n[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"parameters\": {\"x\": [1,2]}}]\n```\n",
       {{"f", "{}"}, {"g", R"({"x": [1, 2]})"}}},
      {R"({"name": "f", "arguments": {"a": "b"}})", {{"f", R"({"a": "b"})"}}},
      {"The weather is fine.", {}},
      {R"(Sure: [{"name": "f", "parameters": {}}])", {}},  // text first: content
      {R"([{"name": "f", "parameters": "x"}])", {}},       // arguments that are no object
      {R"([{"name": "f", "parameters": {}})", {}},         // cut off
      {"[]", {}},
      {R"({"answer": 42})", {}},
      {"``", {}},
      {"", {}},
  };
  for (const Case& c : cases) {
    const ToolCallParse p = parse_tool_calls("generic", c.output);
    ASSERT_EQ(p.calls.size(), c.calls.size()) << c.output;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, c.calls[i].first) << c.output;
      EXPECT_EQ(p.calls[i].arguments, c.calls[i].second) << c.output;
    }
    if (c.calls.empty()) EXPECT_EQ(p.content.value_or("?"), c.output);
    else EXPECT_FALSE(p.content.has_value()) << c.output;
    ToolCallStream s("generic");
    std::string text;
    for (char ch : c.output) text += s.feed(std::string(1, ch)).content;
    const ToolCallStream::Delta e = s.finish();
    EXPECT_EQ(text + e.content, p.content.value_or("")) << c.output;
    EXPECT_EQ(e.calls.size(), p.calls.size()) << c.output;
  }
  ToolCallStream s("generic");
  EXPECT_EQ(s.feed("  ").content, "");  // whitespace: not decided yet
  EXPECT_EQ(s.feed("It").content, "  It");
  EXPECT_EQ(s.feed(" is [1]").content, " is [1]");
  EXPECT_TRUE(s.finish().calls.empty());
}

// Whether a model's own template writes a system message (where tools for a template without
// them are described) is found by rendering one: Gemma's kind refuses it.
TEST(ChatTemplate, FindsWhetherAModelsTemplateWritesASystemMessage) {
  const test::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
    return ModelChatTemplate::from_file(dir.file(name), test::data_path("qwen2-tokenizer"));
  };
  EXPECT_TRUE(write("all.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}").writes_system());
  EXPECT_FALSE(write("refuses.jinja", "{% for m in messages %}{% if m.role == 'system' %}"
                                      "{{ raise_exception('System role not supported') }}{% endif %}"
                                      "{{ m.content }}{% endfor %}")
                   .writes_system());
  EXPECT_FALSE(write("drops.jinja", "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}"
                                    "{% endfor %}")
                   .writes_system());
}
