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
  KvRuntimeOptions f32;
  f32.kv_dtype = DType::F32;
  const int64_t ctx = model.spec().max_position_embeddings;
  auto cache = model.make_kv_runtime(1, ctx, f32);
  Tensor logits = Tensor::host(DType::F32, {T, V});
  model.forward({ForwardChunk{tokens.data(), T, 0, 0}}, *cache, logits, /*all_positions=*/true);
  EXPECT_TRUE(close_rel(ref.values, logits.data_as<float>(), ref.values.size(), tolerance)) << dir << ": one forward";

  auto cache2 = model.make_kv_runtime(1, ctx, f32);
  Tensor rows5 = Tensor::host(DType::F32, {5, V});
  model.forward({ForwardChunk{tokens.data(), 5, 0, 0}}, *cache2, rows5, true);
  std::vector<float> got(rows5.data_as<float>(), rows5.data_as<float>() + 5 * V);
  Tensor one = Tensor::host(DType::F32, {1, V});
  for (int64_t t = 5; t < T; ++t) {
    model.forward({ForwardChunk{tokens.data() + t, 1, t, 0}}, *cache2, one);
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

}  // namespace kvpr::test
