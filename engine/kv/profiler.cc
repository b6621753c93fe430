#include "engine/kv/profiler.h"

#include <algorithm>
#include <cmath>

#include "engine/base/error.h"

namespace kvpr {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GB/s of `reps` copies host->device (or device->host), optionally with a copy in the other
// direction running at the same time.
double copy_gbps(Backend& be, const Tensor& host, const Tensor& dev, bool h2d, bool with_other_direction,
                 const Tensor& other_host, const Tensor& other_dev, int reps) {
  std::vector<double> ms;
  const Stream s = h2d ? Stream::H2D : Stream::D2H;
  for (int r = 0; r < reps + 1; ++r) {  // first one warms up
    if (with_other_direction) {
      // Keep the other direction busy for the whole timed copy.
      if (h2d) be.copy(other_host, other_dev, Stream::D2H, "profile D2H load");
      else be.copy(other_dev, other_host, Stream::H2D, "profile H2D load");
    }
    Event a = be.record(s);
    if (h2d) be.copy(dev, host, s, "profile H2D");
    else be.copy(host, dev, s, "profile D2H");
    Event b = be.record(s);
    be.synchronize();
    if (r > 0) ms.push_back(be.elapsed_ms(a, b));
  }
  double t = median(ms) / 1e3;
  return t > 0 ? static_cast<double>(host.nbytes()) / t / 1e9 : 0.0;
}

}  // namespace

LinkProfile profile_backend(Backend& be, KvProjector& projector, const KvShape& shape, DType dtype,
                            const ProfileOptions& opts) {
  LinkProfile p;
  p.device = be.name();
  p.hidden = shape.hidden;
  const int64_t n = std::max<int64_t>(opts.transfer_bytes / 4, 1024);
  Tensor host = be.alloc_pinned(DType::F32, {n}), dev = be.alloc(DType::F32, {n});
  Tensor host2 = be.alloc_pinned(DType::F32, {n}), dev2 = be.alloc(DType::F32, {n});
  p.h2d_alone_gbps = copy_gbps(be, host, dev, true, false, host2, dev2, opts.reps);
  p.h2d_gbps = copy_gbps(be, host, dev, true, true, host2, dev2, opts.reps);
  p.d2h_gbps = copy_gbps(be, host, dev, false, false, host2, dev2, opts.reps);
  KVPR_CHECK(p.h2d_gbps > 0, "profiler: could not time H2D copies");

  // Recompute at the shapes the runtime uses (StagedKv::attend, engine/kv/staged_kv.cc).
  json::Array points;
  std::vector<double> xs, ys;
  for (int64_t rows : opts.rows) {
    Tensor x = be.alloc(dtype, {rows, shape.hidden});
    // The runtime's recompute: stored X into the projection, K/V out in the dtype the model
    // projects them in for this store, then into the store's dtype.
    Tensor kv = be.alloc(projector.kv_dtype_for(dtype), {2, rows, shape.kv_hidden()});
    Tensor kp = kv.rows(0, 1).reshape({rows, shape.kv_hidden()});
    Tensor vp = kv.rows(1, 1).reshape({rows, shape.kv_hidden()});
    Tensor k = be.alloc(dtype, {rows, shape.kv_hidden()}), v = be.alloc(dtype, {rows, shape.kv_hidden()});
    Tensor pos;  // rotary models turn the recomputed K by each row's position
    if (projector.needs_positions()) {
      Tensor host_pos = Tensor::host(DType::I32, {rows});
      for (int64_t i = 0; i < rows; ++i) host_pos.data_as<int32_t>()[i] = static_cast<int32_t>(i);
      pos = be.alloc(DType::I32, {rows});
      be.copy(pos, host_pos, Stream::Compute);
    }
    std::vector<double> ms;
    for (int r = 0; r < opts.reps + 1; ++r) {
      Event a = be.record(Stream::Compute);
      projector.project_kv(0, x, kv, pos);
      be.convert(k, kp);
      be.convert(v, vp);
      Event b = be.record(Stream::Compute);
      be.synchronize();
      if (r > 0) ms.push_back(be.elapsed_ms(a, b));
    }
    double sec = median(ms) / 1e3;
    json::Value pt(json::Object{});
    pt.set("rows", rows);
    pt.set("seconds", sec);
    points.push_back(pt);
    xs.push_back(static_cast<double>(rows));
    ys.push_back(sec);
  }
  // Least-squares line through the points: seconds = c0 + c1 * rows.
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i) mx += xs[i], my += ys[i];
  mx /= xs.size();
  my /= ys.size();
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) sxy += (xs[i] - mx) * (ys[i] - my), sxx += (xs[i] - mx) * (xs[i] - mx);
  double c1 = sxx > 0 ? sxy / sxx : ys.back() / xs.back();
  c1 = std::max(c1, 1e-12);
  p.recompute_per_row_s = c1;
  p.recompute_fixed_s = std::max(0.0, my - c1 * mx);
  p.gemm_points = json::Value(std::move(points));
  return p;
}

}  // namespace kvpr
