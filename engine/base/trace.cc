#include "engine/base/trace.h"

#include <fstream>

#include "engine/base/error.h"

namespace kvpr {

Tracer::Tracer() : t0_(std::chrono::steady_clock::now()) {}

double Tracer::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

int Tracer::track_id(const std::string& track) {
  for (size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == track) return static_cast<int>(i) + 1;
  tracks_.push_back(track);
  return static_cast<int>(tracks_.size());
}

void Tracer::span(const std::string& track, const std::string& name, double start_us, double end_us,
                  json::Value args) {
  json::Value e(json::Object{});
  std::lock_guard<std::mutex> lock(mu_);
  e.set("name", name);
  e.set("ph", "X");
  e.set("pid", 1);
  e.set("tid", track_id(track));
  e.set("ts", start_us);
  e.set("dur", std::max(0.0, end_us - start_us));
  if (!args.is_null()) e.set("args", std::move(args));
  events_.push_back(std::move(e));
}

void Tracer::counter(const std::string& name, double at_us, const std::string& series, double value) {
  json::Value e(json::Object{});
  e.set("name", name);
  e.set("ph", "C");
  e.set("pid", 1);
  e.set("ts", at_us);
  json::Value args(json::Object{});
  args.set(series, value);
  e.set("args", std::move(args));
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

json::Value Tracer::to_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  json::Array all;
  json::Value proc(json::Object{});
  proc.set("name", "process_name");
  proc.set("ph", "M");
  proc.set("pid", 1);
  proc.set("args", json::Object{{"name", json::Value("kvpr worker")}});
  all.push_back(proc);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    json::Value m(json::Object{});
    m.set("name", "thread_name");
    m.set("ph", "M");
    m.set("pid", 1);
    m.set("tid", static_cast<int64_t>(i + 1));
    m.set("args", json::Object{{"name", json::Value(tracks_[i])}});
    all.push_back(m);
    json::Value order(json::Object{});
    order.set("name", "thread_sort_index");
    order.set("ph", "M");
    order.set("pid", 1);
    order.set("tid", static_cast<int64_t>(i + 1));
    order.set("args", json::Object{{"sort_index", json::Value(static_cast<int64_t>(i))}});
    all.push_back(order);
  }
  all.insert(all.end(), events_.begin(), events_.end());
  json::Value doc(json::Object{});
  doc.set("traceEvents", std::move(all));
  doc.set("displayTimeUnit", "ms");
  return doc;
}

void Tracer::write(const std::string& path) const {
  std::ofstream f(path, std::ios::trunc);
  KVPR_CHECK(f, path, ": cannot create");
  f << to_json().dump() << "\n";
  KVPR_CHECK(f.good(), path, ": write failed");
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

}  // namespace kvpr
