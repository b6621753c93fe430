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

}  // namespace kvpr
