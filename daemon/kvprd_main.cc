// kvprd: the controller. Starts the workers, serves the HTTP API, supervises, notifies
// systemd, and drains on SIGTERM.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "openai/chat_template.h"
#include "openai/model_chat_template.h"
#include "openai/generation_config.h"
#include "daemon/config.h"
#include "daemon/engine_probe.h"
#include "daemon/server.h"
#include "daemon/worker_pool.h"
#include "engine/base/error.h"
#include "engine/text/tokenizer.h"

namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find('\n', p);
    if (q == std::string::npos) q = s.size();
    out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

std::string self_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

// What kvprd serves, decided at start from the model and the flags: its context, chat
// template, tool-call parser and sampling defaults (read, and refused when out of range, before
// any worker starts).
kvpr::ServedModel served_model(const kvpr::DaemonConfig& cfg, const kvpr::EngineDescription& spec) {
  using namespace kvpr;
  ServedModel served;
  served.name = cfg.served_model_name;
  served.reasoning = cfg.reasoning_parser != "none";
  const int64_t max_seq_len = cfg.engine.generator.max_seq_len;
  served.max_model_len = max_seq_len > 0 ? std::min(max_seq_len, spec.max_position_embeddings) : spec.max_position_embeddings;
  served.vocab_size = spec.vocab_size;
  ChatTemplateChoice choice = choose_chat_template(cfg.model, cfg.chat_template);
  served.chat_template = choice.family;
  served.default_system = choice.default_system;
  served.model_template = choice.model;
  spdlog::info("chat template {} ({}: {})", choice.family, cfg.chat_template, choice.why);
  const std::string& tmpl = served.chat_template;
  // Tool calls: the parser for how the template's model writes them (auto), else the generic
  // format (tools described in a system message, openai/generic_tools.h), or as given.
  served.tool_call_parser = cfg.tool_call_parser;
  if (served.tool_call_parser == "auto") {
    served.tool_call_parser = chat_tool_call_parser(tmpl);
    if (served.tool_call_parser.empty()) served.tool_call_parser = "generic";
  }
  KVPR_CHECK(served.tool_call_parser == "none" || served.tool_call_parser == "generic" || chat_template_has_tools(tmpl),
             "--tool-call-parser ", served.tool_call_parser,
             " needs a chat template that writes tools (qwen2.5, qwen3, mistral-nemo, llama-3.1, llama-3.2, harmony), not ", tmpl,
             " (generic serves tools on any template)");
  // gpt-oss's calls are messages of its format, parsed with its channels: that parser and that template go together.
  KVPR_CHECK((served.tool_call_parser == "harmony") == (tmpl == "harmony") || served.tool_call_parser == "none",
             "--tool-call-parser ", served.tool_call_parser, " and the chat template ", tmpl,
             " do not go together: gpt-oss's harmony template writes calls in its own format (--tool-call-parser harmony)");
  spdlog::info("tool calls: {}", served.tool_call_parser == "none"      ? "off (requests with tools are refused)"
                                 : served.tool_call_parser == "generic" ? "generic (the template writes no tools: they "
                                                                          "are described in a system message)"
                                                                        : served.tool_call_parser);
  if (cfg.generation_config) {
    served.defaults = read_sampling_defaults(cfg.model);
    spdlog::info("sampling defaults from generation_config.json: {}", served.defaults.describe());
  }
  return served;
}

// kvpr-worker: --worker-binary, else next to kvprd, else where the build tree has it.
std::string worker_binary(const kvpr::DaemonConfig& cfg) {
  std::string worker = cfg.worker_binary.empty() ? self_dir() + "/kvpr-worker" : cfg.worker_binary;
  if (std::filesystem::exists(worker)) return worker;
  const std::string built = self_dir() + "/../worker/kvpr-worker";
  KVPR_CHECK(std::filesystem::exists(built), "worker binary not found: ", worker, " (set --worker-binary)");
  return built;
}

// The running daemon's life: systemd's readiness and watchdog, SIGTERM's drain, SIGHUP's reload.
class Lifecycle {
 public:
  Lifecycle(boost::asio::io_context& io, kvpr::DaemonConfig& cfg, kvpr::WorkerPool& pool, kvpr::Server& server,
            int argc, char** argv)
      : io_(io), cfg_(cfg), pool_(pool), server_(server), argc_(argc), argv_(argv), watchdog_(io), drain_timer_(io) {}

  // Starts the workers and runs the io loop until the daemon stops; its exit code.
  int run(boost::asio::signal_set& terminate, boost::asio::signal_set& hangup) {
    pool_.on_all_ready([] {
      spdlog::info("all workers ready");
      sd_notify(0, "READY=1\nSTATUS=serving");
    });
    pool_.on_start_failed([this](const std::string& why) {
      spdlog::error("no worker could start; exiting: {}", why);
      std::fprintf(stderr, "kvprd: error: %s\n", why.c_str());
      sd_notifyf(0, "STATUS=no worker could start: %s", why.c_str());
      exit_code_ = 1;
      stop();
    });
    pool_.start();
    start_watchdog();
    terminate.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (!ec) drain(sig);
    });
    wait_for_hangup(hangup);
    io_.run();
    spdlog::info("kvprd stopped");
    return exit_code_;
  }

 private:
  void stop() {
    server_.close();
    pool_.stop();
    watchdog_.cancel();
    io_.stop();
  }

  // systemd's watchdog: a ping at half the interval while the io loop is alive.
  void start_watchdog() {
    if (sd_watchdog_enabled(0, &watchdog_usec_) <= 0) return;
    sd_notify(0, "WATCHDOG=1");
    watchdog_.expires_after(std::chrono::microseconds(watchdog_usec_ / 2));
    watchdog_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) start_watchdog();
    });
  }

  // SIGTERM / SIGINT: stop taking requests (/health says draining, so load balancers move on),
  // finish in-flight ones up to the drain timeout; those still running then end with an error
  // (an error event and [DONE] for a stream, a 503 otherwise), and their last bytes get 2 s.
  void drain(int sig) {
    spdlog::info("signal {}: draining ({} request(s) in flight, timeout {}s)", sig, server_.in_flight_requests(),
                 cfg_.drain_timeout_s);
    sd_notify(0, "STOPPING=1");
    server_.begin_drain();
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(cfg_.drain_timeout_s * 1000));
    check_drained();
  }

  void check_drained() {
    const auto now = std::chrono::steady_clock::now();
    if (server_.in_flight_requests() > 0 && now >= deadline_ && !abandoned_) {
      spdlog::warn("drain timeout: {} request(s) still running end with an error", server_.in_flight_requests());
      server_.abandon_in_flight();
      abandoned_ = true;
      deadline_ = now + std::chrono::seconds(2);
    }
    if (server_.in_flight_requests() == 0 || (abandoned_ && now >= deadline_)) return stop();
    drain_timer_.expires_after(std::chrono::milliseconds(50));
    drain_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) check_drained();
    });
  }

  // SIGHUP (systemctl reload): the config file is read again (flags still win); what can change
  // live applies to requests from now on, what cannot is logged as needing a restart. No request
  // is dropped, and a file that does not parse leaves everything as it was.
  void wait_for_hangup(boost::asio::signal_set& hangup) {
    hangup.async_wait([this, &hangup](const boost::system::error_code& ec, int) {
      if (ec) return;
      reload();
      wait_for_hangup(hangup);
    });
  }

  void reload() {
    try {
      bool help = false;
      const kvpr::DaemonConfig next = kvpr::parse_daemon_config(argc_, argv_, &help);
      const std::vector<std::string> restart = kvpr::apply_live_config(cfg_, next);
      spdlog::set_level(spdlog::level::from_str(cfg_.log_level));
      server_.apply_config(cfg_);
      pool_.apply_config(cfg_);
      spdlog::info("SIGHUP: reloaded {} (log level {}, max-queue {}, max-body-bytes {}, {} API key(s))",
                   cfg_.config_file.empty() ? "the flags" : cfg_.config_file, cfg_.log_level, cfg_.max_queue,
                   cfg_.max_body_bytes, cfg_.api_keys.size());
      if (!restart.empty()) {
        std::string names;
        for (const auto& n : restart) names += (names.empty() ? "" : ", ") + n;
        spdlog::warn("SIGHUP: changed but needs a restart to apply: {}", names);
      }
    } catch (const std::exception& e) {
      spdlog::error("SIGHUP: the new settings are refused, the running ones kept: {}", e.what());
    }
  }

  boost::asio::io_context& io_;
  kvpr::DaemonConfig& cfg_;
  kvpr::WorkerPool& pool_;
  kvpr::Server& server_;
  int argc_;
  char** argv_;
  boost::asio::steady_timer watchdog_, drain_timer_;
  uint64_t watchdog_usec_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  bool abandoned_ = false;
  int exit_code_ = 0;
};

}  // namespace

namespace kvpr {
namespace {

// Descriptors: the open connections (and the few past the limit that may ask /health), each
// worker's channel, and a margin for the rest (listening socket, event loop, logs, the model's
// files while it loads). A soft limit below that is raised to what the hard one allows; if even
// that is short, the graceful 503 at --max-connections could never come before accept() fails.
void check_descriptor_limit(const DaemonConfig& cfg) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t need = static_cast<rlim_t>(cfg.max_connections) + 16 + 8 * static_cast<rlim_t>(std::max(1, cfg.workers)) + 64;
  if (rl.rlim_cur >= need) return;
  const rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
  if (rl.rlim_cur > was && ::setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= need) {
    spdlog::info("descriptor limit raised from {} to {} for --max-connections {}", was, rl.rlim_cur, cfg.max_connections);
    return;
  }
  spdlog::warn("--max-connections {} needs about {} descriptors but the limit is {} (hard {}): raise it (LimitNOFILE= in "
               "the unit, ulimit -n) or lower --max-connections, else accept() fails before the 503",
               cfg.max_connections, need, ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : was, rl.rlim_max);
}

}  // namespace
}  // namespace kvpr

int main(int argc, char** argv) {
  using namespace kvpr;
  // Prompts, answers and KV live in this process and its workers: no core dump and no ptrace by
  // other processes of the same user (the workers do the same after their exec).
  ::prctl(PR_SET_DUMPABLE, 0);
  DaemonConfig cfg;
  bool print_topology = false;
  try {
    bool help = false;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      if (std::string(argv[i]) == "--print-topology") print_topology = true;
      else args.push_back(argv[i]);
    }
    cfg = parse_daemon_config(static_cast<int>(args.size()), args.data(), &help);
    if (help) {
      std::fputs(daemon_help().c_str(), stdout);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvprd: %s\n", e.what());
    return 2;
  }
  auto logger = spdlog::stderr_color_mt("kvprd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  ::signal(SIGPIPE, SIG_IGN);

  try {
    if (!cfg.config_file.empty()) spdlog::info("config file {}", cfg.config_file);
    else spdlog::info("no config file (the command line only; --config FILE names one)");
    check_descriptor_limit(cfg);
    const std::string worker = worker_binary(cfg);
    const EngineDescription spec = probe_engine(worker, cfg);  // the GPUs and the model, as the engine sees them
    const Tokenizer tok = Tokenizer::load(cfg.model);
    const ServedModel served = served_model(cfg, spec);
    boost::asio::io_context io;
    // Signals are caught from here on (SIGHUP's default would end the daemon).
    boost::asio::signal_set terminate(io, SIGTERM, SIGINT);
    boost::asio::signal_set hangup(io, SIGHUP);
    WorkerPool pool(io, cfg, worker, spec);
    if (print_topology) {
      std::fputs(pool.placement().c_str(), stdout);
      return 0;
    }
    for (const auto& line : split_lines(pool.placement())) spdlog::info("placement: {}", line);
    if (tok.size() > spec.vocab_size)
      spdlog::warn("the tokenizer has {} tokens, the model's vocabulary {}: prompts with ids beyond it are refused",
                   tok.size(), spec.vocab_size);
    Server server(io, cfg, pool, tok, served);
    server.listen();
    // Without --kv-mode each worker picks its backend's default (auto on a GPU) and says so when ready.
    const std::string kv_mode = cfg.engine.kv_mode_given ? std::string("kv mode ") + kv_mode_name(cfg.engine.generator.kv.mode)
                                                         : std::string("each worker's default kv mode");
    spdlog::info("kvprd listening on http://{}:{} serving '{}' ({} layers, context {}, {})", cfg.host, cfg.port,
                 cfg.served_model_name, spec.num_layers, served.max_model_len, kv_mode);
    if (cfg.health_port > 0)
      spdlog::info("kvprd health port: http://{}:{}/health and /metrics alone", cfg.host, cfg.health_port);
    return Lifecycle(io, cfg, pool, server, argc, argv).run(terminate, hangup);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::fprintf(stderr, "kvprd: %s\n", e.what());
    return 1;
  }
}
