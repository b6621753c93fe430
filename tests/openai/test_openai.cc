// The OpenAI layer on its own (openai/request, openai/response): requests parsed into the
// engine's parameters, the field that is wrong named in each 400, and responses and stream
// chunks built from engine events. The daemon's end-to-end tests (daemon_test.py) drive the
// same code through HTTP and the official clients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "engine/base/error.h"
#include "engine/constrain/json_schema.h"
#include "openai/generation_config.h"
#include "openai/generic_tools.h"
#include "openai/request.h"
#include "openai/response.h"
#include "tests/openai/openai_fixtures.h"
#include "tests/test_util.h"

namespace kvpr {
namespace {

using test::finish_event;
using test::qwen_served;
using test::qwen_tokenizer;
using test::token_event;

GenerateRequest parse(const std::string& body, bool chat, const ServedModel& served = qwen_served()) {
  const json::Value v = parse_body(body);
  check_model(v, served);
  return parse_generate_request(v, chat, served, qwen_tokenizer());
}

TEST(OpenAiProtocol, ChatRequestBecomesTheEngineParameters) {
  const Tokenizer& tok = qwen_tokenizer();
  GenerateRequest req = parse(R"({"model": "demo", "messages": [{"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}],
      "n": 2, "seed": 9223372036854775807, "stop": "END", "max_completion_tokens": 5, "temperature": 0.5,
      "logit_bias": {"17": -100}, "top_logprobs": 3, "logprobs": true})",
                              true);
  ASSERT_EQ(req.messages.size(), 2u);
  EXPECT_EQ(req.messages[0].role, "system");
  EXPECT_EQ(req.messages[1].content, "Hi there");
  const Prompts p = make_prompts(req, qwen_served(), tok);
  const RenderedChat rc = render_chat("qwen2.5", req.messages, req.chat_options);
  ASSERT_EQ(p.ids.size(), 1u);
  EXPECT_EQ(p.ids[0], tok.encode(rc.prompt));
  const GenerationParams e0 = engine_request(req, tok, 0).params, e1 = engine_request(req, tok, 1).params;
  EXPECT_EQ(e0.max_new_tokens, 5);
  EXPECT_FLOAT_EQ(e0.sampling.temperature, 0.5f);
  EXPECT_EQ(e0.top_logprobs, 3);
  EXPECT_EQ(e0.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{17, -100.f}}));
  // The template's end-of-turn string and id are stops as well as the request's.
  EXPECT_EQ(e0.stop.front(), "END");
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  EXPECT_NE(std::find(e0.stop_token_ids.begin(), e0.stop_token_ids.end(), im_end), e0.stop_token_ids.end());
  // Each choice its own seed, wrapping at the end of int64.
  EXPECT_EQ(*e0.sampling.seed, static_cast<uint64_t>(INT64_MAX));
  EXPECT_EQ(*e1.sampling.seed, static_cast<uint64_t>(INT64_MIN));
}

TEST(OpenAiProtocol, CompletionPromptsInEveryForm) {
  const Tokenizer& tok = qwen_tokenizer();
  GenerateRequest a = parse(R"({"model": "demo", "prompt": ["one", "two"], "echo": true})", false);
  EXPECT_EQ(make_prompts(a, qwen_served(), tok).ids, (std::vector<std::vector<int32_t>>{tok.encode("one"), tok.encode("two")}));
  GenerateRequest b = parse(R"({"model": "demo", "prompt": [[5, 6], [7.0]]})", false);
  const Prompts pb = make_prompts(b, qwen_served(), tok);
  EXPECT_EQ(pb.ids, (std::vector<std::vector<int32_t>>{{5, 6}, {7}}));
  EXPECT_EQ(pb.texts[0], tok.decode({5, 6}, false));
  GenerateRequest c = parse(R"({"model": "demo", "prompt": [5, 6], "max_tokens": 4094})", false);
  EXPECT_EQ(make_prompts(c, qwen_served(), tok).ids.size(), 1u);
  GenerateRequest d = parse(R"({"model": "demo", "prompt": [5, 6], "max_tokens": 4095})", false);
  EXPECT_THROW(make_prompts(d, qwen_served(), tok), ApiError);  // past the context
}

// Each bad request is a 400 (a 404 for another model) whose param names the field.
TEST(OpenAiProtocol, EachBadFieldIsRefusedByName) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::vector<std::pair<std::string, std::pair<int, std::string>>> cases = {
      {R"({"prompt": "x"})", {400, "model"}},
      {R"({"model": 5, "prompt": "x"})", {400, "model"}},
      {R"({"model": "other", "prompt": "x"})", {404, "model"}},
      {R"({"model": "demo", "prompt": "x", "temperature": 2.5})", {400, "temperature"}},
      {R"({"model": "demo", "prompt": "x", "max_tokens": 1e300})", {400, "max_tokens"}},
      {R"({"model": "demo", "prompt": "x", "max_tokens": 2.5})", {400, "max_tokens"}},
      {R"({"model": "demo", "prompt": "x", "max_tokens": -1})", {400, "max_tokens"}},
      {R"({"model": "demo", "prompt": "x", "n": 17})", {400, "n"}},
      {R"({"model": "demo", "prompt": "x", "stop": ["a", ""]})", {400, "stop"}},
      {R"({"model": "demo", "prompt": "x", "logprobs": 6})", {400, "logprobs"}},
      {R"({"model": "demo", "prompt": "x", "logit_bias": {"a": 1}})", {400, "logit_bias"}},
      {R"({"model": "demo", "prompt": "x", "stream_options": {"include_usage": true}})", {400, "stream_options"}},
      {R"({"model": "demo", "prompt": "x", "suffix": "y"})", {400, "suffix"}},
      {R"({"model": "demo", "prompt": "x", "response_format": {"type": "json_object", "schema": []}})",
       {400, "response_format"}},
      {R"({"model": "demo", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}})",
       {400, "response_format"}},
      {R"({"model": "demo", "prompt": [1, -1]})", {400, "prompt"}},
      {R"({"model": "demo", "prompt": {}})", {400, "prompt"}},
      {R"({"model": "demo", "messages": []})", {400, "messages"}},
      {R"({"model": "demo", "messages": [{"role": "robot", "content": "x"}]})", {400, "messages"}},
      {R"({"model": "demo", )" + msgs + R"(, "top_logprobs": 2})", {400, "top_logprobs"}},
      {R"({"model": "demo", )" + msgs + R"(, "tool_choice": "required"})", {400, "tool_choice"}},
      {R"({"model": "demo", )" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "a b"}}]})", {400, "tools"}},
      {R"({"model": "demo", )" + msgs + R"(, "chat_template_kwargs": {"x": 1}})", {400, "chat_template_kwargs"}},
      {R"({"model": "demo", )" + msgs + R"(, "functions": [{}]})", {400, "functions"}},
      // Contradictions between fields (OpenAI's and vLLM's 400s).
      {R"({"model": "demo", "prompt": "x", "max_tokens": 4, "min_tokens": 5})", {400, "min_tokens"}},
      {R"({"model": "demo", "prompt": "x", "min_tokens": -1})", {400, "min_tokens"}},
      {R"({"model": "demo", "prompt": "x", "best_of": 1, "n": 2})", {400, "best_of"}},
      {R"({"model": "demo", )" + msgs + R"(, "parallel_tool_calls": false})", {400, "parallel_tool_calls"}},
      // Fields that would change the output and that this server does not have, by name.
      {R"({"model": "demo", "prompt": "x", "use_beam_search": true})", {400, "use_beam_search"}},
      {R"({"model": "demo", "prompt": "x", "include_stop_str_in_output": true})", {400, "include_stop_str_in_output"}},
      {R"({"model": "demo", "prompt": "x", "skip_special_tokens": false})", {400, "skip_special_tokens"}},
      {R"({"model": "demo", "prompt": "x", "guided_json": {"type": "object"}})", {400, "guided_json"}},
      {R"({"model": "demo", "prompt": "x", "prompt_logprobs": 1})", {400, "prompt_logprobs"}},
      {R"({"model": "demo", )" + msgs + R"(, "continue_final_message": true})", {400, "continue_final_message"}},
      {R"({"model": "demo", )" + msgs + R"(, "add_generation_prompt": false})", {400, "add_generation_prompt"}},
  };
  for (const auto& [body, want] : cases) {
    const bool chat = body.find("\"messages\"") != std::string::npos;
    try {
      parse(body, chat);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, want.first) << body << ": " << e.message;
      EXPECT_EQ(e.param, want.second) << body << ": " << e.message;
    }
  }
  // Their neutral values, which some clients always send, are served.
  for (const std::string& body : std::vector<std::string>{R"({"model": "demo", "prompt": "x", "use_beam_search": false, "length_penalty": 1,
                                    "skip_special_tokens": true, "include_stop_str_in_output": false,
                                    "guided_json": null, "min_tokens": 0, "best_of": 1})",
                                 R"({"model": "demo", )" + msgs + R"(, "add_generation_prompt": true, "echo": false,
                                    "continue_final_message": false, "parallel_tool_calls": true})"})
    EXPECT_NO_THROW(parse(body, body.find("\"messages\"") != std::string::npos)) << body;
  const GenerateRequest held = parse(R"({"model": "demo", "prompt": "x", "max_tokens": 8, "min_tokens": 3})", false);
  EXPECT_EQ(engine_request(held, qwen_tokenizer(), 0).params.min_new_tokens, 3);
  // Ids the tokenizer does not have are refused where the engine's parameters are made.
  GenerateRequest big = parse(R"({"model": "demo", "prompt": "x", "logit_bias": {"99999999": 1}})", false);
  EXPECT_THROW(engine_request(big, qwen_tokenizer(), 0), ApiError);
  for (const char* body : {"[1]", "{\"a\": NaN}", "{\"model\": \"\xff\"}", "", "{\"n\": 010}"})
    EXPECT_THROW(parse_body(body), ApiError);
  // Nesting: up to kMaxRequestDepth levels (brackets inside strings do not count).
  const std::string in = "{\"a\":" + std::string(kMaxRequestDepth - 1, '[') + std::string(kMaxRequestDepth - 1, ']') + "}";
  EXPECT_NO_THROW(parse_body(in));
  EXPECT_NO_THROW(parse_body("{\"s\": \"" + std::string(100, '[') + "\\\"\"}"));
  const std::string past = "{\"a\":" + std::string(kMaxRequestDepth, '[') + std::string(kMaxRequestDepth, ']') + "}";
  EXPECT_THROW(parse_body(past), ApiError);
}

TEST(OpenAiResponse, UsageCountsAPromptOnceWithItsBestCachedChoice) {
  GenerateRequest req = parse(R"({"model": "demo", "prompt": ["aa", "bbb"], "n": 2})", false);
  const Prompts p = make_prompts(req, qwen_served(), qwen_tokenizer());
  ResponseState r = start_response(req, p, "cmpl-1", 7, "demo");
  ASSERT_EQ(r.choices.size(), 4u);
  const int64_t cached[] = {1, 3, 0, 2};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(add_event(r, i, token_event(5, "x")));
    EXPECT_TRUE(add_event(r, i, finish_event("length", cached[i])));
    EXPECT_FALSE(add_event(r, i, token_event(5, "late")));  // a choice that is done takes nothing more
  }
  const Usage u = usage_of(r);
  EXPECT_EQ(u.prompt_tokens, static_cast<int64_t>(p.ids[0].size() + p.ids[1].size()));
  EXPECT_EQ(u.completion_tokens, 4);
  EXPECT_EQ(u.cached_tokens, 3 + 2);
  IdMaker ids;
  const ResponseContext ctx{qwen_tokenizer(), false, ids};
  const json::Value body = response_json(r, ctx);
  EXPECT_EQ(body.find("choices")->as_array().size(), 4u);
  EXPECT_EQ(body.find("choices")->as_array()[3].find("text")->as_string(), "x");
  EXPECT_EQ(body.find("usage")->find("prompt_tokens_details")->find("cached_tokens")->as_int(), 5);
}

// What a stream sends, put together, is what the whole response says: text, logprobs (each
// token's once, on the chunk that carries it or the next), and the tool calls at the end.
TEST(OpenAiResponse, StreamedChunksAddUpToTheWholeResponse) {
  const Tokenizer& tok = qwen_tokenizer();
  const std::string answer = "Sure.<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  const std::vector<int32_t> ids = tok.encode(answer, false);
  GenerateRequest req = parse(R"({"model": "demo", "messages": [{"role": "user", "content": "weather?"}],
      "logprobs": true, "top_logprobs": 1, "stream": true,
      "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]})",
                              true);
  ASSERT_TRUE(req.tools.parse);
  const Prompts p = make_prompts(req, qwen_served(), tok);
  ResponseState streamed = start_response(req, p, "chatcmpl-1", 7, "demo");
  ResponseState whole = streamed;
  IdMaker call_ids;
  const ResponseContext ctx{tok, false, call_ids};
  std::string content, finish;
  size_t logprobs_seen = 0;
  json::Value tool_calls;
  std::vector<EngineEvent> events;
  for (int32_t id : ids) {
    EngineEvent ev = token_event(id, tok.token_bytes(id, false));
    ev.top = {{id, -0.5}};
    events.push_back(ev);
  }
  events.push_back(finish_event("stop"));
  for (const EngineEvent& ev : events) {
    add_event(whole, 0, ev);
    add_event(streamed, 0, ev);
    for (const json::Value& chunk : stream_chunks(streamed, 0, ev, ctx)) {
      const json::Value& ch = chunk.find("choices")->as_array().at(0);
      if (const json::Value* d = ch.find("delta")) {
        if (const json::Value* c = d->find("content")) content += c->as_string();
        if (const json::Value* t = d->find("tool_calls")) tool_calls = *t;
      }
      if (const json::Value* lp = ch.find("logprobs"); lp && !lp->is_null())
        logprobs_seen += lp->find("content")->as_array().size();
      if (!ch.find("finish_reason")->is_null()) finish = ch.find("finish_reason")->as_string();
    }
  }
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(logprobs_seen, ids.size());
  ASSERT_TRUE(tool_calls.is_array());
  EXPECT_EQ(tool_calls.as_array().at(0).find("function")->find("name")->as_string(), "get");
  EXPECT_EQ(tool_calls.as_array().at(0).find("id")->as_string().rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(tool_calls.as_array().at(0).find("function")->find("arguments")->as_string(), "{\"city\": \"Oslo\"}");
  const json::Value body = response_json(whole, ctx);
  const json::Value& choice = body.find("choices")->as_array().at(0);
  EXPECT_EQ(choice.find("finish_reason")->as_string(), "tool_calls");
  EXPECT_EQ(choice.find("message")->find("content")->as_string(), "Sure.");
  EXPECT_EQ(choice.find("message")->find("tool_calls")->as_array().at(0).find("function")->dump(),
            tool_calls.as_array().at(0).find("function")->dump());
  EXPECT_EQ(choice.find("logprobs")->find("content")->as_array().size(), ids.size());
}

// Mistral's [TOOL_CALLS] is a special token the worker's text leaves out: the response puts it
// back where the model emitted it, so the parser finds the calls.
TEST(OpenAiResponse, MistralToolCallMarkerComesBackFromItsToken) {
  ResponseState r;
  r.chat = true;
  r.tools.parse = true;
  r.tools.parser = "mistral";
  r.markers = {{77, "[TOOL_CALLS]"}};
  r.choices.resize(1);
  add_event(r, 0, token_event(77, ""));
  add_event(r, 0, token_event(5, "[{\"name\": \"f\", \"arguments\": {}}]"));
  add_event(r, 0, finish_event("stop"));
  IdMaker ids;
  const ResponseContext ctx{qwen_tokenizer(), false, ids, /*nine_alnum_tool_call_ids=*/true};
  const json::Value body = response_json(r, ctx);
  const json::Value& msg = *body.find("choices")->as_array().at(0).find("message");
  EXPECT_TRUE(msg.find("content")->is_null());
  const std::string id = msg.find("tool_calls")->as_array().at(0).find("id")->as_string();
  EXPECT_EQ(id.size(), 9u);  // Mistral's template takes only ids of 9 letters and digits
  EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isalnum(c); })) << id;
  EXPECT_EQ(msg.find("tool_calls")->as_array().at(0).find("function")->find("name")->as_string(), "f");
}


// A request the engine refuses is a 400 naming the field its part came from: the schema the
// engine could not compile is the tools' for a forced tool call, else the response_format's.
TEST(OpenAiProtocol, EngineRefusalsNameTheirField) {
  EngineEvent ev;
  ev.error = "the schema nests deeper than 64 levels";
  ev.refused = true;
  ev.refused_part = "json_schema";
  ToolRequest none;
  ApiError e = refusal_error(none, ev);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "response_format");
  EXPECT_EQ(e.message, "'response_format.json_schema.schema': the schema nests deeper than 64 levels");
  ToolRequest forced;
  forced.required = true;
  forced.schema = json::Object{{"type", "array"}};
  e = refusal_error(forced, ev);
  EXPECT_EQ(e.param, "tools");
  EXPECT_EQ(e.message, "the tools' parameters: the schema nests deeper than 64 levels");
  ev.refused_part.clear();
  ev.error = "the prompt has 9000 tokens but the KV cache holds 8192";
  e = refusal_error(forced, ev);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "");
  EXPECT_EQ(e.message, ev.error);
}

// generation_config.json's sampling fields, read as kvprd's defaults.
TEST(GenerationConfig, SamplingDefaultsFromGenerationConfig) {
  test::TempDir dir;
  EXPECT_TRUE(read_sampling_defaults(dir.path()).empty());  // no file
  std::ofstream(dir.file("generation_config.json"))
      << R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"})";
  SamplingDefaults d = read_sampling_defaults(dir.path());  // Qwen2.5-7B-Instruct's
  EXPECT_EQ(d.temperature, 0.7);
  EXPECT_EQ(d.top_p, 0.8);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(d.repetition_penalty, 1.05);
  EXPECT_EQ(d.describe(), "temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05");
  std::ofstream(dir.file("generation_config.json")) << R"({"temperature": null, "top_p": 0.9, "min_p": 0.05, "max_length": 4096})";
  d = read_sampling_defaults(dir.path());
  EXPECT_FALSE(d.temperature);
  EXPECT_EQ(d.describe(), "top_p 0.9, min_p 0.05");
  auto error = [&](const std::string& body) {
    std::ofstream(dir.file("generation_config.json")) << body;
    try {
      read_sampling_defaults(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(error(R"({"temperature": 2.5})"), "generation_config.json: \"temperature\" is 2.5, outside [0, 2]");
  EXPECT_HAS(error(R"({"top_p": 0})"), "\"top_p\" is 0, outside (0, 1]");
  EXPECT_HAS(error(R"({"min_p": 1.5})"), "\"min_p\" is 1.5, outside [0, 1]");
  EXPECT_HAS(error(R"({"top_k": 2.5})"), "\"top_k\" is 2.5");
  EXPECT_HAS(error(R"({"repetition_penalty": "high"})"), "\"repetition_penalty\" must be a number");
  EXPECT_HAS(error("[1]"), "expected a JSON object");
}


// response_format {"type": "json_object", "schema": {...}} (llama.cpp's and Together's form, as
// instructor's JSON_SCHEMA mode sends it) applies the schema; without one, any JSON object.
TEST(OpenAiProtocol, JsonObjectWithASchemaAppliesIt) {
  const Tokenizer& tok = qwen_tokenizer();
  GenerateRequest req = parse(R"({"model": "demo", "prompt": "x", "response_format": {"type": "json_object",
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})",
                              false);
  GenerationParams g = engine_request(req, tok, 0).params;
  EXPECT_FALSE(g.json_object);
  EXPECT_EQ(g.json_schema.dump(), R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
  req = parse(R"({"model": "demo", "prompt": "x", "response_format": {"type": "json_object"}})", false);
  g = engine_request(req, tok, 0).params;
  EXPECT_TRUE(g.json_object);
  EXPECT_TRUE(g.json_schema.is_null());
}

ServedModel generic_served() {
  ServedModel s = qwen_served();
  s.chat_template = "chatml";  // writes no tools
  s.tool_call_parser = "generic";
  return s;
}

const char* kWeatherTool =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}])";

// Tools on a template that writes none: described in a system message, the conversation's calls
// written as the JSON list the model is asked for and their results as user messages; a forced
// choice is constrained as with any template, and the answer parsed back as calls.
TEST(OpenAiProtocol, ToolsOnATemplateWithoutThemUseTheGenericFormat) {
  const Tokenizer& tok = qwen_tokenizer();
  const ServedModel served = generic_served();
  const std::string body = std::string(R"({"model": "demo", "tools": )") + kWeatherTool + R"(, "messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}, {"role": "user", "content": "And?"}]})";
  GenerateRequest req = parse(body, true, served);
  EXPECT_TRUE(req.tools.generic);
  EXPECT_TRUE(req.tools.parse);
  EXPECT_EQ(req.tools.parser, "generic");
  EXPECT_TRUE(req.chat_options.tools.empty());  // the template gets none
  const Prompts p = make_prompts(req, served, tok);
  const std::string tools_text = generic_tools_prompt({req.tools.tools, false, "", true});
  const std::vector<ChatMessage> want = {
      {"system", "Be brief.\n\n" + tools_text},
      {"user", "Weather in Paris?"},
      {"assistant", R"([{"name":"get_weather","parameters":{"city":"Paris"}}])"},
      {"user", "Tool result (call_1):\n21 C\n\nAnd?"}};
  EXPECT_EQ(p.ids.at(0), tok.encode(render_chat("chatml", want).prompt));
  EXPECT_NE(tools_text.find(R"({"name":"get_weather","parameters":{"type":"object")"), std::string::npos) << tools_text;
  EXPECT_NE(tools_text.find("answer with only a JSON list"), std::string::npos) << tools_text;

  // Forced: constrained to the list of calls, or to the named function's arguments.
  req = parse(std::string(R"({"model": "demo", "tool_choice": "required", "tools": )") + kWeatherTool +
                  R"(, "messages": [{"role": "user", "content": "Weather?"}]})",
              true, served);
  EXPECT_TRUE(req.tools.required);
  EXPECT_EQ(engine_request(req, tok, 0).params.json_schema.find("type")->as_string(), "array");
  req = parse(std::string(R"({"model": "demo", "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "tools": )") + kWeatherTool + R"(, "messages": [{"role": "user", "content": "Weather?"}]})",
              true, served);
  EXPECT_EQ(req.tools.named, "get_weather");
  EXPECT_EQ(engine_request(req, tok, 0).params.json_schema.find("type")->as_string(), "object");
  const Prompts named = make_prompts(req, served, tok);
  EXPECT_NE(tok.decode(named.ids.at(0), false).find("Now call the function get_weather: answer with only its arguments"),
            std::string::npos);
  EXPECT_EQ(tok.decode(named.ids.at(0), false).find("JSON list"), std::string::npos);

  // A template that writes no system message gets the tools in the first user message.
  const std::vector<ChatMessage> no_system =
      generic_tool_messages({{"user", "Hi"}}, {req.tools.tools, false, "", true}, /*writes_system=*/false);
  ASSERT_EQ(no_system.size(), 1u);
  EXPECT_EQ(no_system[0].content, tools_text + "\n\nHi");

  // --tool-call-parser none still refuses tools.
  ServedModel off = served;
  off.tool_call_parser = "none";
  try {
    parse(std::string(R"({"model": "demo", "tools": )") + kWeatherTool + R"(, "messages": [{"role": "user", "content": "x"}]})",
          true, off);
    ADD_FAILURE() << "tools with --tool-call-parser none were taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
  }
}

// tool_choice "required" constrains the answer to a list of calls, each tool's parameters in the
// list's $defs: a tool's own $refs ("#", "#/$defs/X", as Pydantic writes nested models) still
// mean its parameters and its definitions, not the list around them.
TEST(OpenAiProtocol, ForcedToolCallsKeepEachToolsRefs) {
  GenerateRequest req = parse(R"({"model": "demo", "tool_choice": "required",
      "messages": [{"role": "user", "content": "x"}], "tools": [
      {"type": "function", "function": {"name": "route", "parameters": {"$defs": {"City": {"type": "object",
          "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false}},
          "type": "object", "properties": {"to": {"$ref": "#/$defs/City"}, "via": {"anyOf": [{"type": "null"},
          {"$ref": "#"}]}}, "required": ["to"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {},
          "additionalProperties": false}}}]})",
                              true);
  const JsonSchema schema = JsonSchema::compile(engine_request(req, qwen_tokenizer(), 0).params.json_schema);
  auto valid = [&](const std::string& text) {
    SchemaRecognizer r(&schema);
    return r.feed(text) && r.complete();
  };
  EXPECT_TRUE(valid(R"([{"name":"route","parameters":{"to":{"name":"Oslo"}}}])"));
  EXPECT_TRUE(valid(R"([{"name":"route","parameters":{"to":{"name":"Oslo"},"via":{"to":{"name":"Bergen"}}}},)"
                    R"({"name":"ping","parameters":{}}])"));
  EXPECT_FALSE(valid(R"([{"name":"route","parameters":{"to":"Oslo"}}])"));  // City is an object
  EXPECT_FALSE(valid(R"([{"name":"route","parameters":{"to":{"name":"Oslo"},"via":[]}}])"));  // "#" is route's
  EXPECT_FALSE(valid(R"([{"name":"ping","parameters":{"to":{"name":"Oslo"}}}])"));
  EXPECT_FALSE(valid("[]"));
  // $defs and definitions of one name stay apart; a "$ref" that is data (in an enum) stays data.
  req = parse(R"({"model": "demo", "tool_choice": "required", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "$defs": {"X": {"type": "integer"}}, "definitions": {"X": {"type": "string"}},
          "properties": {"i": {"$ref": "#/$defs/X"}, "s": {"$ref": "#/definitions/X"},
                         "e": {"type": "string", "default": {"$ref": "#"}}}, "additionalProperties": false}}}]})",
              true);
  const json::Value wrapped = engine_request(req, qwen_tokenizer(), 0).params.json_schema;
  EXPECT_NE(wrapped.dump().find(R"("default":{"$ref":"#"})"), std::string::npos) << wrapped.dump();
  const JsonSchema both = JsonSchema::compile(wrapped);
  auto valid_both = [&](const std::string& text) {
    SchemaRecognizer r(&both);
    return r.feed(text) && r.complete();
  };
  EXPECT_TRUE(valid_both(R"([{"name":"f","parameters":{"i":1,"s":"a","e":"b"}}])"));
  EXPECT_FALSE(valid_both(R"([{"name":"f","parameters":{"i":"a"}}])"));
  EXPECT_FALSE(valid_both(R"([{"name":"f","parameters":{"s":1}}])"));
  // A tool whose parameters are only "$ref": "#" names no value: refused, not a list of lists.
  req = parse(R"({"model": "demo", "tool_choice": "required", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]})",
              true);
  EXPECT_THROW(JsonSchema::compile(engine_request(req, qwen_tokenizer(), 0).params.json_schema), Error);
}

// The generic answer comes back as tool_calls, whole and streamed.
TEST(OpenAiResponse, GenericToolCallsComeBackAsCalls) {
  const Tokenizer& tok = qwen_tokenizer();
  GenerateRequest req = parse(std::string(R"({"model": "demo", "stream": true, "tools": )") + kWeatherTool +
                                  R"(, "messages": [{"role": "user", "content": "Weather?"}]})",
                              true, generic_served());
  const Prompts p = make_prompts(req, generic_served(), tok);
  ResponseState streamed = start_response(req, p, "chatcmpl-1", 7, "demo"), whole = streamed;
  IdMaker ids;
  const ResponseContext ctx{tok, false, ids};
  std::string content, finish;
  json::Value calls;
  for (const EngineEvent& ev : {token_event(5, "[{\"name\": \"get_weather\", "), token_event(6, "\"parameters\": {\"city\": "),
                                token_event(7, "\"Paris\"}}]"), finish_event("stop")}) {
    add_event(whole, 0, ev);
    add_event(streamed, 0, ev);
    for (const json::Value& chunk : stream_chunks(streamed, 0, ev, ctx)) {
      const json::Value& ch = chunk.find("choices")->as_array().at(0);
      if (const json::Value* c = ch.find("delta")->find("content"); c && c->is_string()) content += c->as_string();
      if (const json::Value* t = ch.find("delta")->find("tool_calls")) calls = *t;
      if (!ch.find("finish_reason")->is_null()) finish = ch.find("finish_reason")->as_string();
    }
  }
  EXPECT_EQ(content, "");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_TRUE(calls.is_array());
  EXPECT_EQ(calls.as_array().at(0).find("function")->dump(), R"({"name":"get_weather","arguments":"{\"city\": \"Paris\"}"})");
  const json::Value body = response_json(whole, ctx);
  const json::Value& msg = *body.find("choices")->as_array().at(0).find("message");
  EXPECT_TRUE(msg.find("content")->is_null());
  EXPECT_EQ(msg.find("tool_calls")->as_array().at(0).find("function")->dump(), calls.as_array().at(0).find("function")->dump());
}

}  // namespace
}  // namespace kvpr
