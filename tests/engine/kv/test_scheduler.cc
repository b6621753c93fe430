// The split scheduler against optima computed by hand from its formulas, and its online
// adaptation under the CPU backend's emulated link.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/kv/profiler.h"
#include "engine/model/opt_model.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

// 1 GB/s link, 1 us + 0.01 us per recomputed token; X = 1000 B, K+V = 2000 B per token.
LinkProfile profile(double gbps = 1.0, double c0 = 1e-6, double c1 = 1e-8) {
  LinkProfile p;
  p.h2d_gbps = p.h2d_alone_gbps = p.d2h_gbps = gbps;
  p.recompute_fixed_s = c0;
  p.recompute_per_row_s = c1;
  return p;
}

// Brute force over every L, for checking the O(1) choice.
int64_t brute(const SplitScheduler& s, int64_t cached, int64_t max_split, double other, bool pipeline, int64_t g) {
  int64_t best = 0;
  double bt = pipeline ? s.pipeline_time(cached, 0, other) : s.paper_time(cached, 0);
  for (int64_t l = g; l <= max_split; l += g) {
    double t = pipeline ? s.pipeline_time(cached, l, other) : s.paper_time(cached, l);
    if (t < bt - 1e-15) bt = t, best = l;
  }
  return best;
}

// Reproducible uniform numbers in [lo, hi) (a 64-bit LCG), for the random shapes.
struct Uniform {
  uint64_t x;
  double operator()(double lo, double hi) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * static_cast<double>(x >> 11) / 9007199254740992.0;
  }
};

}  // namespace

TEST(SplitScheduler, PaperModelHandComputedOptimum) {
  // t(L) = L·1e-6 + max(1e-6 + 1e-8·L, (S-L)·2e-6), S = 1000.
  // Branches meet where 1e-6 + 1e-8 L = 2e-6 (1000 - L): L = (2e-3 - 1e-6) / (2.01e-6) = 994.527...
  SplitScheduler s(profile(), 1000, 2000, 1, SplitModel::Paper);
  SplitDecision d = s.choose(1000, 1000, -1);
  EXPECT_EQ(d.model, SplitModel::Paper);
  EXPECT_EQ(d.split, 995);  // the discrete optimum next to 994.53
  EXPECT_NEAR(d.predicted_s, 995e-6 + std::max(1e-6 + 995e-8, 5 * 2e-6), 1e-12);
  EXPECT_NEAR(d.baseline_s, 2e-3, 1e-12);  // full transfer: 1000 tokens x 2000 B at 1 GB/s
  EXPECT_EQ(d.split, brute(s, 1000, 1000, -1, false, 1));
}

TEST(SplitScheduler, PipelineModelHandComputedOptimum) {
  // t(L) = max((L·1000 + (S-L)·2000)/1e9, other + 1e-6 + 1e-8·L), S = 1000, other = 0.5 ms.
  // Meet: 2e-3 - 1e-6 L = 5.01e-4 + 1e-8 L  ->  L = 1.499e-3 / 1.01e-6 = 1484.2 -> capped at S.
  SplitScheduler s(profile(), 1000, 2000, 1, SplitModel::Pipeline);
  SplitDecision d = s.choose(1000, 1000, 0.5e-3);
  EXPECT_EQ(d.model, SplitModel::Pipeline);
  EXPECT_EQ(d.split, 1000);
  // With more other work the link is hidden earlier: other = 1.5 ms -> L = 4.99e-4/1.01e-6 = 494.06.
  SplitDecision d2 = s.choose(1000, 1000, 1.5e-3);
  EXPECT_TRUE(d2.split == 494 || d2.split == 495) << d2.split;
  EXPECT_EQ(d2.split, brute(s, 1000, 1000, 1.5e-3, true, 1));
  // When the other work already exceeds the full transfer, recomputing cannot help.
  EXPECT_EQ(s.choose(1000, 1000, 3e-3).split, 0);
}

TEST(SplitScheduler, StreamedWeightsShiftThePipelineOptimum) {
  // W = 0.5 MB of weights per layer on the link as well: link(L) = (5e5 + 2e6 - 1000 L)/1e9.
  // other = 1.5 ms: meet 2.5e-3 - 1e-6 L = 1.501e-3 + 1e-8 L -> L = 9.99e-4 / 1.01e-6 = 989.1,
  // where without weights it was 494 (above): a busier link is worth more recomputation.
  SplitScheduler s(profile(), 1000, 2000, 1, SplitModel::Pipeline);
  s.set_fixed_link_bytes(5e5);
  SplitDecision d = s.choose(1000, 1000, 1.5e-3);
  EXPECT_TRUE(d.split == 989 || d.split == 990) << d.split;
  EXPECT_EQ(d.split, brute(s, 1000, 1000, 1.5e-3, true, 1));
  EXPECT_NEAR(d.baseline_s, 2.5e-3, 1e-12);
  // The paper model only gains the constant W/v: same optimum as without weights (995).
  SplitScheduler p(profile(), 1000, 2000, 1, SplitModel::Paper);
  p.set_fixed_link_bytes(5e5);
  SplitDecision dp = p.choose(1000, 1000, -1);
  EXPECT_EQ(dp.split, 995);
  EXPECT_NEAR(dp.predicted_s, 5e-4 + 995e-6 + std::max(1e-6 + 995e-8, 5 * 2e-6), 1e-12);
}

TEST(SplitScheduler, GroupedQueryAttentionGivesZero) {
  // GQA with 4 query heads per KV head: X (h) is twice K+V (2·h/4): never recompute.
  SplitScheduler s(profile(0.001), 4096, 2048, 16);
  EXPECT_FALSE(s.recompute_can_help());
  EXPECT_EQ(s.choose(100000, 100000, -1).split, 0);
  EXPECT_EQ(s.choose(100000, 100000, 0.0).split, 0);
}

TEST(SplitScheduler, BoundaryCases) {
  SplitScheduler s(profile(), 1000, 2000, 16);
  EXPECT_EQ(s.choose(0, 0, -1).split, 0);      // nothing cached (prefill)
  EXPECT_EQ(s.choose(1000, 0, -1).split, 0);   // no stored X
  // Recompute far too slow (1 ms per token): L = 0.
  SplitScheduler slow(profile(1.0, 0, 1e-3), 1000, 2000, 16);
  EXPECT_EQ(slow.choose(1000, 1000, -1).split, 0);
  // Recompute free and the link slow: L = everything available (l = s').
  SplitScheduler fast(profile(0.001, 0, 1e-12), 1000, 2000, 16);
  EXPECT_EQ(fast.choose(1000, 1000, -1).split, 1000);
  EXPECT_EQ(fast.choose(1000, 300, -1).split, 300);  // capped by stored X, even off the grid
  // Granularity: a multiple of 16 unless capped.
  SplitScheduler g(profile(), 1000, 2000, 16, SplitModel::Paper);
  int64_t l = g.choose(1000, 1000, -1).split;
  EXPECT_EQ(l % 16, 0);
  EXPECT_EQ(l, brute(g, 1000, 1000, -1, false, 16));
}

TEST(SplitScheduler, MatchesBruteForceOnRandomShapes) {
  Uniform rnd{42};
  for (int i = 0; i < 300; ++i) {
    LinkProfile p = profile(rnd(0.01, 30), rnd(0, 1e-4), rnd(1e-9, 1e-5));
    int64_t g = i % 3 == 0 ? 1 : 16;
    SplitScheduler s(p, 8192, 16384, g, i % 2 ? SplitModel::Paper : SplitModel::Pipeline);
    int64_t cached = static_cast<int64_t>(rnd(1, 5000)), max_split = static_cast<int64_t>(rnd(0, static_cast<double>(cached)));
    double other = i % 2 ? -1 : rnd(0, 5e-3);
    SplitDecision d = s.choose(cached, max_split, other);
    bool pipeline = !(i % 2);
    double best = pipeline ? s.pipeline_time(cached, brute(s, cached, max_split, other, true, g), other)
                           : s.paper_time(cached, brute(s, cached, max_split, other, false, g));
    // The O(1) choice is as good as the best multiple of g (it may also take the cap).
    EXPECT_LE(d.predicted_s, best * (1 + 1e-12)) << "case " << i;
  }
}

// kv mode auto's tiers: the choice over (R, L) against every R and every multiple of g for L.
TEST(SplitScheduler, TiersMatchBruteForceOverResidentAndSplit) {
  Uniform rnd{7};
  for (int i = 0; i < 200; ++i) {
    const int64_t g = i % 3 == 0 ? 1 : 16;
    const bool pipeline = i % 2 == 0;
    SplitScheduler s(profile(rnd(0.01, 30), rnd(0, 1e-4), rnd(1e-9, 1e-5)), 8192, 16384, g,
                     pipeline ? SplitModel::Pipeline : SplitModel::Paper);
    s.set_fixed_link_bytes(i % 4 == 0 ? rnd(0, 1e7) : 0);  // streamed weights
    const int64_t cached = static_cast<int64_t>(rnd(1, 600));
    const int64_t rmax = static_cast<int64_t>(rnd(0, static_cast<double>(cached)));
    const int64_t max_split = static_cast<int64_t>(rnd(0, static_cast<double>(cached)));
    const double other = pipeline ? rnd(0, 5e-3) : -1;
    auto t = [&](int64_t r, int64_t l) {
      return pipeline ? s.pipeline_time(cached - r, l, other) : s.paper_time(cached - r, l);
    };
    double best = t(0, 0);
    for (int64_t r = 0; r <= rmax; ++r) {
      const int64_t cap = std::min(max_split, cached - r);
      for (int64_t l = 0; l <= cap; l = l + g > cap && l < cap ? cap : l + g) best = std::min(best, t(r, l));
    }
    const TierDecision d = s.choose_tiers(cached, rmax, max_split, other);
    EXPECT_EQ(d.resident, rmax) << "case " << i << ": the device tier is never worse";
    EXPECT_LE(d.split.split, std::min(max_split, cached - rmax)) << "case " << i;
    EXPECT_NEAR(d.split.predicted_s, t(d.resident, d.split.split), 1e-15) << "case " << i;
    EXPECT_LE(d.split.predicted_s, best * (1 + 1e-12)) << "case " << i;
  }
}

TEST(SplitScheduler, ProfileSavesAndLoads) {
  test::TempDir tmp;
  LinkProfile p = profile(12.5, 3e-6, 2e-8);
  p.device = "test";
  p.save(tmp.file("p.json"));
  LinkProfile q = LinkProfile::load(tmp.file("p.json"));
  EXPECT_DOUBLE_EQ(q.h2d_gbps, 12.5);
  EXPECT_DOUBLE_EQ(q.recompute_per_row_s, 2e-8);
  EXPECT_EQ(q.device, "test");
  std::ofstream(tmp.file("bad.json")) << R"({"h2d_gbps": -1})";
  EXPECT_THROW(LinkProfile::load(tmp.file("bad.json")), Error);
}

TEST(SplitScheduler, AdaptationMovesTheSplitAsTheModelPredicts) {
  // Deterministic: measurements of a slow link pull the estimate down and the split up to
  // every cached token; measurements of a fast link bring it back to zero.
  SplitScheduler s(profile(20.0, 50e-6, 1e-7), 128, 256, 1, SplitModel::Pipeline);
  s.observe_other(100e-6);
  EXPECT_EQ(s.choose(50, 50, s.other_s()).split, 0);  // 50 x 256 B at 20 GB/s: 0.6 us, hidden
  for (int i = 0; i < 8; ++i) s.observe_link(50 * 256, 50 * 256 / 0.002e9);  // 2 MB/s
  EXPECT_LT(s.profile().h2d_gbps, 0.0025);
  // Now moving K+V costs 6.4 ms per layer; recomputing costs 50 us + 5 us: recompute all.
  EXPECT_EQ(s.choose(50, 50, s.other_s()).split, 50);
  for (int i = 0; i < 40; ++i) s.observe_link(50 * 128, 50 * 128 / 20e9);
  EXPECT_GT(s.profile().h2d_gbps, 5.0);
  EXPECT_EQ(s.choose(50, 50, s.other_s()).split, 0);
}

TEST(SplitScheduler, FollowsTheEmulatedLinkMidRun) {
  // The CPU backend's emulated link is slow while the profile claims it is fast: measured
  // copy times pull the estimate down and the split up to every cached token. When the link
  // speeds up the estimate rises again. (Pacing makes the slow phase exact; the fast phase's
  // copies are short enough that thread wake-ups dominate, so only the direction is checked.)
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);

  GeneratorOptions o;
  o.max_batch = 1;
  o.kv_dtype = DType::F32;
  o.kv.mode = KvMode::Kvpr;
  o.kv.split_granularity = 1;
  o.kv.profile = profile(20.0, 50e-6, 1e-8);  // claims a fast link; 50 us to start a recompute
  Generator gen(model, tok, o);
  // 0.5 MB/s: 256 B of K+V per token per layer = 512 us, X's 128 B 256 us: recomputing every
  // token wins by a margin that a loaded machine (sanitizers, parallel tests) does not erase.
  be.set_emulated_link_gbps(0.0005);
  GenerationParams p;
  p.max_new_tokens = 30;
  p.ignore_eos = true;
  gen.add(std::vector<int32_t>(20, 9), p);
  double slow_estimate = 0, fast_estimate = 0;
  int step = 0;
  while (!gen.idle()) {
    if (step == 14) be.set_emulated_link_gbps(50.0);
    gen.step();
    const StepStats& st = gen.kv_runtime().last_step();
    if (step >= 4 && step < 14) {
      EXPECT_EQ(st.split_total, 20 + step - 1) << "slow link, step " << step;
    }
    if (step == 13) slow_estimate = st.link_gbps_estimate;
    fast_estimate = st.link_gbps_estimate;
    ++step;
  }
  EXPECT_LT(slow_estimate, 0.0025);
  EXPECT_GT(fast_estimate, 3 * slow_estimate);
}

TEST(SplitScheduler, OtherWorkLeavesOutWaitsForTheLink) {
  // A slow link and a recompute too slow to ever pay (1 s per token): every layer copies all of
  // its KV and the compute stream waits for it. The "other" device time the pipeline model
  // learns is the layer's own work, not those waits: were the waits counted, other + recompute
  // would always equal the link time and the split could never move.
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  KvRuntimeOptions o;
  o.mode = KvMode::Kvpr;
  o.kv_dtype = DType::F32;
  o.profile = profile(0.0002, 0, 1.0);
  auto kv = model.make_kv_runtime(1, 40, o);
  // 0.2 MB/s: a layer's KV of 27 tokens takes 35 ms, far above its compute even on a loaded machine.
  be.set_emulated_link_gbps(0.0002);
  std::vector<int32_t> toks(30, 9);
  Tensor logits = Tensor::host(DType::F32, {1, model.config().vocab_size});
  model.forward({ForwardChunk{toks.data(), 24, 0, 0}}, *kv, logits);
  for (int64_t t = 24; t < 28; ++t) model.forward({ForwardChunk{toks.data() + t, 1, t, 0}}, *kv, logits);
  EXPECT_EQ(kv->last_step().split_total, 0);
  const double link_s = 27.0 * 2 * model.config().hidden_size * 4 / 2e5;  // one layer's KV of the last step
  EXPECT_GT(kv->scheduler()->other_s(), 0);
  EXPECT_LT(kv->scheduler()->other_s(), 0.25 * link_s) << "link " << link_s;
}

TEST(Profiler, MeasuresTheEmulatedLink) {
  CpuBackend be;
  be.set_emulated_link_gbps(0.5);
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  ProfileOptions po;
  po.transfer_bytes = 2 << 20;  // 2 MiB at 0.5 GB/s: 4 ms per copy
  po.reps = 3;
  po.rows = {4, 16, 64};
  LinkProfile p = profile_backend(be, model, model.kv_shape(), DType::F32, po);
  // Pacing bounds the rate from above; a busy machine can only make it lower.
  for (double g : {p.h2d_alone_gbps, p.h2d_gbps, p.d2h_gbps}) {
    EXPECT_LE(g, 0.5 * 1.02);
    EXPECT_GT(g, 0.1);
  }
  EXPECT_GT(p.recompute_per_row_s, 0);
  EXPECT_EQ(p.gemm_points.as_array().size(), 3u);
}
