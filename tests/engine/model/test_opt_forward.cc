// The OPT forward against float64 logits from an independent torch implementation
// (tests/scripts/make_opt_fixtures.py), for every fixture layout.
#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/opt_model.h"
#include "tests/test_util.h"

using namespace kvpr;

class OptForward : public ::testing::TestWithParam<const char*> {};

TEST_P(OptForward, LogitsMatchFloat64Reference) {
  std::string dir = test::data_path(std::string("opt/") + GetParam());
  CpuBackend be;
  OptModel model(be, dir);
  NpyArray ids = read_npy(dir + "/input_ids.npy");
  NpyArray ref = read_npy(dir + "/logits.npy");
  const int64_t T = static_cast<int64_t>(ids.values.size()), V = model.config().vocab_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
  std::vector<int32_t> tokens(ids.values.begin(), ids.values.end());
  KvRuntimeOptions f32;
  f32.kv_dtype = DType::F32;
  auto cache = model.make_kv_runtime(1, 64, f32);
  Tensor logits = Tensor::host(DType::F32, {T, V});
  model.forward({ForwardChunk{tokens.data(), T, 0, 0}}, *cache, logits, /*all_positions=*/true);
  EXPECT_TRUE(test::close_rel(ref.values, logits.data_as<float>(), ref.values.size(), 1e-4));

  // The same tokens fed as a prefill of 5 and then one at a time through the cache.
  auto cache2 = model.make_kv_runtime(1, 64, f32);
  Tensor row = Tensor::host(DType::F32, {5, V});
  model.forward({ForwardChunk{tokens.data(), 5, 0, 0}}, *cache2, row, true);
  std::vector<float> got(row.data_as<float>(), row.data_as<float>() + 5 * V);
  Tensor one = Tensor::host(DType::F32, {1, V});
  for (int64_t t = 5; t < T; ++t) {
    model.forward({ForwardChunk{tokens.data() + t, 1, t, 0}}, *cache2, one);
    got.insert(got.end(), one.data_as<float>(), one.data_as<float>() + V);
  }
  EXPECT_TRUE(test::close_rel(ref.values, got.data(), got.size(), 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OptForward,
                         ::testing::Values("pre_ln_safetensors", "post_ln_proj_sharded", "decoder_prefix_bin",
                                           "fp16_bin_sharded", "bf16_safetensors"),
                         [](const auto& p) { return std::string(p.param); });
