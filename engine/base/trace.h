// Chrome trace-event recording (opens in Perfetto and chrome://tracing): one track per
// stream, a complete event ("X") for every copy and kernel with its bytes or flops, and
// counter events for the scheduler's split. Thread-safe: copy engines record from their
// own threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/base/json.h"

namespace kvpr {

class Tracer {
 public:
  Tracer();
  // Microseconds since the tracer was created.
  double now_us() const;
  // A span on `track` ("compute", "h2d", "d2h", "host-attention", ...).
  void span(const std::string& track, const std::string& name, double start_us, double end_us,
            json::Value args = json::Value());
  // A counter sample (shown as a graph), e.g. the split l per layer.
  void counter(const std::string& name, double at_us, const std::string& series, double value);
  // Writes {"traceEvents": [...]} with one named thread per track.
  void write(const std::string& path) const;
  json::Value to_json() const;
  size_t size() const;

 private:
  int track_id(const std::string& track);  // caller holds mu_
  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;
  std::vector<json::Value> events_;
};

}  // namespace kvpr
