// kvprd's settings: every option is a command-line flag and a `key = value` line of the
// config file (/etc/kvprd/kvprd.conf by default; flags win). See systemd/kvprd.conf. The
// engine's options are the engine's own table (engine/decode/engine_options.h), passed on to
// every worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/decode/engine_options.h"

namespace kvpr {

struct DaemonConfig {
  std::string model;                 // model directory (required)
  std::string host = "127.0.0.1";
  int port = 8000;
  // > 0: a second listener, on host, for GET /health and /metrics alone (load balancers'
  // probes, Prometheus), which no load on the API port (a connection flood, a slowloris) reaches.
  int health_port = 0;
  std::string served_model_name;     // default: the model directory's name
  std::string backend = "auto";      // auto: cuda when a GPU is visible, else cpu
  std::string gpus = "all";          // cuda: "all" or "0,2"
  int workers = 1;                   // cpu: number of CPU workers
  EngineOptions engine;              // the workers' engine: batch, context, KV mode, ... (engine_options.h)
  int max_queue = 256;               // requests waiting or running before 429
  int64_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  double drain_timeout_s = 30;       // SIGTERM: time to finish in-flight requests
  double http_idle_timeout_s = 60;   // a kept-alive connection with no request begun is closed
  double http_request_timeout_s = 30;  // from a request's first byte to its last (headers and body)
  int max_connections = 1024;        // open HTTP connections; past it new ones get 503 and are closed
  // Bearer keys /v1/*, /tokenize and /detokenize need (none: open). From --api-key (repeatable),
  // --api-key-file (one key a line) and $KVPR_API_KEY.
  std::vector<std::string> api_keys;
  double worker_timeout_s = 10;      // a worker silent this long (no heartbeat) is unresponsive: killed, restarted
  double worker_step_timeout_s = 0;  // a worker in one engine step this long (a hung CUDA call) likewise; 0: auto (step_limit)
  std::string chat_template = "auto";  // see chat_template.h
  bool generation_config = true;     // sampling defaults from the model's generation_config.json
  std::string reasoning_parser = "none";  // qwen3: chat answers split into reasoning_content and content
  std::string tool_call_parser = "auto";  // hermes, llama3_json, mistral, generic or none; auto: the chat
                                          // template's (chat_tool_call_parser), generic where it writes none
  // Responses kept for previous_response_id and GET /v1/responses/{id}: at most this many (0:
  // none, the store is off), this much JSON, each this long.
  int64_t responses_store = 1024;
  int64_t responses_store_bytes = int64_t{256} << 20;
  double responses_store_ttl_s = 3600;
  std::string worker_binary;         // default: kvpr-worker next to kvprd
  std::string log_level = "info";
  std::string config_file;           // the file that was read, if any
};

// Parses argv (and the config file named by --config, else /etc/kvprd/kvprd.conf when it
// exists). Throws kvpr::Error with a one-line message on a bad flag or value. Called again on
// SIGHUP (the file re-read, the flags still winning).
DaemonConfig parse_daemon_config(int argc, char** argv, bool* show_help);

// SIGHUP: what of `next` can change while serving is copied into `live` (log level, queue and
// body limits, timeouts, connection limit, API keys); the names of the options that differ but
// need a restart are returned.
std::vector<std::string> apply_live_config(DaemonConfig& live, const DaemonConfig& next);
std::string daemon_help();

}  // namespace kvpr
