// OpenAI's Responses API (POST /v1/responses, as OpenAI documents it and vLLM serves it) on the
// chat path: a request's input items (messages with input_text parts, function_call and
// function_call_output items, the stored conversation of a previous_response_id) and its
// instructions, tools, tool_choice, text.format and limits are translated into a chat completion
// request and parsed by the same code (openai/request.h: template, tools, reasoning, constraints,
// the limits and checks); the chat's answer, whole or as its stream's chunks (openai/response.h),
// is turned into the Response object's output items (reasoning, message, function_call) and the
// Responses event sequence. Finished responses are kept for previous_response_id and GET in a
// ResponseStore bounded in count, bytes and age.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/base/json.h"
#include "openai/ids.h"
#include "openai/request.h"

namespace kvpr {

// POST /v1/responses, parsed.
struct ResponsesRequest {
  GenerateRequest chat;  // what the engine is asked: the conversation as a chat completion request
  json::Array input;     // this request's input as items (a string input becomes one user message)
  // The stored conversation (previous_response_id's input and output items, oldest first) and
  // this input after it: what a later previous_response_id continues.
  json::Array conversation;
  std::string previous_response_id;
  bool store = true;
  // The request's fields the Response object repeats, in OpenAI's order and with its defaults
  // (instructions, max_output_tokens, metadata, parallel_tool_calls, temperature, text, tool_choice,
  // tools, top_p, truncation, user, reasoning, store, previous_response_id).
  json::Object echo;
};

// The body (a JSON object, its "model" checked by the caller) as a Responses request; the items of
// `previous` (ResponseStore::conversation of previous_response_id) come first. 400s name the
// Responses field (input, max_output_tokens, text.format, tools, ...); built-in tools (web search,
// file search, ...), background responses, conversations and reusable prompts are refused by name.
ResponsesRequest parse_responses_request(const json::Value& body, const ServedModel& served, const Tokenizer& tok,
                                         const json::Array* previous);
// What previous_response_id the body names ("" when none; a 400 when it is not a string).
std::string previous_response_id_of(const json::Value& body);
// An ApiError of the chat parser (or an engine refusal) with its param and message in the
// Responses' names: messages -> input, max_tokens -> max_output_tokens, response_format -> text.format.
ApiError as_responses_error(ApiError e);

// One Response, built as the chat answer's events come (one choice: n is 1).
class ResponsesTurn {
 public:
  ResponsesTurn(ResponsesRequest req, std::string id, int64_t created_at, std::string model, IdMaker& ids);

  // The Response object as it stands: status "in_progress", "completed", "incomplete" or "failed",
  // its output items so far, usage once finished.
  json::Value object() const;
  const std::string& id() const { return id_; }
  const ResponsesRequest& request() const { return req_; }

  // The whole answer: its output items from the chat completion (response_json) and the status
  // from its finish reason; `usage` the chat's usage.
  void finish_whole(const json::Value& chat_completion);

  // Streaming: the events so far, each as (type, JSON with its sequence_number): response.created
  // and response.in_progress first, then those of each chat chunk (stream_chunks), then the
  // items' done events and response.completed or response.incomplete.
  using Event = std::pair<std::string, json::Value>;
  std::vector<Event> start_events();
  std::vector<Event> chunk_events(const json::Value& chat_chunk);
  std::vector<Event> finish_events(const std::string& finish_reason, const json::Value& chat_usage);
  // A stream that fails: an "error" event (OpenAI's shape: code, message, param), then
  // response.failed with the Response, its status "failed" and its error.
  std::vector<Event> error_events(const ApiError& e);

  // What the store keeps: the conversation with this response's output items after it.
  json::Array stored_conversation() const;

 private:
  Event event(std::string type, json::Object fields);
  void close_open(std::vector<Event>& out);
  void open_item(std::vector<Event>& out, json::Object item, bool with_part);
  void set_status(const std::string& finish_reason, const json::Value& chat_usage);

  ResponsesRequest req_;
  std::string id_;
  int64_t created_at_;
  std::string model_;
  IdMaker& ids_;
  std::string status_ = "in_progress";
  json::Value incomplete_details_;
  json::Value error_;
  json::Value usage_;
  json::Array output_;
  int64_t sequence_ = 0;
  // The item being streamed (-1: none), what kind ("reasoning", "message", "function_call") and
  // the chat tool-call index it is (function calls).
  int64_t open_ = -1;
  std::string open_type_;
  int64_t open_call_index_ = -1;
};

// Response (usage) as the Responses API counts it, from a chat completion's usage.
json::Value responses_usage(const json::Value& chat_usage);

// Finished responses for previous_response_id and GET/DELETE /v1/responses/{id}: at most
// `max_entries` (0: none kept, the store is off) and `max_bytes` of JSON, each for `ttl` after it
// was stored; the oldest go first. Input items are kept with the fields this server reads alone
// (a client's other keys are dropped at parsing), so a stored conversation is what it renders.
class ResponseStore {
 public:
  using Clock = std::chrono::steady_clock;
  ResponseStore(size_t max_entries, size_t max_bytes, std::chrono::seconds ttl)
      : max_entries_(max_entries), max_bytes_(max_bytes), ttl_(ttl) {}

  bool enabled() const { return max_entries_ > 0; }
  void put(const std::string& id, const json::Value& response, const json::Array& conversation,
           const json::Array& input, Clock::time_point now = Clock::now());
  // Kept as JSON text, so that what the store holds is what it counts (a tree of values takes
  // many times its text's bytes).
  struct Entry {
    std::string response;      // the Response object as returned
    std::string conversation;  // input and output items, oldest first (what previous_response_id continues)
    std::string input;         // its own request's input items (GET .../input_items)
    size_t bytes = 0;
    Clock::time_point stored;
  };
  const Entry* find(const std::string& id, Clock::time_point now = Clock::now());
  bool erase(const std::string& id);
  size_t size() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  void evict(Clock::time_point now);

  size_t max_entries_, max_bytes_;
  std::chrono::seconds ttl_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
  size_t bytes_ = 0;
};

}  // namespace kvpr
