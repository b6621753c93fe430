// kvpr-bench ops [--preset P] [--batch B] [--ctx S] [--backend B] [--json FILE]
//     The device ops of one decode layer at the preset's shapes, each timed alone with events
//     (median of repeats): bytes and flops per call, GB/s and TFLOP/s, and GB/s as a fraction
//     of the device copy bandwidth measured in the same run (the memory-bound ceiling).
//     Batched against unbatched forms (one Q/K/V GEMM vs three, copy_rows vs a copy per
//     sequence) are timed side by side, launch overhead included, and so is one whole decode
//     layer issued op by op against the same layer replayed as a CUDA graph.
#include "bench/commands.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "bench/bench_common.h"
#include "bench/decode_bounds.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/demo_model.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/constrain/json_object.h"
#include "engine/constrain/json_schema.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"
#include "engine/kv/split_scheduler.h"
#include "engine/base/thread_pool.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

// The ops of one decode layer, each timed alone: its settings, the device copy rate the GB/s
// are compared with, and the rows of the report.
class OpsRun {
 public:
  explicit OpsRun(const std::vector<std::string>& args)
      : opt_(args, {"--preset", "--backend", "--batch", "--ctx", "--reps", "--probe-mib", "--json"}),
        preset_name_(opt_.get("--preset", "opt-6.7b")),
        c(preset(preset_name_)),
        batch_(opt_.get_int("--batch", 32)),
        ctx_(opt_.get_int("--ctx", 1024)),
        reps_(opt_.get_int("--reps", 10)),
        h(c.hidden_size), f(c.ffn_dim), V(c.vocab_size), B(batch_), S(ctx_) {
    KVPR_CHECK(batch_ > 0 && ctx_ > 0 && reps_ > 0, "batch, ctx and reps must be positive");
    be = bench_backend(opt_.get("--backend", "auto"));
  }

  int run() {
    std::fprintf(stderr, "kvpr-bench ops: %s shapes on %s, batch %d, context %d\n", preset_name_.c_str(),
                 be->name().c_str(), batch_, ctx_);
    const int64_t probe_mib = opt_.get_int("--probe-mib", be->device_is_host() ? 128 : 2048);
    KVPR_CHECK(probe_mib > 0, "--probe-mib must be positive");
    hbm_ = device_copy_gbps(*be, probe_mib << 20);
    x = rnd(DType::F32, {B, h}, 1, 1.f);
    projections();
    recompute();
    link_copies();
    attention_and_layer();
    write_json(opt_.get("--json", ""), json::Object{{"preset", preset_name_}, {"backend", be->name()}, {"batch", batch_},
                                                    {"ctx", ctx_}, {"device_copy_gbps", hbm_}, {"ops", std::move(rows_)}});
    return 0;
  }

 private:
  static constexpr DType wt = DType::F16, kv = DType::F16;
  static constexpr double es = 2.0;  // bytes per fp16 element

  Tensor rnd(DType dt, Shape shape, uint64_t seed, float sd) {
    Tensor t = be->alloc(dt, std::move(shape));
    be->fill_random(t, seed, 0.f, sd);
    return t;
  }

  // Median milliseconds of fn() between events on stream `on` (the compute stream unless said),
  // after a warm-up.
  double time_ms(const std::function<void()>& fn, Stream on = Stream::Compute) {
    fn();
    be->synchronize();
    std::vector<double> ms;
    for (int r = 0; r < reps_; ++r) {
      Event e0 = be->record(on);
      fn();
      Event e1 = be->record(on);
      be->synchronize();
      ms.push_back(be->elapsed_ms(e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  void report(const std::string& name, double ms, double bytes, double flops) {
    const double gbps = bytes / (ms / 1e3) / 1e9, tflops = flops / (ms / 1e3) / 1e12;
    std::printf("%-40s %9.4f ms %9.1f GB/s (%5.1f%% of copy) %8.2f TFLOP/s\n", name.c_str(), ms, gbps, 100.0 * gbps / hbm_,
                tflops);
    rows_.push_back(json::Object{{"op", name}, {"ms", ms}, {"bytes", bytes}, {"flops", flops}, {"gbps", gbps},
                                 {"of_device_copy", gbps / hbm_}, {"tflops", tflops}});
  }

  // Projections at decode shapes (M = batch): weight bytes dominate.
  void projections() {
    Tensor wqkv = rnd(wt, {3, h, h}, 2, 0.02f), bqkv = rnd(wt, {3, h}, 3, 0.02f);
    Tensor out3 = be->alloc(DType::F32, {3, B, h});
    const double bytes = 3.0 * h * h * es + B * h * 4.0 + 3.0 * B * h * 4.0, flops = 2.0 * 3 * B * h * h;
    report("qkv: one batched GEMM", time_ms([&] { be->linear_batched(out3, x, wqkv, bqkv, Activation::None); }), bytes,
           flops);
    report("qkv: three GEMMs", time_ms([&] {
             for (int64_t i = 0; i < 3; ++i)
               be->linear(out3.rows(i, 1).reshape({B, h}), x, wqkv.rows(i, 1).reshape({h, h}),
                          bqkv.rows(i, 1).reshape({h}), Activation::None);
           }),
           bytes, flops);
    Tensor fc1 = rnd(wt, {f, h}, 4, 0.02f), b1 = rnd(wt, {f}, 5, 0.02f), fc2 = rnd(wt, {h, f}, 6, 0.02f);
    Tensor mid = be->alloc(DType::F32, {B, f}), out = be->alloc(DType::F32, {B, h}), y2 = be->alloc(DType::F32, {B, h});
    report("fc1 + relu", time_ms([&] { be->linear(mid, x, fc1, b1, Activation::ReLU); }),
           f * h * es + B * (h + f) * 4.0, 2.0 * B * f * h);
    Tensor b2 = rnd(wt, {h}, 10, 0.02f);
    report("fc2 + residual: linear_accumulate", time_ms([&] { be->linear_accumulate(out, mid, fc2, b2); }),
           f * h * es + B * (2 * h + f) * 4.0, 2.0 * B * f * h);
    report("fc2 + residual: linear, add", time_ms([&] {
             be->linear(y2, mid, fc2, b2, Activation::None);
             be->add(out, out, y2);
           }),
           f * h * es + B * (4 * h + f) * 4.0, 2.0 * B * f * h);
    Tensor lm = rnd(wt, {V, h}, 7, 0.02f), logits = be->alloc(DType::F32, {B, V});
    report("lm_head", time_ms([&] { be->linear(logits, x, lm, Tensor(), Activation::None); }),
           V * h * es + B * (h + V) * 4.0, 2.0 * B * V * h);
    Tensor ids = be->alloc(DType::I32, {B}), stats = be->alloc(DType::F32, {B, 2});
    report("argmax_lse (greedy)", time_ms([&] { be->argmax_lse(ids, stats, logits, static_cast<int32_t>(V)); }),
           B * V * 4.0, 0);
    Tensor g = rnd(wt, {h}, 8, 1.f), bb = rnd(wt, {h}, 9, 0.1f), y = be->alloc(DType::F32, {B, h});
    report("layer_norm", time_ms([&] { be->layer_norm(y, x, g, bb, 1e-5f); }), 2.0 * B * h * 4.0, 0);
  }

  // KVPR recompute: K and V of l cached tokens from their stored fp16 X, as the runtime does it
  // (one GEMM, the bias in it, fp16 K/V out) and as it did before (X widened to fp32, an fp32
  // product, a bias pass, K/V converted to fp16). Bytes: the weights, X read, K/V written once.
  void recompute() {
  for (int64_t l : {int64_t{256}, S * B / 4, S * B}) {
    Tensor xl = rnd(kv, {l, h}, 10, 1.f), wkv = rnd(wt, {2, h, h}, 11, 0.02f), bkv = rnd(wt, {2, h}, 12, 0.02f);
    Tensor kvl = be->alloc(kv, {2, l, h}), x32 = be->alloc(DType::F32, {l, h}), kv32 = be->alloc(DType::F32, {2, l, h});
    const double bytes = 2.0 * h * h * es + l * h * es + 2.0 * l * h * es, flops = 4.0 * l * h * h;
    report("recompute K,V of " + std::to_string(l) + " rows: fused",
           time_ms([&] { be->linear_batched(kvl, xl, wkv, bkv, Activation::None); }), bytes, flops);
    report("recompute K,V of " + std::to_string(l) + " rows: via fp32", time_ms([&] {
             be->convert(x32, xl);
             be->linear_batched(kv32, x32, wkv, bkv, Activation::None);
             be->convert(kvl, kv32);
           }),
           bytes, flops);
  }
  }

  // A layer's K[l:S] for the batch over the link (l = S/4, pinned host store in consecutive
  // slots): one copy_spans (one 2-D copy) against one copy per sequence, and a ragged batch.
  void link_copies() {
    const int64_t cap = S + 64, l = S / 4;
    Tensor host = be->alloc_pinned(kv, {B * cap, h}), dev = be->alloc(kv, {B * (S + 1), h});
    std::vector<RowSpan> uniform, ragged;
    for (int64_t s = 0; s < B; ++s) {
      uniform.push_back(RowSpan{s * cap + l, s * (S + 1) + l, S - l});
      ragged.push_back(RowSpan{s * cap + l, s * (S + 1) + l, S - l - (s % 3) * 7});
    }
    double rbytes = 0;
    for (const RowSpan& r : ragged) rbytes += static_cast<double>(r.count) * h * es;
    const double ubytes = static_cast<double>(B) * (S - l) * h * es;
    report("K[l:S] H2D: copy_spans, uniform", time_ms([&] { be->copy_spans(dev, host, uniform, Stream::H2D); }, Stream::H2D),
           ubytes, 0);
    report("K[l:S] H2D: copy_spans, ragged", time_ms([&] { be->copy_spans(dev, host, ragged, Stream::H2D); }, Stream::H2D),
           rbytes, 0);
    report("K[l:S] H2D: copy per sequence", time_ms([&] {
             for (const RowSpan& r : uniform)
               be->copy(dev.rows(r.dst_row, r.count), host.rows(r.src_row, r.count), Stream::H2D);
           }, Stream::H2D),
           ubytes, 0);
  }

  // Decode attention over a resident cache (batch sequences of S tokens, fp16 K/V), the new K
  // rows into it, and a whole decode layer around it.
  void attention_and_layer() {
    Tensor q = rnd(DType::F32, {B, h}, 12, 1.f), out = be->alloc(DType::F32, {B, h});
    Tensor kc = rnd(kv, {B, S + 1, h}, 13, 1.f), vc = rnd(kv, {B, S + 1, h}, 14, 1.f);
    std::vector<AttentionSeq> seqs;
    for (int64_t s = 0; s < B; ++s)
      seqs.push_back(AttentionSeq{s, 1, S, kc.rows(s, 1).reshape({S + 1, h}), vc.rows(s, 1).reshape({S + 1, h})});
    const double scale = 1.0 / std::sqrt(static_cast<double>(h / c.num_heads));
    report("decode attention (ctx " + std::to_string(S) + ")",
           time_ms([&] { be->attention(out, q, seqs, static_cast<int>(c.num_heads), static_cast<float>(scale)); }),
           2.0 * B * (S + 1) * h * es + 2.0 * B * h * 4.0, 4.0 * B * (S + 1) * h);
    // The batch's new K rows into their caches: one copy_rows against one convert per sequence.
    Tensor cache = kc.reshape({B * (S + 1), h});
    std::vector<RowSpan> spans;
    for (int64_t s = 0; s < B; ++s) spans.push_back(RowSpan{s, s * (S + 1) + S, 1});
    report("new K rows: copy_rows", time_ms([&] { be->copy_rows(cache, x, spans); }), B * h * (4.0 + es), 0);
    report("new K rows: convert per sequence", time_ms([&] {
             for (const RowSpan& sp : spans) be->convert(cache.rows(sp.dst_row, 1), x.rows(sp.src_row, 1));
           }),
           B * h * (4.0 + es), 0);
    decode_layer(cache, vc.reshape({B * (S + 1), h}), seqs, scale);
  }

  // One resident decode layer's ops in order, issued op by op and replayed as a CUDA graph (the
  // same work): the difference is what launching costs per layer, host and device.
  void decode_layer(Tensor cache, Tensor vcache, const std::vector<AttentionSeq>& seqs, double scale) {
    Tensor out = be->alloc(DType::F32, {B, h});
    Tensor wqkv = rnd(wt, {3, h, h}, 20, 0.02f), bqkv = rnd(wt, {3, h}, 21, 0.02f), wo = rnd(wt, {h, h}, 22, 0.02f);
    Tensor bo = rnd(wt, {h}, 23, 0.02f), fc1 = rnd(wt, {f, h}, 24, 0.02f), b1 = rnd(wt, {f}, 25, 0.02f);
    Tensor fc2 = rnd(wt, {h, f}, 26, 0.02f), b2 = rnd(wt, {h}, 27, 0.02f), g = rnd(wt, {h}, 28, 1.f);
    Tensor bb = rnd(wt, {h}, 29, 0.1f), a = be->alloc(DType::F32, {B, h}), qkv = be->alloc(DType::F32, {3, B, h});
    Tensor mid = be->alloc(DType::F32, {B, f}), res = rnd(DType::F32, {B, h}, 30, 1.f);
    std::vector<RowSpan> kv_spans;
    for (int64_t s = 0; s < B; ++s) kv_spans.push_back(RowSpan{s, s * (S + 1) + S, 1});
    auto layer = [&] {
      be->layer_norm(a, res, g, bb, 1e-5f);
      be->linear_batched(qkv, a, wqkv, bqkv, Activation::None);
      be->copy_rows(cache, qkv.rows(1, 1).reshape({B, h}), kv_spans);
      be->copy_rows(vcache, qkv.rows(2, 1).reshape({B, h}), kv_spans);
      be->attention(out, qkv.rows(0, 1).reshape({B, h}), seqs, static_cast<int>(c.num_heads), static_cast<float>(scale));
      be->linear_accumulate(res, out, wo, bo);
      be->layer_norm(a, res, g, bb, 1e-5f);
      be->linear(mid, a, fc1, b1, Activation::ReLU);
      be->linear_accumulate(res, mid, fc2, b2);
    };
    const double layer_bytes = (4.0 * h * h + 2.0 * f * h) * es + 2.0 * B * (S + 1) * h * es;
    const double layer_flops = 2.0 * B * (4.0 * h * h + 2.0 * f * h) + 4.0 * B * (S + 1) * h;
    report("decode layer: op by op", time_ms(layer), layer_bytes, layer_flops);
    report("decode layer: CUDA graph", time_ms([&] {
             GraphStepScope graph(*be, true);  // eager, then captured, then replayed (the median)
             layer();
           }),
           layer_bytes, layer_flops);
  }

  const Options opt_;
  const std::string preset_name_;
  const OptConfig c;
  const int batch_, ctx_, reps_;
  const int64_t h, f, V, B, S;  // the shapes, named as in the byte and flop formulas
  std::unique_ptr<Backend> be;
  double hbm_ = 0;
  Tensor x;  // the layer input, [batch, hidden]
  json::Array rows_;
};

int cmd_ops(const std::vector<std::string>& args) { return OpsRun(args).run(); }

}  // namespace kvpr::bench
