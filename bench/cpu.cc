// kvpr-bench cpu [--json FILE] [--quick]
//     OPT-125m shapes with random weights: prefill and decode tokens/s of the CPU backend, and
//     the decode-attention kernel's bandwidth next to a memcpy measured in the same run.
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
#include "engine/base/rng.h"
#include "engine/base/thread_pool.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

namespace {

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

}  // namespace

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

}  // namespace kvpr::bench
