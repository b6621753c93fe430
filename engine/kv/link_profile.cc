#include "engine/kv/link_profile.h"

#include <fstream>

#include "engine/base/error.h"

namespace kvpr {

json::Value LinkProfile::to_json() const {
  json::Value v(json::Object{});
  v.set("device", device);
  v.set("hidden", hidden);
  v.set("h2d_gbps", h2d_gbps);
  v.set("h2d_alone_gbps", h2d_alone_gbps);
  v.set("d2h_gbps", d2h_gbps);
  v.set("recompute_fixed_s", recompute_fixed_s);
  v.set("recompute_per_row_s", recompute_per_row_s);
  v.set("gemm_points", gemm_points.is_null() ? json::Value(json::Array{}) : gemm_points);
  return v;
}

LinkProfile LinkProfile::from_json(const json::Value& v) {
  LinkProfile p;
  auto num = [&](const char* k, double* out) {
    const json::Value* f = v.find(k);
    KVPR_CHECK(f && f->is_number(), "profile: missing number \"", k, "\"");
    *out = f->as_double();
  };
  num("h2d_gbps", &p.h2d_gbps);
  num("h2d_alone_gbps", &p.h2d_alone_gbps);
  num("d2h_gbps", &p.d2h_gbps);
  num("recompute_fixed_s", &p.recompute_fixed_s);
  num("recompute_per_row_s", &p.recompute_per_row_s);
  KVPR_CHECK(p.h2d_gbps > 0 && p.recompute_per_row_s >= 0 && p.recompute_fixed_s >= 0,
             "profile: bandwidth must be positive and costs non-negative");
  if (const json::Value* d = v.find("device"); d && d->is_string()) p.device = d->as_string();
  if (const json::Value* h = v.find("hidden"); h && h->is_int()) p.hidden = h->as_int();
  if (const json::Value* g = v.find("gemm_points")) p.gemm_points = *g;
  return p;
}

void LinkProfile::save(const std::string& path) const {
  std::ofstream f(path, std::ios::trunc);
  KVPR_CHECK(f, path, ": cannot create");
  f << to_json().dump() << "\n";
  KVPR_CHECK(f.good(), path, ": write failed");
}

LinkProfile LinkProfile::load(const std::string& path) {
  try {
    return from_json(json::parse_file(path));
  } catch (const Error& e) {
    std::string m = e.what();
    if (m.rfind(path, 0) == 0) throw;
    KVPR_THROW(path, ": ", m);
  }
}

}  // namespace kvpr
