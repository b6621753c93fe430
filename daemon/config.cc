#include "daemon/config.h"

#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

#include "openai/chat_template.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

struct Option {
  const char* name;
  std::string help;
  std::function<void(DaemonConfig&, const std::string&)> set;
};

// kvprd's own integers are ints; their ranges are checked once the whole config is read.
int to_int(const char* k, const std::string& v) {
  return static_cast<int>(parse_option_integer(k, v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

const std::vector<Option>& options() {
  static const std::vector<Option> o = {
      {"model", "model directory (Hugging Face OPT checkpoint) [required]", [](DaemonConfig& c, const std::string& v) { c.model = v; }},
      {"host", "address to listen on [127.0.0.1]", [](DaemonConfig& c, const std::string& v) { c.host = v; }},
      {"port", "TCP port [8000]", [](DaemonConfig& c, const std::string& v) { c.port = static_cast<int>(parse_option_integer("port", v, 1, 65535)); }},
      {"health-port", "a second TCP port for GET /health and /metrics alone (probes, Prometheus), which no load on "
       "the API port reaches [none]",
       [](DaemonConfig& c, const std::string& v) { c.health_port = static_cast<int>(parse_option_integer("health-port", v, 1, 65535)); }},
      {"served-model-name", "model name in the API [the model directory's name]",
       [](DaemonConfig& c, const std::string& v) { c.served_model_name = v; }},
      {"backend", "auto, cpu or cuda [auto: cuda when a GPU is visible]", [](DaemonConfig& c, const std::string& v) { c.backend = v; }},
      {"gpus", "cuda: all or a list like 0,2 [all]", [](DaemonConfig& c, const std::string& v) { c.gpus = v; }},
      {"workers", "cpu: number of CPU workers [1]", [](DaemonConfig& c, const std::string& v) { c.workers = to_int("workers", v); }},
      {"max-queue", "requests waiting or running before 429 [256]", [](DaemonConfig& c, const std::string& v) { c.max_queue = to_int("max-queue", v); }},
      {"max-body-bytes", "largest request body, else 413 [1048576]",
       [](DaemonConfig& c, const std::string& v) { c.max_body_bytes = to_int("max-body-bytes", v); }},
      {"drain-timeout", "seconds to finish in-flight requests on SIGTERM [30]",
       [](DaemonConfig& c, const std::string& v) { c.drain_timeout_s = parse_option_number("drain-timeout", v); }},
      {"http-idle-timeout", "seconds a kept-alive connection may wait with no request before it is closed [60]",
       [](DaemonConfig& c, const std::string& v) { c.http_idle_timeout_s = parse_option_number("http-idle-timeout", v); }},
      {"http-request-timeout", "seconds from a request's first byte to its last (headers and body), else the "
       "connection is closed [30]",
       [](DaemonConfig& c, const std::string& v) { c.http_request_timeout_s = parse_option_number("http-request-timeout", v); }},
      {"max-connections", "open HTTP connections; past it a new one gets a 503 and is closed [1024]",
       [](DaemonConfig& c, const std::string& v) { c.max_connections = to_int("max-connections", v); }},
      {"api-key", "a key clients must send as 'Authorization: Bearer KEY' to /v1/*, /tokenize and /detokenize "
       "(repeatable; also $KVPR_API_KEY) [none: open]",
       [](DaemonConfig& c, const std::string& v) {
         KVPR_CHECK(!v.empty(), "api-key: empty");
         c.api_keys.push_back(v);
       }},
      {"api-key-file", "a file of API keys, one a line (# comments) [none]",
       [](DaemonConfig& c, const std::string& v) {
         std::ifstream f(v);
         KVPR_CHECK(f, "api-key-file: cannot open '", v, "'");
         std::string line;
         while (std::getline(f, line)) {
           line = trim(line.substr(0, line.find('#')));
           if (!line.empty()) c.api_keys.push_back(line);
         }
       }},
      {"worker-timeout", "seconds a worker may go without a heartbeat before it is reported unresponsive, its "
       "requests fail and it is restarted (a long step does not count: heartbeats come from their own thread) [10]",
       [](DaemonConfig& c, const std::string& v) { c.worker_timeout_s = parse_option_number("worker-timeout", v); }},
      {"worker-step-timeout", "seconds one engine step may run before the worker is taken as hung (a CUDA call "
       "that never returns, memory that never comes): its requests fail and it is restarted; auto: 20 x the "
       "worker's longest step so far, at least 30 s [auto]",
       [](DaemonConfig& c, const std::string& v) {
         c.worker_step_timeout_s = v == "auto" ? 0 : parse_option_number("worker-step-timeout", v);
       }},
      {"chat-template", "auto (the model's own, else the built-in one it matches), one of " + chat_template_names() + ", or a FILE.jinja [auto]",
       [](DaemonConfig& c, const std::string& v) { c.chat_template = v; }},
      {"generation-config",
       "auto: fields a request leaves out (temperature, top_p, top_k, min_p, repetition_penalty) take the model's "
       "generation_config.json values; none: OpenAI's defaults [auto]",
       [](DaemonConfig& c, const std::string& v) { c.generation_config = !parse_option_either("generation-config", v, "auto", "none"); }},
      {"reasoning-parser",
       "qwen3: a chat answer that opens with <think> has its reasoning (up to </think>) in reasoning_content, "
       "the rest in content, as vLLM's qwen3 parser; none: all in content [none]",
       [](DaemonConfig& c, const std::string& v) {
         KVPR_CHECK(v == "none" || v == "qwen3", "reasoning-parser: expected none or qwen3, got '", v, "'");
         c.reasoning_parser = v;
       }},
      {"tool-call-parser",
       "how a chat answer's tool calls are found, as vLLM's parsers of these names: hermes (<tool_call> blocks: "
       "Qwen2.5, Qwen3), mistral (a JSON list after [TOOL_CALLS]: Mistral-Nemo) or llama3_json (JSON "
       "{\"name\", \"parameters\"}: Llama-3.1, 3.2), harmony (commentary messages to=functions.NAME: gpt-oss), "
       "or generic (any model: the tools described in a system "
       "message, the calls a JSON list); auto: the one for the chat template, generic where it writes no tools; "
       "none: requests with tools are refused [auto]",
       [](DaemonConfig& c, const std::string& v) {
         KVPR_CHECK(v == "auto" || v == "none" || v == "hermes" || v == "llama3_json" || v == "mistral" ||
                        v == "harmony" || v == "generic",
                    "tool-call-parser: expected auto, none, hermes, mistral, llama3_json, harmony or generic, got '", v,
                    "'");
         c.tool_call_parser = v;
       }},
      {"responses-store", "finished Responses kept for previous_response_id and GET /v1/responses/{id}, at most "
       "this many (the oldest go first; 0: none, the store is off) [1024]",
       [](DaemonConfig& c, const std::string& v) {
         c.responses_store = parse_option_integer("responses-store", v, 0, int64_t{1} << 24);
       }},
      {"responses-store-memory", "the stored Responses' JSON at most [256MiB]",
       [](DaemonConfig& c, const std::string& v) {
         c.responses_store_bytes = static_cast<int64_t>(parse_option_size("responses-store-memory", v));
       }},
      {"responses-store-ttl", "seconds a stored Response is kept [3600]",
       [](DaemonConfig& c, const std::string& v) {
         c.responses_store_ttl_s = parse_option_number("responses-store-ttl", v);
         KVPR_CHECK(c.responses_store_ttl_s >= 1 && c.responses_store_ttl_s <= 1e8,
                    "responses-store-ttl must be 1 to 100000000 seconds");
       }},
      {"worker-binary", "path of kvpr-worker [next to kvprd]", [](DaemonConfig& c, const std::string& v) { c.worker_binary = v; }},
      {"log-level", "trace, debug, info, warn or error [info]", [](DaemonConfig& c, const std::string& v) { c.log_level = v; }},
  };
  return o;
}

void apply(DaemonConfig& c, const std::string& key, const std::string& value, const std::string& where) {
  try {
    for (const auto& o : options())
      if (key == o.name) return o.set(c, value);
    if (const EngineOption* e = find_engine_option(key)) return e->set(c.engine, value);
  } catch (const Error& e) {
    KVPR_THROW(where, e.what());
  }
  KVPR_THROW(where, "unknown option '", key, "'");
}


void read_file(DaemonConfig& c, const std::string& path) {
  std::ifstream f(path);
  KVPR_CHECK(f, path, ": cannot open");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    size_t eq = line.find('=');
    KVPR_CHECK(eq != std::string::npos, path, ":", n, ": expected 'key = value'");
    apply(c, trim(line.substr(0, eq)), trim(line.substr(eq + 1)), path + ":" + std::to_string(n) + ": ");
  }
  c.config_file = path;
}

}  // namespace

std::string daemon_help() {
  std::string s =
      "usage: kvprd --model DIR [options]\n\n"
      "Serves an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,\n"
      "/health, /metrics, /tokenize, /detokenize) with one worker process per GPU, or N CPU workers.\n\n"
      "options (each also a 'key = value' line of the config file):\n";
  auto line = [&](const char* option, const std::string& help) {
    std::string name = std::string("  --") + option + " V";
    name.resize(std::max<size_t>(name.size() + 1, 30), ' ');
    s += name + help + "\n";
  };
  for (const auto& o : options()) line(o.name, o.help);
  s += "\nthe workers' engine:\n";
  for (const auto& o : engine_options()) line(o.name, o.help);
  s += "  --config FILE                config file, read only when named (the systemd unit names /etc/kvprd/kvprd.conf)\n"
       "  --print-topology             print each worker's GPU, NUMA node and cpus, and exit\n"
       "  --help                       this text\n";
  return s;
}

DaemonConfig parse_daemon_config(int argc, char** argv, bool* show_help) {
  *show_help = false;
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *show_help = true;
      continue;
    }
    KVPR_CHECK(a.rfind("--", 0) == 0, "unexpected argument '", a, "'");
    std::string key = a.substr(2), value;
    if (size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      KVPR_CHECK(i + 1 < argc, "--", key, " needs a value");
      value = argv[++i];
    }
    if (key == "config") {
      config_path = value;
    } else {
      flags.emplace_back(key, value);
    }
  }
  DaemonConfig c;
  // A file is read only when named: a command-line start never picks up the machine's unit
  // configuration behind its back.
  if (!config_path.empty()) read_file(c, config_path);
  for (const auto& [k, v] : flags) apply(c, k, v, "");
  if (*show_help) return c;
  KVPR_CHECK(!c.model.empty(), "--model is required (see kvprd --help)");
  KVPR_CHECK(c.port > 0 && c.port < 65536, "port must be in 1..65535");
  KVPR_CHECK(c.health_port != c.port, "health-port must differ from port");
  KVPR_CHECK(c.workers >= 1 && c.workers <= 256, "workers must be in 1..256");
  validate(c.engine);
  KVPR_CHECK(c.max_queue >= 1, "max-queue must be >= 1");
  KVPR_CHECK(c.max_body_bytes >= 1024, "max-body-bytes must be >= 1024");
  KVPR_CHECK(c.http_idle_timeout_s > 0 && c.http_request_timeout_s > 0, "http timeouts must be > 0 seconds");
  KVPR_CHECK(c.max_connections >= 1, "max-connections must be >= 1");
  // Heartbeats come every second: a timeout must allow for one late beat and a worker's start.
  KVPR_CHECK(c.worker_timeout_s >= 3 && (c.worker_step_timeout_s == 0 || c.worker_step_timeout_s >= 3),
             "worker timeouts must be >= 3 seconds (or auto for the step timeout)");
  KVPR_CHECK(c.drain_timeout_s >= 0, "drain-timeout must be >= 0");
  if (const char* k = std::getenv("KVPR_API_KEY"); k && *k) c.api_keys.emplace_back(k);  // as vLLM's VLLM_API_KEY
  KVPR_CHECK(c.backend == "auto" || c.backend == "cpu" || c.backend == "cuda", "backend must be auto, cpu or cuda");
  if (c.served_model_name.empty()) c.served_model_name = std::filesystem::path(c.model).filename().string();
  if (c.served_model_name.empty()) c.served_model_name = std::filesystem::path(c.model).parent_path().filename().string();
  return c;
}

std::vector<std::string> apply_live_config(DaemonConfig& live, const DaemonConfig& next) {
  live.log_level = next.log_level;
  live.max_queue = next.max_queue;
  live.max_body_bytes = next.max_body_bytes;
  live.drain_timeout_s = next.drain_timeout_s;
  live.http_idle_timeout_s = next.http_idle_timeout_s;
  live.http_request_timeout_s = next.http_request_timeout_s;
  live.max_connections = next.max_connections;
  live.api_keys = next.api_keys;
  live.worker_timeout_s = next.worker_timeout_s;
  live.worker_step_timeout_s = next.worker_step_timeout_s;
  // Everything else is the workers', the model's or the listener's: compared as the flags spell it.
  DaemonConfig a = live, b = next;
  std::vector<std::string> restart;
  auto differ = [&](const char* name, auto DaemonConfig::*field) {
    if (a.*field != b.*field) restart.emplace_back(name);
  };
  differ("model", &DaemonConfig::model);
  differ("host", &DaemonConfig::host);
  differ("port", &DaemonConfig::port);
  differ("health-port", &DaemonConfig::health_port);
  differ("served-model-name", &DaemonConfig::served_model_name);
  differ("backend", &DaemonConfig::backend);
  differ("gpus", &DaemonConfig::gpus);
  differ("workers", &DaemonConfig::workers);
  for (const auto& o : engine_options())
    if (o.get(a.engine) != o.get(b.engine)) restart.emplace_back(o.name);
  differ("chat-template", &DaemonConfig::chat_template);
  differ("generation-config", &DaemonConfig::generation_config);
  differ("reasoning-parser", &DaemonConfig::reasoning_parser);
  differ("tool-call-parser", &DaemonConfig::tool_call_parser);
  differ("responses-store", &DaemonConfig::responses_store);
  differ("responses-store-memory", &DaemonConfig::responses_store_bytes);
  differ("responses-store-ttl", &DaemonConfig::responses_store_ttl_s);
  differ("worker-binary", &DaemonConfig::worker_binary);
  return restart;
}

}  // namespace kvpr
