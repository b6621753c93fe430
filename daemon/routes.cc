#include "daemon/routes.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <spdlog/spdlog.h>

#include "openai/response.h"

namespace kvpr {

using Clock = std::chrono::steady_clock;

// One generation request: its exchange, its response as it is built, its engine requests.
struct Routes::Generation {
  std::shared_ptr<Exchange> ex;
  ResponseState r;
  std::vector<EngineRequest> requests;  // per choice of n: the engine's parameters
  std::vector<uint64_t> engine_ids;  // per choice
  bool streaming = false;
  // The stream's 200 and headers go out with its first event, so that a request the engine
  // refuses (a schema it cannot compile, a prompt past its KV cache) is still a 400.
  bool stream_started = false;
  bool answering = true;  // false once answered, abandoned, or its client left
  int64_t remaining = 0;  // choices not done
  Clock::time_point t0 = Clock::now(), last_token;
  bool first_token_seen = false;
  std::unique_ptr<ResponsesTurn> turn;  // POST /v1/responses: the Response it answers with

  // The error as this request's API names it.
  ApiError as_answered(const ApiError& e) const { return turn ? as_responses_error(e) : e; }

  void cancel(WorkerPool& pool) const {
    for (size_t i = 0; i < r.choices.size() && i < engine_ids.size(); ++i)  // (only the choices submitted)
      if (!r.choices[i].done) pool.cancel(engine_ids[i]);
  }
};

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Whether `given` is `key`, in a time that depends on `given`'s length alone.
bool equal_in_constant_time(std::string_view given, std::string_view key) {
  unsigned diff = given.size() != key.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(key[i % key.size()]);
  return diff == 0;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) return false;
  return true;
}

}  // namespace

Routes::Routes(const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok, const ServedModel& served,
               DaemonMetrics& metrics, const HttpServer& http)
    : cfg_(cfg),
      pool_(pool),
      tok_(tok),
      served_(served),
      metrics_(metrics),
      http_(http),
      created_unix_(unix_now()),
      responses_(static_cast<size_t>(cfg.responses_store), static_cast<size_t>(cfg.responses_store_bytes),
                 std::chrono::seconds(static_cast<int64_t>(cfg.responses_store_ttl_s))) {}

void Routes::handle(const std::shared_ptr<Exchange>& ex) {
  const HttpRequest& req = ex->request();
  const std::string& path = req.path;
  authorize(req);
  auto need = [&](const std::string& method) {
    // HEAD is GET without the body (RFC 9110 §9.3.2; the transport leaves the body out).
    if (req.method != method && !(method == "GET" && req.method == "HEAD"))
      throw ApiError{405, "method " + req.method + " not allowed on " + path, "invalid_request_error", ""};
  };
  if (path == "/health") return need("GET"), health(*ex);
  if (path == "/metrics") return need("GET"), metrics(*ex);
  if (path == "/v1/models") return need("GET"), models(*ex);
  if (path == "/tokenize") return need("POST"), tokenize(*ex);
  if (path == "/detokenize") return need("POST"), detokenize(*ex);
  if (path == "/v1/completions") return need("POST"), generate(ex, Api::Completions);
  if (path == "/v1/chat/completions") return need("POST"), generate(ex, Api::Chat);
  if (path == "/v1/responses") return need("POST"), generate(ex, Api::Responses);
  if (path.starts_with("/v1/responses/")) return stored_response(*ex);
  throw ApiError{404, "no route " + path, "invalid_request_error", ""};
}

// With API keys set, /v1/*, /tokenize and /detokenize need `Authorization: Bearer KEY` (as
// vLLM's --api-key); /health and /metrics stay open for probes and Prometheus.
void Routes::authorize(const HttpRequest& req) const {
  if (cfg_.api_keys.empty()) return;
  if (!req.path.starts_with("/v1/") && req.path != "/tokenize" && req.path != "/detokenize") return;
  const std::string_view auth = req.authorization;
  constexpr std::string_view scheme = "Bearer ";
  bool ok = false;
  if (auth.size() > scheme.size() && iequals_prefix(auth, scheme))
    for (const auto& key : cfg_.api_keys) ok = equal_in_constant_time(auth.substr(scheme.size()), key) || ok;
  if (!ok)
    throw ApiError{401, auth.empty() ? "this server needs an API key: send 'Authorization: Bearer KEY'"
                                     : "incorrect API key provided",
                   "invalid_request_error", ""};
}

void Routes::health(Exchange& ex) {
  json::Array workers;
  int ready = 0;
  for (const auto& w : pool_.status()) {
    json::Object o{{"index", w.index}, {"state", w.state}, {"pid", static_cast<int64_t>(w.pid)},
                   {"restarts", w.restarts}, {"unresponsive", w.unresponsive}, {"in_flight", w.in_flight}};
    // Its device (the backend's name: cuda:N (the GPU's name), or cpu) and KV mode, once ready.
    if (!w.info.backend.empty()) o.emplace_back("device", w.info.backend);
    if (!w.info.kv_mode.empty()) o.emplace_back("kv_mode", w.info.kv_mode);
    if (!w.last_error.empty()) o.emplace_back("last_error", w.last_error);
    if (!w.info.placement.is_null()) o.emplace_back("placement", w.info.placement);
    if (w.stats.kv_blocks_total > 0) {  // its paged KV store, from its last stats message
      const WorkerStats& st = w.stats;
      o.emplace_back("kv_cache",
                     json::Object{{"tier", st.kv_tier},
                                  {"block_tokens", st.kv_block_tokens},
                                  {"blocks_total", st.kv_blocks_total},
                                  {"blocks_used", st.kv_blocks_used},
                                  {"blocks_free", st.kv_blocks_total - st.kv_blocks_used},
                                  {"blocks_cached", st.kv_blocks_cached},
                                  {"preemptions", st.preemptions},
                                  {"rope_recomputes", st.rope_recomputes},
                                  // The sliding-window layers' ring (0 without one).
                                  {"ring_blocks_total", st.ring_blocks_total},
                                  {"ring_blocks_used", st.ring_blocks_used},
                                  // Bytes per tier, and the tier sizes of the last step (kv mode auto: the
                                  // device tier holds each sequence's tail; the split l is recomputed).
                                  {"tiers", json::Object{{"host_bytes_used", st.host_kv_bytes},
                                                         {"host_bytes", st.host_kv_reserved_bytes},
                                                         {"device_bytes_used", st.device_kv_used_bytes},
                                                         {"device_bytes", st.device_kv_bytes},
                                                         {"resident_tokens", st.kv_resident_tokens},
                                                         {"staged_tokens", st.kv_staged_tokens},
                                                         {"recomputed_tokens", st.split}}},
                                  {"prefix_hit_rate", st.prefix_query_tokens > 0
                                                          ? static_cast<double>(st.prefix_hit_tokens) /
                                                                static_cast<double>(st.prefix_query_tokens)
                                                          : 0.0}});
    }
    if (w.state == "ready") ++ready;
    workers.push_back(std::move(o));
  }
  const std::string status = draining_ ? "draining"
                             : ready == 0 ? "unavailable"
                             : ready == static_cast<int>(workers.size()) ? "ok"
                                                                         : "degraded";
  respond_json(ex, draining_ || ready == 0 ? 503 : 200,
               json::Object{{"status", status}, {"ready_workers", ready}, {"workers", std::move(workers)}});
}

void Routes::models(Exchange& ex) {
  json::Object m{{"id", served_.name}, {"object", "model"}, {"created", created_unix_}, {"owned_by", "kvpr"},
                 {"root", served_.name},  // not the path on this host
                 {"max_model_len", served_.max_model_len}};
  json::Array data;
  data.push_back(std::move(m));
  respond_json(ex, 200, json::Object{{"object", "list"}, {"data", std::move(data)}});
}

void Routes::tokenize(Exchange& ex) {
  const TokenizeRequest r = parse_tokenize_request(parse_body(ex.request().body));
  const std::vector<int32_t> ids = encode_prompt(tok_, r.text, r.add_special_tokens, "prompt");
  json::Array a(ids.begin(), ids.end());
  respond_json(ex, 200, json::Object{{"tokens", std::move(a)}, {"count", static_cast<int64_t>(ids.size())},
                                     {"max_model_len", served_.max_model_len}});
}

void Routes::detokenize(Exchange& ex) {
  const std::vector<int32_t> ids = parse_detokenize_request(parse_body(ex.request().body), tok_);
  respond_json(ex, 200, json::Object{{"prompt", tok_.decode(ids)}});
}

void Routes::metrics(Exchange& ex) {
  ex.respond(200, render_prometheus(metrics_, pool_.status(), http_.in_flight(), http_.connections()),
             "text/plain; version=0.0.4; charset=utf-8");
}

void Routes::generate(const std::shared_ptr<Exchange>& ex, Api api) {
  const auto t0 = Clock::now();  // TTFT and end-to-end time count the parsing and tokenizing too
  if (draining_) throw ApiError{503, "the server is shutting down", "service_unavailable", ""};
  if (pool_.ready_count() == 0) throw ApiError{503, "no worker is ready (loading or restarting)", "service_unavailable", ""};
  const json::Value body = parse_body(ex->request().body);
  check_model(body, served_);
  const bool chat = api != Api::Completions;
  GenerateRequest req;
  std::unique_ptr<ResponsesTurn> turn;
  if (api == Api::Responses) {
    // The conversation so far, when it continues a stored response.
    const std::string previous = previous_response_id_of(body);
    const ResponseStore::Entry* stored = previous.empty() ? nullptr : responses_.find(previous);
    if (!previous.empty() && !stored)
      throw ApiError{404, "no stored response '" + previous + "'" +
                              (responses_.enabled() ? " (never stored, deleted, expired, or from before a restart)"
                                                    : ": this server keeps none (--responses-store 0)"),
                     "invalid_request_error", "previous_response_id"};
    // A conversation continued step by step stays within what one request may send, a few times
    // over (its parts the template never renders would otherwise grow without bound).
    const size_t most = 8 * static_cast<size_t>(cfg_.max_body_bytes);
    if (stored && stored->conversation.size() > most)
      throw bad_request("the conversation of '" + previous + "' is " + std::to_string(stored->conversation.size()) +
                            " bytes of JSON, more than this server continues (8 x --max-body-bytes, " +
                            std::to_string(most) + "): send the conversation you need as 'input'",
                        "previous_response_id");
    const json::Array conversation = stored ? json::parse(stored->conversation).as_array() : json::Array{};
    ResponsesRequest rr = parse_responses_request(body, served_, tok_, stored ? &conversation : nullptr);
    req = rr.chat;
    turn = std::make_unique<ResponsesTurn>(std::move(rr), ids_.id("resp_"), unix_now(), served_.name, ids_);
  } else {
    req = parse_generate_request(body, chat, served_, tok_);
  }
  Prompts prompts;
  try {
    prompts = make_prompts(req, served_, tok_);
  } catch (const ApiError& e) {
    throw turn ? as_responses_error(e) : e;
  }
  const int64_t n = req.sampling.n;
  const int64_t count = static_cast<int64_t>(prompts.ids.size()) * n;
  if (count > cfg_.max_queue)  // would never fit: not a 429 to retry
    throw bad_request(std::to_string(prompts.ids.size()) + " prompt(s) x n = " + std::to_string(n) + " make " +
                          std::to_string(count) + " sequences, more than this server queues (" +
                          std::to_string(cfg_.max_queue) + ", --max-queue)",
                      "n");
  if (engine_in_flight_ + count > cfg_.max_queue)
    throw ApiError{429, "the server is at capacity (" + std::to_string(engine_in_flight_) + " requests in flight); retry shortly",
                   "rate_limit_exceeded", ""};
  auto g = std::make_shared<Generation>();
  g->t0 = t0;
  for (int64_t j = 0; j < n; ++j) g->requests.push_back(engine_request(req, tok_, j));  // (may still refuse it)
  g->ex = ex;
  g->r = start_response(req, prompts, turn ? turn->id() : ids_.id(chat ? "chatcmpl-" : "cmpl-"), unix_now(), served_.name);
  g->turn = std::move(turn);
  g->streaming = req.sampling.stream;
  g->remaining = static_cast<int64_t>(g->r.choices.size());
  live_.insert(g);
  // The client leaving cancels what is still generating; the remaining events come with finish
  // "cancelled" and are accounted then.
  ex->hold([self = shared_from_this(), weak = std::weak_ptr<Generation>(g)] {
    auto gen = weak.lock();
    if (!gen || !gen->answering) return;
    gen->answering = false;
    self->live_.erase(gen);
    gen->cancel(self->pool_);
    spdlog::info("{}: client disconnected, generation cancelled", gen->r.id);
  });
  submit(g, req);
}

// One engine request per choice. The sink keeps the generation until its last event, also
// after the client left, so every choice is accounted for exactly once.
void Routes::submit(const std::shared_ptr<Generation>& g, const GenerateRequest& req) {
  const size_t n = static_cast<size_t>(req.sampling.n);
  // A choice that could not be submitted may answer the request at once (a stream not yet
  // begun gets its error): the rest are then not sent.
  for (size_t i = 0; i < g->r.choices.size() && g->answering; ++i) {
    const ChoiceState& c = g->r.choices[i];
    EngineRequest m = g->requests[i % n];
    m.id = next_engine_id_++;
    m.prompt = c.prompt;
    g->engine_ids.push_back(m.id);
    metrics_.prompt_tokens += c.prompt.size();
    std::string why;
    const bool ok = pool_.submit(
        m, static_cast<int64_t>(c.prompt.size()) + req.sampling.max_tokens,
        [self = shared_from_this(), g, i](const EngineEvent& ev) { self->on_event(g, i, ev); }, &why);
    ++engine_in_flight_;
    if (!ok) {
      EngineEvent ev;
      ev.error = why;
      on_event(g, i, ev);
    }
  }
}

void Routes::count_event(Generation& g, const EngineEvent& ev) {
  if (!ev.error.empty()) {
    metrics_.finished["error"]++;
    return;
  }
  const auto now = Clock::now();
  if (ev.token >= 0) {
    ++metrics_.generation_tokens;
    if (!g.first_token_seen) {
      g.first_token_seen = true;
      metrics_.ttft.observe(std::chrono::duration<double>(now - g.t0).count());
    } else {
      metrics_.itl.observe(std::chrono::duration<double>(now - g.last_token).count());
    }
    g.last_token = now;
  }
  if (!ev.finish_reason.empty()) {
    metrics_.finished[ev.finish_reason]++;
    metrics_.prefix_cache_queries += static_cast<uint64_t>(ev.prompt_tokens);
    metrics_.prefix_cache_hits += static_cast<uint64_t>(ev.cached_tokens);
  }
}

void Routes::on_event(const std::shared_ptr<Generation>& g, size_t i, const EngineEvent& ev) {
  if (g->r.choices[i].done) return;
  count_event(*g, ev);
  if (add_event(g->r, i, ev)) {
    --g->remaining;
    --engine_in_flight_;
  }
  if (!g->answering || g->ex->gone()) return;  // the client went away: nothing more to send
  if (g->streaming && !g->stream_started) {
    if (!ev.error.empty()) {  // nothing sent yet: the error with its own status
      live_.erase(g);
      return end_with_error(*g, g->r.failure);
    }
    g->ex->start_events();
    g->stream_started = true;
    if (g->turn)
      for (auto& [type, e] : g->turn->start_events()) g->ex->send_event(e.dump(), type);
  }
  try {
    if (g->streaming) send_chunks(*g, i, ev);
    if (g->remaining == 0) {
      live_.erase(g);
      complete(*g);
    }
  } catch (const std::exception& e) {  // its answer could not be built (a tool call that does not parse, ...)
    fail_answer(g, std::string("internal error: ") + e.what());
  }
}

// A stream's share of event `ev` of choice i: its chunks, or a Response's events.
void Routes::send_chunks(Generation& g, size_t i, const EngineEvent& ev) {
  const ResponseContext ctx{tok_, served_.reasoning, ids_, served_.chat_template == "mistral-nemo"};
  if (!ev.error.empty() && g.turn) {
    for (auto& [type, e] : g.turn->error_events(g.as_answered(g.r.failure))) g.ex->send_event(e.dump(), type);
    return;
  }
  for (const json::Value& chunk : stream_chunks(g.r, i, ev, ctx)) {
    if (!g.turn) {
      g.ex->send_event(chunk.dump());
      continue;
    }
    for (auto& [type, e] : g.turn->chunk_events(chunk)) g.ex->send_event(e.dump(), type);
  }
}

// This request alone ends with `why`: its other choices are cancelled, a stream gets an error
// event and [DONE], an answer not yet sent a 500. Nothing unwinds into the pool.
void Routes::fail_answer(const std::shared_ptr<Generation>& g, const std::string& why) {
  spdlog::error("{}: {}", g->r.id, why);
  live_.erase(g);
  if (!g->ex->gone()) return end_with_error(*g, {500, why, "server_error", ""});
  g->answering = false;
  g->cancel(pool_);
}

// Ends a request that is still answering with `e`: its other choices cancelled, a stream an
// error event and [DONE], an answer not yet sent the error JSON.
void Routes::end_with_error(Generation& g, const ApiError& e) {
  g.answering = false;
  g.cancel(pool_);
  if (!g.stream_started) return respond_error(*g.ex, g.as_answered(e));
  if (g.turn) {
    for (auto& [type, event] : g.turn->error_events(g.as_answered(e))) g.ex->send_event(event.dump(), type);
  } else {
    g.ex->send_event(error_body(e).dump());
    g.ex->send_event("[DONE]");
  }
  g.ex->end_events();
}

void Routes::complete(Generation& g) {
  const double seconds = std::chrono::duration<double>(Clock::now() - g.t0).count();
  metrics_.e2e.observe(seconds);
  const Usage u = usage_of(g.r);
  spdlog::info("{} {}: {} choice(s), prompt {} tokens, completion {} tokens, {} in {:.3f}s", g.r.id,
               g.turn ? "response" : g.r.chat ? "chat" : "completion", g.r.choices.size(), u.prompt_tokens, u.completion_tokens,
               g.r.error.empty() ? g.r.choices[0].finish : "error", seconds);
  g.answering = false;  // the request counts (in the HTTP layer) until its last byte is out
  if (g.streaming) return end_stream(g);
  if (!g.r.error.empty()) return respond_error(*g.ex, g.as_answered(g.r.failure));
  const ResponseContext ctx{tok_, served_.reasoning, ids_, served_.chat_template == "mistral-nemo"};
  json::Value answer = response_json(g.r, ctx);
  if (g.turn) {
    g.turn->finish_whole(answer);
    answer = g.turn->object();
    if (g.turn->request().store) responses_.put(g.turn->id(), answer, g.turn->stored_conversation(), g.turn->request().input);
  }
  respond_json(*g.ex, 200, answer);
}

// A stream's end: the usage chunk when asked for and [DONE], or a Response's last events.
void Routes::end_stream(Generation& g) {
  if (!g.turn) {
    if (g.r.error.empty() && g.r.sampling.include_usage) g.ex->send_event(usage_chunk(g.r).dump());
    g.ex->send_event("[DONE]");
    return g.ex->end_events();
  }
  if (g.r.error.empty()) {  // (a failed one sent its error event)
    for (auto& [type, e] : g.turn->finish_events(g.r.choices[0].finish, usage_json(usage_of(g.r))))
      g.ex->send_event(e.dump(), type);
    if (g.turn->request().store)
      responses_.put(g.turn->id(), g.turn->object(), g.turn->stored_conversation(), g.turn->request().input);
  }
  g.ex->end_events();
}

// GET /v1/responses/{id} (the Response as it was returned), DELETE it, GET its input items.
void Routes::stored_response(Exchange& ex) {
  const HttpRequest& req = ex.request();
  std::string id = req.path.substr(std::string_view("/v1/responses/").size());
  const bool items = id.ends_with("/input_items");
  if (items) id.resize(id.size() - std::string_view("/input_items").size());
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (!get && !(req.method == "DELETE" && !items))
    throw ApiError{405, "method " + req.method + " not allowed on " + req.path, "invalid_request_error", ""};
  const ResponseStore::Entry* e = responses_.find(id);
  if (!e)
    throw ApiError{404, "no stored response '" + id + "'" + (responses_.enabled() ? "" : " (--responses-store 0)"),
                   "invalid_request_error", ""};
  if (req.method == "DELETE") {
    responses_.erase(id);
    return respond_json(ex, 200, json::Object{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
  }
  if (!items) return ex.respond(200, e->response, "application/json");
  // OpenAI lists them newest first unless ?order=asc.
  json::Array data = json::parse(e->input).as_array();
  if (req.target.find("order=asc") == std::string::npos) std::reverse(data.begin(), data.end());
  json::Object list{{"object", "list"}, {"data", data}, {"has_more", false}};
  auto id_of = [](const json::Value& item) { return item.find("id") ? *item.find("id") : json::Value(); };
  list.emplace_back("first_id", data.empty() ? json::Value() : id_of(data.front()));
  list.emplace_back("last_id", data.empty() ? json::Value() : id_of(data.back()));
  respond_json(ex, 200, list);
}

void Routes::abandon_in_flight() {
  const auto open = live_;
  live_.clear();
  for (const auto& g : open) {
    if (!g->answering || g->ex->gone()) continue;
    g->ex->close_after();
    end_with_error(*g, {503, "the server shut down before this request finished (--drain-timeout)", "service_unavailable", ""});
  }
}

}  // namespace kvpr
