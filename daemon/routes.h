// kvprd's routes: the OpenAI API (and /health, /metrics, /tokenize, /detokenize) on the worker
// pool. A generation is parse (openai/request; a Responses request through openai/responses into
// the same) -> prompts -> one engine request per choice on the pool -> each event into the
// response state (openai/response) -> the stream's chunks (a Response's events) or, at the end,
// the whole response. Runs on the io_context's thread, as the pool's callbacks do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

#include "daemon/config.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/worker_pool.h"
#include "engine/text/tokenizer.h"
#include "openai/ids.h"
#include "openai/request.h"
#include "openai/responses.h"

namespace kvpr {

class Routes : public std::enable_shared_from_this<Routes> {
 public:
  Routes(const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok, const ServedModel& served,
         DaemonMetrics& metrics, const HttpServer& http);

  // Answers the exchange (or throws ApiError for the HTTP layer to send).
  void handle(const std::shared_ptr<Exchange>& ex);
  // SIGHUP: the live settings (API keys, --max-queue) for requests from now on.
  void apply_config(const DaemonConfig& live) { cfg_ = live; }
  void begin_drain() { draining_ = true; }
  // The drain timeout has passed: generations still running end now (an error event and [DONE]
  // for a stream, a 503 otherwise).
  void abandon_in_flight();

  struct Generation;

 private:
  void authorize(const HttpRequest& req) const;
  void health(Exchange& ex);
  void models(Exchange& ex);
  void tokenize(Exchange& ex);
  void detokenize(Exchange& ex);
  void metrics(Exchange& ex);
  enum class Api { Completions, Chat, Responses };
  void generate(const std::shared_ptr<Exchange>& ex, Api api);
  // GET or DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.
  void stored_response(Exchange& ex);
  void submit(const std::shared_ptr<Generation>& g, const GenerateRequest& req);
  void on_event(const std::shared_ptr<Generation>& g, size_t i, const EngineEvent& ev);
  void complete(Generation& g);
  void fail_answer(const std::shared_ptr<Generation>& g, const std::string& why);
  void end_with_error(Generation& g, const ApiError& e);
  void count_event(Generation& g, const EngineEvent& ev);
  void send_chunks(Generation& g, size_t i, const EngineEvent& ev);
  void end_stream(Generation& g);

  DaemonConfig cfg_;
  WorkerPool& pool_;
  const Tokenizer& tok_;
  ServedModel served_;
  DaemonMetrics& metrics_;
  const HttpServer& http_;
  bool draining_ = false;
  int64_t created_unix_ = 0;
  int64_t engine_in_flight_ = 0;  // engine requests (choices) not finished
  uint64_t next_engine_id_ = 1;
  IdMaker ids_;
  ResponseStore responses_;
  std::unordered_set<std::shared_ptr<Generation>> live_;  // not answered yet (abandoned at the drain timeout)
};

}  // namespace kvpr
