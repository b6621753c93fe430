// gpt-oss against float64 logits and greedy tokens from an independent torch implementation
// (tests/scripts/make_gpt_oss_fixtures.py): attention sinks, biases on every projection, YaRN
// with an unrounded correction range, alternating sliding layers, a biased router choosing 2 of 4
// experts, the clamped SwiGLU over interleaved gate/up columns with biases; the experts read from
// MXFP4 blocks as OpenAI ships them and from transformers' dequantized layout; every KV mode.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/model/checkpoint.h"
#include "engine/model/gpt_oss_experts.h"
#include "engine/model/llama_model.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/engine/model/reference_check.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

const char* const kFixtures[] = {"mxfp4_bf16", "dequantized_bf16"};

std::string fixture(const std::string& name) { return test::data_path("gpt_oss/" + name); }

}  // namespace

TEST(GptOss, LogitsAndGreedyTokensMatchFloat64Reference) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (const char* name : kFixtures) {
    CpuBackend be;
    std::unique_ptr<Model> model = load_model(be, fixture(name));
    // MXFP4 experts kept as stored (the CPU's GEMMs read fp4), the dequantized layout dense.
    EXPECT_EQ(model->kept_quantized(), std::string(name) == "mxfp4_bf16") << name;
    test::expect_logits_match_reference(*model, fixture(name));
    test::expect_greedy_matches_reference(fixture(name), tok);
  }
}

TEST(GptOss, EveryKvModeGivesTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : kFixtures) {
    test::expect_every_kv_mode_gives_cpu_tokens(device, fixture(name), tok, test::kFixturePrompts,
                                                10, 3, name);
    test::expect_chunks_past_cached_tokens_give_cpu_tokens(device, fixture(name), tok,
                                                            test::kFixturePrompts, 10, 3,
                                                            name);
  }
}

TEST(GptOss, ConfigReadAsTransformersReadsIt) {
  const LlamaConfig c = LlamaConfig::load(fixture("mxfp4_bf16"));
  EXPECT_STREQ(c.architecture(), "GptOssForCausalLM");
  EXPECT_TRUE(c.attention_sinks && c.qkv_bias && c.o_bias && c.router_bias && c.expert_bias && c.norm_topk_prob);
  EXPECT_EQ(c.mlp_activation, Activation::ClampedSwiGLU);
  EXPECT_EQ(std::vector<int64_t>({c.window(0), c.window(1), c.window(2)}), std::vector<int64_t>({4, 0, 4}));
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  // YaRN with truncate false (the correction range unrounded) over head_dim 16, base 150000.
  const double dim = 16, low = dim * std::log(16 / (32 * 2 * M_PI)) / (2 * std::log(150000.0));
  EXPECT_NEAR(c.rope_yarn_low, std::max(low, 0.0), 1e-9);
  EXPECT_NEAR(c.rope_attention_factor, 0.1 * std::log(4.0) + 1, 1e-9);
  EXPECT_EQ(c.context(), 64);
  json::Value cfg = json::parse(test::read_file(fixture("mxfp4_bf16") + "/config.json"));
  cfg.set("swiglu_limit", 10.0);
  EXPECT_THROW(LlamaConfig::from_json(cfg, "config.json"), Error);
}

// MXFP4 as OpenAI packs it: E2M1 codes, two per byte (the low nibble the even element), a
// power-of-two scale per 32 (E8M0, bias 127); the derived experts' rows are the even (gate) and
// odd (up) rows of the fused matrix.
TEST(GptOss, Mxfp4DequantizesAsPacked) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(fp4_e2m1_value(c), want[c]) << int(c);
  const CheckpointDir ckpt(fixture("mxfp4_bf16"));
  const std::string base = "model.layers.1.mlp.experts.";
  const TensorRecord* blocks = ckpt.find(base + "gate_up_proj_blocks");
  const TensorRecord* scales = ckpt.find(base + "gate_up_proj_scales");
  ASSERT_TRUE(blocks && scales);
  EXPECT_EQ(blocks->shape, Shape({4, 128, 1, 16}));
  EXPECT_EQ(gpt_oss_expert_dtype(ckpt, base + "2.up_proj.weight"), DType::BF16);
  const Tensor up = gpt_oss_expert_weight(ckpt, base + "2.up_proj.weight");
  ASSERT_EQ(up.shape(), Shape({64, 32}));
  // Element (row 5, column 7) of expert 2's up: fused row 2·5 + 1 = 11, byte 3's high nibble.
  const auto* b = static_cast<const uint8_t*>(blocks->data) + ((2 * 128 + 11) * 1 + 0) * 16;
  const int exponent = static_cast<const uint8_t*>(scales->data)[(2 * 128 + 11) * 1] - 127;
  const float hand = fp4_e2m1_value(b[3] >> 4) * std::ldexp(1.f, exponent);
  EXPECT_EQ(bf16_to_f32(up.data_as<uint16_t>()[5 * 32 + 7]), hand);
  EXPECT_NE(hand, 0.f);
  // Kept in MXFP4: the same bytes, the scale as F32, dequantizing to the same values.
  const Weight kept = gpt_oss_expert_fp4(ckpt, base + "2.up_proj.weight");
  ASSERT_EQ(kept.format, WeightFormat::Fp4);
  EXPECT_EQ(kept.shape, Shape({64, 32}));
  EXPECT_EQ(kept.codes.data_as<uint8_t>()[5 * 16 + 3], b[3]);
  EXPECT_EQ(kept.scales.data_as<float>()[5], std::ldexp(1.f, exponent));
  const Tensor back = dequantize(kept);
  for (int64_t i = 0; i < up.numel(); ++i) ASSERT_EQ(back.data_as<float>()[i], bf16_to_f32(up.data_as<uint16_t>()[i])) << i;
  EXPECT_EQ(gpt_oss_expert_fp4_bytes(ckpt, base + "2.up_proj.bias"), 0);
  EXPECT_FALSE(gpt_oss_expert_fp4(ckpt, base + "2.up_proj.bias").defined());
  EXPECT_FALSE(gpt_oss_expert_dtype(ckpt, base + "9x.up_proj.weight").has_value());
  EXPECT_FALSE(gpt_oss_expert_dtype(ckpt, "model.layers.1.mlp.router.weight").has_value());
}

// With --weights host (the layers' matrices in pinned host memory, streamed a layer ahead), the
// derived experts, Gemma's and Phi-3's layers give the tokens of weights on the device, in every
// KV mode that moves KV.
TEST(GptOss, StreamedWeightsGiveTheDeviceWeightsTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (const std::string& dir : {fixture("mxfp4_bf16"), test::data_path("gemma/gemma3_wrapper_bf16"),
                                 test::data_path("gemma/gemma2_f32"), test::data_path("llama/phi3_partial_rotary_fused_f32")}) {
    CpuBackend be;
    ModelLoadOptions lo;
    lo.stream_weights = true;
    std::unique_ptr<Model> device = load_model(be, dir), streamed = load_model(be, dir, lo);
    ASSERT_NE(streamed->weight_stream(), nullptr) << dir;
    EXPECT_EQ(streamed->parameter_count(), device->parameter_count()) << dir;
    GenerationParams p;
    p.max_new_tokens = 8;
    p.ignore_eos = true;
    for (KvMode m : {KvMode::Resident, KvMode::Offload, KvMode::Kvpr}) {
      GeneratorOptions o;
      o.kv_dtype = DType::F32;
      o.kv.mode = m;
      if (m == KvMode::Kvpr) o.kv.forced_split = 3;
      const auto want = Generator(*device, tok, o).generate_all({{5, 17, 33, 2, 80, 41, 9}, {60, 61}}, p);
      const auto got = Generator(*streamed, tok, o).generate_all({{5, 17, 33, 2, 80, 41, 9}, {60, 61}}, p);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << dir << " " << kv_mode_name(m);
    }
  }
}
