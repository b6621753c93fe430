#include "daemon/metrics.h"

#include <cstdio>

namespace kvpr {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  char buf[64];
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    std::snprintf(buf, sizeof buf, "%g", bounds_[i]);
    out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  std::snprintf(buf, sizeof buf, "%.6f", sum_);
  out += name + "_sum " + buf + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

namespace {

// The daemon's requests: in flight, tokens, prefix cache, finish reasons, HTTP codes, latencies.
void render_requests(std::string& out, const DaemonMetrics& m, const std::vector<WorkerStatus>& workers,
                     int64_t http_in_flight) {
  auto gauge = [&](const std::string& name, const std::string& help, double v, const std::string& labels = "") {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + labels + " " + std::to_string(v) + "\n";
  };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + std::to_string(v) + "\n";
  };
  int64_t running = 0, waiting = 0;
  for (const auto& w : workers) {
    running += w.stats.running;
    waiting += w.stats.waiting;
  }
  gauge("kvpr_requests_running", "Sequences in a worker's running batch.", static_cast<double>(running));
  gauge("kvpr_requests_waiting", "Sequences queued in workers or for admission.", static_cast<double>(waiting));
  gauge("kvpr_http_requests_in_flight", "HTTP generation requests being served.", static_cast<double>(http_in_flight));
  counter("kvpr_prompt_tokens_total", "Prompt tokens processed.", static_cast<double>(m.prompt_tokens));
  counter("kvpr_generation_tokens_total", "Tokens generated.", static_cast<double>(m.generation_tokens));
  counter("kvpr_prefix_cache_queries_total", "Prompt tokens looked up in the workers' prefix caches.",
          static_cast<double>(m.prefix_cache_queries));
  counter("kvpr_prefix_cache_hits_total", "Prompt tokens whose K/V were found in a worker's prefix cache.",
          static_cast<double>(m.prefix_cache_hits));
  out += "# HELP kvpr_request_success_total Finished sequences by finish reason.\n# TYPE kvpr_request_success_total counter\n";
  for (const char* r : {"stop", "length", "cancelled", "error"})
    out += std::string("kvpr_request_success_total{finish_reason=\"") + r + "\"} " +
           std::to_string(m.finished.count(r) ? m.finished.at(r) : 0) + "\n";
  out += "# HELP kvpr_http_responses_total HTTP responses by status code.\n# TYPE kvpr_http_responses_total counter\n";
  for (const auto& [code, n] : m.http_responses)
    out += "kvpr_http_responses_total{code=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
  m.ttft.render(out, "kvpr_time_to_first_token_seconds", "Time to first token.");
  m.itl.render(out, "kvpr_inter_token_latency_seconds", "Time between tokens of a sequence.");
  m.e2e.render(out, "kvpr_e2e_request_latency_seconds", "End-to-end request latency.");
}

// Each worker's device, KV mode and NUMA node, as labels of a constant 1 (Prometheus' info pattern).
void render_worker_info(std::string& out, const std::vector<WorkerStatus>& workers) {
  auto label = [](const std::string& v) {
    std::string e;
    for (char c : v) e += c == '"' ? std::string("\\\"") : c == '\\' ? std::string("\\\\") : c == '\n' ? std::string("\\n") : std::string(1, c);
    return e;
  };
  out += "# HELP kvpr_worker_info A worker's device, KV mode and NUMA node (1 once it has been ready).\n"
         "# TYPE kvpr_worker_info gauge\n";
  for (const auto& w : workers) {
    if (w.info.backend.empty()) continue;
    const json::Value* node = w.info.placement.is_object() ? w.info.placement.find("numa_node") : nullptr;
    out += "kvpr_worker_info{worker=\"" + std::to_string(w.index) + "\",device=\"" + label(w.info.backend) +
           "\",kv_mode=\"" + label(w.info.kv_mode) + "\",numa_node=\"" +
           (node && node->is_int() ? std::to_string(node->as_int()) : std::string("none")) + "\"} 1\n";
  }
}

// Each worker's last stats message, a gauge per field.
void render_worker_stats(std::string& out, const std::vector<WorkerStatus>& workers) {
  auto per_worker = [&](const char* name, const char* help, auto field) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (const auto& w : workers)
      out += std::string(name) + "{worker=\"" + std::to_string(w.index) + "\"} " +
             std::to_string(static_cast<double>(w.stats.*field)) + "\n";
  };
  per_worker("kvpr_worker_batch_size", "Sequences in the worker's batch.", &WorkerStats::running);
  per_worker("kvpr_worker_split", "Current split l (tokens recomputed per layer).", &WorkerStats::split);
  per_worker("kvpr_worker_h2d_gbps", "Measured host-to-device bandwidth.", &WorkerStats::h2d_gbps);
  per_worker("kvpr_worker_host_kv_bytes", "Host KV bytes in use.", &WorkerStats::host_kv_bytes);
  per_worker("kvpr_worker_device_kv_bytes", "Device memory of the KV device tier (kv mode auto).",
             &WorkerStats::device_kv_bytes);
  per_worker("kvpr_worker_device_kv_used_bytes", "Of it, blocks mirroring host KV blocks now (kv mode auto).",
             &WorkerStats::device_kv_used_bytes);
  per_worker("kvpr_worker_kv_resident_tokens",
             "Cached tokens the last step read in place on the device (kv mode auto: the tier the scheduler chose).",
             &WorkerStats::kv_resident_tokens);
  per_worker("kvpr_worker_kv_staged_tokens", "Cached tokens the last step recomputed or copied over the link.",
             &WorkerStats::kv_staged_tokens);
  per_worker("kvpr_worker_busy_fraction", "Fraction of time the worker spent stepping.", &WorkerStats::busy_fraction);
  per_worker("kvpr_worker_graph_replays", "Decode steps replayed as CUDA graphs since the worker started (cuda-graphs).",
             &WorkerStats::graph_replays);
  per_worker("kvpr_worker_spec_draft_tokens", "Draft tokens checked since the worker started (speculative-tokens).",
             &WorkerStats::spec_draft_tokens);
  per_worker("kvpr_worker_spec_accepted_tokens", "Draft tokens accepted since the worker started (speculative-tokens).",
             &WorkerStats::spec_accepted_tokens);
  per_worker("kvpr_worker_kv_blocks_total", "Paged KV blocks in the worker's store.", &WorkerStats::kv_blocks_total);
  per_worker("kvpr_worker_kv_blocks_used", "Paged KV blocks held by sequences.", &WorkerStats::kv_blocks_used);
  per_worker("kvpr_worker_kv_blocks_cached", "Free paged KV blocks whose content is kept for the prefix cache.",
             &WorkerStats::kv_blocks_cached);
  per_worker("kvpr_worker_preemptions", "Sequences preempted for KV blocks since the worker started.",
             &WorkerStats::preemptions);
  per_worker("kvpr_worker_rope_recomputes",
             "Sequences whose K/V were computed again past longrope's original context since the worker started.",
             &WorkerStats::rope_recomputes);
  per_worker("kvpr_worker_prefix_query_tokens", "Prompt tokens looked up in the prefix cache since the worker started.",
             &WorkerStats::prefix_query_tokens);
  per_worker("kvpr_worker_prefix_hit_tokens", "Of them, tokens whose K/V were found in cached blocks.",
             &WorkerStats::prefix_hit_tokens);
}

// Each worker's state, restarts and unresponsive kills, and the open connections.
void render_lifecycle(std::string& out, const std::vector<WorkerStatus>& workers, int64_t connections) {
  out += "# HELP kvpr_worker_up Worker ready (1) or not (0).\n# TYPE kvpr_worker_up gauge\n";
  for (const auto& w : workers)
    out += "kvpr_worker_up{worker=\"" + std::to_string(w.index) + "\"} " + (w.state == "ready" ? "1" : "0") + "\n";
  out += "# HELP kvpr_worker_restarts_total Worker restarts.\n# TYPE kvpr_worker_restarts_total counter\n";
  for (const auto& w : workers)
    out += "kvpr_worker_restarts_total{worker=\"" + std::to_string(w.index) + "\"} " + std::to_string(w.restarts) + "\n";
  out += "# HELP kvpr_worker_unresponsive_total Times the worker went silent past --worker-timeout (or stuck in a step) "
         "and was killed.\n# TYPE kvpr_worker_unresponsive_total counter\n";
  for (const auto& w : workers)
    out += "kvpr_worker_unresponsive_total{worker=\"" + std::to_string(w.index) + "\"} " + std::to_string(w.unresponsive) +
           "\n";
  out += "# HELP kvpr_http_connections Open HTTP connections.\n# TYPE kvpr_http_connections gauge\n"
         "kvpr_http_connections " + std::to_string(connections) + "\n";
}

}  // namespace

std::string render_prometheus(const DaemonMetrics& m, const std::vector<WorkerStatus>& workers, int64_t http_in_flight,
                              int64_t connections) {
  std::string out;
  render_requests(out, m, workers, http_in_flight);
  render_worker_info(out, workers);
  render_worker_stats(out, workers);
  render_lifecycle(out, workers, connections);
  return out;
}
}  // namespace kvpr
