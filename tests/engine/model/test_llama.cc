// Llama against float64 logits and greedy tokens from an independent torch implementation
// (tests/scripts/make_llama_fixtures.py): every fixture layout (f32 safetensors; bf16, tied
// head, attention biases and linear rope scaling in two shards; f16 .bin with MLP biases and
// transformers 5's rope_parameters; llama3 rope scaling with grouped-query attention; Qwen2.5
// with YaRN), through the cache one token at a time, every KV mode
// (KVPR's recompute turns K by each row's position), and the configs kvpr refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/model/llama_model.h"
#include "engine/base/npy.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/engine/model/reference_check.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

const char* const kFixtures[] = {"f32_safetensors", "bf16_tied_scaled_sharded", "f16_bin_rope_parameters",
                                 "gqa_f32_safetensors", "mqa_f16_bin_sharded", "llama3_rope_gqa_bf16",
                                 "mistral_sliding_window", "qwen2_qkv_bias_tied_bf16",
                                 "qwen3_head_dim_qk_norm_bf16", "qwen3_mha_head_dim_f32", "qwen2_yarn_gqa_f32",
                                 "qwen3_moe_dense_layer_f32", "qwen2_moe_shared_expert_bf16", "mixtral_gqa_f16_bin",
                                 "phi3_partial_rotary_fused_f32", "phi3_longrope_f32"};

std::string fixture(const std::string& name) { return test::data_path("llama/" + name); }

class LlamaForward : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(LlamaForward, LogitsMatchFloat64Reference) {
  const std::string dir = fixture(GetParam());
  CpuBackend be;
  std::unique_ptr<Model> model = load_model(be, dir);
  ASSERT_NE(dynamic_cast<LlamaModel*>(model.get()), nullptr);
  EXPECT_EQ(model->spec().model_type, json::parse(test::read_file(dir + "/config.json")).find("model_type")->as_string());
  test::expect_logits_match_reference(*model, dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaForward, ::testing::ValuesIn(kFixtures),
                         [](const auto& p) { return std::string(p.param); });

TEST(Llama, GreedyTokensMatchReference) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (const char* name : kFixtures) test::expect_greedy_matches_reference(fixture(name), tok);
}

// Phi's longrope past its original context, in every KV mode on the CPU (the emulated device's
// in test_cuda.cc): the reference's tokens and log-probabilities through the crossing.
TEST(Llama, LongropeCrossingMatchesReference) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend be;
  test::expect_longrope_crossing_matches_reference(be, fixture("phi3_longrope_f32"), tok, "cpu");
}

// YaRN's frequencies, attention factor and served context from rope_scaling as checkpoints ship
// it (Qwen2.5's and Qwen3's recipe, DeepSeek's mscale pair, gpt-oss's untruncated range, explicit
// betas and attention factor) against transformers' _compute_yarn_parameters, computed in fp32 by
// tests/scripts/make_llama_fixtures.py; each case also read from transformers 5's rope_parameters.
TEST(Llama, YarnRopeMatchesTransformers) {
  const json::Value cases = json::parse(test::read_file(fixture("yarn_rope.json")));
  const std::string base = test::read_file(fixture("f32_safetensors") + "/config.json");
  auto at = [](const json::Value& v, const char* key) -> const json::Value& {
    const json::Value* f = v.find(key);
    if (!f) throw std::runtime_error(std::string("yarn_rope.json: no ") + key);
    return *f;
  };
  ASSERT_EQ(cases.as_array().size(), 6u);
  for (const json::Value& c : cases.as_array()) {
    const std::string name = at(c, "name").as_string();
    const int64_t hd = at(c, "head_dim").as_int();
    const double theta = at(c, "rope_theta").as_double(), factor = at(at(c, "rope_scaling"), "factor").as_double();
    for (bool v5 : {false, true}) {
      json::Value cfg = json::parse(base);
      cfg.set("hidden_size", hd * 4);
      cfg.set("max_position_embeddings", at(c, "max_position_embeddings").as_int());
      json::Value scaling = json::parse(at(c, "rope_scaling").dump());
      if (v5) {  // transformers 5: {"rope_theta": ..., "rope_type": "yarn", ...}
        scaling.set("rope_theta", theta);
        cfg.set("rope_parameters", scaling);
      } else {
        cfg.set("rope_theta", theta);
        cfg.set("rope_scaling", scaling);
      }
      const LlamaConfig lc = LlamaConfig::from_json(cfg, "config.json");
      ASSERT_EQ(lc.head_dim(), hd) << name;
      const RopeParams r = lc.rope_params();
      const json::Array& want = at(c, "inv_freq").as_array();
      ASSERT_EQ(static_cast<int64_t>(want.size()), hd / 2) << name;
      int kept = 0, divided = 0;
      for (int i = 0; i < hd / 2; ++i) {
        const double w = want[i].as_double(), got = rope_inv_freq(i, static_cast<int>(hd), r);
        EXPECT_NEAR(got, w, 2e-6 * w) << name << " pair " << i;
        const double plain = 1.0 / std::pow(theta, 2.0 * i / hd);
        kept += std::abs(got - plain) < 1e-6 * plain;
        divided += std::abs(got * factor - plain) < 1e-6 * plain;
      }
      EXPECT_GT(kept, 0) << name;  // the fast pairs keep their frequency, the slow ones are divided
      EXPECT_GT(divided, 0) << name;
      EXPECT_NEAR(r.attention_scale, at(c, "attention_factor").as_double(), 1e-6) << name;
      EXPECT_EQ(lc.context(), at(c, "context").as_int()) << name;
    }
  }
}

// Every KV mode on the CPU backend gives the tokens of resident decoding on the CPU; KVPR's
// forced split puts the recompute/transfer boundary inside every prompt.
TEST(Llama, EveryKvModeGivesTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : kFixtures)
    test::expect_every_kv_mode_gives_cpu_tokens(device, fixture(name), tok, test::kFixturePrompts,
                                                10, 3, name);
}

// Chunked prefill and the prefix cache in every mode: chunks that start past cached tokens.
TEST(Llama, ChunksPastCachedTokensGiveTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : kFixtures)
    test::expect_chunks_past_cached_tokens_give_cpu_tokens(device, fixture(name), tok,
                                                            test::kFixturePrompts, 10, 3,
                                                            name);
}

// X kept in the host store, projected again with each row's position, gives the stored K
// (rotated) and V: what KVPR's recompute relies on. Without positions it is refused.
TEST(Llama, RecomputedKeysFromStoredInputsEqualStoredKeys) {
  for (const char* name : {"f32_safetensors", "gqa_f32_safetensors"}) {
    CpuBackend be;
    LlamaModel model(be, fixture(name));
    KvRuntimeOptions o;
    o.mode = KvMode::Recompute;
    o.kv_dtype = DType::F32;
    auto kv = model.make_kv_runtime(2, 32, o);
    const int64_t V = model.spec().vocab_size, w = model.spec().kv_hidden();  // K/V width (GQA: narrower than X)
    std::vector<int32_t> toks = {4, 8, 15, 16, 23, 42, 7, 9, 11};
    Tensor logits = Tensor::host(DType::F32, {1, V});
    model.forward({ForwardChunk{toks.data(), 8, 0, 1}}, *kv, logits);
    model.forward({ForwardChunk{toks.data() + 8, 1, 8, 1}}, *kv, logits);
    be.synchronize();
    const HostKvStore* store = kv->host_store();
    Tensor pos = Tensor::host(DType::I32, {9});
    for (int i = 0; i < 9; ++i) pos.data_as<int32_t>()[i] = i;
    for (int64_t l = 0; l < model.spec().num_layers; ++l) {
      Tensor kvp = Tensor::host(DType::F32, {2, 9, w});
      model.project_kv(l, store->x(l, 1).rows(0, 9), kvp, pos);
      std::vector<double> stored_k(9 * w), stored_v(9 * w);
      for (int64_t i = 0; i < 9 * w; ++i) {
        stored_k[i] = store->k(l, 1).data_as<float>()[i];
        stored_v[i] = store->v(l, 1).data_as<float>()[i];
      }
      EXPECT_TRUE(test::close_rel(stored_k, kvp.data_as<float>(), stored_k.size(), 1e-5)) << name << " layer " << l;
      EXPECT_TRUE(test::close_rel(stored_v, kvp.data_as<float>() + 9 * w, stored_v.size(), 1e-5)) << name << " layer " << l;
    }
    EXPECT_THROW(model.project_kv(0, store->x(0, 1).rows(0, 9), Tensor::host(DType::F32, {2, 9, w}), Tensor()), Error);
  }
}

// With grouped-query attention X (hidden) is not smaller than K+V (2 * kv_hidden): the
// scheduler never recomputes (docs/design.md §1), kvpr stores no X, and a forced split still gives
// the same tokens.
TEST(Llama, GroupedQueryAttentionSchedulesNoRecompute) {
  CpuBackend be;
  LlamaModel model(be, fixture("gqa_f32_safetensors"));
  EXPECT_EQ(model.spec().num_kv_heads, 2);
  EXPECT_EQ(model.kv_shape().kv_hidden(), 16);
  KvRuntimeOptions o;
  o.mode = KvMode::Kvpr;
  o.kv_dtype = DType::F32;
  o.profile = LinkProfile{};
  o.profile->h2d_gbps = o.profile->h2d_alone_gbps = o.profile->d2h_gbps = 0.001;  // a slow link
  o.profile->recompute_per_row_s = 1e-12;                                           // and free recompute
  auto kv = model.make_kv_runtime(1, 32, o);
  EXPECT_FALSE(kv->scheduler()->recompute_can_help());
  std::vector<int32_t> toks = {4, 8, 15, 16, 23, 42, 7, 9};
  Tensor logits = Tensor::host(DType::F32, {1, model.spec().vocab_size});
  model.forward({ForwardChunk{toks.data(), 7, 0, 0}}, *kv, logits);
  model.forward({ForwardChunk{toks.data() + 7, 1, 7, 0}}, *kv, logits);
  EXPECT_EQ(kv->last_step().split_total, 0);
  EXPECT_EQ(kv->last_step().split_total_layer0, 0);
  // Per token and layer: K and V of 2 heads of 8 (f32); kvpr keeps no X it would never use,
  // recompute (and kvpr with a forced split) keeps X of 32 too.
  EXPECT_EQ(KvRuntime::host_bytes_per_token(KvMode::Kvpr, model.kv_shape(), DType::F32), 2 * (2 * 16) * 4);
  EXPECT_EQ(kv->host_bytes_per_token(), 2 * (2 * 16) * 4);
  EXPECT_EQ(kv->host_store()->x_capacity(), 0);
  EXPECT_EQ(KvRuntime::host_bytes_per_token(KvMode::Recompute, model.kv_shape(), DType::F32), 2 * (2 * 16 + 32) * 4);
  o.forced_split = 4;
  auto forced = model.make_kv_runtime(1, 32, o);
  EXPECT_EQ(forced->host_store()->x_capacity(), 32);
  EXPECT_EQ(forced->host_bytes_per_token(), 2 * (2 * 16 + 32) * 4);
}

TEST(Llama, ConfigsKvprDoesNotRunAreRefusedByName) {
  test::TempDir tmp;
  const std::string good = test::read_file(fixture("f32_safetensors") + "/config.json");
  auto error_for = [&](const std::string& key, const std::string& value) {
    json::Value cfg = json::parse(good);
    cfg.set(key, json::parse(value));
    const std::string dir = tmp.file("m");
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << cfg.dump();
    try {
      load_model_spec(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(error_for("num_key_value_heads", "3"), "config.json: num_key_value_heads 3 does not divide num_attention_heads 4");
  EXPECT_HAS(error_for("num_key_value_heads", "8"), "num_key_value_heads 8 does not divide");
  EXPECT_EQ(error_for("num_key_value_heads", "1"), "");  // multi-query attention
  EXPECT_HAS(error_for("rope_scaling", R"({"rope_type": "dynamic", "factor": 8.0})"),
             "config.json: rope scaling type \"dynamic\" is not supported (default, linear, llama3, yarn, longrope)");
  EXPECT_HAS(error_for("rope_scaling", R"({"rope_type": "longrope", "factor": 8.0})"),
             "config.json: longrope rope scaling needs a list short_factor");
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "yarn", "original_max_position_embeddings": 32})"),
             "config.json: rope scaling: missing \"factor\"");
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "yarn", "factor": -2})"),
             "config.json: yarn rope scaling factor must be positive");
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "yarn", "factor": 4, "attention_factor": 0})"),
             "config.json: yarn rope scaling attention_factor must be positive");
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "yarn", "factor": 4, "beta_slow": -1})"),
             "config.json: yarn rope scaling needs positive original_max_position_embeddings, beta_fast and beta_slow");
  EXPECT_HAS(error_for("partial_rotary_factor", "0.375"),
             "config.json: partial_rotary_factor 0.375 turns 3 of 8 elements of a head, which must be a positive even number");
  EXPECT_HAS(error_for("partial_rotary_factor", "1.5"), "config.json: partial_rotary_factor 1.5 must be in (0, 1]");
  EXPECT_EQ(error_for("partial_rotary_factor", "1.0"), "");
  EXPECT_EQ(error_for("partial_rotary_factor", "0.5"), "");
  // Phi-3: fused projections, partial rotary (6 of 8), its window on every layer.
  const LlamaConfig phi = LlamaConfig::load(fixture("phi3_partial_rotary_fused_f32"));
  EXPECT_STREQ(phi.architecture(), "Phi3ForCausalLM");
  EXPECT_TRUE(phi.fused_projections);
  EXPECT_EQ(phi.rope_dim(), 6);
  EXPECT_EQ(phi.rope_params().rotary_dim, 6);
  EXPECT_EQ(phi.window(1), 6);
  // Longrope ("su" in the first Phi-3 configs): a factor per rotary pair, positive.
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "su", "short_factor": [1], "long_factor": [1]})"),
             "config.json: longrope needs 4 short and long factors (rotary dimensions / 2), not 1 and 1");
  EXPECT_HAS(error_for("rope_scaling", R"({"type": "longrope", "short_factor": [1, 1, 0, 1], "long_factor": [1, 1, 1, 1]})"),
             "config.json: longrope short_factor must be positive");
  EXPECT_HAS(error_for("rope_scaling",
                       R"({"type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [1, 1, 1, 1], "attention_factor": 0})"),
             "config.json: longrope rope scaling attention_factor must be positive");
  {
    // Without original_max_position_embeddings the original context is the whole one: one
    // regime, no attention factor (transformers: factor 1).
    json::Value cfg = json::parse(good);
    cfg.set("rope_scaling", json::parse(R"({"type": "su", "short_factor": [1, 2, 3, 4], "long_factor": [5, 6, 7, 8]})"));
    const LlamaConfig c = LlamaConfig::from_json(cfg, "config.json");
    EXPECT_EQ(c.spec().long_rope_after, 0);
    EXPECT_FLOAT_EQ(c.rope_params().attention_scale, 1.f);
    EXPECT_EQ(c.rope_params().longrope_pairs, 4);
    EXPECT_FLOAT_EQ(c.rope_params().longrope[0][3], 4.f);
    EXPECT_FLOAT_EQ(c.rope_params().longrope[1][0], 5.f);
  }
  // The longrope fixture (Phi-4-mini's shape: 3 pairs of a partial rotary): past 8 tokens the long
  // factors, cos and sin scaled by sqrt(1 + ln 8 / ln 8); read alike from transformers 5's
  // rope_parameters, which may carry the original context itself.
  const LlamaConfig lr = LlamaConfig::load(fixture("phi3_longrope_f32"));
  EXPECT_EQ(lr.spec().long_rope_after, 8);
  EXPECT_FLOAT_EQ(lr.rope_params().attention_scale, std::sqrt(2.f));
  EXPECT_EQ(lr.rope_params().longrope_pairs, 3);
  EXPECT_FLOAT_EQ(lr.rope_params().longrope[1][2], 30.f);
  {
    json::Value cfg = json::parse(test::read_file(fixture("phi3_longrope_f32") + "/config.json"));
    json::Value rp = *cfg.find("rope_scaling");
    rp.set("rope_type", "longrope");
    rp.set("rope_theta", 10000.0);
    rp.set("original_max_position_embeddings", 16);
    cfg.set("rope_parameters", rp);
    cfg.set("rope_scaling", json::Value());
    cfg.set("original_max_position_embeddings", json::Value());
    const LlamaConfig v5 = LlamaConfig::from_json(cfg, "config.json");
    EXPECT_EQ(v5.spec().long_rope_after, 16);
    EXPECT_FLOAT_EQ(v5.rope_params().attention_scale, static_cast<float>(std::sqrt(1 + std::log(4.0) / std::log(16.0))));
    EXPECT_FLOAT_EQ(v5.rope_params().longrope[0][1], 1.5f);
  }
  // Mixtures of experts: the experts' fields of each family, checked.
  auto moe_error = [&](const char* fixture_name, const std::string& key, const std::string& value) {
    json::Value cfg = json::parse(test::read_file(fixture(fixture_name) + "/config.json"));
    cfg.set(key, json::parse(value));
    try {
      LlamaConfig::from_json(cfg, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(moe_error("qwen3_moe_dense_layer_f32", "num_experts_per_tok", "9"),
             "config.json: num_experts_per_tok 9 must be in 1..num_experts (8)");
  EXPECT_HAS(moe_error("qwen3_moe_dense_layer_f32", "num_experts", "null"), "config.json: missing \"num_experts\"");
  EXPECT_HAS(moe_error("qwen3_moe_dense_layer_f32", "mlp_only_layers", "3"),
             "config.json: mlp_only_layers must be a list of layer indices");
  EXPECT_HAS(moe_error("mixtral_gqa_f16_bin", "num_local_experts", "0"), "config.json: num_experts 0 must be in 1..1024");
  EXPECT_HAS(moe_error("qwen2_moe_shared_expert_bf16", "moe_intermediate_size", "0"),
             "config.json: moe_intermediate_size and decoder_sparse_step must be positive");
  const LlamaConfig q3m = LlamaConfig::load(fixture("qwen3_moe_dense_layer_f32"));
  EXPECT_TRUE(q3m.moe_layer(0));
  EXPECT_FALSE(q3m.moe_layer(1));  // in mlp_only_layers
  EXPECT_TRUE(q3m.norm_topk_prob && q3m.qk_norm);
  const LlamaConfig q2m = LlamaConfig::load(fixture("qwen2_moe_shared_expert_bf16"));
  EXPECT_TRUE(q2m.qkv_bias && !q2m.o_bias && !q2m.norm_topk_prob);
  EXPECT_EQ(q2m.shared_expert_intermediate_size, 40);
  const LlamaConfig mx = LlamaConfig::load(fixture("mixtral_gqa_f16_bin"));
  EXPECT_EQ(mx.moe_intermediate_size, 48);  // Mixtral's experts are intermediate_size wide
  EXPECT_TRUE(mx.norm_topk_prob);
  EXPECT_STREQ(mx.architecture(), "MixtralForCausalLM");
  EXPECT_HAS(error_for("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})"),
             "config.json: rope scaling: missing \"low_freq_factor\"");
  EXPECT_HAS(error_for("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                          "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})"),
             "config.json: llama3 rope scaling needs high_freq_factor above low_freq_factor");
  EXPECT_HAS(error_for("hidden_act", "\"quick_gelu\""),
             "config.json: hidden_act \"quick_gelu\" is not supported (silu, gelu, gelu_pytorch_tanh)");
  EXPECT_HAS(error_for("num_attention_heads", "5"), "is not divisible into 5 heads");
  EXPECT_HAS(error_for("intermediate_size", "\"80\""), "config.json: \"intermediate_size\": expected an integer");
  EXPECT_EQ(error_for("rope_scaling", "null"), "");
  EXPECT_EQ(error_for("sliding_window", "null"), "");  // as Qwen3 and Llama configs write "none"
  EXPECT_EQ(error_for("head_dim", "null"), "");
  EXPECT_EQ(error_for("head_dim", "8"), "");  // hidden_size / heads, said explicitly
  EXPECT_HAS(error_for("head_dim", "7"), "config.json: head_dim 7 must be positive and even");
  ModelSpec s = load_model_spec(fixture("f16_bin_rope_parameters"));
  EXPECT_EQ(s.model_type, "llama");
  EXPECT_EQ(s.eos_token_id, 2);  // the first of the list
  EXPECT_EQ(s.ffn_dim, 80);
  EXPECT_EQ(LlamaConfig::load(fixture("f16_bin_rope_parameters")).rope_theta, 20000.0);
  EXPECT_EQ(LlamaConfig::load(fixture("bf16_tied_scaled_sharded")).rope_freq_scale, 0.5);
  // Mistral: every layer slides its window, and the context served is max_position_embeddings
  // (the window masks the attention, exactly as transformers does).
  const ModelSpec mistral = load_model_spec(fixture("mistral_sliding_window"));
  EXPECT_EQ(mistral.model_type, "mistral");
  EXPECT_EQ(mistral.max_position_embeddings, 64);
  const LlamaConfig mistral_config = LlamaConfig::load(fixture("mistral_sliding_window"));
  EXPECT_EQ(mistral_config.window(0), 5);
  EXPECT_EQ(mistral_config.window(1), 5);
  EXPECT_HAS(error_for("layer_types", R"(["sliding_attention", "chunked_attention"])"),
             "config.json: layer_types[1] \"chunked_attention\" is not supported (sliding_attention, full_attention)");
  EXPECT_HAS(error_for("layer_types", R"(["sliding_attention"])"), "config.json: layer_types must list one type per layer (2)");
  EXPECT_HAS(error_for("model_type", "\"gemma\""), "config.json: model_type \"gemma\" is not supported");
  // Qwen2: biases on q/k/v only; its sliding_window counts only with use_sliding_window, and
  // then only when some layer (those from max_window_layers on) slides.
  const LlamaConfig qwen = LlamaConfig::load(fixture("qwen2_qkv_bias_tied_bf16"));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_bias);
  EXPECT_EQ(qwen.context(), 64);
  EXPECT_STREQ(qwen.architecture(), "Qwen2ForCausalLM");
  // Which layers slide (window 4), as transformers' Qwen2Config builds layer_types.
  auto qwen_windows = [&](bool use, int64_t max_window_layers) {
    json::Value cfg = json::parse(test::read_file(fixture("qwen2_qkv_bias_tied_bf16") + "/config.json"));
    cfg.set("use_sliding_window", use);
    cfg.set("max_window_layers", max_window_layers);
    const LlamaConfig c = LlamaConfig::from_json(cfg, "config.json");
    EXPECT_EQ(c.context(), 64);
    return std::vector<int64_t>{c.window(0), c.window(1)};
  };
  EXPECT_EQ(qwen_windows(false, 0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(qwen_windows(true, 0), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(qwen_windows(true, 1), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(qwen_windows(true, 2), (std::vector<int64_t>{0, 0}));  // both below max_window_layers
  // Qwen3: its own head width (Q 64 wide on a hidden size of 32), per-head Q/K norms, no biases.
  const LlamaConfig q3 = LlamaConfig::load(fixture("qwen3_head_dim_qk_norm_bf16"));
  EXPECT_EQ(q3.head_dim(), 16);
  EXPECT_EQ(q3.q_width(), 64);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias || q3.o_bias);
  EXPECT_STREQ(q3.architecture(), "Qwen3ForCausalLM");
  const ModelSpec q3s = load_model_spec(fixture("qwen3_head_dim_qk_norm_bf16"));
  EXPECT_EQ(q3s.head_dim, 16);
  EXPECT_EQ(q3s.kv_hidden(), 32);
  EXPECT_EQ(q3s.q_width(), 64);
  const LlamaConfig llama_bias = LlamaConfig::load(fixture("bf16_tied_scaled_sharded"));
  EXPECT_TRUE(llama_bias.qkv_bias && llama_bias.o_bias);
  const LlamaConfig l3 = LlamaConfig::load(fixture("llama3_rope_gqa_bf16"));
  EXPECT_EQ(l3.rope_llama3_factor, 8.0);
  EXPECT_EQ(l3.rope_high_freq_factor, 4.0);
  EXPECT_EQ(l3.rope_original_max_position, 256.0);
}
