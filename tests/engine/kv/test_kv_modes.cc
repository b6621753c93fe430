// Every KV mode gives the same greedy tokens as resident and logits within tolerance, for
// batches of different lengths, random forced splits, and generations that cross the
// activation cap; the host store holds exactly what was computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <random>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/model/opt_model.h"
#include "tests/test_util.h"

using namespace kvpr;
namespace fs = std::filesystem;

namespace {

using test::char_tokenizer;

struct ModeRun {
  std::vector<std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<std::vector<float>>> logits;  // per request id, per step
  std::vector<StepStats> steps;
  std::vector<int64_t> groups;  // GPU batches of each step
};

// Prompts of different lengths; the third joins two steps later (continuous batching).
// `before_step`, when given, is called with the generator before each step.
ModeRun run(OptModel& model, const Tokenizer& tok, const GeneratorOptions& opts, int new_tokens = 10,
            const std::function<void(Generator&, int)>& before_step = {}) {
  ModeRun r;
  Generator gen(model, tok, opts);
  GenerationParams p;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  const int64_t V = model.config().vocab_size;
  auto obs = [&](uint64_t id, const float* row, int64_t) { r.logits[id].emplace_back(row, row + V); };
  std::vector<uint64_t> ids = {gen.add({5, 17, 33, 2, 80, 41, 9}, p), gen.add({60, 61}, p)};
  for (int s = 0; !gen.idle(); ++s) {
    if (s == 2) ids.push_back(gen.add({7, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, p));
    if (before_step) before_step(gen, s);
    gen.step(obs);
    r.steps.push_back(gen.kv_runtime().last_step());
    r.groups.push_back(gen.kv_runtime().groups());
  }
  for (uint64_t id : ids) r.tokens.push_back(gen.take_result(id).tokens);
  return r;
}

GeneratorOptions options(KvMode mode, DType kv, std::optional<int64_t> split = std::nullopt, int64_t cap = -1,
                         int64_t gpu_batches = 1) {
  GeneratorOptions o;
  o.kv.gpu_batches = gpu_batches;
  o.max_batch = 3;
  o.kv_dtype = kv;
  o.kv.mode = mode;
  o.kv.forced_split = split;
  o.kv.activation_cap = cap;
  o.kv.host_attention_threads = 2;
  return o;
}

void expect_same(const ModeRun& ref, const ModeRun& got, double tol, const std::string& what) {
  ASSERT_EQ(ref.tokens, got.tokens) << what;
  for (const auto& [id, rows] : ref.logits) {
    const auto& mine = got.logits.at(id);
    ASSERT_EQ(rows.size(), mine.size());
    for (size_t s = 0; s < rows.size(); ++s) {
      std::vector<double> r(rows[s].begin(), rows[s].end());
      EXPECT_TRUE(test::close_rel(r, mine[s].data(), r.size(), tol)) << what << " request " << id << " step " << s;
    }
  }
}

// The fixture's model with its layers' weights streamed from pinned host memory (--weights host).
OptModel streamed_model(Backend& be, const std::string& dir) {
  ModelLoadOptions lo;
  lo.stream_weights = true;
  return OptModel(be, dir, lo);
}

class KvModes : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(KvModes, EveryModeMatchesResident) {
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path(std::string("opt/") + GetParam()));
  Tokenizer tok = char_tokenizer(tmp, 96);
  ModeRun ref = run(model, tok, options(KvMode::Resident, DType::F32));
  expect_same(ref, run(model, tok, options(KvMode::Offload, DType::F32)), 1e-5, "offload");
  expect_same(ref, run(model, tok, options(KvMode::Recompute, DType::F32)), 1e-5, "recompute");
  expect_same(ref, run(model, tok, options(KvMode::CpuAttn, DType::F32)), 1e-5, "cpu-attn");
  std::mt19937 rng(std::hash<std::string>{}(GetParam()));
  for (int trial = 0; trial < 4; ++trial) {
    int64_t split = std::uniform_int_distribution<int64_t>(0, 20)(rng);
    ModeRun k = run(model, tok, options(KvMode::Kvpr, DType::F32, split));
    expect_same(ref, k, 1e-5, "kvpr split " + std::to_string(split));
    // The split used never exceeds what is cached.
    for (const auto& st : k.steps)
      for (int64_t l : st.split) EXPECT_LE(l, split);
  }
}

// A worker moved to another cpuset between steps (kvpr-bench scale's phases): cpu-attn's host
// attention on a new number of threads gives the same results.
TEST_P(KvModes, HostAttentionThreadsChangeBetweenSteps) {
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path(std::string("opt/") + GetParam()));
  Tokenizer tok = char_tokenizer(tmp, 96);
  const ModeRun ref = run(model, tok, options(KvMode::CpuAttn, DType::F32));
  const ModeRun moved = run(model, tok, options(KvMode::CpuAttn, DType::F32), 10, [](Generator& g, int s) {
    if (s == 1 || s == 4) g.kv_runtime().set_host_attention_threads(s == 1 ? 1 : 3);
  });
  expect_same(ref, moved, 1e-6, "cpu-attn on 2, then 1, then 3 threads");
  // The other modes have no host attention: a no-op; zero threads is an error.
  const ModeRun off = run(model, tok, options(KvMode::Offload, DType::F32), 10,
                          [](Generator& g, int s) { if (s == 1) g.kv_runtime().set_host_attention_threads(1); });
  expect_same(run(model, tok, options(KvMode::Offload, DType::F32)), off, 0, "offload");
  Generator g(model, tok, options(KvMode::CpuAttn, DType::F32));
  EXPECT_THROW(g.kv_runtime().set_host_attention_threads(0), Error);
}

TEST_P(KvModes, ActivationCapIsCrossed) {
  // X is kept for the first 6 tokens only: recompute covers l = min(s', 6), the rest is copied.
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path(std::string("opt/") + GetParam()));
  Tokenizer tok = char_tokenizer(tmp, 96);
  ModeRun ref = run(model, tok, options(KvMode::Resident, DType::F32), 14);
  ModeRun rec = run(model, tok, options(KvMode::Recompute, DType::F32, std::nullopt, 6), 14);
  expect_same(ref, rec, 1e-5, "recompute cap 6");
  for (const auto& st : rec.steps)
    for (int64_t l : st.split) EXPECT_LE(l, 6);
  EXPECT_EQ(rec.steps.back().split_total, 6);  // every sequence still running is past the cap
  expect_same(ref, run(model, tok, options(KvMode::Kvpr, DType::F32, 9, 6), 14), 1e-5, "kvpr split 9 cap 6");
}

TEST_P(KvModes, HalfPrecisionStorageKeepsGreedyTokens) {
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path(std::string("opt/") + GetParam()));
  Tokenizer tok = char_tokenizer(tmp, 96);
  ModeRun ref = run(model, tok, options(KvMode::Resident, DType::F16));
  // Recomputing K from fp16-stored X rounds differently from storing fp16 K: tokens agree,
  // logits to fp16 precision.
  for (KvMode m : {KvMode::Offload, KvMode::Recompute, KvMode::CpuAttn})
    expect_same(ref, run(model, tok, options(m, DType::F16)), m == KvMode::Recompute ? 1e-2 : 1e-5, kv_mode_name(m));
  expect_same(ref, run(model, tok, options(KvMode::Kvpr, DType::F16, 4)), 1e-2, "kvpr f16");
}

TEST_P(KvModes, StreamedWeightsGiveTheSameResults) {
  // The layers' weights in pinned host memory, streamed a layer ahead (--weights host): every
  // KV mode gives the tokens and logits of resident KV with the weights on the device.
  test::TempDir tmp;
  CpuBackend be;
  const std::string dir = test::data_path(std::string("opt/") + GetParam());
  OptModel resident(be, dir);
  OptModel streamed = streamed_model(be, dir);
  ASSERT_NE(streamed.weight_stream(), nullptr);
  EXPECT_EQ(resident.weight_stream(), nullptr);
  EXPECT_EQ(streamed.parameter_count(), resident.parameter_count());
  EXPECT_EQ(streamed.weight_bytes(), resident.weight_bytes());
  Tokenizer tok = char_tokenizer(tmp, 96);
  ModeRun ref = run(resident, tok, options(KvMode::Resident, DType::F32));
  for (KvMode m : {KvMode::Resident, KvMode::Offload, KvMode::Recompute, KvMode::CpuAttn})
    expect_same(ref, run(streamed, tok, options(m, DType::F32)), 1e-6, std::string("streamed ") + kv_mode_name(m));
  expect_same(ref, run(streamed, tok, options(KvMode::Kvpr, DType::F32, 5)), 1e-5, "streamed kvpr split 5");
  // What crossed the link: the KV of offload plus, every step, the layers that were not still
  // in a slot.
  ModeRun off = run(resident, tok, options(KvMode::Offload, DType::F32));
  ModeRun off_streamed = run(streamed, tok, options(KvMode::Offload, DType::F32));
  ASSERT_EQ(off.steps.size(), off_streamed.steps.size());
  for (size_t s = 0; s < off.steps.size(); ++s) {
    EXPECT_EQ(off.steps[s].weight_h2d_bytes, 0);
    EXPECT_EQ(off_streamed.steps[s].h2d_bytes - off_streamed.steps[s].weight_h2d_bytes, off.steps[s].h2d_bytes);
  }
}

// Paged KV: every mode gives the contiguous layout's tokens and logits (one block per sequence,
// as the store was before blocks) at blocks of 1 token, 16 tokens, and 5 (a size dividing none
// of the prompts, so chunks and runs start and end inside blocks), and with the activation cap
// (X kept for the first tokens only) crossed inside a block.
TEST_P(KvModes, PagedBlocksGiveTheContiguousResults) {
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path(std::string("opt/") + GetParam()));
  Tokenizer tok = char_tokenizer(tmp, 96);
  auto with_blocks = [](GeneratorOptions o, int64_t bt) {
    o.block_tokens = bt;
    return o;
  };
  const int64_t whole = model.spec().max_position_embeddings;
  ModeRun ref = run(model, tok, with_blocks(options(KvMode::Resident, DType::F32), whole));
  for (int64_t bt : {1, 16, 5}) {
    const std::string at = " at blocks of " + std::to_string(bt);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::Resident, DType::F32), bt)), 1e-5, "resident" + at);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::Offload, DType::F32), bt)), 1e-5, "offload" + at);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::Recompute, DType::F32), bt)), 1e-5, "recompute" + at);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::CpuAttn, DType::F32), bt)), 1e-5, "cpu-attn" + at);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::Kvpr, DType::F32, 6), bt)), 1e-5, "kvpr" + at);
    expect_same(ref, run(model, tok, with_blocks(options(KvMode::Kvpr, DType::F32, 20, 9), bt)), 1e-5,
                "kvpr, X for 9 tokens" + at);
  }
}

// kv mode auto: resident's tokens and logits at every GPU budget (none, two blocks, half of what
// the run's sequences need, all), at blocks of 4 and 5 tokens, with the third sequence joining
// mid-run and the first two leaving before it, the split forced or the scheduler's, in two GPU
// batches, with streamed weights, and with fp16 and fp8 storage. No budget moves what kvpr
// moves; a budget holding everything moves no KV over the link.
TEST_P(KvModes, AutoGivesResidentResultsAtEveryBudget) {
  test::TempDir tmp;
  CpuBackend be;
  const std::string dir = test::data_path(std::string("opt/") + GetParam());
  OptModel model(be, dir);
  Tokenizer tok = char_tokenizer(tmp, 96);
  auto in_auto = [&](GeneratorOptions o, int64_t bt, double blocks) {
    o.block_tokens = bt;
    KvRuntimeOptions kv = o.kv;
    kv.kv_dtype = *o.kv_dtype;
    if (blocks < 0) {
      o.kv.gpu_kv_fraction = 1;
    } else {
      o.kv.gpu_kv_fraction = -1;
      o.kv.gpu_kv_bytes = blocks * KvRuntime::device_block_bytes(model.kv_shape(), KvLayout{1, bt, bt}, kv);
    }
    return o;
  };
  LinkProfile profile;  // a slow link: the scheduler recomputes
  profile.h2d_gbps = 0.01;
  profile.recompute_per_row_s = 1e-9;
  for (DType dt : {DType::F32, DType::F16, DType::F8E4M3}) {
    const ModeRun ref = run(model, tok, options(KvMode::Resident, dt));
    for (int64_t bt : {4, 5}) {
      // The run's sequences hold 17, 12 and 22 tokens.
      const int64_t need = (17 + bt - 1) / bt + (12 + bt - 1) / bt + (22 + bt - 1) / bt;
      const std::string at = std::string(dtype_name(dt)) + ", blocks of " + std::to_string(bt);
      // fp32: a split recomputes (the same greedy tokens, logits to 1e-5); the others copy
      // every staged row (bit for bit what resident stores).
      const int64_t split = dt == DType::F32 ? 6 : 0;
      const ModeRun kvpr = run(model, tok, [&] {
        GeneratorOptions o = options(KvMode::Kvpr, dt, split);
        o.block_tokens = bt;
        return o;
      }());
      for (double blocks : {0.0, 2.0, static_cast<double>(need / 2), -1.0}) {
        const std::string what = "auto, " + at + ", " + (blocks < 0 ? std::string("all") : std::to_string(int(blocks))) + " device blocks";
        const ModeRun a = run(model, tok, in_auto(options(KvMode::Auto, dt, split), bt, blocks));
        expect_same(ref, a, dt == DType::F32 ? 1e-5 : 1e-6, what);
        int64_t resident = 0, promoted = 0;
        for (size_t s = 0; s < a.steps.size(); ++s) {
          resident += a.steps[s].resident_tokens;
          promoted += a.steps[s].promoted_blocks;
          EXPECT_LE(a.steps[s].h2d_bytes, kvpr.steps[s].h2d_bytes) << what << " step " << s;
          if (blocks == 0) {
            EXPECT_EQ(a.steps[s].h2d_bytes, kvpr.steps[s].h2d_bytes) << what << " step " << s;
          } else if (blocks < 0) {
            EXPECT_EQ(a.steps[s].h2d_bytes, 0) << what << " step " << s;
            EXPECT_EQ(a.steps[s].staged_tokens, 0) << what << " step " << s;
          }
        }
        if (blocks == 0) {
          EXPECT_EQ(resident, 0) << what;
        } else {
          EXPECT_GT(resident, 0) << what;
        }
        if (blocks == 2) {
          EXPECT_GT(promoted, 0) << what << ": blocks freed by the first two go to the third's head";
        }
      }
    }
  }
  // The scheduler's split, two GPU batches, streamed weights.
  const ModeRun ref = run(model, tok, options(KvMode::Resident, DType::F32));
  GeneratorOptions sched = in_auto(options(KvMode::Auto, DType::F32), 4, 5);
  sched.kv.profile = profile;
  sched.kv.adapt = false;
  const ModeRun s = run(model, tok, sched);
  expect_same(ref, s, 1e-5, "auto, the scheduler's split");
  int64_t recomputed = 0;
  for (const auto& st : s.steps) {
    recomputed += st.split_total;
    EXPECT_EQ(st.split_source, "scheduler:paper");  // not adapting: no measured device time
  }
  EXPECT_GT(recomputed, 0) << "on a slow link the scheduler recomputes staged tokens";
  expect_same(ref, run(model, tok, in_auto(options(KvMode::Auto, DType::F32, 3, -1, 2), 4, 5)), 1e-5, "auto, 2 GPU batches");
  OptModel streamed = streamed_model(be, dir);
  expect_same(ref, run(streamed, tok, in_auto(options(KvMode::Auto, DType::F32, 3, -1, 2), 4, 5)), 1e-5,
              "auto, streamed weights, 2 GPU batches");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvModes,
                         ::testing::Values("pre_ln_safetensors", "post_ln_proj_sharded", "fp16_bin_sharded"),
                         [](const auto& p) { return std::string(p.param); });

// A cache larger than the memory it would live in is refused before anything is allocated, with
// its size and the settings that change it (2^30 sequences: 32 TiB in every mode).
TEST(KvRuntime, ACacheThatCannotFitIsRefusedByItsSize) {
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  for (KvMode m : {KvMode::Resident, KvMode::Offload, KvMode::Kvpr, KvMode::Auto}) {
    KvRuntimeOptions o;
    o.kv_dtype = DType::F32;
    o.mode = m;
    o.forced_split = 0;
    try {
      model.make_kv_runtime(int64_t{1} << 30, 64, o);
      ADD_FAILURE() << kv_mode_name(m);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("the KV cache of 1073741824 sequences x 64 tokens (kv mode " + std::string(kv_mode_name(m)) +
                         ") needs "), std::string::npos) << msg;
      EXPECT_NE(msg.find(m == KvMode::Resident ? "GiB of memory" : "GiB of pinned host memory"), std::string::npos) << msg;
      EXPECT_NE(msg.find("lower kv-cache, max-batch or max-seq-len"), std::string::npos) << msg;
    }
  }
  EXPECT_NE(host_bytes_available(), 0u);
}

TEST(KvRuntime, HostStoreHoldsTheComputedKeysValuesAndInputs) {
  // After a prefill in offload/kvpr mode, the host store equals what the resident cache
  // computed, row for row; X equals the layer input (checked through recomputation).
  test::TempDir tmp;
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  const OptConfig& c = model.config();
  std::vector<int32_t> toks = {3, 14, 15, 92, 65, 35, 8, 9};
  KvRuntimeOptions o;
  o.kv_dtype = DType::F32;
  o.mode = KvMode::Kvpr;
  o.forced_split = 3;
  auto kv = model.make_kv_runtime(2, 32, o);
  Tensor logits = Tensor::host(DType::F32, {1, c.vocab_size});
  model.forward({ForwardChunk{toks.data(), 8, 0, 1}}, *kv, logits);
  model.forward({ForwardChunk{toks.data(), 1, 8, 1}}, *kv, logits);  // append one token
  be.synchronize();
  const HostKvStore* store = kv->host_store();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->x_capacity(), 32);
  // Recompute every layer's K from the stored X and compare with the stored K.
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Tensor x = store->x(l, 1).rows(0, 9);
    Tensor kvp = Tensor::host(DType::F32, {2, 9, c.hidden_size});
    Tensor k = kvp.rows(0, 1).reshape({9, c.hidden_size}), v = kvp.rows(1, 1).reshape({9, c.hidden_size});
    model.project_kv(l, x, kvp, Tensor());
    std::vector<double> stored_k(9 * c.hidden_size), stored_v(9 * c.hidden_size);
    for (int64_t i = 0; i < 9 * c.hidden_size; ++i) {
      stored_k[i] = store->k(l, 1).data_as<float>()[i];
      stored_v[i] = store->v(l, 1).data_as<float>()[i];
    }
    EXPECT_TRUE(test::close_rel(stored_k, k.data_as<float>(), stored_k.size(), 1e-5)) << "layer " << l;
    EXPECT_TRUE(test::close_rel(stored_v, v.data_as<float>(), stored_v.size(), 1e-5)) << "layer " << l;
  }
  // Slot 0 was never used: still zero.
  for (int64_t i = 0; i < 8 * c.hidden_size; ++i) ASSERT_EQ(store->k(0, 0).data_as<float>()[i], 0.f);
  // Bytes: K, V and X in F32 for every layer.
  EXPECT_EQ(kv->host_bytes_per_token(), c.num_layers * 3 * c.hidden_size * 4);
  EXPECT_EQ(store->bytes(), static_cast<size_t>(2 * 32 * kv->host_bytes_per_token()));
}

// kv mode auto after a step that failed part way (begun, a layer prepared, never ended): the
// next step drops the device tier's mirrors, stages every token from the host store, promotes
// them back, and gives resident's logits.
TEST(KvRuntime, AutoRecoversFromAStepThatFailedPartWay) {
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> toks = {3, 14, 15, 92, 65, 35, 8, 9, 79, 32, 38, 46, 26, 43};
  const std::vector<int32_t> table = {5, 1, 7, 2};
  const KvLayout layout{8, 4, 32};
  auto logits_of = [&](KvMode m, bool abort) {
    KvRuntimeOptions o;
    o.kv_dtype = DType::F32;
    o.mode = m;
    if (m == KvMode::Auto) {
      o.forced_split = 0;
      o.gpu_kv_fraction = 1;
    }
    auto kv = model.make_kv_runtime(layout, o);
    Tensor logits = Tensor::host(DType::F32, {1, V});
    model.forward({ForwardChunk{toks.data(), 12, 0, 0, table}}, *kv, logits);
    model.forward({ForwardChunk{toks.data() + 12, 1, 12, 0, table}}, *kv, logits);
    if (abort) {
      EXPECT_EQ(kv->device_tier()->mirrored(), 4);
      kv->begin({ForwardChunk{toks.data() + 13, 1, 13, 0, table}});
      kv->prepare(0, 0);
    }
    model.forward({ForwardChunk{toks.data() + 13, 1, 13, 0, table}}, *kv, logits);
    be.synchronize();
    if (abort) {
      EXPECT_EQ(kv->last_step().staged_tokens, 13) << "every mirror dropped";
      EXPECT_EQ(kv->last_step().promoted_blocks, 4) << "and the staged blocks promoted back";
    }
    return std::vector<float>(logits.data_as<float>(), logits.data_as<float>() + V);
  };
  const std::vector<float> want = logits_of(KvMode::Resident, false);
  const std::vector<float> got = logits_of(KvMode::Auto, true);
  EXPECT_TRUE(test::close_rel(std::vector<double>(want.begin(), want.end()), got.data(), got.size(), 1e-5));
}

TEST(KvRuntime, BytesMovedFollowTheSplit) {
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  const OptConfig& c = model.config();
  std::vector<int32_t> toks(20, 11);
  for (int64_t split : {0, 8, 20}) {
    KvRuntimeOptions o;
    o.kv_dtype = DType::F16;
    o.mode = KvMode::Kvpr;
    o.forced_split = split;
    auto kv = model.make_kv_runtime(1, 32, o);
    Tensor logits = Tensor::host(DType::F32, {1, c.vocab_size});
    model.forward({ForwardChunk{toks.data(), 20, 0, 0}}, *kv, logits);
    model.forward({ForwardChunk{toks.data(), 1, 20, 0}}, *kv, logits);
    const StepStats& st = kv->last_step();
    EXPECT_EQ(st.split_total, split);
    EXPECT_EQ(st.split_source, "forced");
    // Per layer: X[0:l] (h·2 bytes/token) + K and V of the rest (2·h·2 bytes/token).
    int64_t want = c.num_layers * (split * c.hidden_size * 2 + (20 - split) * 2 * c.hidden_size * 2);
    EXPECT_EQ(st.h2d_bytes, want) << "split " << split;
    // Stored: the new token's K, V and X.
    EXPECT_EQ(st.d2h_bytes, c.num_layers * 3 * c.hidden_size * 2);
  }
}

TEST_P(KvModes, GpuBatchesColumnByColumnGiveTheSameResults) {
  // The step's sequences in 2 or 3 GPU batches, each through a layer before the next layer:
  // every mode gives resident's tokens and logits; the same KV crosses the link, and with
  // streamed weights each layer's weights still cross once per step.
  test::TempDir tmp;
  CpuBackend be;
  const std::string dir = test::data_path(std::string("opt/") + GetParam());
  OptModel model(be, dir);
  OptModel streamed = streamed_model(be, dir);
  Tokenizer tok = char_tokenizer(tmp, 96);
  ModeRun ref = run(model, tok, options(KvMode::Resident, DType::F32));
  ModeRun off1 = run(model, tok, options(KvMode::Offload, DType::F32));
  ModeRun wh1 = run(streamed, tok, options(KvMode::Offload, DType::F32));
  for (int64_t G : {2, 3}) {
    const std::string g = ", " + std::to_string(G) + " GPU batches";
    for (KvMode m : {KvMode::Resident, KvMode::Offload, KvMode::Recompute, KvMode::CpuAttn})
      expect_same(ref, run(model, tok, options(m, DType::F32, std::nullopt, -1, G)), 1e-6, kv_mode_name(m) + g);
    ModeRun k = run(model, tok, options(KvMode::Kvpr, DType::F32, 5, -1, G));
    expect_same(ref, k, 1e-5, "kvpr split 5" + g);
    ModeRun off = run(model, tok, options(KvMode::Offload, DType::F32, std::nullopt, -1, G));
    ModeRun wh = run(streamed, tok, options(KvMode::Offload, DType::F32, std::nullopt, -1, G));
    EXPECT_EQ(off.groups.front(), 2) << g;  // two sequences, then three
    EXPECT_EQ(*std::max_element(off.groups.begin(), off.groups.end()), G) << g;
    expect_same(ref, wh, 1e-6, "streamed weights, offload" + g);
    expect_same(ref, run(streamed, tok, options(KvMode::Kvpr, DType::F32, 4, -1, G)), 1e-5, "streamed kvpr" + g);
    ASSERT_EQ(off.steps.size(), off1.steps.size());
    for (size_t s = 0; s < off.steps.size(); ++s) {
      EXPECT_EQ(off.steps[s].h2d_bytes, off1.steps[s].h2d_bytes) << "step " << s << g;
      EXPECT_EQ(off.steps[s].d2h_bytes, off1.steps[s].d2h_bytes) << "step " << s << g;
      EXPECT_EQ(wh.steps[s].weight_h2d_bytes, wh1.steps[s].weight_h2d_bytes) << "step " << s << g;
      EXPECT_EQ(wh.steps[s].h2d_bytes, wh1.steps[s].h2d_bytes) << "step " << s << g;
    }
  }
}

TEST(KvRuntime, GpuBatchesBalanceContextTokens) {
  // Contexts of 10, 10, 10, 10 and 40 tokens in two GPU batches: the first four together (40)
  // and the long one alone (40), not two and three sequences (20 and 60). More batches than
  // sequences: one per sequence.
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  KvRuntimeOptions o;
  o.mode = KvMode::Offload;
  o.kv_dtype = DType::F32;
  o.gpu_batches = 2;
  std::vector<int32_t> tok = {7};
  std::vector<ForwardChunk> chunks;
  int64_t slot = 0;
  for (int64_t past : {9, 9, 9, 9, 39}) chunks.push_back(ForwardChunk{tok.data(), 1, past, slot++});
  auto kv = model.make_kv_runtime(5, 64, o);
  kv->begin(chunks);
  ASSERT_EQ(kv->groups(), 2);
  EXPECT_EQ(kv->group_rows(0).begin, 0);
  EXPECT_EQ(kv->group_rows(0).count, 4);
  EXPECT_EQ(kv->group_rows(1).begin, 4);
  EXPECT_EQ(kv->group_rows(1).count, 1);
  o.gpu_batches = 8;
  auto kv8 = model.make_kv_runtime(5, 64, o);
  kv8->begin({chunks.begin(), chunks.begin() + 3});
  ASSERT_EQ(kv8->groups(), 3);
  for (int64_t g = 0; g < 3; ++g) EXPECT_EQ(kv8->group_rows(g).begin, g);
  be.synchronize();
}

TEST(WeightStream, EveryLayerCountCopiesEachLayerOncePerStep) {
  // Random OPT models of 1, 2, 3 and 5 layers, weights on the device and streamed, same seed:
  // the same logits. Two slots hold two layers, so models of one or two layers never copy
  // after loading; larger ones copy every layer once per step (the next step's layer 0 during
  // the last layer), whichever slot parity the step starts in.
  CpuBackend be;
  for (int64_t layers : {1, 2, 3, 5}) {
    OptConfig c;
    c.vocab_size = 64;
    c.max_position_embeddings = 64;
    c.hidden_size = 32;
    c.num_heads = 4;
    c.ffn_dim = 48;
    c.word_embed_proj_dim = 32;
    c.num_layers = layers;
    OptModel dev(be, c, DType::F16, 7);
    ModelLoadOptions streamed;
    streamed.stream_weights = true;
    OptModel host(be, c, DType::F16, 7, streamed);
    LayerWeightStream* ws = host.weight_stream();
    ASSERT_NE(ws, nullptr);
    ASSERT_EQ(ws->layers(), layers);
    // Per layer: Q/K/V, out_proj, fc1, fc2 in F16, each on a 256-byte boundary.
    const size_t per_layer = 3 * 32 * 32 * 2 + 32 * 32 * 2 + 48 * 32 * 2 + 32 * 48 * 2;
    EXPECT_EQ(ws->layer_bytes(0), per_layer);
    EXPECT_EQ(ws->host_bytes(), per_layer * static_cast<size_t>(layers));
    EXPECT_EQ(host.device_weight_bytes(), dev.weight_bytes() - per_layer * static_cast<size_t>(layers) + 2 * per_layer);
    for (KvMode m : {KvMode::Resident, KvMode::Offload}) {
      KvRuntimeOptions o;
      o.mode = m;
      auto kd = dev.make_kv_runtime(2, 32, o), kh = host.make_kv_runtime(2, 32, o);
      std::vector<int32_t> a = {3, 9, 27, 17, 51, 25, 40, 2}, b = {8, 1, 60};
      Tensor la = Tensor::host(DType::F32, {2, c.vocab_size}), lb = Tensor::host(DType::F32, {2, c.vocab_size});
      for (int step = 0; step < 5; ++step) {
        std::vector<ForwardChunk> chunks =
            step == 0 ? std::vector<ForwardChunk>{{a.data(), 3, 0, 0}, {b.data(), 2, 0, 1}}
                      : std::vector<ForwardChunk>{{a.data() + step + 2, 1, step + 2, 0}, {b.data(), 1, step + 1, 1}};
        dev.forward(chunks, *kd, la);
        host.forward(chunks, *kh, lb);
        for (int64_t i = 0; i < la.numel(); ++i)
          ASSERT_EQ(la.data_as<float>()[i], lb.data_as<float>()[i])
              << layers << " layers, " << kv_mode_name(m) << ", step " << step << ", logit " << i;
        const int64_t copied = kh->last_step().weight_h2d_bytes;
        if (layers <= 2) {
          EXPECT_EQ(copied, 0) << layers << " layers, step " << step;
        } else if (step > 0 || m == KvMode::Offload) {  // the very first step found layers 0 and 1 loaded
          EXPECT_EQ(copied, static_cast<int64_t>(ws->host_bytes())) << layers << " layers, step " << step;
        }
        EXPECT_EQ(kd->last_step().weight_h2d_bytes, 0);
      }
    }
  }
}

// Pinned host memory that counts its allocations.
class CountingAllocator : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    ++allocations;
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p, size_t) override { std::free(p); }
  std::string describe() const override { return "counting"; }
  int allocations = 0;
};

// A CPU backend whose allocations are seen: device bytes in use, pinned allocations counted.
struct CountingBackend {
  CountingBackend() { be.set_host_allocator(pinned); }
  bool allocated() const { return be.device_bytes_in_use() > 0 || pinned->allocations > 0; }
  CpuBackend be;
  std::shared_ptr<CountingAllocator> pinned = std::make_shared<CountingAllocator>();
};

TEST(WeightStream, APlanPastHostMemoryIsRefusedBeforeAnythingIsAllocated) {
  // A KV cache no host holds (2^30 sequences), given to the load as the plan the generator will
  // make: loading a checkpoint (streamed or not) and making random weights both refuse it
  // before their first allocation, naming the weights and the KV cache; the plan's callback
  // sees the model's spec and the checkpoint's weight dtype. A plan that fits loads as before.
  const std::string dir = test::data_path("opt/pre_ln_safetensors");
  const OptConfig config = OptConfig::load(dir);
  for (bool stream : {false, true}) {
    CountingBackend cb;
    ModelLoadOptions lo;
    lo.stream_weights = stream;
    ModelSpec seen;
    DType seen_dtype = DType::U8;
    lo.kv_plan = [&](const ModelSpec& spec, DType weight_dtype, const Backend&, double) {
      seen = spec;
      seen_dtype = weight_dtype;
      GeneratorOptions go;
      go.kv_cache_bytes = 1e18;  // (a size given is taken as given; a default one is sized by memory)
      go.kv.mode = KvMode::Offload;
      return Generator::kv_plan(go, spec, weight_dtype);
    };
    try {
      OptModel model(cb.be, dir, lo);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("the weights need "), std::string::npos) << msg;  // the CPU backend's device is the host
      EXPECT_NE(msg.find("GiB and the KV cache of 2147483647 blocks x 16 tokens (room for "), std::string::npos) << msg;
      EXPECT_NE(msg.find(" tokens, kv mode offload) "), std::string::npos) << msg;
      EXPECT_NE(msg.find("GiB of host memory, "), std::string::npos) << msg;
      EXPECT_NE(msg.find("lower kv-cache, max-batch or max-seq-len"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    EXPECT_FALSE(cb.allocated()) << "stream " << stream;
    EXPECT_EQ(seen.num_layers, config.num_layers);
    EXPECT_EQ(seen.hidden_size, config.hidden_size);
    EXPECT_EQ(seen_dtype, DType::F32);  // the fixture's dtype

    lo.kv_plan = [](const ModelSpec& spec, DType weight_dtype, const Backend&, double) {
      GeneratorOptions go;
      go.max_batch = 2;
      return Generator::kv_plan(go, spec, weight_dtype);
    };
    OptModel model(cb.be, dir, lo);
    EXPECT_TRUE(cb.allocated());
    EXPECT_EQ(cb.pinned->allocations > 0, stream);
    EXPECT_EQ(model.weight_stream() != nullptr, stream);
  }
  OptConfig big = config;
  big.num_layers = 3;
  CountingBackend cb;
  ModelLoadOptions lo;
  lo.stream_weights = true;
  lo.kv_plan = [](const ModelSpec& spec, DType weight_dtype, const Backend&, double) {
    GeneratorOptions go;
    go.kv_cache_bytes = 1e18;
    go.kv.mode = KvMode::Recompute;
    return Generator::kv_plan(go, spec, weight_dtype);
  };
  EXPECT_THROW(OptModel(cb.be, big, DType::F16, 7, lo), Error);
  EXPECT_FALSE(cb.allocated());
}

TEST(WeightStream, SchedulerCountsTheWeightsOnTheLink) {
  // The KVPR scheduler of a streamed model adds a layer's weight bytes to the link time.
  CpuBackend be;
  ModelLoadOptions lo;
  lo.stream_weights = true;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"), lo);
  KvRuntimeOptions o;
  o.mode = KvMode::Kvpr;
  o.profile = LinkProfile{};
  o.profile->h2d_gbps = o.profile->h2d_alone_gbps = o.profile->d2h_gbps = 1;
  auto kv = model.make_kv_runtime(1, 16, o);
  EXPECT_DOUBLE_EQ(kv->scheduler()->fixed_link_bytes(),
                   static_cast<double>(model.weight_stream()->host_bytes()) / model.config().num_layers);
}

TEST(KvRuntime, KvprWithoutProfileOrSplitIsAnError) {
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  KvRuntimeOptions o;
  o.mode = KvMode::Kvpr;
  try {
    model.make_kv_runtime(1, 16, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a link profile"), std::string::npos);
  }
}

TEST(KvRuntime, FirstLayerGetsItsOwnSplitWhenItPays) {
  // The link is slow but the rest of each layer's work takes long enough to hide it: the
  // pipeline model moves everything for layers 1.., while layer 0, whose copies nothing
  // overlaps, recomputes (the paper's model). Results stay equal to resident.
  CpuBackend be;
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  const OptConfig& c = model.config();
  LinkProfile p;
  p.h2d_gbps = p.h2d_alone_gbps = p.d2h_gbps = 0.001;  // 1 MB/s
  p.recompute_fixed_s = 0;
  p.recompute_per_row_s = 1e-9;
  KvRuntimeOptions o;
  o.kv_dtype = DType::F32;
  o.mode = KvMode::Kvpr;
  o.profile = p;
  o.split_granularity = 1;
  o.adapt = false;
  auto kv = model.make_kv_runtime(1, 32, o);
  kv->scheduler()->observe_other(10.0);  // 10 s of other work per layer: the link is hidden
  KvRuntimeOptions r;
  r.kv_dtype = DType::F32;
  auto resident = model.make_kv_runtime(1, 32, r);
  std::vector<int32_t> toks = {4, 8, 15, 16, 23, 42, 7, 9};
  Tensor a = Tensor::host(DType::F32, {1, c.vocab_size}), b = Tensor::host(DType::F32, {1, c.vocab_size});
  model.forward({ForwardChunk{toks.data(), 7, 0, 0}}, *kv, a);
  model.forward({ForwardChunk{toks.data(), 7, 0, 0}}, *resident, b);
  model.forward({ForwardChunk{toks.data() + 7, 1, 7, 0}}, *kv, a);
  model.forward({ForwardChunk{toks.data() + 7, 1, 7, 0}}, *resident, b);
  const StepStats& st = kv->last_step();
  EXPECT_EQ(st.split_source, "scheduler:pipeline");
  EXPECT_EQ(st.split_total, 0);
  EXPECT_EQ(st.split_total_layer0, 7);
  // Layer 0 moves X of 7 tokens; the other layer moves K and V of 7 tokens.
  EXPECT_EQ(st.h2d_bytes, 7 * c.hidden_size * 4 + 7 * 2 * c.hidden_size * 4);
  std::vector<double> ref(b.data_as<float>(), b.data_as<float>() + c.vocab_size);
  EXPECT_TRUE(test::close_rel(ref, a.data_as<float>(), ref.size(), 1e-5));
}
