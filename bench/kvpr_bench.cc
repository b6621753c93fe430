// kvpr-bench: benchmarks (never timed tests).
//   kvpr-bench cpu [--json FILE] [--quick]
//     OPT-125m shapes with random weights: prefill and decode tokens/s of the CPU backend, and
//     the decode-attention kernel's bandwidth next to a memcpy measured in the same run.
//   kvpr-bench decode [--preset opt-6.7b|opt-13b|opt-1.3b|tiny|llama-2-7b|llama-2-13b|llama-2-70b|llama-3.1-8b|
//                      llama-tiny|qwen2.5-7b|qwen3-8b|qwen3-0.6b|qwen3-tiny]
//                     [--batch B] [--prompt P] [--gen N]
//                     [--modes resident,resident+graphs,offload,kvpr,recompute,cpu-attn] [--backend auto|cpu|cuda]
//                     [--kv-dtype f16] [--weights device|host] [--gpu-batches N] [--emulate-link-gbps G]
//                     [--host-attention-threads N]
//                     [--peer HF.json] [--json FILE] [--svg FILE] [--trace-dir DIR] [--max-positions N]
//     (--max-positions: the preset's position range, for contexts past OPT's 2048 positions.)
//     Every KV mode side by side in one run on one model with random weights generated on the
//     device: decode ms per step, tokens/s, split per step, bytes over the link per step, busy
//     fraction of the compute stream, and each mode's bound from the measured profile.
//     resident+graphs is resident with its decode steps replayed as CUDA graphs (GPU default).
//     --weights host streams the layers' weights from pinned host memory in every mode (no graphs).
//   kvpr-bench serve [--preset P] [--backend B] [--kv-mode M] [--conversations C] [--prompt P] [--answer A]
//                    [--new N] [--decoders D] [--long-prompt L] [--chunk K] [--json FILE]
//     Scheduling as a server sees it, on and off in one run: second turns of C conversations with
//     and without the prefix cache (time to first tokens, tokens prefilled), and D decoding
//     sequences when an L-token prompt arrives, prefilled whole or in chunks of K (their longest
//     gap between tokens, the prompt's time to first token).
//   kvpr-bench ops [--preset P] [--batch B] [--ctx S] [--backend B] [--json FILE]
//     The device ops of one decode layer at the preset's shapes, each timed alone with events
//     (median of repeats): bytes and flops per call, GB/s and TFLOP/s, and GB/s as a fraction
//     of the device copy bandwidth measured in the same run (the memory-bound ceiling).
//     Batched against unbatched forms (one Q/K/V GEMM vs three, copy_rows vs a copy per
//     sequence) are timed side by side, launch overhead included, and so is one whole decode
//     layer issued op by op against the same layer replayed as a CUDA graph.
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
#include "bench/scale.h"
#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/demo_model.h"
#include "engine/error.h"
#include "engine/generator.h"
#include "engine/json.h"
#include "engine/json_grammar.h"
#include "engine/json_schema.h"
#include "engine/llama_model.h"
#include "engine/opt_model.h"
#include "engine/profiler.h"
#include "engine/split_scheduler.h"
#include "engine/sampling.h"
#include "engine/thread_pool.h"
#include "engine/tokenizer.h"

namespace {

using namespace kvpr;
using namespace kvpr::bench;

json::Value bench_attention(CpuBackend& be, DType kv_dtype, int batch, int ctx, int heads, int head_dim, int reps) {
  const int hidden = heads * head_dim;
  Rng rng(1);
  std::vector<AttentionSeq> seqs;
  Tensor q = be.alloc(DType::F32, {batch, hidden});
  for (int64_t i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = static_cast<float>(rng.uniform() - 0.5);
  for (int b = 0; b < batch; ++b) {
    AttentionSeq s;
    s.q_begin = b;
    s.q_len = 1;
    s.past_len = ctx - 1;
    s.k = be.alloc(kv_dtype, {ctx, hidden});
    s.v = be.alloc(kv_dtype, {ctx, hidden});
    for (int64_t i = 0; i < s.k.numel(); ++i) {
      store_from_f32(s.k.data(), kv_dtype, i, static_cast<float>(rng.uniform() - 0.5));
      store_from_f32(s.v.data(), kv_dtype, i, static_cast<float>(rng.uniform() - 0.5));
    }
    seqs.push_back(s);
  }
  Tensor out = be.alloc(DType::F32, {batch, hidden});
  const double bytes = 2.0 * batch * ctx * hidden * dtype_size(kv_dtype);
  be.attention(out, q, seqs, heads, 0.125f);  // warm up
  double t_att = time_median(reps, [&] { be.attention(out, q, seqs, heads, 0.125f); });

  // memcpy of the same number of bytes, split across the same thread pool.
  std::vector<char> src(static_cast<size_t>(bytes)), dst(static_cast<size_t>(bytes));
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 0, dst.size());
  ThreadPool& pool = ThreadPool::global();
  auto copy = [&] {
    pool.parallel_for(static_cast<int64_t>(src.size()), 1 << 20, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(e - b));
    });
  };
  copy();
  double t_copy = time_median(reps, copy);
  json::Value r(json::Object{});
  r.set("kv_dtype", dtype_name(kv_dtype));
  r.set("batch", batch);
  r.set("context", ctx);
  r.set("heads", heads);
  r.set("head_dim", head_dim);
  r.set("kv_bytes", bytes);
  r.set("attention_ms", t_att * 1e3);
  r.set("attention_gbps", bytes / t_att / 1e9);
  r.set("memcpy_gbps", bytes / t_copy / 1e9);
  r.set("attention_over_memcpy", t_copy / t_att);
  return r;
}

json::Value bench_model(const std::string& dir, int batch, int prompt, int steps) {
  CpuBackend be;
  OptModel model(be, dir);
  const OptConfig& c = model.config();
  KvRuntimeOptions kvo;
  kvo.kv_dtype = model.weight_dtype();
  auto kv = model.make_kv_runtime(batch, prompt + steps, kvo);
  Rng rng(2);
  std::vector<std::vector<int32_t>> toks(batch);
  std::vector<ForwardChunk> chunks;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < prompt; ++i) toks[b].push_back(static_cast<int32_t>(rng.next() % 50000));
    chunks.push_back(ForwardChunk{toks[b].data(), prompt, 0, b});
  }
  Tensor logits = Tensor::host(DType::F32, {batch, c.vocab_size});
  auto t0 = Clock::now();
  model.forward(chunks, *kv, logits);
  double t_prefill = seconds_since(t0);
  std::vector<int32_t> next(batch);
  t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    std::vector<ForwardChunk> dec;
    for (int b = 0; b < batch; ++b) {
      const float* row = logits.data_as<float>() + static_cast<int64_t>(b) * c.vocab_size;
      next[b] = static_cast<int32_t>(std::max_element(row, row + 50257) - row);
      dec.push_back(ForwardChunk{&next[b], 1, prompt + s, b});
    }
    model.forward(dec, *kv, logits);
  }
  double t_decode = seconds_since(t0);
  json::Value r(json::Object{});
  r.set("batch", batch);
  r.set("prompt", prompt);
  r.set("decode_steps", steps);
  r.set("weight_dtype", dtype_name(model.weight_dtype()));
  r.set("weight_bytes", static_cast<int64_t>(model.weight_bytes()));
  r.set("prefill_s", t_prefill);
  r.set("prefill_tokens_per_s", batch * prompt / t_prefill);
  r.set("decode_ms_per_step", t_decode / steps * 1e3);
  r.set("decode_tokens_per_s", batch * steps / t_decode);
  // First-principles bound for decode on the CPU: every step streams all weights once.
  r.set("decode_weight_gbps", static_cast<double>(model.weight_bytes()) / (t_decode / steps) / 1e9);
  return r;
}

int cmd_cpu(const std::vector<std::string>& args) {
  std::string json_out;
  bool quick = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json" && i + 1 < args.size()) json_out = args[++i];
    else if (args[i] == "--quick") quick = true;
    else KVPR_THROW("unknown option '", args[i], "'");
  }
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "kvpr-bench-opt125m").string();
  if (!fs::exists(dir + "/model.safetensors")) {
    std::fprintf(stderr, "writing random OPT-125m-shaped weights to %s ...\n", dir.c_str());
    DemoModelSpec spec = default_demo_spec();
    spec.config = preset("opt-125m");
    write_demo_model(dir, spec, default_tokenizer_dir());
  }
  CpuBackend be;
  json::Value result(json::Object{});
  result.set("benchmark", "cpu");
  result.set("threads", ThreadPool::global().size());
  result.set("model", "OPT-125m shapes (h=768, 12 layers, 12 heads, ffn 3072, vocab 50272), random F16 weights");
  json::Array att;
  const int reps = quick ? 3 : 7;
  for (DType dt : {DType::F16, DType::F32}) {
    att.push_back(bench_attention(be, dt, 8, quick ? 1024 : 2048, 12, 64, reps));
    const json::Value& a = att.back();
    std::printf("decode attention %-4s  B=8 ctx=%lld  %7.2f ms  %6.2f GB/s  memcpy %6.2f GB/s  ratio %.2f\n",
                dtype_name(dt), static_cast<long long>(a.find("context")->as_int()),
                a.find("attention_ms")->as_double(), a.find("attention_gbps")->as_double(),
                a.find("memcpy_gbps")->as_double(), a.find("attention_over_memcpy")->as_double());
  }
  result.set("decode_attention", std::move(att));
  json::Array runs;
  for (int batch : {1, 8}) {
    runs.push_back(bench_model(dir, batch, quick ? 64 : 128, quick ? 8 : 32));
    const json::Value& r = runs.back();
    std::printf("OPT-125m B=%d prompt %lld: prefill %8.1f tok/s   decode %7.2f ms/step %8.1f tok/s (weights %.1f GB/s)\n",
                batch, static_cast<long long>(r.find("prompt")->as_int()), r.find("prefill_tokens_per_s")->as_double(),
                r.find("decode_ms_per_step")->as_double(), r.find("decode_tokens_per_s")->as_double(),
                r.find("decode_weight_gbps")->as_double());
  }
  result.set("model_runs", std::move(runs));
  write_json(json_out, result);
  return 0;
}

// ------------------------------------------------------------------ decode


// ------------------------------------------------------------------ ops

int cmd_ops(const std::vector<std::string>& args) {
  const Options opt(args, {"--preset", "--backend", "--batch", "--ctx", "--reps", "--probe-mib", "--json"});
  const std::string preset_name = opt.get("--preset", "opt-6.7b"), backend_name = opt.get("--backend", "auto");
  const std::string json_out = opt.get("--json", "");
  const int batch = opt.get_int("--batch", 32), ctx = opt.get_int("--ctx", 1024), reps = opt.get_int("--reps", 10);
  KVPR_CHECK(batch > 0 && ctx > 0 && reps > 0, "batch, ctx and reps must be positive");
  const OptConfig c = preset(preset_name);
  const int64_t h = c.hidden_size, f = c.ffn_dim, V = c.vocab_size, B = batch, S = ctx;
  auto be = create_backend(backend_name);
  std::fprintf(stderr, "kvpr-bench ops: %s shapes on %s, batch %d, context %d\n", preset_name.c_str(),
               be->name().c_str(), batch, ctx);
  const int64_t probe_mib = opt.get_int("--probe-mib", be->device_is_host() ? 128 : 2048);
  KVPR_CHECK(probe_mib > 0, "--probe-mib must be positive");
  const double hbm = device_copy_gbps(*be, probe_mib << 20);
  const DType wt = DType::F16, kv = DType::F16;
  const double es = 2.0;  // bytes per fp16 element

  auto rnd = [&](DType dt, Shape shape, uint64_t seed, float sd) {
    Tensor t = be->alloc(dt, std::move(shape));
    be->fill_random(t, seed, 0.f, sd);
    return t;
  };
  // Median milliseconds of fn() between events on stream `on` (the compute stream unless
  // said), after a warm-up.
  auto time_ms = [&](const std::function<void()>& fn, Stream on = Stream::Compute) {
    fn();
    be->synchronize();
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      Event e0 = be->record(on);
      fn();
      Event e1 = be->record(on);
      be->synchronize();
      ms.push_back(be->elapsed_ms(e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  json::Array rows;
  auto report = [&](const std::string& name, double ms, double bytes, double flops) {
    json::Value o(json::Object{});
    o.set("op", name);
    o.set("ms", ms);
    o.set("bytes", bytes);
    o.set("flops", flops);
    const double gbps = bytes / (ms / 1e3) / 1e9;
    o.set("gbps", gbps);
    o.set("of_device_copy", gbps / hbm);
    o.set("tflops", flops / (ms / 1e3) / 1e12);
    std::printf("%-40s %9.4f ms %9.1f GB/s (%5.1f%% of copy) %8.2f TFLOP/s\n", name.c_str(), ms, gbps,
                100.0 * gbps / hbm, flops / (ms / 1e3) / 1e12);
    rows.push_back(std::move(o));
  };

  Tensor x = rnd(DType::F32, {B, h}, 1, 1.f);
  // Projections at decode shapes (M = batch): weight bytes dominate.
  {
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
  // A layer's K[l:S] for the batch over the link (l = S/4, pinned host store in consecutive
  // slots): one copy_spans (one 2-D copy) against one copy per sequence, and a ragged batch.
  {
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
  // Decode attention over a resident cache: batch sequences of S tokens, fp16 K/V.
  {
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
    // One resident decode layer's ops in order, issued op by op and replayed as a CUDA graph
    // (the same work): the difference is what launching costs per layer, host and device.
    Tensor wqkv = rnd(wt, {3, h, h}, 20, 0.02f), bqkv = rnd(wt, {3, h}, 21, 0.02f), wo = rnd(wt, {h, h}, 22, 0.02f);
    Tensor bo = rnd(wt, {h}, 23, 0.02f), fc1 = rnd(wt, {f, h}, 24, 0.02f), b1 = rnd(wt, {f}, 25, 0.02f);
    Tensor fc2 = rnd(wt, {h, f}, 26, 0.02f), b2 = rnd(wt, {h}, 27, 0.02f), g = rnd(wt, {h}, 28, 1.f);
    Tensor bb = rnd(wt, {h}, 29, 0.1f), a = be->alloc(DType::F32, {B, h}), qkv = be->alloc(DType::F32, {3, B, h});
    Tensor mid = be->alloc(DType::F32, {B, f}), res = rnd(DType::F32, {B, h}, 30, 1.f);
    std::vector<RowSpan> kv_spans;
    for (int64_t s = 0; s < B; ++s) kv_spans.push_back(RowSpan{s, s * (S + 1) + S, 1});
    Tensor vcache = vc.reshape({B * (S + 1), h});
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
  json::Value result(json::Object{});
  result.set("preset", preset_name);
  result.set("backend", be->name());
  result.set("batch", batch);
  result.set("ctx", ctx);
  result.set("device_copy_gbps", hbm);
  result.set("ops", std::move(rows));
  write_json(json_out, result);
  return 0;
}

struct ModeResult {
  json::Value json;
  std::vector<std::vector<int32_t>> tokens;
  double ms_per_step = 0;
};

ModeResult run_mode(Backend& be, Model& model, KvMode mode, bool graphs, const KvRuntimeOptions& base, int batch,
                    int prompt, int gen, const std::string& trace_path) {
  KvRuntimeOptions o = base;
  o.mode = mode;
  auto kv = model.make_kv_runtime(batch, prompt + gen + 2, o);
  GreedyDecode dec(be, model, *kv, batch, prompt);
  const double prefill_s = dec.prefill();
  // Host time to issue a step's work: when it approaches the step time, the step is bound by
  // launches on the host, not by the device (the case for graphs).
  std::vector<double> issue_ms;
  std::vector<GraphOutcome> outcomes;
  std::string capture_error;  // why CUDA refused to capture a step, if it did
  auto step = [&] {
    const GreedyDecode::Step st = dec.step(graphs);
    outcomes.push_back(st.graph.outcome);
    if (capture_error.empty()) capture_error = st.graph.capture_error;
    issue_ms.push_back(st.issue_ms);
  };
  json::Array steps;
  std::vector<double> ms;
  double h2d = 0, d2h = 0;
  for (int s = 0; s < gen; ++s) {
    auto t0 = Clock::now();
    step();
    ms.push_back(seconds_since(t0) * 1e3);
    const StepStats& st = kv->last_step();
    json::Value o2(json::Object{});
    o2.set("ms", ms.back());
    o2.set("host_issue_ms", issue_ms.back());
    if (graphs) o2.set("graph", graph_outcome_name(outcomes.back()));
    o2.set("split", st.split_total);
    o2.set("split_source", st.split_source);
    o2.set("h2d_bytes", st.h2d_bytes);
    o2.set("d2h_bytes", st.d2h_bytes);
    steps.push_back(o2);
    h2d += static_cast<double>(st.h2d_bytes);
    d2h += static_cast<double>(st.d2h_bytes);
  }
  // Two more steps with the tracer on: the trace file and the compute stream's busy fraction.
  Tracer tracer;
  be.synchronize();
  be.set_tracer(&tracer);
  double t_start = tracer.now_us();
  step();
  step();
  be.synchronize();
  double t_end = tracer.now_us();
  be.set_tracer(nullptr);
  double busy_us = 0;
  int64_t compute_ops = 0;
  json::Value doc = tracer.to_json();
  std::string compute_tid;
  for (const auto& e : doc.find("traceEvents")->as_array())
    if (e.find("name")->as_string() == "thread_name" && e.find("args")->find("name")->as_string() == "compute")
      compute_tid = std::to_string(e.find("tid")->as_int());
  for (const auto& e : doc.find("traceEvents")->as_array())
    if (e.find("ph")->as_string() == "X" && std::to_string(e.find("tid")->as_int()) == compute_tid) {
      busy_us += e.find("dur")->as_double();
      ++compute_ops;
    }
  if (!trace_path.empty()) tracer.write(trace_path);

  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : ms) mean += v;
  mean /= std::max<size_t>(1, ms.size());
  ModeResult r;
  r.ms_per_step = sorted[sorted.size() / 2];
  r.tokens = dec.tokens();
  json::Value j(json::Object{});
  j.set("mode", std::string(kv_mode_name(mode)) + (graphs ? "+graphs" : ""));
  j.set("cuda_graphs", graphs);
  if (graphs) {
    j.set("graph_replayed_steps",
          static_cast<int64_t>(std::count(outcomes.begin(), outcomes.begin() + gen, GraphOutcome::Replayed)));
    if (!capture_error.empty()) j.set("graph_capture_error", capture_error);
  }
  j.set("prefill_s", prefill_s);
  j.set("decode_ms_per_step_median", r.ms_per_step);
  j.set("decode_ms_per_step_mean", mean);
  j.set("decode_tokens_per_s", batch / (r.ms_per_step / 1e3));
  j.set("h2d_bytes_per_step", h2d / gen);
  j.set("d2h_bytes_per_step", d2h / gen);
  j.set("compute_busy_fraction", std::min(1.0, busy_us / std::max(1.0, t_end - t_start)));
  std::vector<double> issue_sorted(issue_ms.begin(), issue_ms.begin() + gen);  // the untraced steps
  std::sort(issue_sorted.begin(), issue_sorted.end());
  j.set("host_issue_ms_per_step_median", issue_sorted[issue_sorted.size() / 2]);
  j.set("compute_ops_per_step", static_cast<double>(compute_ops) / 2.0);  // ops and copies on the compute stream
  j.set("host_bytes_per_token", kv->host_bytes_per_token());
  j.set("steps", std::move(steps));
  if (!trace_path.empty()) j.set("trace", trace_path);
  r.json = std::move(j);
  return r;
}

std::string svg_chart(const json::Value& result) {
  // Horizontal bars: decode ms/step per mode (and the peer), with the bound as a tick.
  struct Bar {
    std::string label;
    double ms, bound;
  };
  std::vector<Bar> bars;
  for (const auto& m : result.find("modes")->as_array())
    bars.push_back({m.find("mode")->as_string(), m.find("decode_ms_per_step_median")->as_double(),
                    m.find("bound_ms") ? m.find("bound_ms")->as_double() : 0});
  if (const json::Value* p = result.find("peer"); p && p->find("decode_ms_per_step"))
    bars.push_back({"HF offloaded", p->find("decode_ms_per_step")->as_double(), 0});
  double mx = 1e-9;
  for (const auto& b : bars) mx = std::max({mx, b.ms, b.bound});
  const int W = 760, left = 130, bar_h = 26, top = 50;
  const int H = top + static_cast<int>(bars.size()) * (bar_h + 12) + 40;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"13\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = "decode ms/step (lower is better): " + result.find("title")->as_string();
  std::string esc;
  for (char ch : title) esc += ch == '&' ? std::string("&amp;") : ch == '<' ? std::string("&lt;") : std::string(1, ch);
  o << "<text x=\"10\" y=\"24\" font-size=\"15\">" << esc << "</text>\n";
  const double scale = (W - left - 90) / mx;
  for (size_t i = 0; i < bars.size(); ++i) {
    int y = top + static_cast<int>(i) * (bar_h + 12);
    int w = std::max(1, static_cast<int>(bars[i].ms * scale));
    o << "<text x=\"10\" y=\"" << y + 18 << "\">" << bars[i].label << "</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar_h
      << "\" fill=\"" << (bars[i].label == "kvpr" ? "#d9534f" : "#5b8def") << "\"/>\n";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f ms", bars[i].ms);
    o << "<text x=\"" << left + w + 6 << "\" y=\"" << y + 18 << "\">" << buf << "</text>\n";
    if (bars[i].bound > 0) {
      int bx = left + static_cast<int>(bars[i].bound * scale);
      o << "<line x1=\"" << bx << "\" y1=\"" << y - 3 << "\" x2=\"" << bx << "\" y2=\"" << y + bar_h + 3
        << "\" stroke=\"black\" stroke-width=\"2\"/>\n";
    }
  }
  o << "<text x=\"10\" y=\"" << H - 12 << "\" font-size=\"11\">black tick: physical bound (bytes over the measured "
       "bandwidths, flops over the measured GEMM rate; bench/decode_bounds.h)</text>\n</svg>\n";
  return o.str();
}

int cmd_decode(const std::vector<std::string>& args) {
  const Options opt(args, {"--preset", "--backend", "--batch", "--prompt", "--gen", "--modes", "--kv-dtype",
                         "--emulate-link-gbps", "--weights", "--gpu-batches", "--host-attention-threads", "--peer", "--probe-mib", "--json", "--svg",
                         "--trace-dir", "--max-positions"});
  const std::string preset_name = opt.get("--preset", "opt-6.7b"), backend_name = opt.get("--backend", "auto");
  const std::string json_out = opt.get("--json", ""), svg_out = opt.get("--svg", ""), trace_dir = opt.get("--trace-dir", "");
  const std::string peer_file = opt.get("--peer", "");
  const std::string kv_dtype_name = opt.get("--kv-dtype", "f16");
  const int batch = opt.get_int("--batch", 32), prompt = opt.get_int("--prompt", 1024), gen = opt.get_int("--gen", 32);
  const int host_threads = opt.get_int("--host-attention-threads", 0);
  const double link = opt.get_double("--emulate-link-gbps", 0);
  const std::string weights = opt.get("--weights", "device");
  KVPR_CHECK(weights == "device" || weights == "host", "--weights: expected device or host");
  const bool stream_weights = weights == "host";
  KVPR_CHECK(batch > 0 && prompt > 0 && gen > 1, "batch and prompt must be positive and gen at least 2");
  DType kv_dtype;
  KVPR_CHECK(parse_dtype(kv_dtype_name, &kv_dtype), "bad --kv-dtype");
  auto be = create_backend(backend_name);
  // resident+graphs: resident with decode steps as CUDA graphs; by default on a GPU only.
  const std::string modes_arg =
      opt.get("--modes", be->device_is_host() || stream_weights ? "resident,offload,kvpr,recompute,cpu-attn"
                                                                : "resident,resident+graphs,offload,kvpr,recompute,cpu-attn");
  struct Variant {
    KvMode mode;
    bool graphs;
  };
  std::vector<Variant> modes;
  for (size_t p = 0; p <= modes_arg.size();) {
    size_t q = modes_arg.find(',', p);
    if (q == std::string::npos) q = modes_arg.size();
    std::string name = modes_arg.substr(p, q - p);
    const bool graphs = name == "resident+graphs";
    if (graphs) name = "resident";
    KVPR_CHECK(!(graphs && stream_weights), "resident+graphs does not apply to --weights host");
    KvMode m;
    KVPR_CHECK(parse_kv_mode(name, &m), "unknown mode '", modes_arg.substr(p, q - p), "'");
    modes.push_back({m, graphs});
    p = q + 1;
  }
  if (link > 0) {
    auto* cpu = dynamic_cast<CpuBackend*>(be.get());
    KVPR_CHECK(cpu, "--emulate-link-gbps is for the cpu backend");
    cpu->set_emulated_link_gbps(link);
  }
  std::fprintf(stderr, "kvpr-bench decode: %s on %s, batch %d, prompt %d, %d new tokens, weights on the %s\n",
               preset_name.c_str(), be->name().c_str(), batch, prompt, gen, weights.c_str());
  auto t_init = Clock::now();
  const int max_positions = opt.get_int("--max-positions", 0);
  KVPR_CHECK(max_positions >= 0, "--max-positions must not be negative");
  std::unique_ptr<Model> model_owned = preset_model(*be, preset_name, stream_weights, max_positions);
  Model& model = *model_owned;
  double init_s = seconds_since(t_init);

  // The profile the scheduler uses, measured on this machine now.
  ProfileOptions po;
  // Bandwidth probes: big enough to reach the link's and the memory's plateau.
  const int64_t probe_mib = opt.get_int("--probe-mib", be->device_is_host() ? 128 : 2048);
  KVPR_CHECK(probe_mib > 0, "--probe-mib must be positive");
  po.transfer_bytes = std::max<int64_t>(1, probe_mib / (be->device_is_host() ? 2 : 8)) << 20;
  LinkProfile prof = profile_backend(*be, model, model.kv_shape(), kv_dtype, po);
  const double hbm = device_copy_gbps(*be, probe_mib << 20);
  const double host_bw = host_copy_gbps(256ll << 20);
  const int64_t gemm_rows = std::min<int64_t>(4096, static_cast<int64_t>(batch) * prompt);
  const double gemm_tflops = recompute_gemm_tflops(*be, model.spec().hidden_size, model.spec().kv_hidden(), gemm_rows,
                                                   model.weight_dtype());
  std::fprintf(stderr, "profile: H2D %.2f GB/s (alone %.2f), D2H %.2f GB/s, recompute %.2f us + %.4f us/token; "
               "device copy %.1f GB/s, host copy %.1f GB/s, recompute GEMM %.1f TFLOP/s at %lld rows\n", prof.h2d_gbps,
               prof.h2d_alone_gbps, prof.d2h_gbps, prof.recompute_fixed_s * 1e6, prof.recompute_per_row_s * 1e6, hbm,
               host_bw, gemm_tflops, static_cast<long long>(gemm_rows));

  KvRuntimeOptions base;
  base.kv_dtype = kv_dtype;
  base.profile = prof;
  base.host_attention_threads = host_threads;
  base.adapt = true;
  base.gpu_batches = opt.get_int("--gpu-batches", 1);
  KVPR_CHECK(base.gpu_batches >= 1 && base.gpu_batches <= batch, "--gpu-batches must be in 1..batch");

  json::Value result(json::Object{});
  char title[160];
  std::snprintf(title, sizeof title, "%s, batch %d, prompt %d, %d tokens, %s%s", preset_name.c_str(), batch, prompt,
                gen, be->name().c_str(), stream_weights ? ", weights streamed from host" : "");
  result.set("title", title);
  result.set("benchmark", "decode");
  result.set("device", be->name());
  result.set("preset", preset_name);
  result.set("batch", batch);
  result.set("prompt", prompt);
  result.set("gen", gen);
  result.set("kv_dtype", dtype_name(kv_dtype));
  result.set("weight_bytes", static_cast<int64_t>(model.weight_bytes()));
  result.set("weights", weights);
  result.set("gpu_batches", base.gpu_batches);
  const double streamed_bytes = stream_weights ? static_cast<double>(model.weight_stream()->host_bytes()) : 0;
  result.set("streamed_weight_bytes", streamed_bytes);
  result.set("device_weight_bytes", static_cast<int64_t>(model.device_weight_bytes()));
  result.set("model_init_s", init_s);
  result.set("profile", prof.to_json());
  result.set("device_copy_gbps", hbm);
  result.set("host_copy_gbps", host_bw);
  result.set("recompute_gemm_tflops", gemm_tflops);

  json::Array out_modes;
  std::vector<std::vector<int32_t>> ref_tokens;
  double resident_ms = -1, resident_busy_ms = -1;
  std::map<std::string, double> ms_of;
  for (const auto [m, graphs] : modes) {
    const std::string name = std::string(kv_mode_name(m)) + (graphs ? "+graphs" : "");
    std::string trace = trace_dir.empty() ? "" : trace_dir + "/trace-" + name + ".json";
    std::fprintf(stderr, "  %-15s ...", name.c_str());
    ModeResult r = run_mode(*be, model, m, graphs, base, batch, prompt, gen, trace);
    std::fprintf(stderr, " %8.2f ms/step\n", r.ms_per_step);
    if (m == KvMode::Resident && (resident_ms < 0 || r.ms_per_step < resident_ms)) {
      resident_ms = r.ms_per_step;
      resident_busy_ms = r.ms_per_step * r.json.find("compute_busy_fraction")->as_double();
    }
    if (ref_tokens.empty()) ref_tokens = r.tokens;
    int64_t same = 0, total = 0;
    for (size_t b = 0; b < r.tokens.size(); ++b)
      for (size_t t = prompt; t < r.tokens[b].size() && t < ref_tokens[b].size(); ++t, ++total)
        same += r.tokens[b][t] == ref_tokens[b][t];
    r.json.set("tokens_equal_to_first_mode", total ? static_cast<double>(same) / total : 1.0);
    ms_of[name] = r.ms_per_step;
    out_modes.push_back(std::move(r.json));
  }

  // Two bounds per mode (bench/decode_bounds.h): physical, from the measured bandwidths and GEMM
  // rate, and the model's, from this code's profile and the measured resident step (with
  // streamed weights the resident step waits for them, so its compute stream's busy time).
  const ModelSpec& c = model.spec();
  const double es = static_cast<double>(dtype_size(kv_dtype));
  bench::DecodeShape shape;
  shape.layers = static_cast<double>(c.num_layers);
  shape.cached_tokens = static_cast<double>(batch) * (prompt + gen / 2.0);  // mean cached tokens per layer
  shape.kv_bytes = 2.0 * c.kv_hidden() * es;  // K+V: fewer heads with GQA
  shape.x_bytes = c.hidden_size * es;
  shape.recompute_flops = 4.0 * c.hidden_size * c.kv_hidden();
  shape.weight_bytes = static_cast<double>(model.weight_bytes());
  shape.streamed_weight_bytes = streamed_bytes;
  shape.gpu_batches = base.gpu_batches;
  bench::Measured measured;
  measured.device_gbps = hbm;
  measured.h2d_alone_gbps = prof.h2d_alone_gbps;
  measured.h2d_gbps = prof.h2d_gbps;
  measured.host_gbps = host_bw;
  measured.gemm_tflops = gemm_tflops;
  measured.recompute_fixed_s = prof.recompute_fixed_s;
  measured.recompute_per_row_s = prof.recompute_per_row_s;
  const double dev_ms = stream_weights ? resident_busy_ms : resident_ms;
  measured.resident_step_s = dev_ms > 0 ? dev_ms / 1e3 : 0;
  for (auto& mj : out_modes) {
    const bench::Bound b = bench::decode_bound(mj.find("mode")->as_string(), shape, measured);
    const double ms = mj.find("decode_ms_per_step_median")->as_double();
    mj.set("bound_ms", b.physical_s * 1e3);  // physical
    mj.set("model_bound_ms", b.model_s * 1e3);
    mj.set("over_bound", ms / (b.physical_s * 1e3));
    mj.set("over_model_bound", ms / (b.model_s * 1e3));
  }
  const bench::Bound kvpr_bound = bench::decode_bound("kvpr", shape, measured);
  result.set("kvpr_best_split_from_profile", kvpr_bound.model_split);
  result.set("kvpr_best_split_physical", kvpr_bound.physical_split);
  result.set("modes", std::move(out_modes));
  json::Value ratios(json::Object{});
  if (ms_of.count("kvpr") && ms_of.count("offload")) ratios.set("kvpr_speedup_over_offload", ms_of["offload"] / ms_of["kvpr"]);
  if (ms_of.count("kvpr") && ms_of.count("cpu-attn")) ratios.set("kvpr_speedup_over_cpu_attn", ms_of["cpu-attn"] / ms_of["kvpr"]);
  if (ms_of.count("resident") && ms_of.count("resident+graphs"))
    ratios.set("resident_graphs_speedup", ms_of["resident"] / ms_of["resident+graphs"]);
  if (!peer_file.empty()) {
    json::Value peer = json::parse_file(peer_file);
    result.set("peer", peer);
    if (const json::Value* p = peer.find("decode_ms_per_step"); p && ms_of.count("kvpr"))
      ratios.set("kvpr_speedup_over_hf_offloaded", p->as_double() / ms_of["kvpr"]);
  }
  result.set("ratios", std::move(ratios));

  // The table, printed last.
  std::printf("\n%-15s %12s %12s %10s %12s %8s %10s %10s %10s %8s\n", "mode", "ms/step", "tokens/s", "split",
              "H2D MB/step", "busy", "x bound", "x model", "issue ms", "ops");
  for (const auto& mj : result.find("modes")->as_array()) {
    const auto& steps = mj.find("steps")->as_array();
    std::printf("%-15s %12.2f %12.1f %10lld %12.1f %8.2f %10.2f %10.2f %10.2f %8.0f\n", mj.find("mode")->as_string().c_str(),
                mj.find("decode_ms_per_step_median")->as_double(), mj.find("decode_tokens_per_s")->as_double(),
                static_cast<long long>(steps.back().find("split")->as_int()),
                mj.find("h2d_bytes_per_step")->as_double() / 1e6, mj.find("compute_busy_fraction")->as_double(),
                mj.find("over_bound")->as_double(), mj.find("over_model_bound")->as_double(),
                mj.find("host_issue_ms_per_step_median")->as_double(), mj.find("compute_ops_per_step")->as_double());
  }
  for (const auto& [k, val] : result.find("ratios")->as_object()) std::printf("%s: %.2f\n", k.c_str(), val.as_double());
  write_json(json_out, result);
  if (!svg_out.empty()) {
    std::ofstream o(svg_out);
    o << svg_chart(result);
  }
  return 0;
}

// Constrained decoding's host cost: the time to mask one logits row (every id of a tokenizer's
// vocabulary checked against the JSON recognizer or a schema's) in the states a generation
// passes through, computed afresh (a state not seen before) and from the per-state cache; next
// to a floor, one pass reading every token's bytes (no check can cost less per row).
int cmd_json(const std::vector<std::string>& args) {
  Options o(args, {"--tokenizer", "--json", "--reps"});
  const std::string dir = o.get("--tokenizer", default_tokenizer_dir());
  const int reps = o.get_int("--reps", 5);
  const Tokenizer tok = Tokenizer::load(dir);
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>();
  for (int32_t t = 0; t < tok.size(); ++t) vocab->push_back(tok.token_bytes(t, true));
  const int32_t V = tok.size();
  size_t total_bytes = 0;
  for (const auto& b : *vocab) total_bytes += b.size();
  volatile uint64_t sink = 0;
  const double floor_s = time_median(reps, [&] {
    uint64_t h = 0;
    for (const auto& b : *vocab)
      for (char c : b) h = h * 31 + static_cast<uint8_t>(c);
    sink = h;
  });
  auto person = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(R"({
    "type": "object", "additionalProperties": false, "required": ["name", "age", "email", "tags", "role"],
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200},
                   "age": {"type": "integer"}, "email": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                   "role": {"enum": ["admin", "user", "guest"]}}})")));
  auto pattern_schema = [](const char* s) { return std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(s))); };
  auto when = pattern_schema(R"({"type": "string", "format": "date-time"})");
  auto words = pattern_schema(R"({"type": "string", "pattern": "^[a-z ]+$"})");
  struct Case {
    const char* name;
    std::shared_ptr<const JsonSchema> schema;  // null: json_object
    std::string prefix;                        // text generated before the masked row
  };
  const std::vector<Case> cases = {
      {"json_object: first token", nullptr, ""},
      {"json_object: inside a string", nullptr, "{\"note\": \"the quick brown"},
      {"json_object: after a value", nullptr, "{\"a\": [1, 2"},
      {"schema: first token", person, ""},
      {"schema: a closed object's key", person, "{\"name\": \"Ann\", \""},
      {"schema: inside a bounded string", person, "{\"name\": \"Ann Lee"},
      {"schema: inside an anyOf string", person, "{\"name\": \"A\", \"age\": 3, \"email\": \"a@b"},
      {"schema: inside a date-time", when, "\"2024-07-0"},
      {"schema: inside a pattern's free text", words, "\"hello wor"},
  };
  std::vector<std::vector<int32_t>> prefix_ids;
  json::Array rows;
  std::printf("%-36s %10s %10s %8s %10s\n", "state", "fresh ms", "cached ms", "allowed", "x floor");
  for (const auto& c : cases) {
    const std::vector<int32_t> ids = tok.encode(c.prefix);
    auto make = [&] {
      auto k = c.schema ? std::make_unique<JsonTokenConstraint>(vocab, c.schema) : std::make_unique<JsonTokenConstraint>(vocab);
      for (int32_t id : ids) k->advance(id);
      return k;
    };
    std::vector<float> row(static_cast<size_t>(V), 0.f);
    int64_t allowed = 0;
    std::vector<double> fresh;
    for (int r = 0; r < reps; ++r) {
      auto k = make();
      std::fill(row.begin(), row.end(), 0.f);
      const auto t0 = Clock::now();
      allowed = k->mask(row.data(), V, {});
      fresh.push_back(seconds_since(t0));
    }
    std::sort(fresh.begin(), fresh.end());
    auto k = make();
    k->mask(row.data(), V, {});
    const double cached = time_median(reps, [&] { k->mask(row.data(), V, {}); });
    const double f = fresh[fresh.size() / 2];
    std::printf("%-36s %10.3f %10.3f %8lld %10.1f\n", c.name, f * 1e3, cached * 1e3, static_cast<long long>(allowed),
                f / floor_s);
    json::Value r(json::Object{});
    r.set("state", c.name);
    r.set("prefix", c.prefix);
    r.set("fresh_ms", f * 1e3);
    r.set("cached_ms", cached * 1e3);
    r.set("allowed", allowed);
    r.set("fresh_over_floor", f / floor_s);
    rows.push_back(std::move(r));
  }
  std::printf("floor: one pass over %d tokens (%zu bytes): %.3f ms\n", V, total_bytes, floor_s * 1e3);
  json::Value result(json::Object{});
  result.set("benchmark", "json-mask");
  result.set("tokenizer", dir);
  result.set("vocab", V);
  result.set("vocab_bytes", static_cast<int64_t>(total_bytes));
  result.set("floor_ms", floor_s * 1e3);
  result.set("cases", std::move(rows));
  write_json(o.get("--json", ""), result);
  return 0;
}


// ------------------------------------------------------------------ serve

// The Generator's scheduling as a server sees it, each feature on and off in one run:
//   prefix caching: C conversations' second turns (turn 1's prompt and answer, then N new
//     tokens) after their first, time to every first token and tokens prefilled, cache off vs on;
//   chunked prefill: D sequences decode when one L-token prompt arrives; the longest gap between
//     their tokens and the prompt's time to first token, whole prefill vs chunks of K tokens.
int cmd_serve(const std::vector<std::string>& args) {
  const Options opt(args, {"--preset", "--backend", "--kv-mode", "--kv-dtype", "--conversations", "--prompt", "--answer",
                           "--new", "--decoders", "--long-prompt", "--chunk", "--speculative-tokens",
                           "--emulate-link-gbps", "--json"});
  auto be = create_backend(opt.get("--backend", "auto"));
  const std::string preset_name = opt.get("--preset", be->device_is_host() ? "opt-125m" : "opt-6.7b");
  const int C = opt.get_int("--conversations", 4), P = opt.get_int("--prompt", 512), A = opt.get_int("--answer", 32),
            N = opt.get_int("--new", 64), D = opt.get_int("--decoders", 4), L = opt.get_int("--long-prompt", 1024),
            K = opt.get_int("--chunk", 128);
  const int S = opt.get_int("--speculative-tokens", 4);
  KVPR_CHECK(C > 0 && P > 1 && A > 1 && N > 0 && D > 0 && L > 1 && K > 0 && S > 0, "sizes must be positive");
  KvMode mode;
  KVPR_CHECK(parse_kv_mode(opt.get("--kv-mode", "resident"), &mode), "unknown --kv-mode");
  DType kv_dtype;
  KVPR_CHECK(parse_dtype(opt.get("--kv-dtype", "f16"), &kv_dtype), "bad --kv-dtype");
  std::unique_ptr<Model> model = preset_model(*be, preset_name, false);
  const Tokenizer tok = Tokenizer::load(default_tokenizer_dir());
  const int32_t vocab = static_cast<int32_t>(std::min<int64_t>(model->spec().vocab_size, tok.size()));
  if (const double link = opt.get_double("--emulate-link-gbps", 0); link > 0) {
    auto* cpu = dynamic_cast<CpuBackend*>(be.get());
    KVPR_CHECK(cpu, "--emulate-link-gbps is for the cpu backend");
    cpu->set_emulated_link_gbps(link);
  }
  GeneratorOptions base;
  base.kv_dtype = kv_dtype;
  base.kv.mode = mode;
  if (mode == KvMode::Kvpr) {
    ProfileOptions po;
    po.transfer_bytes = 16ll << 20;
    po.reps = 3;
    po.rows = {16, 64, 256, 1024};
    base.kv.profile = profile_backend(*be, *model, model->kv_shape(), kv_dtype, po);
  }
  std::fprintf(stderr, "kvpr-bench serve: %s on %s, kv mode %s\n", preset_name.c_str(), be->name().c_str(),
               kv_mode_name(mode));
  Rng rng(7);
  auto random_prompt = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
    return v;
  };
  GenerationParams gp;
  gp.ignore_eos = true;

  // Prefix caching.
  std::vector<std::vector<int32_t>> turn1;
  for (int c = 0; c < C; ++c) turn1.push_back(random_prompt(P));
  const std::vector<int32_t> extra = random_prompt(N);
  json::Array prefix_runs;
  std::map<bool, double> ttft;
  std::map<bool, std::vector<std::vector<int32_t>>> answers2;
  for (bool caching : {false, true}) {
    GeneratorOptions g = base;
    g.max_batch = C;
    g.max_seq_len = P + 2 * A + N + 8;
    g.prefix_caching = caching;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = A;
    auto first = gen.generate_all(turn1, gp);
    std::vector<uint64_t> ids;
    int64_t turn2_tokens = 0;
    for (int c = 0; c < C; ++c) {
      std::vector<int32_t> t = turn1[static_cast<size_t>(c)];
      t.insert(t.end(), first[static_cast<size_t>(c)].tokens.begin(), first[static_cast<size_t>(c)].tokens.end());
      t.insert(t.end(), extra.begin(), extra.end());
      turn2_tokens += static_cast<int64_t>(t.size());
      ids.push_back(gen.add(std::move(t), gp));
    }
    const auto t0 = Clock::now();
    std::set<uint64_t> started;
    double t_first = 0;
    while (!gen.idle()) {
      for (const StepOutput& o : gen.step())
        if (o.token >= 0) started.insert(o.id);
      if (t_first == 0 && started.size() == ids.size()) t_first = seconds_since(t0);
    }
    const double total = seconds_since(t0);
    int64_t cached = 0;
    for (uint64_t id : ids) {
      SequenceResult r = gen.take_result(id);
      cached += r.cached_tokens;
      answers2[caching].push_back(r.tokens);
    }
    ttft[caching] = t_first;
    json::Value r(json::Object{});
    r.set("prefix_caching", caching);
    r.set("turn2_prompt_tokens", turn2_tokens);
    r.set("cached_tokens", cached);
    r.set("prefilled_tokens", turn2_tokens - cached);
    r.set("ttft_all_ms", t_first * 1e3);
    r.set("turn2_total_ms", total * 1e3);
    std::printf("prefix caching %-3s: %d second turns of %lld tokens, %6lld prefilled, first tokens after %8.1f ms, "
                "done after %8.1f ms\n", caching ? "on" : "off", C, static_cast<long long>(turn2_tokens / C),
                static_cast<long long>(turn2_tokens - cached), t_first * 1e3, total * 1e3);
    prefix_runs.push_back(std::move(r));
  }
  const int64_t pre_off = prefix_runs[0].find("prefilled_tokens")->as_int(),
                pre_on = prefix_runs[1].find("prefilled_tokens")->as_int();
  json::Value prefix(json::Object{});
  prefix.set("conversations", C);
  prefix.set("turn1_prompt", P);
  prefix.set("answer", A);
  prefix.set("new_tokens", N);
  prefix.set("runs", std::move(prefix_runs));
  prefix.set("ttft_speedup", ttft[false] / ttft[true]);
  // Prefill work is about linear in the tokens prefilled at these lengths: the bound on the speedup.
  prefix.set("prefilled_token_ratio", static_cast<double>(pre_off) / static_cast<double>(pre_on));
  prefix.set("same_tokens", answers2[false] == answers2[true]);
  std::printf("  time to first tokens %.2fx faster; %.2fx fewer tokens prefilled; same tokens: %s\n",
              ttft[false] / ttft[true], static_cast<double>(pre_off) / static_cast<double>(pre_on),
              answers2[false] == answers2[true] ? "yes" : "NO");

  // Chunked prefill.
  json::Array chunk_runs;
  std::map<int, std::vector<int32_t>> long_tokens;
  const std::vector<int32_t> long_prompt = random_prompt(L);
  std::vector<std::vector<int32_t>> short_prompts;
  for (int d = 0; d < D; ++d) short_prompts.push_back(random_prompt(32));
  for (int chunk : {0, K}) {
    GeneratorOptions g = base;
    g.max_batch = D + 1;
    g.max_seq_len = L + 256;
    g.max_step_tokens = chunk > 0 ? chunk : L + D + 256;
    g.prefix_caching = false;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = 200;
    std::vector<uint64_t> dec;
    for (const auto& sp : short_prompts) dec.push_back(gen.add(sp, gp));
    std::map<uint64_t, Clock::time_point> last;
    double worst_gap = 0;
    std::vector<double> gaps;
    auto step = [&] {
      auto outs = gen.step();
      const auto now = Clock::now();
      for (const StepOutput& o : outs) {
        if (o.token < 0) continue;
        if (last.count(o.id)) gaps.push_back(std::chrono::duration<double>(now - last[o.id]).count());
        last[o.id] = now;
      }
      return outs;
    };
    while (last.size() < dec.size()) step();
    for (int i = 0; i < 8; ++i) step();  // steady decoding
    gaps.clear();
    GenerationParams lp = gp;
    lp.max_new_tokens = 8;
    const uint64_t lid = gen.add(long_prompt, lp);
    const auto t0 = Clock::now();
    double long_ttft = 0;
    int steps = 0;
    while (long_ttft == 0) {
      ++steps;
      for (const StepOutput& o : step())
        if (o.id == lid && o.token >= 0) long_ttft = seconds_since(t0);
    }
    for (double x : gaps) worst_gap = std::max(worst_gap, x);
    std::sort(gaps.begin(), gaps.end());
    const double median_gap = gaps.empty() ? 0 : gaps[gaps.size() / 2];
    for (uint64_t id : dec) gen.cancel(id);
    while (!gen.idle()) gen.step();
    long_tokens[chunk] = gen.take_result(lid).tokens;
    json::Value r(json::Object{});
    r.set("max_step_tokens", g.max_step_tokens);
    r.set("steps_to_first_token", steps);
    r.set("long_prompt_ttft_ms", long_ttft * 1e3);
    r.set("decoder_max_gap_ms", worst_gap * 1e3);
    r.set("decoder_median_gap_ms", median_gap * 1e3);
    std::printf("prefill %-12s: %d decoders, a %d-token prompt arrives: its first token after %8.1f ms (%d steps); "
                "decoders' longest gap %8.1f ms, median %6.1f ms\n",
                chunk > 0 ? ("chunks of " + std::to_string(chunk)).c_str() : "whole", D, L, long_ttft * 1e3, steps,
                worst_gap * 1e3, median_gap * 1e3);
    chunk_runs.push_back(std::move(r));
  }
  json::Value chunked(json::Object{});
  chunked.set("decoders", D);
  chunked.set("long_prompt", L);
  chunked.set("chunk", K);
  const double gap_whole = chunk_runs[0].find("decoder_max_gap_ms")->as_double(),
               gap_chunk = chunk_runs[1].find("decoder_max_gap_ms")->as_double();
  const double ttft_whole = chunk_runs[0].find("long_prompt_ttft_ms")->as_double(),
               ttft_chunk = chunk_runs[1].find("long_prompt_ttft_ms")->as_double();
  chunked.set("runs", std::move(chunk_runs));
  chunked.set("max_gap_reduction", gap_whole / gap_chunk);
  chunked.set("long_prompt_ttft_cost", ttft_chunk / ttft_whole);
  chunked.set("same_tokens", long_tokens[0] == long_tokens[K]);
  std::printf("  longest decoder gap %.2fx shorter; the long prompt's first token %.2fx later; same tokens: %s\n",
              gap_whole / gap_chunk, ttft_chunk / ttft_whole, long_tokens[0] == long_tokens[K] ? "yes" : "NO");

  // Speculative decoding: C greedy sequences of P-token prompts decode A tokens one at a time,
  // then checking up to S prompt-lookup drafts a step. What a random model's greedy text repeats
  // sets the acceptance here; the step costs are what carries over to real text.
  json::Array spec_runs;
  std::map<int, std::vector<std::vector<int32_t>>> spec_tokens;
  std::map<int, double> spec_ms_per_token, spec_ms_per_step;
  double spec_tokens_per_step = 1;
  std::vector<std::vector<int32_t>> spec_prompts;
  for (int c = 0; c < C; ++c) spec_prompts.push_back(random_prompt(P));
  for (int k : {0, S}) {
    GeneratorOptions g = base;
    g.max_batch = C;
    g.max_seq_len = P + 4 * A + 8;
    g.prefix_caching = false;
    g.speculative_tokens = k;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = 4 * A;
    for (const auto& sp : spec_prompts) gen.add(sp, gp);
    gen.step();  // the prefill
    int64_t steps = 0, tokens = 0;
    const auto t0 = Clock::now();
    while (!gen.idle()) {
      for (const StepOutput& o : gen.step()) tokens += o.token >= 0;
      ++steps;
    }
    const double total = seconds_since(t0);
    std::vector<std::vector<int32_t>> got;
    for (uint64_t id = 1; id <= static_cast<uint64_t>(C); ++id) got.push_back(gen.take_result(id).tokens);
    spec_tokens[k] = got;
    const SpeculationStats& st = gen.speculation_stats();
    spec_ms_per_token[k] = total * 1e3 / static_cast<double>(tokens);
    spec_ms_per_step[k] = total * 1e3 / static_cast<double>(steps);
    if (k > 0) spec_tokens_per_step = static_cast<double>(tokens) / static_cast<double>(steps * C);
    json::Value r(json::Object{});
    r.set("speculative_tokens", k);
    r.set("decode_steps", steps);
    r.set("tokens", tokens);
    r.set("drafts", st.proposed);
    r.set("accepted", st.accepted);
    r.set("ms_per_step", spec_ms_per_step[k]);
    r.set("ms_per_token", spec_ms_per_token[k]);
    std::printf("speculation %-2d: %d sequences, %lld tokens in %lld steps (%.2f per sequence-step), %lld of %lld drafts "
                "taken, %7.2f ms/step, %7.3f ms/token\n", k, C, static_cast<long long>(tokens),
                static_cast<long long>(steps), static_cast<double>(tokens) / static_cast<double>(steps * C),
                static_cast<long long>(st.accepted), static_cast<long long>(st.proposed), spec_ms_per_step[k],
                spec_ms_per_token[k]);
    spec_runs.push_back(std::move(r));
  }
  json::Value spec(json::Object{});
  spec.set("sequences", C);
  spec.set("prompt", P);
  spec.set("runs", std::move(spec_runs));
  spec.set("speedup", spec_ms_per_token[0] / spec_ms_per_token[S]);
  // A step checking drafts costs this many one-token steps; with acceptance a per draft, a step
  // yields (1 - a^(S+1)) / (1 - a) tokens: the speedup at acceptance a is that over the cost.
  const double cost = spec_ms_per_step[S] / spec_ms_per_step[0];
  spec.set("step_cost_ratio", cost);
  spec.set("tokens_per_sequence_step", spec_tokens_per_step);
  json::Value implied(json::Object{});
  for (double a : {0.3, 0.5, 0.7, 0.9})
    implied.set(std::to_string(a).substr(0, 3), (1 - std::pow(a, S + 1)) / (1 - a) / cost);
  spec.set("implied_speedup_at_acceptance", std::move(implied));
  spec.set("same_tokens", spec_tokens[0] == spec_tokens[S]);
  std::printf("  %.2fx the tokens per second; a step checking drafts costs %.2fx one that does not; same tokens: %s\n",
              spec_ms_per_token[0] / spec_ms_per_token[S], cost, spec_tokens[0] == spec_tokens[S] ? "yes" : "NO");

  json::Value result(json::Object{});
  result.set("benchmark", "serve");
  result.set("preset", preset_name);
  result.set("backend", be->name());
  result.set("kv_mode", kv_mode_name(mode));
  result.set("kv_dtype", dtype_name(kv_dtype));
  result.set("threads", ThreadPool::global().size());
  result.set("prefix_caching", std::move(prefix));
  result.set("chunked_prefill", std::move(chunked));
  result.set("speculative_decoding", std::move(spec));
  result.set("emulated_link_gbps", opt.get_double("--emulate-link-gbps", 0));
  write_json(opt.get("--json", ""), result);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  try {
    if (argc >= 2 && std::string(argv[1]) == "cpu") return cmd_cpu(args);
    if (argc >= 2 && std::string(argv[1]) == "decode") return cmd_decode(args);
    if (argc >= 2 && std::string(argv[1]) == "ops") return cmd_ops(args);
    if (argc >= 2 && std::string(argv[1]) == "json") return cmd_json(args);
    if (argc >= 2 && std::string(argv[1]) == "serve") return cmd_serve(args);
    if (argc >= 2 && std::string(argv[1]) == "scale") return kvpr::scaling::cmd_scale(args);
    if (argc >= 2 && std::string(argv[1]) == "scale-worker") return kvpr::scaling::cmd_scale_worker(args);
    std::fprintf(stderr, "usage: kvpr-bench cpu [--json FILE] [--quick]\n"
                         "       kvpr-bench decode [--preset P] [--batch B] [--prompt P] [--gen N] [--modes M,...]\n"
                         "                         [--backend B] [--kv-dtype D] [--weights device|host] [--gpu-batches N]\n"
                         "                         [--emulate-link-gbps G] [--peer F]\n"
                         "                         [--json F] [--svg F] [--trace-dir D] [--max-positions N]\n"
                         "       kvpr-bench ops [--preset P] [--batch B] [--ctx S] [--reps N] [--backend B] [--json F]\n"
                         "       kvpr-bench json [--tokenizer DIR] [--reps N] [--json F]\n"
                         "       kvpr-bench serve [--preset P] [--backend B] [--kv-mode M] [--kv-dtype D] [--conversations C]\n"
                         "                        [--prompt P] [--answer A] [--new N] [--decoders D] [--long-prompt L]\n"
                         "                        [--chunk K] [--json F]\n"
                         "       kvpr-bench scale [--preset P] [--workers 1,2,4,8] [--modes kvpr,offload,cpu-attn] [--batch B]\n"
                         "                        [--prompt P] [--gen N] [--kv-dtype D] [--backend B] [--real-workers R]\n"
                         "                        [--emulate-link-gbps G] [--probe-mib M] [--json F] [--svg F]\n"
                         "       kvpr-bench scale --topology XML [--workers 1,2,4,8]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpr-bench: error: %s\n", e.what());
    return 1;
  }
}
