#include "daemon/server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <chrono>
#include <deque>
#include <fcntl.h>
#include <random>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "openai/chat_template.h"
#include "openai/reasoning.h"
#include "openai/tool_calls.h"
#include "engine/constrain/json_schema.h"
#include "engine/decode/sampling.h"
#include "daemon/metrics.h"
#include "engine/base/error.h"

namespace kvpr {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace bj = boost::json;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ errors

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status;
  std::string message;
  std::string type;
  std::string param;
};

ApiError bad_request(std::string msg, std::string param = "") {
  return {400, std::move(msg), "invalid_request_error", std::move(param)};
}

bj::value error_body(const ApiError& e) {
  bj::object err;
  err["message"] = sanitize_utf8(e.message);  // a message may quote request bytes (a path, a key)
  err["type"] = e.type;
  err["param"] = e.param.empty() ? bj::value(nullptr) : bj::value(sanitize_utf8(e.param));
  err["code"] = e.status;
  return bj::object{{"error", err}};
}

// ------------------------------------------------------------------ state

struct Server::State {
  net::io_context& io;
  DaemonConfig cfg;
  WorkerPool& pool;
  const Tokenizer& tok;
  ServedModel served;
  tcp::acceptor acceptor;
  net::steady_timer accept_backoff;  // accept() failed (no descriptors): the next try waits
  Clock::time_point accept_error_logged{};
  int64_t connections = 0;  // open sessions
  DaemonMetrics metrics;
  bool draining = false;
  // HTTP generation requests from their start until their response's last byte is written (or
  // the client is gone): a drain waits for these, so no stream loses its end.
  int64_t active_requests = 0;
  std::unordered_set<Session*> sessions;  // open connections (abandoned at the drain timeout)
  int64_t engine_in_flight = 0; // engine requests (choices) not finished
  uint64_t next_engine_id = 1;
  std::mt19937_64 rng{std::random_device{}()};
  int64_t created_unix = 0;
  State(net::io_context& i, const DaemonConfig& c, WorkerPool& p, const Tokenizer& t, const ServedModel& m)
      : io(i), cfg(c), pool(p), tok(t), served(m), acceptor(i), accept_backoff(i) {}

  std::string new_id(const char* prefix) {
    static const char* hex = "0123456789abcdef";
    std::string s = prefix;
    uint64_t a = rng(), b = rng();
    for (int i = 0; i < 16; ++i) s += hex[(a >> (4 * i)) & 15];
    for (int i = 0; i < 8; ++i) s += hex[(b >> (4 * i)) & 15];
    return s;
  }
};

// ------------------------------------------------------------------ request parsing

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const bj::value* field(const bj::object& o, const char* k) {
  auto it = o.find(k);
  return it == o.end() || it->value().is_null() ? nullptr : &it->value();
}

double number_of(const bj::value& v, const char* name) {
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  if (v.is_double()) return v.as_double();
  throw bad_request(std::string("'") + name + "' must be a number", name);
}

// An integer field (an integral double too, as JavaScript clients send 5.0): within int64, else a
// 400 (a double beyond it cannot be converted at all).
int64_t int_of(const bj::value& v, const char* name) {
  if (v.is_int64()) return v.as_int64();
  if (v.is_uint64() && v.as_uint64() <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(v.as_uint64());
  if (v.is_double() && std::abs(v.as_double()) < 0x1p62 && v.as_double() == std::floor(v.as_double()))
    return static_cast<int64_t>(v.as_double());
  if (v.is_uint64() || v.is_double()) throw bad_request(std::string("'") + name + "' is out of range", name);
  throw bad_request(std::string("'") + name + "' must be an integer", name);
}

bool bool_of(const bj::value& v, const char* name) {
  if (!v.is_bool()) throw bad_request(std::string("'") + name + "' must be a boolean", name);
  return v.as_bool();
}

// A JSON value of the request as the engine's (key order and duplicates kept).
json::Value engine_json(const bj::value& v) { return json::parse(bj::serialize(v)); }

struct Sampling {
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0;  // vLLM's extension
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;  // vLLM's extension; chat templates add their end-of-turn id
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int64_t top_logprobs = 0;  // alternatives per token: completions' logprobs=k, chat's top_logprobs
  double repetition_penalty = 1;  // vLLM's extension
  double presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int64_t, double>> logit_bias;
  bool echo = false;
  bool ignore_eos = false;
  bool json_object = false;  // chat: response_format json_object
  json::Value json_schema;   // chat: response_format json_schema's schema
};

// A request's sampling fields; those it leaves out take `d` (generation_config.json's) where set,
// else OpenAI's defaults.
Sampling parse_sampling(const bj::object& o, bool chat, const SamplingDefaults& d) {
  Sampling s;
  s.temperature = d.temperature.value_or(s.temperature);
  s.top_p = d.top_p.value_or(s.top_p);
  s.top_k = std::max<int64_t>(d.top_k.value_or(s.top_k), 0);
  s.min_p = d.min_p.value_or(s.min_p);
  s.repetition_penalty = d.repetition_penalty.value_or(s.repetition_penalty);
  if (auto v = field(o, "max_tokens")) s.max_tokens = int_of(*v, "max_tokens");
  if (chat)
    if (auto v = field(o, "max_completion_tokens")) s.max_tokens = int_of(*v, "max_completion_tokens");
  if (s.max_tokens < 0) throw bad_request("'max_tokens' must be >= 0", "max_tokens");
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
    if (auto u = field(v->as_object(), "include_usage")) s.include_usage = bool_of(*u, "stream_options.include_usage");
  }
  if (auto v = field(o, "stop")) {
    if (v->is_string()) {
      s.stop.emplace_back(v->as_string());
    } else if (v->is_array()) {
      for (const auto& e : v->as_array()) {
        if (!e.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        s.stop.emplace_back(e.as_string());
      }
      if (s.stop.size() > 4) throw bad_request("'stop' holds at most 4 strings", "stop");
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& st : s.stop)
      if (st.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (auto v = field(o, "stop_token_ids"); v && !v->is_null()) {
    if (!v->is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    for (const auto& e : v->as_array()) s.stop_token_ids.push_back(int_of(e, "stop_token_ids"));
    if (s.stop_token_ids.size() > 16) throw bad_request("'stop_token_ids' holds at most 16 ids", "stop_token_ids");
  }
  if (auto v = field(o, "logprobs")) {
    if (chat) {
      s.logprobs = bool_of(*v, "logprobs");
    } else {
      int64_t k = int_of(*v, "logprobs");
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
      if (!(*dst >= -2 && *dst <= 2)) throw bad_request(std::string("'") + name + "' must be in [-2, 2]", name);
    }
  if (auto v = field(o, "logit_bias"); v && !v->is_null()) {
    if (!v->is_object()) throw bad_request("'logit_bias' must map token ids to numbers", "logit_bias");
    for (const auto& kv : v->as_object()) {
      const std::string key(kv.key());
      int64_t id = -1;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0)
        throw bad_request("'logit_bias' keys must be token ids, got '" + key + "'", "logit_bias");
      const double b = number_of(kv.value(), "logit_bias");
      if (!(b >= -100 && b <= 100)) throw bad_request("'logit_bias' values must be in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(id, b);
    }
    if (s.logit_bias.size() > 300) throw bad_request("'logit_bias' holds at most 300 tokens", "logit_bias");
  }
  if (auto v = field(o, "user"); v && !v->is_string()) throw bad_request("'user' must be a string", "user");
  // Features this server does not have are refused, not silently ignored (their neutral
  // values, which some clients always send, are accepted).
  auto unsupported = [](const char* name, const char* what) {
    return bad_request(std::string("'") + name + "' is not supported by this server (" + what + ")", name);
  };
  if (!chat) {
    if (auto v = field(o, "suffix"); v && !v->is_null() && !(v->is_string() && v->as_string().empty()))
      throw unsupported("suffix", "insertion");
    if (auto v = field(o, "best_of"); v && !v->is_null() && !(v->is_int64() && v->as_int64() <= s.n))
      throw unsupported("best_of", "server-side best-of ranking");
  } else {
    if (auto v = field(o, "functions"); v && !(v->is_array() && v->as_array().empty()))
      throw unsupported("functions", "the deprecated function calling; use tools");
  }
  // Structured output, for chat and (as vLLM takes it) completions alike.
  {
    if (auto v = field(o, "response_format"); v && !v->is_null()) {
      const bj::value* type = v->is_object() ? v->as_object().if_contains("type") : nullptr;
      const std::string t = type && type->is_string() ? std::string(type->as_string()) : "";
      if (t == "json_object") {
        s.json_object = true;
      } else if (t == "json_schema") {
        const bj::value* js = field(v->as_object(), "json_schema");
        const bj::value* schema = js && js->is_object() ? field(js->as_object(), "schema") : nullptr;
        if (!schema) throw bad_request("'response_format.json_schema.schema' is required", "response_format");
        s.json_schema = engine_json(*schema);
        try {
          JsonSchema::compile(s.json_schema);
        } catch (const Error& e) {
          throw bad_request(std::string("'response_format.json_schema.schema': ") + e.what(), "response_format");
        }
      } else if (t != "text") {
        throw bad_request("'response_format' type must be text, json_object or json_schema", "response_format");
      }
    }
  }
  return s;
}

// What a chat request asks of tools: the tools written into the prompt, and whether the answer
// is searched for calls. tool_choice "none" (or no tools) leaves both out; "auto" (the default
// with tools) needs a tool-call parser; "required" and a named function would need decoding
// constrained to the tools' schemas, which this server does not do.
struct ToolRequest {
  json::Array tools;
  bool parse = false;
  std::string parser;  // hermes, llama3_json or mistral, when parse
  int32_t marker = -1;  // mistral: the [TOOL_CALLS] token, which the text does not show
  bool parallel = true;
  // tool_choice "required" or naming a function: the answer is constrained to `schema` (a list
  // of {"name", "parameters"} calls, or the named function's arguments) and is the calls.
  bool required = false;
  std::string named;
  json::Value schema;
};

ToolRequest parse_tools(const bj::object& o, const ServedModel& served) {
  ToolRequest t;
  const bj::value* tools = field(o, "tools");
  if (tools && !tools->is_array()) throw bad_request("'tools' must be a list", "tools");
  std::string choice = tools && !tools->as_array().empty() ? "auto" : "none";
  if (const bj::value* c = field(o, "tool_choice")) {
    const bj::value* fn = c->is_object() ? field(c->as_object(), "function") : nullptr;
    const bj::value* fname = fn && fn->is_object() ? field(fn->as_object(), "name") : nullptr;
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
    if ((choice == "required" || choice == "named") && (!tools || tools->as_array().empty()))
      throw bad_request("'tool_choice' " + choice + " needs 'tools'", "tool_choice");
  }
  if (const bj::value* p = field(o, "parallel_tool_calls")) t.parallel = bool_of(*p, "parallel_tool_calls");
  if (!tools || tools->as_array().empty()) return t;
  if (tools->as_array().size() > 128) throw bad_request("'tools' holds at most 128 tools", "tools");
  for (size_t i = 0; i < tools->as_array().size(); ++i) {
    const bj::value& tool = tools->as_array()[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    const bj::value* type = tool.is_object() ? field(tool.as_object(), "type") : nullptr;
    const bj::value* fn = tool.is_object() ? field(tool.as_object(), "function") : nullptr;
    if (!type || !type->is_string() || type->as_string() != "function" || !fn || !fn->is_object())
      throw bad_request(where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
    const bj::value* name = field(fn->as_object(), "name");
    bool ok = name && name->is_string() && !name->as_string().empty() && name->as_string().size() <= 64;
    for (char ch : ok ? std::string(name->as_string()) : std::string())
      ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-');
    if (!ok) throw bad_request(where + ".function.name must be 1 to 64 letters, digits, '_' or '-'", "tools");
    if (const bj::value* d = field(fn->as_object(), "description"); d && !d->is_string())
      throw bad_request(where + ".function.description must be a string", "tools");
    if (const bj::value* ps = field(fn->as_object(), "parameters"); ps && !ps->is_object())
      throw bad_request(where + ".function.parameters must be a JSON Schema object", "tools");
    if (choice == "none") continue;
    // The template sees {"type": "function", "function": {...as sent...}}.
    t.tools.push_back(json::Value(json::Object{{"type", json::Value("function")}, {"function", engine_json(*fn)}}));
  }
  if (choice == "none") return t;
  if (choice == "required" || choice == "named") {
    // Decoding constrained to the tools' schemas (as vLLM does it): a named function's
    // arguments, or a list of calls of the tools.
    json::Array calls;
    for (const auto& tool : t.tools) {
      const json::Value& fn = *tool.find("function");
      const json::Value* ps = fn.find("parameters");
      const json::Value params = ps ? *ps : json::Value(json::Object{{"type", json::Value("object")}});
      if (choice == "named" && fn.find("name")->as_string() == t.named) t.schema = params;
      calls.push_back(json::Value(json::Object{
          {"type", json::Value("object")},
          {"properties", json::Value(json::Object{{"name", json::Value(json::Object{{"const", *fn.find("name")}})},
                                                  {"parameters", params}})},
          {"required", json::Value(json::Array{json::Value("name"), json::Value("parameters")})},
          {"additionalProperties", json::Value(false)}}));
    }
    if (choice == "named" && t.schema.is_null())
      throw bad_request("'tool_choice' names '" + t.named + "', which is not among the tools", "tool_choice");
    if (choice == "required") {
      t.required = true;
      json::Object list{{"type", json::Value("array")}, {"minItems", json::Value(1)},
                        {"items", json::Value(json::Object{{"anyOf", json::Value(std::move(calls))}})}};
      if (!t.parallel) list.emplace_back("maxItems", json::Value(1));
      t.schema = json::Value(std::move(list));
    }
    try {
      JsonSchema::compile(t.schema);
    } catch (const Error& e) {
      throw bad_request(std::string("the tools' parameters: ") + e.what(), "tools");
    }
  }
  if (!chat_template_has_tools(served.chat_template))
    throw bad_request("'tools' need a chat template that writes them (qwen2.5, qwen3, mistral-nemo, llama-3.1, llama-3.2); "
                      "this model's is '" +
                          served.chat_template + "'",
                      "tools");
  if (choice != "auto") return t;
  if (served.tool_call_parser == "none")
    throw bad_request("'tools' are off: kvprd was started with --tool-call-parser none", "tools");
  t.parse = true;
  t.parser = served.tool_call_parser;
  return t;
}

// OpenAI's usage, with the prompt tokens served from the prefix cache as its cached_tokens.
bj::value usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return bj::object{{"prompt_tokens", prompt},
                    {"completion_tokens", completion},
                    {"total_tokens", prompt + completion},
                    {"prompt_tokens_details", bj::object{{"cached_tokens", cached}}}};
}

}  // namespace

// ------------------------------------------------------------------ a generation job

// One HTTP request's generations: n choices for each prompt, each an engine request.
struct Job {
  struct Choice {
    uint64_t engine_id = 0;
    std::vector<int32_t> prompt;
    std::string echo_text;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
    std::vector<std::vector<std::pair<int32_t, double>>> tops;  // per token, when asked for
    std::vector<double> prompt_logprobs;  // echo + logprobs: prompt tokens 1..P-1
    std::vector<std::vector<std::pair<int32_t, double>>> prompt_tops;
    bool echo_sent = false;  // streaming
    std::string finish;
    int64_t cached_tokens = 0;  // of the prompt's, found in the worker's prefix cache
    bool done = false;
    bool sent_role = false;
    ReasoningSplitter reasoning;  // streaming with a reasoning parser
    ToolCallStream tool_stream;  // streaming with tools
    bool tool_call_sent = false;  // streaming a named tool choice: its id and name went out
    std::string tool_text;        // the text with the tool-call marker where the model wrote it (mistral)
    size_t lp_sent = 0;     // streaming: tokens whose logprobs went out
    int64_t lp_offset = 0;  // streaming: text offset of the next token (completions)
  };
  bool chat = false;
  ToolRequest tools;  // chat: tools in the prompt, calls parsed from the answers
  std::string id;
  int64_t created = 0;
  std::string model;
  Sampling s;
  std::vector<Choice> choices;
  int64_t remaining = 0;
  std::string error;
  Clock::time_point t0 = Clock::now(), last_token;
  bool first_token_seen = false;
};

// ------------------------------------------------------------------ sessions

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, std::shared_ptr<Server::State> st) : stream_(std::move(sock)), st_(std::move(st)) {
    ++st_->connections;
    st_->sessions.insert(this);
  }
  ~Session() {
    --st_->connections;
    st_->sessions.erase(this);
  }

  // The drain timeout passed with this request still generating: it ends now, a stream with an
  // error event and [DONE], a non-streaming request with a 503; never an empty reply.
  void abandon() {
    if (!job_ || closed_) return;
    for (const auto& c : job_->choices)
      if (!c.done) st_->pool.cancel(c.engine_id);
    job_.reset();
    keep_alive_ = false;
    const ApiError e{503, "the server shut down before this request finished (--drain-timeout)", "service_unavailable", ""};
    if (streaming_) {
      push_sse(bj::serialize(error_body(e)));
      push_sse("[DONE]");
      push_last();
    } else {
      send_error(e);
    }
  }

  void start() { do_read(); }

  // Past --max-connections: a 503 and the connection closed, without reading a request.
  void refuse() {
    keep_alive_ = false;
    refusing_ = true;
    send_error({503, "the server has too many open connections (" + std::to_string(st_->cfg.max_connections) +
                         ", --max-connections); retry shortly",
                "service_unavailable", ""});
  }

 private:
  static std::chrono::milliseconds seconds_of(double s) {
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }

  // A response's bytes (each write of a stream) must leave within --http-idle-timeout: a client
  // that stops reading is closed (its generation cancelled) instead of holding a connection, its
  // queued output and a drain.
  void arm_write_timeout() { stream_.expires_after(seconds_of(st_->cfg.http_idle_timeout_s)); }

  // ---- reading and plain responses
  // A request is read as Beast's parser is meant to be used: bytes left over in buf_ after one
  // message are the next pipelined request; a kept-alive connection waits for its first byte
  // up to the idle timeout, then the whole request (headers and body) must come within the
  // request timeout; `Expect: 100-continue` is answered once the headers are in.
  void do_read() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(st_->cfg.max_body_bytes));
    parser_->header_limit(64 * 1024);
    if (buf_.size() > 0) return read_header();  // pipelined: the next request is here already
    stream_.expires_after(seconds_of(st_->cfg.http_idle_timeout_s));
    auto self = shared_from_this();
    stream_.async_read_some(buf_.prepare(64 * 1024), [self](beast::error_code ec, size_t n) {
      self->buf_.commit(n);
      if (ec) return self->close();  // the client closed, or was idle too long
      self->read_header();
    });
  }

  void read_header() {
    stream_.expires_after(seconds_of(st_->cfg.http_request_timeout_s));
    auto self = shared_from_this();
    http::async_read_header(stream_, buf_, *parser_, [self](beast::error_code ec, size_t) {
      if (ec) return self->on_read(ec, 0);
      if (beast::iequals(self->parser_->get()[http::field::expect], "100-continue") && !self->parser_->is_done()) {
        auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
        return http::async_write(self->stream_, *res, [self, res](beast::error_code wec, size_t) {
          if (wec) return self->close();
          self->read_body();
        });
      }
      self->read_body();
    });
  }

  void read_body() {
    if (parser_->is_done()) return on_read({}, 0);
    http::async_read(stream_, buf_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted) return close();
    if (ec == beast::error::timeout) {  // the stream has closed the socket: nothing can be sent
      spdlog::info("a request did not arrive whole within {}s (--http-request-timeout): connection closed",
                   st_->cfg.http_request_timeout_s);
      return close();
    }
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      return send_error({413, "request body larger than " + std::to_string(st_->cfg.max_body_bytes) + " bytes",
                         "invalid_request_error", ""});
    }
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return send_error({431, "request headers larger than 64 KiB", "invalid_request_error", ""});
    }
    if (ec) {
      keep_alive_ = false;
      return send_error(bad_request(std::string("malformed HTTP request: ") + ec.message()));
    }
    req_ = parser_->release();
    keep_alive_ = req_.keep_alive();
    stream_.expires_never();
    try {
      route();
    } catch (const ApiError& e) {
      send_error(e);
    } catch (const std::exception& e) {
      send_error({500, std::string("internal error: ") + e.what(), "server_error", ""});
    }
  }

  void send_json(int status, const bj::value& body, std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "kvprd");
    res->set(http::field::content_type, "application/json");
    for (auto& [k, v] : headers) res->set(k, v);
    res->body() = bj::serialize(body) + "\n";
    finish_response(res, status);
  }

  void send_text(int status, std::string body, const char* type) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "kvprd");
    res->set(http::field::content_type, type);
    res->body() = std::move(body);
    finish_response(res, status);
  }

  void finish_response(std::shared_ptr<http::response<http::string_body>> res, int status) {
    st_->metrics.http_responses[status]++;
    if (st_->draining) keep_alive_ = false;
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    auto self = shared_from_this();
    arm_write_timeout();
    http::async_write(stream_, *res, [self, res, status](beast::error_code ec, size_t) {
      self->end_request();
      if (!ec && (status == 413 || self->refusing_)) return self->discard_then_close();
      if (ec || !self->keep_alive_) return self->close();
      self->do_read();
    });
  }

  // After a 413 the client may still be sending its body: read and drop it for a while so it
  // gets to read the response instead of a reset connection.
  void discard_then_close() {
    stream_.expires_after(std::chrono::seconds(5));
    discard_.resize(64 * 1024);
    auto self = shared_from_this();
    stream_.async_read_some(net::buffer(discard_), [self](beast::error_code ec, size_t n) {
      self->discarded_ += n;
      if (ec || self->discarded_ > (64u << 20)) return self->close();
      self->discard_then_close();
    });
  }

  void send_error(const ApiError& e) {
    std::vector<std::pair<std::string, std::string>> h;
    if (e.status == 429) h.emplace_back("Retry-After", "1");
    if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
    if (e.status >= 500 || e.status == 429 || e.status == 413)
      spdlog::warn("{} {} -> {} {}", std::string(req_.method_string()), std::string(req_.target()), e.status, e.message);
    send_json(e.status, error_body(e), std::move(h));
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    cancel_job();
    end_request();
  }

  // A generation request counts from its start to its response's last byte.
  void begin_request() {
    request_counted_ = true;
    ++st_->active_requests;
  }
  void end_request() {
    if (!request_counted_) return;
    request_counted_ = false;
    --st_->active_requests;
  }

  // ---- routing
  void route() {
    std::string target(req_.target());
    std::string path = target.substr(0, target.find('?'));
    authorize(path);
    const bool get = req_.method() == http::verb::get, post = req_.method() == http::verb::post;
    auto need = [&](bool ok) {
      if (!ok) throw ApiError{405, "method " + std::string(req_.method_string()) + " not allowed on " + path,
                              "invalid_request_error", ""};
    };
    if (path == "/health") return need(get), health();
    if (path == "/metrics") return need(get), metrics();
    if (path == "/v1/models") return need(get), models();
    if (path == "/tokenize") return need(post), tokenize();
    if (path == "/detokenize") return need(post), detokenize();
    if (path == "/v1/completions") return need(post), generate(false);
    if (path == "/v1/chat/completions") return need(post), generate(true);
    throw ApiError{404, "no route " + path, "invalid_request_error", ""};
  }

  // With API keys set, /v1/*, /tokenize and /detokenize need `Authorization: Bearer KEY` (as
  // vLLM's --api-key); /health and /metrics stay open for probes and Prometheus.
  void authorize(const std::string& path) const {
    if (st_->cfg.api_keys.empty()) return;
    if (!path.starts_with("/v1/") && path != "/tokenize" && path != "/detokenize") return;
    const std::string_view auth = req_[http::field::authorization];
    constexpr std::string_view scheme = "Bearer ";
    bool ok = false;
    if (auth.size() > scheme.size() && beast::iequals(auth.substr(0, scheme.size()), scheme))
      for (const auto& key : st_->cfg.api_keys) ok = equal_in_constant_time(auth.substr(scheme.size()), key) || ok;
    if (!ok)
      throw ApiError{401, auth.empty() ? "this server needs an API key: send 'Authorization: Bearer KEY'"
                                       : "incorrect API key provided",
                     "invalid_request_error", ""};
  }

  // Whether `given` is `key`, in a time that depends on `given`'s length alone.
  static bool equal_in_constant_time(std::string_view given, std::string_view key) {
    unsigned diff = given.size() != key.size();
    for (size_t i = 0; i < given.size(); ++i)
      diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(key[i % key.size()]);
    return diff == 0;
  }

  bj::object body_object() {
    bj::error_code ec;
    bj::value v = bj::parse(req_.body(), ec);
    if (ec) throw bad_request("request body is not valid JSON: " + ec.message());
    if (!v.is_object()) throw bad_request("request body must be a JSON object");
    return std::move(v.as_object());
  }

  void check_model(const bj::object& o) {
    const bj::value* m = field(o, "model");
    if (!m) throw bad_request("'model' is required", "model");
    if (!m->is_string()) throw bad_request("'model' must be a string", "model");
    if (m->as_string() != st_->cfg.served_model_name)
      throw ApiError{404, "model '" + std::string(m->as_string()) + "' does not exist; this server serves '" +
                              st_->cfg.served_model_name + "'",
                     "invalid_request_error", "model"};
  }

  void health() {
    bj::array workers;
    int ready = 0;
    for (const auto& w : st_->pool.status()) {
      bj::object o{{"index", w.index}, {"state", w.state}, {"pid", w.pid}, {"restarts", w.restarts},
                   {"unresponsive", w.unresponsive}, {"in_flight", w.in_flight}};
      if (!w.last_error.empty()) o["last_error"] = w.last_error;
      if (const json::Value* pl = w.info.find("placement")) {
        bj::error_code jec;
        o["placement"] = bj::parse(pl->dump(), jec);
      }
      if (w.state == "ready") ++ready;
      workers.push_back(std::move(o));
    }
    std::string status = st_->draining ? "draining" : ready == 0 ? "unavailable"
                                                     : ready == static_cast<int>(workers.size()) ? "ok" : "degraded";
    int code = (st_->draining || ready == 0) ? 503 : 200;
    send_json(code, bj::object{{"status", status}, {"ready_workers", ready}, {"workers", std::move(workers)}});
  }

  void models() {
    bj::object m{{"id", st_->cfg.served_model_name}, {"object", "model"}, {"created", st_->created_unix},
                 {"owned_by", "kvpr"}, {"root", st_->cfg.served_model_name},  // not the path on this host
                 {"max_model_len", st_->served.max_model_len}};
    send_json(200, bj::object{{"object", "list"}, {"data", bj::array{m}}});
  }

  void tokenize() {
    bj::object o = body_object();
    const bj::value* p = field(o, "prompt");
    if (!p) p = field(o, "text");
    if (!p || !p->is_string()) throw bad_request("'prompt' must be a string", "prompt");
    bool special = true;
    if (auto v = field(o, "add_special_tokens")) special = bool_of(*v, "add_special_tokens");
    std::vector<int32_t> ids = st_->tok.encode(std::string(p->as_string()), special);
    bj::array a;
    for (int32_t t : ids) a.push_back(t);
    send_json(200, bj::object{{"tokens", std::move(a)}, {"count", static_cast<int64_t>(ids.size())},
                              {"max_model_len", st_->served.max_model_len}});
  }

  void detokenize() {
    bj::object o = body_object();
    const bj::value* t = field(o, "tokens");
    if (!t || !t->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const auto& e : t->as_array()) {
      int64_t id = int_of(e, "tokens");
      if (id < 0 || id >= st_->tok.size()) throw bad_request("token id " + std::to_string(id) + " is out of range", "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    send_json(200, bj::object{{"prompt", st_->tok.decode(ids)}});
  }

  void metrics() {
    send_text(200,
              render_prometheus(st_->metrics, st_->pool.status(), st_->active_requests, st_->connections),
              "text/plain; version=0.0.4; charset=utf-8");
  }

  // ---- generation
  std::vector<int32_t> tokens_of(const bj::value& v) {
    std::vector<int32_t> ids;
    for (const auto& e : v.as_array()) {
      int64_t id = int_of(e, "prompt");
      if (id < 0 || id >= st_->tok.size()) throw bad_request("token id " + std::to_string(id) + " is out of range", "prompt");
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  }

  // An assistant message's tool_calls, their arguments parsed from JSON text (vLLM's json.loads).
  static std::vector<ChatToolCall> tool_calls_of(const bj::object& m, size_t index) {
    std::vector<ChatToolCall> out;
    const bj::value* calls = field(m, "tool_calls");
    if (!calls) return out;
    const std::string where = "messages[" + std::to_string(index) + "].tool_calls";
    if (!calls->is_array()) throw bad_request(where + " must be a list", "messages");
    for (size_t j = 0; j < calls->as_array().size(); ++j) {
      const bj::value& c = calls->as_array()[j];
      const std::string at = where + "[" + std::to_string(j) + "]";
      const bj::value* fn = c.is_object() ? field(c.as_object(), "function") : nullptr;
      const bj::value* name = fn && fn->is_object() ? field(fn->as_object(), "name") : nullptr;
      const bj::value* args = fn && fn->is_object() ? field(fn->as_object(), "arguments") : nullptr;
      if (!name || !name->is_string() || !args || !args->is_string())
        throw bad_request(at + " must have function.name and function.arguments (a JSON string)", "messages");
      ChatToolCall call;
      call.name = name->as_string();
      if (const bj::value* id = field(c.as_object(), "id"); id && id->is_string()) call.id = id->as_string();
      try {
        call.arguments = json::parse(std::string_view(args->as_string()));
      } catch (const Error& e) {
        throw bad_request(at + ".function.arguments is not JSON: " + e.what(), "messages");
      }
      out.push_back(std::move(call));
    }
    return out;
  }

  void generate(bool chat) {
    if (st_->draining) throw ApiError{503, "the server is shutting down", "service_unavailable", ""};
    if (st_->pool.ready_count() == 0) throw ApiError{503, "no worker is ready (loading or restarting)", "service_unavailable", ""};
    bj::object o = body_object();
    check_model(o);
    auto job = std::make_shared<Job>();
    job->chat = chat;
    job->s = parse_sampling(o, chat, st_->served.defaults);
    job->id = st_->new_id(chat ? "chatcmpl-" : "cmpl-");
    job->created = unix_now();
    job->model = st_->cfg.served_model_name;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> prompt_texts;
    if (chat) {
      const bj::value* msgs = field(o, "messages");
      if (!msgs || !msgs->is_array() || msgs->as_array().empty())
        throw bad_request("'messages' must be a non-empty list", "messages");
      std::vector<ChatMessage> cm;
      for (const auto& m : msgs->as_array()) {
        if (!m.is_object()) throw bad_request("each message must be an object", "messages");
        const bj::value* role = field(m.as_object(), "role");
        const bj::value* content = field(m.as_object(), "content");
        if (!role || !role->is_string()) throw bad_request("each message needs a string 'role'", "messages");
        std::string r(role->as_string());
        if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool")
          throw bad_request("unknown message role '" + r + "'", "messages");
        ChatMessage msg;
        if (r == "assistant") msg.tool_calls = tool_calls_of(m.as_object(), cm.size());
        if (r == "tool")
          if (const bj::value* id = field(m.as_object(), "tool_call_id")) {
            if (!id->is_string()) throw bad_request("a tool message's 'tool_call_id' must be a string", "messages");
            msg.tool_call_id = id->as_string();
          }
        // Mistral's template takes ids of 9 characters: longer ones are cut to their last 9, as
        // vLLM does.
        if (st_->served.chat_template == "mistral-nemo") {
          auto last9 = [](std::string& id) {
            if (id.size() > 9) id = id.substr(id.size() - 9);
          };
          last9(msg.tool_call_id);
          for (auto& c : msg.tool_calls) last9(c.id);
        }
        if (r == "assistant")
          if (const bj::value* rc = field(m.as_object(), "reasoning_content")) {
            if (!rc->is_string()) throw bad_request("'reasoning_content' must be a string", "messages");
            msg.reasoning = std::string(rc->as_string());
          }
        std::string text;
        if (!content && !msg.tool_calls.empty()) {
          // an assistant message that only calls tools
        } else if (content && content->is_string()) {
          text = content->as_string();
        } else if (content && content->is_array()) {
          for (const auto& part : content->as_array()) {  // [{"type": "text", "text": ...}]
            const bj::value* t = part.is_object() ? field(part.as_object(), "text") : nullptr;
            if (!t || !t->is_string()) throw bad_request("only text content parts are supported", "messages");
            text += t->as_string();
          }
        } else {
          throw bad_request("each message needs 'content' (a string or text parts)", "messages");
        }
        msg.role = r == "developer" ? "system" : r;
        msg.content = std::move(text);
        cm.push_back(std::move(msg));
      }
      job->tools = parse_tools(o, st_->served);
      if (job->tools.parser == "mistral")
        if (auto id = st_->tok.token_to_id("[TOOL_CALLS]")) job->tools.marker = *id;
      ChatOptions chat_options;
      chat_options.default_system = st_->served.default_system;
      if (const bj::value* kw = field(o, "chat_template_kwargs"); kw && !kw->is_null()) {  // vLLM's extension
        if (!kw->is_object()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
        for (const auto& kv : kw->as_object()) {
          if (kv.key() != "enable_thinking")
            throw bad_request("'chat_template_kwargs." + std::string(kv.key()) +
                                  "' is not supported by this server (enable_thinking is)",
                              "chat_template_kwargs");
          chat_options.enable_thinking = bool_of(kv.value(), "chat_template_kwargs.enable_thinking");
        }
      }
      chat_options.tools = job->tools.tools;
      RenderedChat rc;
      try {
        rc = render_chat(st_->served.chat_template, cm, chat_options);
      } catch (const Error& e) {  // tool messages or calls for a template without tools
        throw bad_request(e.what(), "messages");
      }
      for (auto& st : rc.stop) job->s.stop.push_back(st);
      for (const auto& t : rc.stop_tokens)
        if (auto id = st_->tok.token_to_id(t)) job->s.stop_token_ids.push_back(*id);
      prompts.push_back(st_->tok.encode(rc.prompt));
      prompt_texts.push_back(rc.prompt);
    } else {
      const bj::value* p = field(o, "prompt");
      if (!p) throw bad_request("'prompt' is required", "prompt");
      if (p->is_string()) {
        prompts.push_back(st_->tok.encode(std::string(p->as_string())));
        prompt_texts.emplace_back(p->as_string());
      } else if (p->is_array() && !p->as_array().empty() && p->as_array()[0].is_string()) {
        for (const auto& e : p->as_array()) {
          if (!e.is_string()) throw bad_request("'prompt' list must hold only strings", "prompt");
          prompts.push_back(st_->tok.encode(std::string(e.as_string())));
          prompt_texts.emplace_back(e.as_string());
        }
      } else if (p->is_array() && !p->as_array().empty() && p->as_array()[0].is_array()) {
        for (const auto& e : p->as_array()) {
          if (!e.is_array()) throw bad_request("'prompt' must be a list of token-id lists", "prompt");
          prompts.push_back(tokens_of(e));
          prompt_texts.push_back(st_->tok.decode(prompts.back(), false));
        }
      } else if (p->is_array() && !p->as_array().empty()) {
        prompts.push_back(tokens_of(*p));
        prompt_texts.push_back(st_->tok.decode(prompts.back(), false));
      } else {
        throw bad_request("'prompt' must be a string, a list of strings, or token ids", "prompt");
      }
      if (prompts.size() > 64) throw bad_request("at most 64 prompts per request", "prompt");
    }
    for (const auto& pr : prompts) {
      if (pr.empty()) throw bad_request("the prompt is empty", chat ? "messages" : "prompt");
      // A tokenizer larger than the model's embedding (a mismatched checkpoint) yields ids
      // the model cannot take: refused here, not failed in the worker.
      for (int32_t id : pr)
        if (id >= st_->served.vocab_size)
          throw bad_request("prompt token id " + std::to_string(id) + " is beyond the model's vocabulary of " +
                                std::to_string(st_->served.vocab_size) + " tokens (the tokenizer has " +
                                std::to_string(st_->tok.size()) + ")",
                            chat ? "messages" : "prompt");
      const int64_t len = static_cast<int64_t>(pr.size());
      if (job->s.max_tokens > st_->served.max_model_len - len)  // (a sum could overflow)
        throw bad_request("this model's maximum context length is " + std::to_string(st_->served.max_model_len) +
                              " tokens, but " + std::to_string(len) + " in the prompt and " +
                              std::to_string(job->s.max_tokens) + " for the completion were requested",
                          chat ? "messages" : "prompt");
    }
    const int64_t count = static_cast<int64_t>(prompts.size()) * job->s.n;
    if (count > st_->cfg.max_queue)  // would never fit: not a 429 to retry
      throw bad_request(std::to_string(prompts.size()) + " prompt(s) x n = " + std::to_string(job->s.n) + " make " +
                            std::to_string(count) + " sequences, more than this server queues (" +
                            std::to_string(st_->cfg.max_queue) + ", --max-queue)",
                        "n");
    if (st_->engine_in_flight + count > st_->cfg.max_queue)
      throw ApiError{429, "the server is at capacity (" + std::to_string(st_->engine_in_flight) +
                              " requests in flight); retry shortly",
                     "rate_limit_exceeded", ""};
    // One engine request per choice.
    json::Value params(json::Object{});
    params.set("max_tokens", job->s.max_tokens);
    params.set("temperature", job->s.temperature);
    params.set("top_p", job->s.top_p);
    params.set("top_k", job->s.top_k);
    if (job->s.min_p > 0) params.set("min_p", job->s.min_p);
    params.set("ignore_eos", job->s.ignore_eos);
    if (job->s.top_logprobs > 0) params.set("top_logprobs", job->s.top_logprobs);
    if (job->s.repetition_penalty != 1) params.set("repetition_penalty", job->s.repetition_penalty);
    if (job->s.json_object) params.set("json_object", true);
    if (!job->tools.schema.is_null()) params.set("json_schema", job->tools.schema);  // forced tool calls
    else if (!job->s.json_schema.is_null()) params.set("json_schema", job->s.json_schema);
    if (job->s.presence_penalty != 0) params.set("presence_penalty", job->s.presence_penalty);
    if (job->s.frequency_penalty != 0) params.set("frequency_penalty", job->s.frequency_penalty);
    if (!job->s.logit_bias.empty()) {
      json::Array bias;
      for (const auto& [id, b] : job->s.logit_bias) {
        if (id >= st_->tok.size())
          throw bad_request("'logit_bias' token id " + std::to_string(id) + " is not in the vocabulary", "logit_bias");
        json::Array pair;
        pair.emplace_back(id);
        pair.emplace_back(b);
        bias.emplace_back(std::move(pair));
      }
      params.set("logit_bias", std::move(bias));
    }
    // echo + logprobs: the prompt's tokens are scored too (OpenAI's legacy completions).
    if (!chat && job->s.echo && job->s.logprobs) params.set("prompt_logprobs", job->s.top_logprobs);
    json::Array stops;
    for (const auto& st : job->s.stop) stops.emplace_back(st);
    params.set("stop", std::move(stops));
    if (!job->s.stop_token_ids.empty()) {
      json::Array ids;
      for (int64_t id : job->s.stop_token_ids) {
        if (id < 0 || id >= st_->tok.size())
          throw bad_request("'stop_token_ids' id " + std::to_string(id) + " is not in the vocabulary", "stop_token_ids");
        ids.emplace_back(id);
      }
      params.set("stop_token_ids", std::move(ids));
    }
    for (size_t pi = 0; pi < prompts.size(); ++pi)
      for (int64_t j = 0; j < job->s.n; ++j) {
        Job::Choice c;
        c.prompt = prompts[pi];
        if (job->s.echo) c.echo_text = prompt_texts[pi];
        if (job->tools.parse) c.tool_stream = ToolCallStream(job->tools.parser);
        job->choices.push_back(std::move(c));
      }
    job_ = job;
    streaming_ = job->s.stream;
    begin_request();
    job->remaining = static_cast<int64_t>(job->choices.size());
    if (streaming_) start_stream();
    watch_disconnect();
    for (size_t i = 0; i < job->choices.size(); ++i) {
      Job::Choice& c = job->choices[i];
      c.engine_id = st_->next_engine_id++;
      json::Value pp = params;
      // n > 1 with a seed: each choice gets its own stream of random numbers.
      if (job->s.seed)  // (wrapping, not overflowing, at the ends of int64)
        pp.set("seed", static_cast<int64_t>(static_cast<uint64_t>(*job->s.seed) + i % static_cast<uint64_t>(job->s.n)));
      st_->metrics.prompt_tokens += c.prompt.size();
      std::string why;
      // The sink keeps the session alive until the job's last event, also after the client
      // left, so every choice is accounted for exactly once.
      bool ok = st_->pool.submit(c.engine_id, c.prompt, pp, static_cast<int64_t>(c.prompt.size()) + job->s.max_tokens,
                                 [self = shared_from_this(), job, i](const EngineEvent& ev) { self->on_event(job, i, ev); },
                                 &why);
      ++st_->engine_in_flight;
      if (!ok) {
        EngineEvent ev;
        ev.error = why;
        on_event(job, i, ev);
      }
    }
  }

  void on_event(const std::shared_ptr<Job>& job, size_t i, const EngineEvent& ev) {
    Job::Choice& c = job->choices[i];
    if (c.done) return;
    DaemonMetrics& m = st_->metrics;
    auto now = Clock::now();
    if (!ev.error.empty()) {
      c.done = true;
      c.finish = "error";
      job->error = ev.error;
      m.finished["error"]++;
    } else {
      if (ev.token >= 0) {
        ++m.generation_tokens;
        if (!job->first_token_seen) {
          job->first_token_seen = true;
          m.ttft.observe(std::chrono::duration<double>(now - job->t0).count());
        } else {
          m.itl.observe(std::chrono::duration<double>(now - job->last_token).count());
        }
        job->last_token = now;
        c.tokens.push_back(ev.token);
        c.logprobs.push_back(ev.logprob);
        c.tops.push_back(ev.top);
      }
      if (!ev.prompt_logprobs.empty()) {
        c.prompt_logprobs = ev.prompt_logprobs;
        c.prompt_tops = ev.prompt_top;
      }
      if (job->tools.marker >= 0 && ev.token == job->tools.marker) c.tool_text += "[TOOL_CALLS]";
      c.tool_text += ev.text;
      c.text += ev.text;
      if (!ev.finish_reason.empty()) {
        c.done = true;
        c.finish = ev.finish_reason;
        c.cached_tokens = ev.cached_tokens;
        m.finished[ev.finish_reason]++;
        m.prefix_cache_queries += static_cast<uint64_t>(ev.prompt_tokens);
        m.prefix_cache_hits += static_cast<uint64_t>(ev.cached_tokens);
      }
    }
    if (c.done) {
      --job->remaining;
      --st_->engine_in_flight;
    }
    if (job != job_ || closed_) return;  // the client went away: nothing more to send
    if (streaming_) stream_event(*job, i, ev);
    if (job->remaining == 0) complete(*job);
  }

  // ---- non-streaming response
  void complete(Job& job) {
    st_->metrics.e2e.observe(std::chrono::duration<double>(Clock::now() - job.t0).count());
    // A prompt counts once, whatever its n; its cached tokens are those of its choice that found
    // the most in the cache.
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, prompt_cached = 0;
    for (size_t i = 0; i < job.choices.size(); ++i) {
      if (i % job.s.n == 0) {
        prompt_tokens += static_cast<int64_t>(job.choices[i].prompt.size());
        cached_tokens += prompt_cached;
        prompt_cached = 0;
      }
      prompt_cached = std::max(prompt_cached, job.choices[i].cached_tokens);
      completion_tokens += static_cast<int64_t>(job.choices[i].tokens.size());
    }
    cached_tokens += prompt_cached;
    spdlog::info("{} {}: {} choice(s), prompt {} tokens, completion {} tokens, {} in {:.3f}s", job.id,
                 job.chat ? "chat" : "completion", job.choices.size(), prompt_tokens, completion_tokens,
                 job.error.empty() ? job.choices[0].finish : "error",
                 std::chrono::duration<double>(Clock::now() - job.t0).count());
    auto finish_request = [&] { job_.reset(); };  // the request counts until its last byte is out
    if (streaming_) {
      if (job.error.empty() && job.s.include_usage) {
        bj::object u{{"id", job.id}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", job.created}, {"model", job.model}, {"choices", bj::array{}},
                     {"usage", usage_json(prompt_tokens, completion_tokens, cached_tokens)}};
        push_sse(bj::serialize(u));
      }
      push_sse("[DONE]");
      push_last();
      finish_request();
      return;
    }
    if (!job.error.empty()) {
      finish_request();
      return send_error({500, job.error, "server_error", ""});
    }
    bj::array choices;
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const Job::Choice& c = job.choices[i];
      bj::object ch{{"index", static_cast<int64_t>(i)}, {"finish_reason", c.finish}};
      bj::value lp = nullptr;
      if (job.s.logprobs) {
        int64_t off = 0;
        bj::value prompt_part = job.s.echo && !job.chat ? prompt_logprobs_json(c, off) : bj::value();
        off = static_cast<int64_t>(c.echo_text.size());
        lp = logprobs_json(job, c, 0, c.tokens.size(), off);
        if (prompt_part.is_object())  // prompt tokens first, then the generated ones
          for (auto& [key, arr] : lp.as_object()) {
            bj::array joined = prompt_part.as_object().at(key).as_array();
            for (auto& v : arr.as_array()) joined.push_back(std::move(v));
            arr = std::move(joined);
          }
      }
      if (job.chat) {
        bj::object msg{{"role", "assistant"}, {"content", c.text}};
        std::string content = c.text;
        if (st_->cfg.reasoning_parser != "none") {
          const ReasoningSplitter::Parts parts = ReasoningSplitter::split(c.text);
          content = parts.content;
          msg["content"] = parts.content;
          msg["reasoning_content"] = parts.reasoning;
          if (parts.content.empty() && !parts.reasoning.empty()) msg["content"] = nullptr;
          if (parts.reasoning.empty()) msg["reasoning_content"] = nullptr;
        }
        if (!job.tools.named.empty()) {  // the answer is the named function's arguments
          msg["content"] = nullptr;
          msg["tool_calls"] = tool_calls_json(job, {{job.tools.named, content}}, false);
        } else if (job.tools.required) {  // the answer is a list of calls
          if (auto calls = forced_calls(content)) {
            msg["content"] = nullptr;
            msg["tool_calls"] = tool_calls_json(job, *calls, false);
            ch["finish_reason"] = "tool_calls";
          }
        } else if (job.tools.parse) {
          ToolCallParse p = parse_tool_calls(job.tools.parser, job.tools.marker >= 0 ? c.tool_text : content);
          if (!p.calls.empty()) {
            msg["content"] = p.content ? bj::value(*p.content) : bj::value(nullptr);
            msg["tool_calls"] = tool_calls_json(job, p.calls, false);
            ch["finish_reason"] = "tool_calls";
          }
        }
        ch["message"] = std::move(msg);
      } else {
        ch["text"] = c.echo_text + c.text;
      }
      ch["logprobs"] = lp;
      choices.push_back(std::move(ch));
    }
    bj::object body{{"id", job.id}, {"object", job.chat ? "chat.completion" : "text_completion"},
                    {"created", job.created}, {"model", job.model}, {"choices", std::move(choices)},
                    {"usage", usage_json(prompt_tokens, completion_tokens, cached_tokens)}};
    finish_request();
    send_json(200, body);
  }

  // A new call's id: chatcmpl-tool-<hex>, or, for Mistral's template, which takes only ids of 9
  // letters and digits, 9 of them (as vLLM makes them).
  std::string tool_call_id() {
    if (st_->served.chat_template != "mistral-nemo") return st_->new_id("chatcmpl-tool-");
    static const char* an = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id;
    for (int i = 0; i < 9; ++i) id += an[st_->rng() % 62];
    return id;
  }

  // tool_choice "required": the answer (a JSON list of {"name", "parameters"}, as its schema
  // made it) as calls; nullopt when it is not one (cut off by max_tokens).
  static std::optional<std::vector<ToolCallText>> forced_calls(const std::string& answer) {
    try {
      std::vector<ToolCallText> calls;
      const json::Value list = json::parse(answer);  // (kept: the loop's range refers into it)
      for (const auto& c : list.as_array())
        calls.push_back({c.find("name")->as_string(), c.find("parameters")->dump_python()});
      return calls;
    } catch (const Error&) {
      return std::nullopt;
    }
  }

  // OpenAI's tool_calls of a message (or, streamed, of a delta: each with its index), with fresh
  // ids; only the first with parallel_tool_calls false.
  bj::array tool_calls_json(const Job& job, const std::vector<ToolCallText>& calls, bool indexed) {
    bj::array out;
    for (size_t k = 0; k < calls.size() && (job.tools.parallel || k == 0); ++k) {
      bj::object call;
      if (indexed) call["index"] = static_cast<int64_t>(k);
      call["id"] = tool_call_id();
      call["type"] = "function";
      call["function"] = bj::object{{"name", calls[k].name}, {"arguments", calls[k].arguments}};
      out.push_back(std::move(call));
    }
    return out;
  }

  // The echoed prompt's part of a completions logprobs object: its tokens (text as the echo
  // shows it, so text_offset indexes the returned text), their log-probabilities (null for
  // the first, which nothing predicts) and alternatives.
  bj::value prompt_logprobs_json(const Job::Choice& c, int64_t& offset) {
    // Token texts that concatenate to the echoed text: without special tokens for a text
    // prompt (its BOS is not in the echo), with them for a prompt given as ids.
    bool skip = true;
    std::string joined;
    for (int32_t id : c.prompt) joined += st_->tok.token_bytes(id, true);
    if (joined != c.echo_text) skip = false;
    bj::array tokens, lps, offsets, tops;
    for (size_t k = 0; k < c.prompt.size(); ++k) {
      std::string t = st_->tok.token_bytes(c.prompt[k], skip);
      tokens.push_back(bj::value(sanitize_utf8(t)));
      offsets.push_back(offset);
      offset += static_cast<int64_t>(t.size());
      if (k == 0 || k - 1 >= c.prompt_logprobs.size()) {
        lps.push_back(nullptr);
        tops.push_back(nullptr);
        continue;
      }
      lps.push_back(c.prompt_logprobs[k - 1]);
      bj::object top;
      if (k - 1 < c.prompt_tops.size())
        for (const auto& [id, lp] : c.prompt_tops[k - 1]) top.emplace(sanitize_utf8(st_->tok.token_bytes(id, false)), lp);
      top.emplace(sanitize_utf8(t), c.prompt_logprobs[k - 1]);  // the prompt's own token is always there
      tops.push_back(std::move(top));
    }
    return bj::object{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)}, {"top_logprobs", std::move(tops)},
                      {"text_offset", std::move(offsets)}};
  }

  // OpenAI's logprobs objects for tokens [from, to) of a choice. Chat: content[i] = {token,
  // logprob, bytes, top_logprobs: the top_logprobs most likely tokens}. Completions: tokens,
  // token_logprobs, text_offset (from `offset`, advanced past the tokens) and top_logprobs[i]
  // = {token text: logprob} for the `logprobs` most likely tokens plus the sampled one (so up
  // to logprobs + 1 entries, as OpenAI documents).
  bj::value logprobs_json(const Job& job, const Job::Choice& c, size_t from, size_t to, int64_t& offset) {
    auto text_of = [&](int32_t id) { return sanitize_utf8(st_->tok.token_bytes(id, false)); };
    if (job.chat) {
      auto entry = [&](int32_t id, double lp) {
        std::string t = st_->tok.token_bytes(id, false);
        bj::array bytes;
        for (unsigned char b : t) bytes.push_back(b);
        return bj::object{{"token", sanitize_utf8(t)}, {"logprob", lp}, {"bytes", std::move(bytes)}};
      };
      bj::array content;
      for (size_t k = from; k < to; ++k) {
        bj::object e = entry(c.tokens[k], c.logprobs[k]);
        bj::array top;
        if (k < c.tops.size())
          for (const auto& [id, lp] : c.tops[k]) top.push_back(entry(id, lp));
        e["top_logprobs"] = std::move(top);
        content.push_back(std::move(e));
      }
      return bj::object{{"content", std::move(content)}};
    }
    bj::array tokens, lps, offsets, tops;
    for (size_t k = from; k < to; ++k) {
      std::string t = text_of(c.tokens[k]);
      tokens.push_back(bj::value(t));
      lps.push_back(c.logprobs[k]);
      offsets.push_back(offset);
      bj::object top;
      if (k < c.tops.size())
        for (const auto& [id, lp] : c.tops[k]) top.emplace(text_of(id), lp);  // first (likelier) wins a clash
      top.emplace(t, c.logprobs[k]);  // the sampled token is always there
      tops.push_back(std::move(top));
      offset += static_cast<int64_t>(t.size());
    }
    return bj::object{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)}, {"top_logprobs", std::move(tops)},
                      {"text_offset", std::move(offsets)}};
  }

  // ---- streaming (server-sent events over chunked transfer encoding)
  struct Out {
    enum Kind { Header, Data, Last } kind;
    std::string data;
  };

  void start_stream() {
    sse_res_.emplace(http::status::ok, 11);
    sse_res_->set(http::field::server, "kvprd");
    sse_res_->set(http::field::content_type, "text/event-stream");
    sse_res_->set(http::field::cache_control, "no-cache");
    sse_res_->keep_alive(keep_alive_);
    sse_res_->chunked(true);
    sse_sr_.emplace(*sse_res_);
    st_->metrics.http_responses[200]++;
    out_.push_back({Out::Header, {}});
    write_next();
  }

  void push_sse(const std::string& payload) {
    out_.push_back({Out::Data, "data: " + payload + "\n\n"});
    write_next();
  }
  void push_last() {
    out_.push_back({Out::Last, {}});
    write_next();
  }

  void stream_event(Job& job, size_t i, const EngineEvent& ev) {
    Job::Choice& c = job.choices[i];
    if (!ev.error.empty()) {
      ApiError e{500, ev.error, "server_error", ""};
      push_sse(bj::serialize(error_body(e)));
      return;
    }
    auto chunk = [&](bj::object choice) {
      return bj::serialize(bj::object{{"id", job.id}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                                      {"created", job.created}, {"model", job.model},
                                      {"choices", bj::array{std::move(choice)}}});
    };
    if (job.chat && !c.sent_role) {
      c.sent_role = true;
      push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)}, {"delta", bj::object{{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
    if (!job.chat && job.s.echo && !c.echo_sent) {  // the prompt first (with its logprobs when asked)
      c.echo_sent = true;
      int64_t off = 0;
      push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)}, {"text", c.echo_text},
                                {"logprobs", job.s.logprobs ? prompt_logprobs_json(c, off) : bj::value()},
                                {"finish_reason", nullptr}}));
    }
    // Logprobs of the tokens not yet reported ride on the next chunk that goes out.
    auto pending_logprobs = [&]() -> bj::value {
      if (!job.s.logprobs || c.lp_sent >= c.tokens.size()) return nullptr;
      if (c.lp_sent == 0) c.lp_offset = static_cast<int64_t>(c.echo_text.size());
      bj::value v = logprobs_json(job, c, c.lp_sent, c.tokens.size(), c.lp_offset);
      c.lp_sent = c.tokens.size();
      return v;
    };
    std::vector<ToolCallText> calls;
    if (job.chat) {
      const bool finished = !ev.finish_reason.empty();
      std::string reasoning, content = ev.text;
      if (st_->cfg.reasoning_parser != "none") {
        // Reasoning and answer as separate delta fields; text that may still be a tag waits.
        ReasoningSplitter::Parts parts = c.reasoning.feed(ev.text);
        if (finished) {
          ReasoningSplitter::Parts rest = c.reasoning.finish();
          parts.reasoning += rest.reasoning;
          parts.content += rest.content;
        }
        reasoning = std::move(parts.reasoning);
        content = std::move(parts.content);
      }
      if (!job.tools.named.empty()) {
        // The named function's arguments as they come: its id and name with the first piece.
        if (!content.empty() || finished) {
          bj::object call{{"index", 0}, {"function", bj::object{{"arguments", content}}}};
          if (!c.tool_call_sent) {
            call["id"] = tool_call_id();
            call["type"] = "function";
            call["function"].as_object()["name"] = job.tools.named;
            c.tool_call_sent = true;
          }
          push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)},
                                    {"delta", bj::object{{"tool_calls", bj::array{std::move(call)}}}},
                                    {"logprobs", pending_logprobs()}, {"finish_reason", nullptr}}));
        }
        content.clear();
      } else if (job.tools.required) {
        content.clear();  // the list of calls, sent whole at the end
        if (finished) {
          if (auto forced = forced_calls(c.text)) calls = std::move(*forced);
          else content = c.text;
        }
      } else if (job.tools.parse) {
        // Text before a <tool_call> goes out as it comes; the calls when the answer is complete.
        if (job.tools.marker >= 0 && ev.token == job.tools.marker) content = "[TOOL_CALLS]" + content;
        content = c.tool_stream.feed(content).content;
        if (finished) {
          ToolCallStream::Delta rest = c.tool_stream.finish();
          content += rest.content;
          calls = std::move(rest.calls);
        }
      }
      if (!reasoning.empty() || !content.empty()) {
        bj::object delta;
        if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
        if (!content.empty()) delta["content"] = content;
        push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)}, {"delta", std::move(delta)},
                                  {"logprobs", pending_logprobs()}, {"finish_reason", nullptr}}));
      }
      if (!calls.empty())
        push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)},
                                  {"delta", bj::object{{"tool_calls", tool_calls_json(job, calls, true)}}},
                                  {"logprobs", pending_logprobs()}, {"finish_reason", nullptr}}));
    } else if (!ev.text.empty()) {
      push_sse(chunk(bj::object{{"index", static_cast<int64_t>(i)}, {"text", ev.text}, {"logprobs", pending_logprobs()},
                                {"finish_reason", nullptr}}));
    }
    if (!ev.finish_reason.empty()) {
      bj::object ch{{"index", static_cast<int64_t>(i)}, {"logprobs", pending_logprobs()},
                    {"finish_reason", calls.empty() ? ev.finish_reason : std::string("tool_calls")}};
      if (job.chat) ch["delta"] = bj::object{};
      else ch["text"] = "";
      push_sse(chunk(std::move(ch)));
    }
  }

  void write_next() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    auto self = shared_from_this();
    auto done = [self](beast::error_code ec, size_t) {
      self->writing_ = false;
      Out::Kind k = self->out_.front().kind;
      self->out_.pop_front();
      if (ec) return self->close();  // the client went away: close() cancels the job
      if (k == Out::Last) {
        self->sse_sr_.reset();
        self->sse_res_.reset();
        self->streaming_ = false;
        self->end_request();
        if (!self->keep_alive_ || self->st_->draining) return self->close();
        return self->do_read();
      }
      self->write_next();
    };
    Out& o = out_.front();
    arm_write_timeout();
    if (o.kind == Out::Header) http::async_write_header(stream_, *sse_sr_, done);
    else if (o.kind == Out::Data) net::async_write(stream_, http::make_chunk(net::buffer(o.data)), done);
    else net::async_write(stream_, http::make_chunk_last(), done);
  }

  // While a job runs, notice a client that disconnects (readable with nothing to read).
  void watch_disconnect() {
    auto self = shared_from_this();
    stream_.socket().async_wait(tcp::socket::wait_read, [self](beast::error_code ec) {
      if (ec || self->closed_ || !self->job_) return;
      char c;
      ssize_t r = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r == 0) return self->close();  // orderly shutdown by the client
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return self->close();
      // Data of a pipelined request: not a disconnect.
    });
  }

  void cancel_job() {
    if (!job_) return;
    for (const auto& c : job_->choices)
      if (!c.done) st_->pool.cancel(c.engine_id);
    spdlog::info("{}: client disconnected, generation cancelled", job_->id);
    // The job's remaining events arrive with finish "cancelled" and are accounted then.
    job_.reset();
  }

  beast::tcp_stream stream_;
  std::shared_ptr<Server::State> st_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  bool keep_alive_ = true;
  bool refusing_ = false;
  bool request_counted_ = false;  // in st_->active_requests
  bool closed_ = false;
  bool streaming_ = false;
  bool writing_ = false;
  std::shared_ptr<Job> job_;
  std::optional<http::response<http::empty_body>> sse_res_;
  std::optional<http::response_serializer<http::empty_body>> sse_sr_;
  std::deque<Out> out_;
  std::vector<char> discard_;
  size_t discarded_ = 0;
};

// ------------------------------------------------------------------ server

Server::Server(net::io_context& io, const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok,
               const ServedModel& served)
    : st_(std::make_shared<State>(io, cfg, pool, tok, served)) {
  st_->created_unix = unix_now();
}

Server::~Server() { close(); }

void Server::listen() {
  beast::error_code ec;
  auto addr = net::ip::make_address(st_->cfg.host, ec);
  KVPR_CHECK(!ec, "bad --host '", st_->cfg.host, "': ", ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(st_->cfg.port));
  st_->acceptor.open(ep.protocol(), ec);
  if (!ec) st_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) st_->acceptor.bind(ep, ec);
  if (!ec) st_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  KVPR_CHECK(!ec, "cannot listen on ", st_->cfg.host, ":", st_->cfg.port, ": ", ec.message());
  ::fcntl(st_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);  // not inherited by workers
  accept_next(st_);
}

// Each pending accept holds the state; closing the acceptor ends the chain (no cycle).
// accept() failing (out of descriptors: EMFILE, ENFILE; out of memory) would fail again at
// once: the next try waits 100 ms, so the loop neither spins nor stops serving the connections
// it has. Accepted sockets are close-on-exec (workers never inherit a client's connection).
void Server::accept_next(std::shared_ptr<State> st) {
  st->acceptor.async_accept([st](beast::error_code e, tcp::socket sock) {
    if (e == net::error::operation_aborted || !st->acceptor.is_open()) return;
    if (e) {
      if (Clock::now() - st->accept_error_logged > std::chrono::seconds(10)) {
        st->accept_error_logged = Clock::now();
        spdlog::warn("accept failed: {} (retrying every 100 ms; logged every 10 s)", e.message());
      }
      st->accept_backoff.expires_after(std::chrono::milliseconds(100));
      st->accept_backoff.async_wait([st](beast::error_code ec) {
        if (!ec) accept_next(st);
      });
      return;
    }
    ::fcntl(sock.native_handle(), F_SETFD, FD_CLOEXEC);
    auto session = std::make_shared<Session>(std::move(sock), st);
    if (st->connections > st->cfg.max_connections) session->refuse();
    else session->start();
    accept_next(st);
  });
}

void Server::begin_drain() { st_->draining = true; }
bool Server::draining() const { return st_->draining; }
int64_t Server::in_flight_requests() const { return st_->active_requests; }

void Server::close() {
  beast::error_code ec;
  st_->acceptor.close(ec);
  st_->accept_backoff.cancel();
}

void Server::apply_config(const DaemonConfig& live) { st_->cfg = live; }

void Server::abandon_in_flight() {
  std::vector<std::shared_ptr<Session>> open;
  for (Session* s : st_->sessions) open.push_back(s->shared_from_this());
  for (auto& s : open) s->abandon();
}

}  // namespace kvpr
