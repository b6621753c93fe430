// kvprd: the controller. Starts the workers, serves the HTTP API, supervises, notifies
// systemd, and drains on SIGTERM.
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "openai/chat_template.h"
#include "engine/decode/generation_config.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "daemon/worker_pool.h"
#include "engine/base/error.h"
#include "engine/model/model.h"
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

}  // namespace

int main(int argc, char** argv) {
  using namespace kvpr;
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
    ModelSpec model_cfg = load_model_spec(cfg.model);
    Tokenizer tok = Tokenizer::load(cfg.model);
    const int64_t max_seq_len = cfg.engine.generator.max_seq_len;
    int64_t ctx = max_seq_len > 0 ? std::min(max_seq_len, model_cfg.max_position_embeddings)
                                      : model_cfg.max_position_embeddings;
    ServedModel served;
    served.name = cfg.served_model_name;
    served.reasoning = cfg.reasoning_parser != "none";
    served.max_model_len = ctx;
    served.vocab_size = model_cfg.vocab_size;
    std::string& tmpl = served.chat_template;
    tmpl = cfg.chat_template;
    if (tmpl == "auto") {
      std::string why;
      tmpl = auto_chat_template(cfg.model, &why, &served.default_system);
      spdlog::info("chat template {} (auto: {})", tmpl, why);
    }
    KVPR_CHECK(known_chat_template(tmpl), "unknown --chat-template '", cfg.chat_template, "' (auto, ",
               chat_template_names(), ")");
    // Tool calls: the parser for how the template's model writes them (auto), or as given.
    served.tool_call_parser = cfg.tool_call_parser;
    if (served.tool_call_parser == "auto") {
      served.tool_call_parser = chat_tool_call_parser(tmpl);
      if (served.tool_call_parser.empty()) served.tool_call_parser = "none";
    }
    KVPR_CHECK(served.tool_call_parser == "none" || chat_template_has_tools(tmpl), "--tool-call-parser ",
               served.tool_call_parser,
               " needs a chat template that writes tools (qwen2.5, qwen3, mistral-nemo, llama-3.1, llama-3.2), not ", tmpl);
    spdlog::info("tool calls: {}", served.tool_call_parser == "none" ? "off (requests with tools are refused)"
                                                                      : served.tool_call_parser);
    // Sampling defaults: read (and refused when out of range) before any worker starts.
    if (cfg.generation_config) {
      served.defaults = read_sampling_defaults(cfg.model);
      spdlog::info("sampling defaults from generation_config.json: {}", served.defaults.describe());
    }
    std::string worker = cfg.worker_binary.empty() ? self_dir() + "/kvpr-worker" : cfg.worker_binary;
    if (!std::filesystem::exists(worker)) {
      std::string installed = self_dir() + "/../worker/kvpr-worker";  // build tree layout
      KVPR_CHECK(std::filesystem::exists(installed), "worker binary not found: ", worker, " (set --worker-binary)");
      worker = installed;
    }

    boost::asio::io_context io;
    // Signals are caught from here on (SIGHUP's default would end the daemon).
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    boost::asio::signal_set hangup(io, SIGHUP);
    WorkerPool pool(io, cfg, worker);
    if (print_topology) {
      std::fputs(pool.placement().c_str(), stdout);
      return 0;
    }
    for (const auto& line : split_lines(pool.placement())) spdlog::info("placement: {}", line);
    if (tok.size() > model_cfg.vocab_size)
      spdlog::warn("the tokenizer has {} tokens, the model's vocabulary {}: prompts with ids beyond it are refused",
                   tok.size(), model_cfg.vocab_size);
    Server server(io, cfg, pool, tok, served);
    server.listen();
    spdlog::info("kvprd listening on http://{}:{} serving '{}' ({} layers, context {}, kv mode {})", cfg.host, cfg.port,
                 cfg.served_model_name, model_cfg.num_layers, ctx, kv_mode_name(cfg.engine.generator.kv.mode));
    pool.on_all_ready([&] {
      spdlog::info("all workers ready");
      sd_notify(0, "READY=1\nSTATUS=serving");
    });
    int exit_code = 0;
    boost::asio::steady_timer watchdog(io);
    pool.on_start_failed([&](const std::string& why) {
      spdlog::error("no worker could start; exiting: {}", why);
      std::fprintf(stderr, "kvprd: error: %s\n", why.c_str());
      sd_notifyf(0, "STATUS=no worker could start: %s", why.c_str());
      exit_code = 1;
      server.close();
      pool.stop();
      watchdog.cancel();
      io.stop();
    });
    pool.start();

    // systemd watchdog: ping at half the interval while the io loop is alive.
    uint64_t watchdog_usec = 0;
    std::function<void()> ping;
    if (sd_watchdog_enabled(0, &watchdog_usec) > 0) {
      ping = [&] {
        sd_notify(0, "WATCHDOG=1");
        watchdog.expires_after(std::chrono::microseconds(watchdog_usec / 2));
        watchdog.async_wait([&](const boost::system::error_code& ec) {
          if (!ec) ping();
        });
      };
      ping();
    }

    // SIGTERM / SIGINT: stop taking requests (/health says draining, so load balancers move on),
    // finish in-flight ones up to the drain timeout; those still running then end with an error
    // (an error event and [DONE] for a stream, a 503 otherwise), and their last bytes get 2 s.
    boost::asio::steady_timer drain_timer(io);
    auto deadline = std::chrono::steady_clock::now();
    bool abandoned = false;
    std::function<void()> check_drained = [&] {
      const auto now = std::chrono::steady_clock::now();
      if (server.in_flight_requests() > 0 && now >= deadline && !abandoned) {
        spdlog::warn("drain timeout: {} request(s) still running end with an error", server.in_flight_requests());
        server.abandon_in_flight();
        abandoned = true;
        deadline = now + std::chrono::seconds(2);
      }
      if (server.in_flight_requests() == 0 || (abandoned && now >= deadline)) {
        server.close();
        pool.stop();
        watchdog.cancel();
        io.stop();
        return;
      }
      drain_timer.expires_after(std::chrono::milliseconds(50));
      drain_timer.async_wait([&](const boost::system::error_code& ec) {
        if (!ec) check_drained();
      });
    };
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      spdlog::info("signal {}: draining ({} request(s) in flight, timeout {}s)", sig, server.in_flight_requests(),
                   cfg.drain_timeout_s);
      sd_notify(0, "STOPPING=1");
      server.begin_drain();
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(cfg.drain_timeout_s * 1000));
      check_drained();
    });
    // SIGHUP (systemctl reload): the config file is read again (flags still win); what can change
    // live applies to requests from now on, what cannot is logged as needing a restart. No
    // request is dropped, and a file that does not parse leaves everything as it was.
    std::function<void()> on_hangup = [&] {
      hangup.async_wait([&](const boost::system::error_code& ec, int) {
        if (ec) return;
        try {
          bool help = false;
          const DaemonConfig next = parse_daemon_config(argc, argv, &help);
          const std::vector<std::string> restart = apply_live_config(cfg, next);
          spdlog::set_level(spdlog::level::from_str(cfg.log_level));
          server.apply_config(cfg);
          pool.apply_config(cfg);
          spdlog::info("SIGHUP: reloaded {} (log level {}, max-queue {}, max-body-bytes {}, {} API key(s))",
                       cfg.config_file.empty() ? "the flags" : cfg.config_file, cfg.log_level, cfg.max_queue,
                       cfg.max_body_bytes, cfg.api_keys.size());
          if (!restart.empty()) {
            std::string names;
            for (const auto& n : restart) names += (names.empty() ? "" : ", ") + n;
            spdlog::warn("SIGHUP: changed but needs a restart to apply: {}", names);
          }
        } catch (const std::exception& e) {
          spdlog::error("SIGHUP: the new settings are refused, the running ones kept: {}", e.what());
        }
        on_hangup();
      });
    };
    on_hangup();
    io.run();
    spdlog::info("kvprd stopped");
    return exit_code;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::fprintf(stderr, "kvprd: %s\n", e.what());
    return 1;
  }
}
