// Every KV mode on a device backend against the CPU backend's greedy tokens, for one tiny
// fixture: what tests/engine/backend/test_cuda.cc checks on a GPU and the emulated-device suite checks under
// random schedules.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/rng.h"
#include "engine/decode/generator.h"
#include "engine/model/model.h"

namespace kvpr::test {

// The prompts the model fixtures' mode checks run: a long one, a short one, one with a repeat.
inline const std::vector<std::vector<int32_t>> kFixturePrompts = {{5, 17, 33, 2, 80, 41, 9}, {60, 61}, {7, 7, 8, 9, 10}};

inline std::vector<std::vector<int32_t>> greedy_tokens(Model& model, const Tokenizer& tok,
                                                       const GeneratorOptions& o,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const GenerationParams& p) {
  std::vector<std::vector<int32_t>> out;
  for (auto& r : Generator(model, tok, o).generate_all(prompts, p)) out.push_back(r.tokens);
  return out;
}

// `base` with kv mode auto's device tier `blocks` blocks of base.block_tokens (of `model`'s K and
// V in base's KV dtype, fp32 when unset).
inline GeneratorOptions with_gpu_blocks(GeneratorOptions base, const Model& model, double blocks) {
  KvRuntimeOptions kv = base.kv;
  kv.kv_dtype = base.kv_dtype.value_or(DType::F32);
  base.kv.gpu_kv_fraction = -1;
  base.kv.gpu_kv_bytes =
      blocks * KvRuntime::device_block_bytes(model.kv_shape(), KvLayout{1, base.block_tokens, base.block_tokens}, kv);
  return base;
}

// Teacher-forced log-probabilities of `prompt`'s tokens 1.. in `mode` with a `dtype` cache,
// scored in chunks of 4 tokens so that every chunk attends to K/V read back from the cache
// (kvpr and auto recompute those of the first 16 tokens from X; auto's device tier holds one
// block of 16, the last).
inline std::vector<float> chunked_prompt_scores(Model& model, const Tokenizer& tok, KvMode mode, DType dtype,
                                                const std::vector<int32_t>& prompt) {
  GeneratorOptions o;
  o.max_batch = 2;
  o.kv_dtype = dtype;
  o.kv.mode = mode;
  if (kv_mode_splits(mode)) o.kv.forced_split = 16;
  if (mode == KvMode::Auto) o = with_gpu_blocks(o, model, 1);
  o.max_step_tokens = 4;
  GenerationParams p;
  p.max_new_tokens = 0;
  p.prompt_logprobs = 0;
  return Generator(model, tok, o).generate_all({prompt}, p)[0].prompt_logprobs;
}

// Mean and largest |a - b| of two score lists of one length, none of them NaN or infinite.
struct ScoreGap {
  double mean = 0, worst = 0;
  bool finite = true;
};
inline ScoreGap score_gap(const std::vector<float>& a, const std::vector<float>& b) {
  ScoreGap g;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    g.finite = g.finite && std::isfinite(a[i]) && std::isfinite(b[i]);
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    g.mean += d / static_cast<double>(a.size());
    g.worst = std::max(g.worst, d);
  }
  return g;
}

// `base` in KV mode `m`, the split of KVPR and auto forced to `kvpr_split`; auto's device tier two
// blocks of at most 4 tokens (short sequences then have tails on the device and heads staged,
// tails sliding and blocks moving as sequences grow and end).
inline GeneratorOptions in_mode(GeneratorOptions base, KvMode m, int kvpr_split, const Model& model) {
  base.kv.mode = m;
  if (kv_mode_splits(m)) base.kv.forced_split = kvpr_split;
  if (m == KvMode::Auto) {
    base.block_tokens = std::min<int64_t>(base.block_tokens, 4);
    base = with_gpu_blocks(base, model, 2);
  }
  return base;
}

// Greedy decoding of `prompts` (max_new tokens, EOS ignored, an f32 cache, one batch) on the CPU
// backend: the options and parameters used, and the tokens every device run must give.
struct CpuGreedy {
  GeneratorOptions options;
  GenerationParams params;
  std::vector<std::vector<int32_t>> tokens;
};
inline CpuGreedy cpu_greedy(const std::string& dir, const Tokenizer& tok, const std::vector<std::vector<int32_t>>& prompts,
                            int max_new, bool prefix_caching = true) {
  CpuGreedy r;
  r.params.max_new_tokens = max_new;
  r.params.ignore_eos = true;
  CpuBackend cpu;
  std::unique_ptr<Model> mc = load_model(cpu, dir);
  r.options.max_batch = static_cast<int>(prompts.size());
  r.options.kv_dtype = DType::F32;
  r.options.prefix_caching = prefix_caching;
  r.tokens = greedy_tokens(*mc, tok, r.options, prompts, r.params);
  return r;
}

// Greedy decoding of `prompts` (max_new tokens, EOS ignored, fp32 KV, one batch) in each mode
// on `device` (KVPR and auto with their split forced to `kvpr_split`, auto as in_mode sets it)
// equals the CPU backend's, with the weights on the device and streamed from pinned host memory
// (--weights host; offload, kvpr, cpu-attn and auto then also run column by column, two GPU
// batches per layer).
inline void expect_every_kv_mode_gives_cpu_tokens(Backend& device, const std::string& dir, const Tokenizer& tok,
                                                  const std::vector<std::vector<int32_t>>& prompts, int max_new,
                                                  int kvpr_split, const std::string& label) {
  const CpuGreedy ref = cpu_greedy(dir, tok, prompts, max_new);
  const GeneratorOptions& oc = ref.options;
  const GenerationParams& p = ref.params;
  const std::vector<std::vector<int32_t>>& want = ref.tokens;
  std::unique_ptr<Model> mg_owned = load_model(device, dir);
  Model& mg = *mg_owned;
  for (KvMode m : kAllKvModes) {
    GeneratorOptions og = in_mode(oc, m, kvpr_split, mg);
    EXPECT_EQ(greedy_tokens(mg, tok, og, prompts, p), want) << label << " " << kv_mode_name(m);
  }
  ModelLoadOptions streamed;
  streamed.stream_weights = true;
  std::unique_ptr<Model> ms = load_model(device, dir, streamed);
  for (KvMode m : kAllKvModes) {
    GeneratorOptions og = in_mode(oc, m, kvpr_split, *ms);
    if (m == KvMode::Offload || m == KvMode::Kvpr || m == KvMode::CpuAttn || m == KvMode::Auto) og.kv.gpu_batches = 2;
    EXPECT_EQ(greedy_tokens(*ms, tok, og, prompts, p), want)
        << label << " " << kv_mode_name(m) << ", streamed weights, " << og.kv.gpu_batches << " GPU batches";
  }
  ms.reset();
  // Resident decode steps as CUDA graphs: captured on the second decode step, replayed after
  // (a mixture of experts, whose host picks each layer's experts, runs eagerly).
  GeneratorOptions og = oc;
  og.cuda_graphs = true;
  const GraphCounters before = device.graph_counters();
  EXPECT_EQ(greedy_tokens(mg, tok, og, prompts, p), want) << label << " resident, CUDA graphs";
  const GraphCounters after = device.graph_counters();
  if (device.name().rfind("cuda", 0) == 0 && max_new >= 4) {
    EXPECT_EQ(after.capture_failed, before.capture_failed) << label;
    EXPECT_EQ(after.interrupted, before.interrupted) << label;
    if (mg.graph_capturable())
      EXPECT_GE(after.replayed - before.replayed, 1) << label;
    else
      EXPECT_EQ(after.replayed + after.captured, before.replayed + before.captured) << label;
  }
}

// The sliding-window layers' ring (KvLayout::ring) under `schedules` random schedules: prompts of 3 to 30
// tokens (past the fixture's windows) arriving at random steps, prefilled in chunks of at most 6
// tokens, three at a time in 2-token blocks, in a KV cache that holds fewer blocks than they
// want (preemption, and prefixes found again in the cache), with sampled sequences among them.
// In every host mode on `device` (auto with device tiers of 2 and 8 blocks: tails that slide,
// and promotions stopped at the ring's window), every sequence's tokens are those of the same
// schedule on `device` in resident mode, whose store is not a ring; the ring's store is smaller
// than every layer's blocks would be, and the runs preempt.
inline void expect_ring_gives_resident_tokens(Backend& device, const std::string& dir, const Tokenizer& tok,
                                              const std::string& label, int schedules = 3) {
  std::unique_ptr<Model> model = load_model(device, dir);
  const ModelSpec& spec = model->spec();
  ASSERT_FALSE(spec.windows.empty()) << label;
  GeneratorOptions o;
  o.kv_dtype = DType::F32;
  o.block_tokens = 2;
  o.max_batch = 3;
  o.max_step_tokens = 6;
  // The bytes of 26 blocks of every layer (52 tokens, fewer than three sequences of up to 50
  // tokens take): the runs preempt. The ring (three windows and a step) is smaller. The reference
  // holds them all.
  auto with_budget = [&](GeneratorOptions g) {
    KvRuntimeOptions kv = g.kv;
    kv.kv_dtype = DType::F32;
    const KvLayout one{1, g.block_tokens, spec.max_position_embeddings};
    g.kv_cache_bytes = 26 * KvRuntime::block_bytes(model->kv_shape(), one, kv);
    return g;
  };
  int64_t preemptions = 0;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(schedules); ++seed) {
    Rng rng(seed * 104729 + 7);
    std::vector<std::vector<int32_t>> prompts(6);
    for (auto& pr : prompts) {
      pr = {5, 17, 33};  // a shared prefix
      for (int64_t k = 0, n = static_cast<int64_t>(rng.next() % 28); k < n; ++k)
        pr.push_back(static_cast<int32_t>(3 + rng.next() % 90));
    }
    std::vector<int64_t> arrival(prompts.size());
    for (auto& a : arrival) a = static_cast<int64_t>(rng.next() % 12);
    auto run = [&](Model& m, const GeneratorOptions& opts, int64_t* preempted) {
      Generator gen(m, tok, opts);
      std::vector<uint64_t> ids(prompts.size(), 0);
      for (int64_t step = 0; step < 10000; ++step) {
        for (size_t i = 0; i < prompts.size(); ++i)
          if (arrival[i] == step) {
            GenerationParams p;
            p.max_new_tokens = 20;
            p.ignore_eos = true;
            if (i % 3 == 2) {  // sampled: the same draws wherever it runs
              p.sampling.temperature = 0.8f;
              p.sampling.seed = seed + i;
            }
            ids[i] = gen.add(prompts[i], p);
          }
        if (step > 12 && gen.idle()) break;
        gen.step();
      }
      if (preempted) *preempted += gen.kv_block_stats().preemptions;
      std::vector<std::vector<int32_t>> out;
      for (uint64_t id : ids) out.push_back(gen.take_result(id).tokens);
      return out;
    };
    const auto want = run(*model, o, nullptr);
    for (int variant = 0; variant < 6; ++variant) {
      const KvMode m = std::array{KvMode::Offload, KvMode::Kvpr, KvMode::Recompute, KvMode::CpuAttn, KvMode::Auto,
                                  KvMode::Auto}[static_cast<size_t>(variant)];
      GeneratorOptions om = in_mode(o, m, 3, *model);
      if (variant == 5) om = with_gpu_blocks(om, *model, 8);
      om = with_budget(om);
      const std::string what = label + " " + kv_mode_name(m) + (m == KvMode::Auto ? variant == 5 ? " (8)" : " (2)" : "");
      Generator probe(*model, tok, om);
      ASSERT_TRUE(probe.kv_runtime().layout().ring()) << what;
      KvLayout every = probe.kv_runtime().layout();
      every.window_blocks = 0;
      EXPECT_LT(probe.kv_runtime().host_store()->bytes(),
                KvRuntime::store_bytes(model->kv_shape(), every, probe.plan().kv))
          << what;
      EXPECT_EQ(run(*model, om, &preemptions), want) << what << ", seed " << seed;
    }
  }
  EXPECT_GT(preemptions, 0) << label;
}

// OPT with fp16 weights and an fp16 cache: KVPR and recompute project K/V from the stored X
// straight into the cache's dtype (one GEMM with its bias, KvProjector::kv_dtype_for) and give
// resident mode's greedy tokens, with part or all of the cached tokens recomputed, on `device`.
inline void expect_fused_recompute_gives_resident_tokens(Backend& device, const std::string& dir,
                                                         const Tokenizer& tok) {
  ModelLoadOptions lo;
  lo.convert_weights = true;
  lo.weight_dtype = DType::F16;
  std::unique_ptr<Model> m = load_model(device, dir, lo);
  EXPECT_EQ(m->kv_dtype_for(DType::F16), DType::F16);  // the fused path is the one taken
  EXPECT_EQ(m->kv_dtype_for(DType::F8E4M3), DType::F32);
  EXPECT_EQ(m->kv_dtype_for(DType::BF16), DType::F32);  // not the weights' dtype
  GeneratorOptions o;
  o.max_batch = 3;
  o.kv_dtype = DType::F16;
  GenerationParams p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 33, 2, 80, 41, 9}, {60, 61}, {7, 7, 8, 9, 10, 11, 12, 13, 14}};
  const auto want = greedy_tokens(*m, tok, in_mode(o, KvMode::Resident, 0, *m), prompts, p);
  for (int split : {3, 1 << 20})
    EXPECT_EQ(greedy_tokens(*m, tok, in_mode(o, KvMode::Kvpr, split, *m), prompts, p), want) << "kvpr, split " << split;
  EXPECT_EQ(greedy_tokens(*m, tok, in_mode(o, KvMode::Recompute, 0, *m), prompts, p), want) << "recompute";
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 3) % 90));
  const ScoreGap g = score_gap(chunked_prompt_scores(*m, tok, KvMode::Kvpr, DType::F16, prompt),
                               chunked_prompt_scores(*m, tok, KvMode::Resident, DType::F16, prompt));
  ASSERT_TRUE(g.finite);
  // The CPU's resident K/V come from fp32 X, KVPR's from X rounded to fp16: 3e-4 mean, 1.5e-3
  // worst apart here; the emulated device (one rounding either way, the same GEMM inputs) 0.
  EXPECT_LT(g.mean, 2e-3) << "worst " << g.worst;
  EXPECT_LT(g.worst, 1e-2);
}

// Speculative decoding (prompt lookup, 4 drafts) in every mode on `device`, weights resident and
// streamed: the greedy tokens of decoding one at a time on the CPU backend, for prompts that
// repeat themselves so that lookups propose. Returns the drafts accepted, to be checked by the
// caller over its fixtures (a tiny random model may or may not repeat what its prompt did).
inline int64_t expect_speculation_gives_cpu_tokens(Backend& device, const std::string& dir, const Tokenizer& tok,
                                                   int max_new, const std::string& label) {
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 33, 5, 17, 33, 5, 17}, {60, 61, 62, 60, 61},
                                                     {7, 7, 7, 7, 7, 7}};
  const CpuGreedy ref = cpu_greedy(dir, tok, prompts, max_new);
  const GeneratorOptions& oc = ref.options;
  const GenerationParams& p = ref.params;
  const std::vector<std::vector<int32_t>>& want = ref.tokens;
  int64_t accepted = 0;
  for (bool streamed : {false, true}) {
    ModelLoadOptions lo;
    lo.stream_weights = streamed;
    std::unique_ptr<Model> mg = load_model(device, dir, lo);
    for (KvMode m : kAllKvModes) {
      GeneratorOptions og = in_mode(oc, m, 3, *mg);
      og.speculative_tokens = 4;
      og.prompt_lookup_min = 1;
      Generator gen(*mg, tok, og);
      std::vector<std::vector<int32_t>> got;
      for (auto& r : gen.generate_all(prompts, p)) got.push_back(r.tokens);
      EXPECT_EQ(got, want) << label << " " << kv_mode_name(m) << (streamed ? ", streamed weights" : "");
      EXPECT_GT(gen.speculation_stats().proposed, 0) << label;
      EXPECT_LE(gen.speculation_stats().accepted, gen.speculation_stats().proposed) << label;
      accepted += gen.speculation_stats().accepted;
    }
  }
  return accepted;
}

// Chunks that start past cached tokens, in every mode on `device`: a first turn prefilled three
// tokens a step, then a second turn (prompt, answer, prompt again) that takes the KV blocks the
// first turn left cached (blocks of 4 tokens, so chunks and cached prefixes end inside and
// across blocks), equal the CPU backend's whole prefills without the cache (the prompts must
// differ in their first token, so that each second turn finds its own blocks).
inline void expect_chunks_past_cached_tokens_give_cpu_tokens(Backend& device, const std::string& dir,
                                                             const Tokenizer& tok,
                                                             const std::vector<std::vector<int32_t>>& prompts,
                                                             int max_new, int kvpr_split, const std::string& label) {
  const CpuGreedy ref = cpu_greedy(dir, tok, prompts, max_new, /*prefix_caching=*/false);
  const GeneratorOptions& oc = ref.options;
  const GenerationParams& p = ref.params;
  const std::vector<std::vector<int32_t>>& want = ref.tokens;
  CpuBackend cpu;
  std::unique_ptr<Model> mc = load_model(cpu, dir);  // for the second turns' reference
  std::unique_ptr<Model> mg_owned = load_model(device, dir);
  Model& mg = *mg_owned;
  std::vector<std::vector<int32_t>> turn2;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> t = prompts[i];
    t.insert(t.end(), want[i].begin(), want[i].end());
    t.insert(t.end(), prompts[i].begin(), prompts[i].end());
    turn2.push_back(std::move(t));
  }
  const std::vector<std::vector<int32_t>> want2 = greedy_tokens(*mc, tok, oc, turn2, p);
  for (KvMode m : kAllKvModes) {
    GeneratorOptions oe = oc;
    oe.prefix_caching = true;
    oe.max_step_tokens = 3;
    oe.block_tokens = 4;
    oe = in_mode(oe, m, kvpr_split, mg);
    Generator g(mg, tok, oe);
    std::vector<std::vector<int32_t>> got1, got2;
    for (auto& r : g.generate_all(prompts, p)) got1.push_back(r.tokens);
    EXPECT_EQ(got1, want) << label << " " << kv_mode_name(m) << ", chunked prefill";
    const std::vector<SequenceResult> r2 = g.generate_all(turn2, p);
    for (size_t i = 0; i < r2.size(); ++i) {
      got2.push_back(r2[i].tokens);
      // The first turn's prompt and every answer token but the last went through the model: their
      // full blocks are reused.
      EXPECT_EQ(r2[i].cached_tokens, (static_cast<int64_t>(prompts[i].size()) + max_new - 1) / 4 * 4)
          << label << " " << kv_mode_name(m) << " prompt " << i;
    }
    EXPECT_EQ(got2, want2) << label << " " << kv_mode_name(m) << ", second turn from the prefix cache";
  }
}

}  // namespace kvpr::test
