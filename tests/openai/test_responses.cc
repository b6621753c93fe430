// The Responses API on the chat path (openai/responses.h): a request's items become the chat
// conversation the chat parser checks, its 400s name the Responses' fields, the chat answer
// becomes output items, the streamed events add up (as the openai client accumulates them) to the
// Response the stream ends with, which is the whole answer's; and the store's bounds.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "openai/response.h"
#include "openai/responses.h"
#include "tests/openai/openai_fixtures.h"

namespace kvpr {
namespace {

using test::finish_event;
using test::qwen_served;
using test::qwen_tokenizer;
using test::token_event;

ResponsesRequest parse(const std::string& body, const json::Array* previous = nullptr,
                       const ServedModel& served = qwen_served()) {
  const json::Value v = parse_body(body);
  check_model(v, served);
  return parse_responses_request(v, served, qwen_tokenizer(), previous);
}

TEST(Responses, InputItemsBecomeTheChatConversation) {
  const json::Array previous = json::parse(R"([{"type": "message", "role": "user", "content": "Hi"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}])")
                                   .as_array();
  const ResponsesRequest r = parse(R"({"model": "demo", "instructions": "Be brief.", "max_output_tokens": 9,
      "metadata": {"k": "v"}, "temperature": 0.5,
      "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
      "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "a city"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "3 C"}]})",
                                   &previous);
  const std::vector<ChatMessage>& m = r.chat.messages;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[0].content, "Be brief.");
  EXPECT_EQ(m[1].content, "Hi");
  EXPECT_EQ(m[2].role, "assistant");
  EXPECT_EQ(m[2].content, "Hello.");
  EXPECT_EQ(m[3].content, "Weather?");
  EXPECT_EQ(m[4].role, "assistant");  // the reasoning and the call: one assistant message
  EXPECT_EQ(m[4].reasoning.value_or(""), "a city");
  ASSERT_EQ(m[4].tool_calls.size(), 1u);
  EXPECT_EQ(m[4].tool_calls[0].id, "call_1");
  EXPECT_EQ(m[4].tool_calls[0].arguments.dump(), R"({"city":"Oslo"})");
  EXPECT_EQ(m[5].role, "tool");
  EXPECT_EQ(m[5].tool_call_id, "call_1");
  EXPECT_EQ(m[5].content, "3 C");
  EXPECT_EQ(r.chat.sampling.max_tokens, 9);
  EXPECT_DOUBLE_EQ(r.chat.sampling.temperature, 0.5);
  ASSERT_EQ(r.chat.tools.tools.size(), 1u);  // as a chat tool, its "strict" left out
  EXPECT_EQ(r.chat.tools.tools[0].find("function")->dump(),
            R"({"name":"get_weather","parameters":{"type":"object"}})");
  EXPECT_EQ(r.conversation.size(), previous.size() + 4);  // what a later previous_response_id continues
  EXPECT_EQ(r.input.size(), 4u);
  // The Response repeats the request's fields, OpenAI's defaults for the others.
  json::Object echo = r.echo;
  auto at = [&](const char* k) {
    for (const auto& [key, v] : echo)
      if (key == k) return v.dump();
    return std::string("absent");
  };
  EXPECT_EQ(at("instructions"), "\"Be brief.\"");
  EXPECT_EQ(at("metadata"), R"({"k":"v"})");
  EXPECT_EQ(at("tool_choice"), "\"auto\"");
  EXPECT_EQ(at("text"), R"({"format":{"type":"text"}})");
  EXPECT_EQ(at("store"), "true");
  // A string input is one user message; text.format is the chat's response_format.
  const ResponsesRequest s = parse(R"({"model": "demo", "input": "Hi", "text": {"format": {"type": "json_schema",
      "name": "t", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": true}}})");
  ASSERT_EQ(s.chat.messages.size(), 1u);
  EXPECT_EQ(s.chat.messages[0].role, "user");
  EXPECT_EQ(s.chat.sampling.json_schema.dump(), R"({"type":"object","properties":{"a":{"type":"integer"}}})");
}

TEST(Responses, ErrorsNameTheResponsesFields) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model": "demo"})", "input"},
      {R"({"model": "demo", "input": 5})", "input"},
      {R"({"model": "demo", "input": []})", "input"},
      {R"({"model": "demo", "input": [{"type": "computer_call"}]})", "input"},
      {R"({"model": "demo", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", "input"},
      {R"({"model": "demo", "input": [{"type": "function_call", "name": "f"}]})", "input"},
      {R"({"model": "demo", "input": "x", "max_output_tokens": -1})", "max_output_tokens"},
      {R"({"model": "demo", "input": "x", "max_output_tokens": 5000})", "input"},  // past the context
      {R"({"model": "demo", "input": "x", "text": {"format": {"type": "yaml"}}})", "text.format"},
      {R"({"model": "demo", "input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format"},
      {R"({"model": "demo", "input": "x", "tools": [{"type": "web_search"}]})", "tools"},
      {R"({"model": "demo", "input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice"},
      {R"({"model": "demo", "input": "x", "background": true})", "background"},
      {R"({"model": "demo", "input": "x", "truncation": "auto"})", "truncation"},
      {R"({"model": "demo", "input": "x", "conversation": "conv_1"})", "conversation"},
      {R"({"model": "demo", "input": "x", "metadata": {"k": 1}})", "metadata"},
      {R"({"model": "demo", "input": "x", "previous_response_id": 5})", "previous_response_id"},
      {R"({"model": "demo", "input": "x", "store": "yes"})", "store"},
      {R"({"model": "demo", "input": "x", "temperature": 3})", "temperature"},
  };
  for (const auto& [body, param] : cases) {
    try {
      ResponsesRequest r = parse(body);
      make_prompts(r.chat, qwen_served(), qwen_tokenizer());
      ADD_FAILURE() << "taken: " << body;
    } catch (const ApiError& e) {
      const ApiError named = as_responses_error(e);
      EXPECT_EQ(named.status, 400) << body;
      EXPECT_EQ(named.param, param) << body << ": " << named.message;
      EXPECT_EQ(named.message.find("'messages'"), std::string::npos) << named.message;
    }
  }
}

// A reasoning model's answer that reasons, says a word and calls a tool, as the worker sends it.
std::vector<EngineEvent> reasoning_and_call() {
  return {token_event(1, "<think>"), token_event(2, "a city"), token_event(3, "</think>"), token_event(4, "Checking."),
          token_event(5, "<tool_call>\n{\"name\": \"get_weather\", "),
          token_event(6, "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"), finish_event("stop", 2)};
}

const char* kWeatherRequest = R"({"model": "demo", "input": "Weather in Oslo?", "stream": true,
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]})";

// Accumulates events as the openai client's ResponseStream does (its snapshot), and checks
// their order and sequence numbers.
struct Accumulated {
  json::Value snapshot;
  json::Value final_response;
  std::vector<std::string> types;
  int64_t next_sequence = 0;

  void add(const ResponsesTurn::Event& ev) {
    const auto& [type, e] = ev;
    types.push_back(type);
    EXPECT_EQ(e.find("type")->as_string(), type);
    EXPECT_EQ(e.find("sequence_number")->as_int(), next_sequence++);
    if (type == "response.created") snapshot = *e.find("response");
    json::Array output = snapshot.find("output")->as_array();
    const json::Value* index = e.find("output_index");
    auto item = [&]() -> json::Value& { return output.at(static_cast<size_t>(index->as_int())); };
    auto append = [&](json::Value& v, const char* key, const std::string& text) {
      v.set(key, v.find(key)->as_string() + text);
    };
    if (type == "response.output_item.added") output.push_back(*e.find("item"));
    if (type == "response.content_part.added") {
      json::Array content = item().find("content")->as_array();
      content.push_back(*e.find("part"));
      item().set("content", std::move(content));
    }
    if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      json::Array content = item().find("content")->as_array();
      append(content.at(0), "text", e.find("delta")->as_string());
      item().set("content", std::move(content));
    }
    if (type == "response.function_call_arguments.delta") append(item(), "arguments", e.find("delta")->as_string());
    if (type == "response.output_item.done") item() = *e.find("item");
    snapshot.set("output", std::move(output));
    if (type == "response.completed" || type == "response.incomplete") final_response = *e.find("response");
  }
};

// The items less their ids (fresh in each run).
std::string without_ids(const json::Value& output) {
  json::Array items;
  for (const auto& item : output.as_array()) {
    json::Object o;
    for (const auto& [k, v] : item.as_object())
      if (k != "id" && k != "call_id") o.emplace_back(k, v);
    items.push_back(std::move(o));
  }
  return json::Value(std::move(items)).dump();
}

TEST(Responses, StreamedEventsAddUpToTheWholeResponse) {
  const Tokenizer& tok = qwen_tokenizer();
  ResponsesRequest req = parse(kWeatherRequest);
  const Prompts p = make_prompts(req.chat, qwen_served(), tok);
  IdMaker ids;
  const ResponseContext ctx{tok, /*reasoning=*/true, ids};
  ResponseState streamed = start_response(req.chat, p, "resp_1", 7, "demo"), whole = streamed;
  ResponsesTurn stream_turn(req, "resp_1", 7, "demo", ids), whole_turn(req, "resp_2", 7, "demo", ids);
  Accumulated acc;
  for (const auto& e : stream_turn.start_events()) acc.add(e);
  for (const EngineEvent& ev : reasoning_and_call()) {
    add_event(whole, 0, ev);
    add_event(streamed, 0, ev);
    for (const json::Value& chunk : stream_chunks(streamed, 0, ev, ctx))
      for (const auto& e : stream_turn.chunk_events(chunk)) acc.add(e);
  }
  for (const auto& e : stream_turn.finish_events(streamed.choices[0].finish, usage_json(usage_of(streamed)))) acc.add(e);
  whole_turn.finish_whole(response_json(whole, ctx));
  const json::Value answer = whole_turn.object();

  // reasoning, message, function_call: each opened, filled and closed in turn.
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(acc.types, want);
  ASSERT_TRUE(acc.final_response.is_object());
  EXPECT_EQ(without_ids(*acc.snapshot.find("output")), without_ids(*acc.final_response.find("output")));
  EXPECT_EQ(without_ids(*acc.final_response.find("output")), without_ids(*answer.find("output")));
  const json::Array& out = answer.find("output")->as_array();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].find("content")->as_array()[0].find("text")->as_string(), "a city");
  EXPECT_EQ(out[1].find("content")->as_array()[0].find("text")->as_string(), "Checking.");
  EXPECT_EQ(out[2].find("name")->as_string(), "get_weather");
  EXPECT_EQ(out[2].find("arguments")->as_string(), R"({"city": "Oslo"})");
  EXPECT_EQ(out[2].find("call_id")->as_string().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(answer.find("status")->as_string(), "completed");
  EXPECT_EQ(answer.find("usage")->find("output_tokens")->as_int(), 6);
  EXPECT_EQ(answer.find("usage")->find("input_tokens_details")->find("cached_tokens")->as_int(), 2);
  EXPECT_EQ(answer.find("usage")->find("total_tokens")->as_int(),
            answer.find("usage")->find("input_tokens")->as_int() + 6);
  // What the store keeps: the input (with ids now) and the output after it.
  const json::Array kept = stream_turn.stored_conversation();
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_EQ(kept[0].find("id")->as_string().rfind("msg_", 0), 0u);
  EXPECT_EQ(kept[3].find("type")->as_string(), "function_call");
}

// What is kept of an input item: the fields this server reads, nothing a client added.
TEST(Responses, InputItemsKeepTheFieldsThisServerReads) {
  const ResponsesRequest r = parse(R"({"model": "demo", "input": [{"type": "message", "role": "user",
      "content": [{"type": "input_text", "text": "Hi", "padding": [0, 0, 0]}], "extra": {"a": [1, 2, 3]}}]})");
  EXPECT_EQ(json::Value(r.input).dump(), R"([{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi"}]}])");
}

// A stream that fails ends with an error event and response.failed, its Response saying why.
TEST(Responses, AFailedStreamEndsWithResponseFailed) {
  IdMaker ids;
  ResponsesTurn turn(parse(R"({"model": "demo", "input": "Hi"})"), "resp_1", 7, "demo", ids);
  Accumulated acc;
  for (const auto& e : turn.start_events()) acc.add(e);
  const std::vector<ResponsesTurn::Event> end = turn.error_events({500, "the worker stopped", "server_error", ""});
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[0].first, "error");
  EXPECT_EQ(end[0].second.find("message")->as_string(), "the worker stopped");
  EXPECT_EQ(end[1].first, "response.failed");
  const json::Value& failed = *end[1].second.find("response");
  EXPECT_EQ(failed.find("status")->as_string(), "failed");
  EXPECT_EQ(failed.find("error")->dump(), R"({"code":"server_error","message":"the worker stopped"})");
  EXPECT_EQ(end[1].second.find("sequence_number")->as_int(), 3);
}

TEST(Responses, AnAnswerCutByMaxOutputTokensIsIncomplete) {
  const Tokenizer& tok = qwen_tokenizer();
  ResponsesRequest req = parse(R"({"model": "demo", "input": "Hi", "max_output_tokens": 1})");
  const Prompts p = make_prompts(req.chat, qwen_served(), tok);
  IdMaker ids;
  const ResponseContext ctx{tok, false, ids};
  ResponseState r = start_response(req.chat, p, "resp_1", 7, "demo");
  add_event(r, 0, token_event(9, "Hel"));
  add_event(r, 0, finish_event("length"));
  ResponsesTurn turn(req, "resp_1", 7, "demo", ids);
  turn.finish_whole(response_json(r, ctx));
  const json::Value o = turn.object();
  EXPECT_EQ(o.find("status")->as_string(), "incomplete");
  EXPECT_EQ(o.find("incomplete_details")->find("reason")->as_string(), "max_output_tokens");
  EXPECT_EQ(o.find("output")->as_array().at(0).find("status")->as_string(), "incomplete");
  // Streamed, an answer with no text is still one (empty) message, then response.incomplete.
  ResponsesTurn empty(req, "resp_2", 7, "demo", ids);
  Accumulated acc;
  for (const auto& e : empty.start_events()) acc.add(e);
  for (const auto& e : empty.finish_events("length", usage_json(usage_of(r)))) acc.add(e);
  EXPECT_EQ(acc.types.back(), "response.incomplete");
  EXPECT_EQ(acc.final_response.find("output")->as_array().size(), 1u);
}

TEST(ResponseStore, KeepsTheNewestWithinCountBytesAndAge) {
  using Clock = ResponseStore::Clock;
  const Clock::time_point t0{};
  auto response = [](const std::string& id) { return json::Value(json::Object{{"id", id}}); };
  ResponseStore store(2, 1 << 20, std::chrono::seconds(60));
  store.put("a", response("a"), json::Array{"x"}, json::Array{"x"}, t0);
  store.put("b", response("b"), json::Array{}, json::Array{}, t0 + std::chrono::seconds(1));
  store.put("c", response("c"), json::Array{}, json::Array{}, t0 + std::chrono::seconds(2));
  EXPECT_EQ(store.find("a", t0 + std::chrono::seconds(3)), nullptr);  // the oldest went first
  ASSERT_NE(store.find("b", t0 + std::chrono::seconds(3)), nullptr);
  EXPECT_EQ(json::parse(store.find("b", t0 + std::chrono::seconds(3))->response).find("id")->as_string(), "b");
  EXPECT_EQ(store.find("b", t0 + std::chrono::seconds(62)), nullptr);  // expired
  ASSERT_NE(store.find("c", t0 + std::chrono::seconds(62)), nullptr);
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
  // Bytes: a response larger than the store is not kept; the others push the oldest out.
  ResponseStore small(100, 200, std::chrono::seconds(60));
  small.put("big", response(std::string(300, 'x')), {}, {}, t0);
  EXPECT_EQ(small.find("big", t0), nullptr);
  small.put("p", response(std::string(80, 'p')), {}, {}, t0);
  small.put("q", response(std::string(80, 'q')), {}, {}, t0);
  small.put("r", response(std::string(80, 'r')), {}, {}, t0);
  EXPECT_EQ(small.find("p", t0), nullptr);
  EXPECT_NE(small.find("r", t0), nullptr);
  EXPECT_LE(small.bytes(), 200u);
  EXPECT_EQ(small.bytes(), small.find("r", t0)->response.size() + small.find("q", t0)->response.size() + 2 * (2 + 2 + 1));
  // Off: nothing is kept.
  ResponseStore off(0, 1 << 20, std::chrono::seconds(60));
  off.put("a", response("a"), {}, {}, t0);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.find("a", t0), nullptr);
}

}  // namespace
}  // namespace kvpr
