// Bounds on one decode step of every KV mode, two per mode (kvpr-bench decode reports both):
//
//   physical  what the hardware allows: bytes over the measured bandwidth of the memory or link
//             they cross (device memory read, H2D with nothing else on the link, host memory
//             read) and flops over the peak GEMM rate measured at those shapes; parts that
//             run one after the other are summed, parts that overlap are maxed. A measurement
//             under its physical bound means the bound is wrong.
//   model     what this code is expected to take, from the run's own profile: H2D measured with
//             D2H running (as while decoding), the recompute cost fitted to this code's K/V
//             projection (its conversions and bias passes included), and the measured resident
//             step as the device time.
//
// "x bound" in the reports is against the physical bound. Header-only: kvpr-bench is built
// twice (native and on the emulated device) and tests/bench/test_decode_bounds.cc checks the formulas
// on the inputs of the 2026-11-30 H200 run.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace kvpr::bench {

// One decode step's shape, per step and summed over layers where it says so.
struct DecodeShape {
  double layers = 0;              // L
  double cached_tokens = 0;       // S: tokens whose K/V a step reads, summed over the batch (mean over the run)
  double kv_bytes = 0;            // K+V bytes of one token in one layer (fewer heads with GQA)
  double x_bytes = 0;             // the layer input X of one token in one layer
  double recompute_flops = 0;     // recomputing one token's K and V in one layer: 2 GEMM rows of h x kv_hidden
  double weight_bytes = 0;        // all layers' weights, read once a step
  double streamed_weight_bytes = 0;  // --weights host: weight bytes crossing the link each step
  int gpu_batches = 1;            // cpu-attn: >= 2 lets host and device work overlap
  double device_tokens = 0;       // auto: of S, those whose K/V its device tier can hold (the budget's)
  // Per layer, the cached tokens a step reads there, summed over the batch: S for a full layer, at
  // most its window per sequence for a sliding one (Gemma 3's local layers). Empty: S in every
  // layer. A step moves, recomputes and reads only these.
  std::vector<double> layer_tokens;
  // Σ over layers of f(T_i), T_i the layer's tokens.
  template <typename F>
  double over_layers(F f) const {
    if (layer_tokens.empty()) return layers * f(cached_tokens);
    double sum = 0;
    for (double t : layer_tokens) sum += f(t);
    return sum;
  }
};

// What the run measured.
struct Measured {
  double device_gbps = 0;         // device memory traffic of a device-to-device copy (read + write bytes / s)
  double h2d_alone_gbps = 0;      // pinned H2D with nothing else on the link
  double h2d_gbps = 0;            // pinned H2D while D2H runs (the profile's: stores go back during decode)
  double host_gbps = 0;           // host memory traffic of a memcpy (read + write bytes / s)
  double gemm_tflops = 0;         // peak GEMM rate at the recompute shapes (0: unknown, recompute costs nothing)
  double recompute_fixed_s = 0;   // the profile's fit of this code's recompute: fixed + per row, per layer
  double recompute_per_row_s = 0;
  double resident_step_s = 0;     // the measured resident step (the model's device time)
};

struct Bound {
  double physical_s = 0, model_s = 0;
  double physical_split = 0, model_split = 0;  // kvpr: the l each bound's minimum takes (tokens)
};

namespace detail {
// The device's part of a step that keeps its KV in device memory: weights and KV read once.
inline double device_read_s(double bytes, const Measured& m) { return bytes / (m.device_gbps * 1e9); }
// kvpr: min over l in [0, S] (steps of 16 tokens, and S itself) of max(link(l), device(l)).
template <typename Link, typename Device>
inline void best_split(double S, Link link, Device device, double* best_s, double* best_l) {
  *best_s = 1e300;
  for (double l = 0;; l = std::min(S, l + 16)) {
    const double t = std::max(link(l), device(l));
    if (t < *best_s) *best_s = t, *best_l = l;
    if (l >= S) break;
  }
}
}  // namespace detail

// `mode`: resident, resident+graphs, offload, kvpr, recompute, cpu-attn or auto (the best
// allocation at its budget: s.device_tokens of the cached tokens read in place, kvpr's best split
// of the rest; kvpr is auto with no device tokens).
inline Bound decode_bound(const std::string& mode, const DecodeShape& s, const Measured& m) {
  using detail::device_read_s;
  const double S = s.cached_tokens;
  const double kv_all = s.over_layers([&](double t) { return t * s.kv_bytes; });
  const double x_all = s.over_layers([&](double t) { return t * s.x_bytes; });
  const double W = s.streamed_weight_bytes;
  const double v_phys = m.h2d_alone_gbps * 1e9, v_model = m.h2d_gbps * 1e9;
  // The device time of a step: physical, its weights and its K/V (however they got there) read
  // once by the layers and attention; model, the measured resident step.
  const double weights_s = device_read_s(s.weight_bytes, m);
  const double device_s = device_read_s(s.weight_bytes + kv_all, m);
  // Recomputing l tokens recomputes at most a layer's own tokens there (none below a window).
  auto recomputed = [&](double l) { return s.over_layers([&](double t) { return std::min(l, t); }); };
  auto recompute_phys = [&](double l) {
    return m.gemm_tflops > 0 ? recomputed(l) * s.recompute_flops / (m.gemm_tflops * 1e12) : 0;
  };
  auto recompute_model = [&](double l) {
    return s.over_layers([&](double t) {
      return std::min(l, t) > 0 ? m.recompute_fixed_s + m.recompute_per_row_s * std::min(l, t) : 0;
    });
  };
  Bound b;
  if (mode == "resident" || mode == "resident+graphs") {
    b.physical_s = std::max(W / v_phys, device_s);
    b.model_s = std::max(W / v_model, device_s);
  } else if (mode == "offload") {
    b.physical_s = std::max((W + kv_all) / v_phys, device_s);
    b.model_s = std::max((W + kv_all) / v_model, m.resident_step_s);
  } else if (mode == "kvpr" || mode == "auto") {
    // Staged tokens cross the link (as X for l of them, in each layer at most its own tokens);
    // the device reads every token's K/V.
    const double held = mode == "auto" ? std::min(S, s.device_tokens) : 0.0;
    const double staged = std::max(0.0, S - held);
    auto link_bytes = [&](double l) {
      return s.over_layers([&](double t) {
        const double st = std::max(0.0, t - std::min(t, held)), r = std::min(l, st);
        return r * s.x_bytes + (st - r) * s.kv_bytes;
      });
    };
    detail::best_split(
        staged, [&](double l) { return (W + link_bytes(l)) / v_phys; },
        [&](double l) { return device_s + recompute_phys(l); }, &b.physical_s, &b.physical_split);
    // This code recomputes a sequence's oldest l tokens in every layer: a sliding layer whose
    // window starts past them needs none of it (and skips it), else recomputes all l and copies
    // from l on.
    auto code_link_bytes = [&](double l) {
      return s.over_layers([&](double t) {
        const double lo = S - t;  // the window's start (0 for a full layer)
        return (l > lo ? l * s.x_bytes : 0.0) + std::max(0.0, S - std::max(l, lo) - held) * s.kv_bytes;
      });
    };
    auto code_recompute_s = [&](double l) {
      return s.over_layers([&](double t) {
        return l > S - t && l > 0 ? m.recompute_fixed_s + m.recompute_per_row_s * l : 0.0;
      });
    };
    detail::best_split(
        staged, [&](double l) { return (W + (s.layer_tokens.empty() ? link_bytes(l) : code_link_bytes(l))) / v_model; },
        [&](double l) { return m.resident_step_s + (s.layer_tokens.empty() ? recompute_model(l) : code_recompute_s(l)); },
        &b.model_s, &b.model_split);
  } else if (mode == "recompute") {
    b.physical_s = std::max((W + x_all) / v_phys, device_s + recompute_phys(S));
    b.model_s = std::max((W + x_all) / v_model, m.resident_step_s + recompute_model(S));
  } else if (mode == "cpu-attn") {
    // The host reads every K/V row once; the device runs the rest of the layer. One GPU batch:
    // each layer's attention waits for its projections and the next layer for it (a sum);
    // two or more: one batch's host attention beside another's device work (a max).
    const double host_s = kv_all / (m.host_gbps * 1e9);
    const double link_s = W / v_phys;
    b.physical_s = s.gpu_batches >= 2 ? std::max({link_s, host_s, weights_s}) : std::max(link_s, host_s + weights_s);
    b.model_s = s.gpu_batches >= 2 ? std::max({W / v_model, host_s, m.resident_step_s})
                                   : std::max(W / v_model, host_s + m.resident_step_s);
  }
  return b;
}

}  // namespace kvpr::bench
