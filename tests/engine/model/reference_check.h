// A model fixture against its float64 reference (tests/scripts/make_*_fixtures.py): the logits of
// every position in one forward and through the cache one token at a time, and the greedy
// continuation of the first five ids.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/npy.h"
#include "engine/decode/generator.h"
#include "engine/model/model.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/test_util.h"

namespace kvpr::test {

// `model` (loaded from `dir`) against dir/logits.npy for dir/input_ids.npy: all positions in one
// forward, then a prefill of 5 and one token at a time at positions 5.. through the cache.
inline void expect_logits_match_reference(Model& model, const std::string& dir, double tolerance = 1e-4) {
  NpyArray ids = read_npy(dir + "/input_ids.npy");
  NpyArray ref = read_npy(dir + "/logits.npy");
  const int64_t T = static_cast<int64_t>(ids.values.size()), V = model.spec().vocab_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
  std::vector<int32_t> tokens(ids.values.begin(), ids.values.end());
  // Longrope: a sequence of T tokens turns by one set of factors, at every position.
  const bool long_rope = model.spec().long_rope_after > 0 && T > model.spec().long_rope_after;
  KvRuntimeOptions f32;
  f32.kv_dtype = DType::F32;
  const int64_t ctx = model.spec().max_position_embeddings;
  auto cache = model.make_kv_runtime(1, ctx, f32);
  Tensor logits = Tensor::host(DType::F32, {T, V});
  model.forward({ForwardChunk{tokens.data(), T, 0, 0, {}, false, long_rope}}, *cache, logits, /*all_positions=*/true);
  EXPECT_TRUE(close_rel(ref.values, logits.data_as<float>(), ref.values.size(), tolerance)) << dir << ": one forward";

  auto cache2 = model.make_kv_runtime(1, ctx, f32);
  Tensor rows5 = Tensor::host(DType::F32, {5, V});
  model.forward({ForwardChunk{tokens.data(), 5, 0, 0, {}, false, long_rope}}, *cache2, rows5, true);
  std::vector<float> got(rows5.data_as<float>(), rows5.data_as<float>() + 5 * V);
  Tensor one = Tensor::host(DType::F32, {1, V});
  for (int64_t t = 5; t < T; ++t) {
    model.forward({ForwardChunk{tokens.data() + t, 1, t, 0, {}, false, long_rope}}, *cache2, one);
    got.insert(got.end(), one.data_as<float>(), one.data_as<float>() + V);
  }
  EXPECT_TRUE(close_rel(ref.values, got.data(), got.size(), tolerance)) << dir << ": token by token";
}

// Greedy decoding of 8 tokens after the first 5 of dir/input_ids.npy gives dir/greedy.npy.
inline void expect_greedy_matches_reference(const std::string& dir, const Tokenizer& tok) {
  CpuBackend be;
  std::unique_ptr<Model> model = load_model(be, dir);
  NpyArray ids = read_npy(dir + "/input_ids.npy");
  NpyArray greedy = read_npy(dir + "/greedy.npy");
  std::vector<int32_t> prompt(ids.values.begin(), ids.values.begin() + 5);
  GeneratorOptions o;
  o.kv_dtype = DType::F32;
  GenerationParams p;
  p.max_new_tokens = 8;
  p.ignore_eos = true;
  auto r = Generator(*model, tok, o).generate_all({prompt}, p);
  EXPECT_EQ(r[0].tokens, std::vector<int32_t>(greedy.values.begin(), greedy.values.end())) << dir;
}

// Longrope's crossing, against dir/greedy.npy and dir/greedy_logprobs.npy: greedy decoding of 8
// tokens after the first 5 ids of dir/input_ids.npy passes the original context, where the
// reference turns the whole sequence by the long factors. In every KV mode on `backend` (kvpr's
// and auto's first 4 tokens recomputed from X), with 2-token blocks, the tokens and their
// log-probabilities are the reference's and the sequence is computed again once. Run twice on one
// generator, the second run finds blocks of both regimes in the prefix cache and gives the same.
inline void expect_longrope_crossing_matches_reference(Backend& backend, const std::string& dir, const Tokenizer& tok,
                                                       const std::string& label) {
  std::unique_ptr<Model> model = load_model(backend, dir);
  NpyArray ids = read_npy(dir + "/input_ids.npy");
  NpyArray greedy = read_npy(dir + "/greedy.npy");
  NpyArray logprobs = read_npy(dir + "/greedy_logprobs.npy");
  const std::vector<int32_t> prompt(ids.values.begin(), ids.values.begin() + 5);
  const std::vector<int32_t> want(greedy.values.begin(), greedy.values.end());
  ASSERT_GT(model->spec().long_rope_after, 5);
  ASSERT_LT(model->spec().long_rope_after, 13);
  GeneratorOptions o;
  o.kv_dtype = DType::F32;
  o.block_tokens = 2;
  GenerationParams p;
  p.max_new_tokens = 8;
  p.ignore_eos = true;
  for (KvMode m : kAllKvModes) {
    Generator g(*model, tok, in_mode(o, m, 4, *model));
    for (int run = 0; run < 2; ++run) {
      const std::string what = label + " " + kv_mode_name(m) + (run ? ", again" : "");
      auto r = g.generate_all({prompt}, p);
      EXPECT_EQ(r[0].tokens, want) << what;
      ASSERT_EQ(r[0].logprobs.size(), logprobs.values.size()) << what;
      for (size_t i = 0; i < logprobs.values.size(); ++i)
        EXPECT_NEAR(r[0].logprobs[i], logprobs.values[i], 1e-4) << what << ", token " << i;
      EXPECT_EQ(g.kv_block_stats().rope_recomputes, run + 1) << what;
    }
    // The second run's prompt (short factors) and its recompute at the crossing (long ones) each
    // found the first run's blocks of their regime.
    EXPECT_EQ(g.prefix_cache_stats().hits, 4) << label << " " << kv_mode_name(m);
  }
}

}  // namespace kvpr::test
