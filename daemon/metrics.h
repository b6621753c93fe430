// Prometheus text-format metrics of the daemon: its counters and histograms, and /metrics' whole
// text. Only touched from the io_context thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/worker_pool.h"

namespace kvpr {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct DaemonMetrics {
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t prefix_cache_queries = 0;  // prompt tokens of finished engine requests
  uint64_t prefix_cache_hits = 0;     // of those, tokens found in a worker's prefix cache
  std::map<std::string, uint64_t> finished;  // by finish_reason (stop, length, cancelled, error)
  std::map<int, uint64_t> http_responses;    // by status code
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  Histogram e2e{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
};

// /metrics: the daemon's counters and histograms, HTTP requests being served and open
// connections, and every worker's gauges from its last stats message.
std::string render_prometheus(const DaemonMetrics& m, const std::vector<WorkerStatus>& workers, int64_t http_in_flight,
                              int64_t connections);

}  // namespace kvpr
