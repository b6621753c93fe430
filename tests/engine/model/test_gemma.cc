// Gemma 2, Gemma 3 and the ForConditionalGeneration wrappers (gemma3, mistral3) against float64
// logits and greedy tokens from an independent torch implementation
// (tests/scripts/make_gemma_fixtures.py): per-layer sliding windows shorter than the sequences,
// Gemma 3's local and global rope, soft-capped scores and logits, (1 + w) norms, scaled
// embeddings, GeGLU; through the cache one token at a time, in every KV mode (KVPR recomputes K
// with each layer's own rope), and the configs as the hub ships them (sparse text_configs, both
// key prefixes of a wrapper).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/base/npy.h"
#include "engine/decode/generator.h"
#include "engine/model/llama_model.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/engine/model/reference_check.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

const char* const kFixtures[] = {"gemma2_f32",          "gemma2_bf16_layer_types", "gemma3_text_f32",
                                 "gemma3_text_rope_parameters_f32", "gemma3_wrapper_bf16", "mistral3_wrapper_f32"};

std::string fixture(const std::string& name) { return test::data_path("gemma/" + name); }

class GemmaForward : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GemmaForward, LogitsMatchFloat64Reference) {
  const std::string dir = fixture(GetParam());
  CpuBackend be;
  std::unique_ptr<Model> model = load_model(be, dir);
  ASSERT_NE(dynamic_cast<LlamaModel*>(model.get()), nullptr);
  test::expect_logits_match_reference(*model, dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GemmaForward, ::testing::ValuesIn(kFixtures),
                         [](const auto& p) { return std::string(p.param); });

TEST(Gemma, GreedyTokensMatchReference) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (const char* name : kFixtures) test::expect_greedy_matches_reference(fixture(name), tok);
}

// Every KV mode on the CPU backend gives the tokens of resident decoding; KVPR's forced split
// puts the recompute/transfer boundary inside every prompt, so K is recomputed from X with each
// layer's rope (Gemma 3's local base on its sliding layers) and the windows drop recomputed keys.
TEST(Gemma, EveryKvModeGivesTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : kFixtures)
    test::expect_every_kv_mode_gives_cpu_tokens(device, fixture(name), tok, test::kFixturePrompts,
                                                10, 3, name);
}

TEST(Gemma, ChunksPastCachedTokensGiveTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : kFixtures)
    test::expect_chunks_past_cached_tokens_give_cpu_tokens(device, fixture(name), tok,
                                                            test::kFixturePrompts, 10, 3,
                                                            name);
}

// The configs as the hub writes them: the class defaults a sparse text_config leans on, the
// layers that slide, each layer's rope, the wrappers' text models, and what is refused by name.
TEST(Gemma, ConfigsReadAsTransformersReadsThem) {
  const LlamaConfig g2 = LlamaConfig::load(fixture("gemma2_f32"));
  EXPECT_STREQ(g2.architecture(), "Gemma2ForCausalLM");
  EXPECT_EQ(std::vector<int64_t>({g2.window(0), g2.window(1), g2.window(2)}), std::vector<int64_t>({4, 0, 4}));
  EXPECT_EQ(g2.attn_softcap, 2.0);
  EXPECT_EQ(g2.final_softcap, 3.0);
  EXPECT_FLOAT_EQ(g2.attention_scale(), 1.f / std::sqrt(24.f));  // query_pre_attn_scalar, not head_dim
  EXPECT_EQ(g2.mlp_activation, Activation::GELUTanh);
  EXPECT_TRUE(g2.gemma_norms && g2.tie_word_embeddings && !g2.qk_norm);
  EXPECT_EQ(g2.context(), 64);  // windows do not cap the context
  const LlamaConfig lt = LlamaConfig::load(fixture("gemma2_bf16_layer_types"));
  EXPECT_EQ(std::vector<int64_t>({lt.window(0), lt.window(1)}), std::vector<int64_t>({0, 4}));  // layer_types wins

  const LlamaConfig g3 = LlamaConfig::load(fixture("gemma3_text_f32"));
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_EQ(std::vector<int64_t>({g3.window(0), g3.window(1), g3.window(2), g3.window(3)}),
            std::vector<int64_t>({4, 4, 0, 4}));  // pattern 3: every third layer global
  EXPECT_EQ(g3.rope_params(0).theta, 10000.f);  // local: rope_local_base_freq, unscaled
  EXPECT_EQ(g3.rope_params(0).freq_scale, 1.f);
  EXPECT_EQ(g3.rope_params(2).theta, 1000000.f);  // global: rope_theta with linear scaling 8
  EXPECT_EQ(g3.rope_params(2).freq_scale, 0.125f);
  EXPECT_EQ(g3.final_softcap, 0.0);
  const LlamaConfig v5 = LlamaConfig::load(fixture("gemma3_text_rope_parameters_f32"));
  EXPECT_EQ(v5.rope_params(0).theta, 20000.f);
  EXPECT_EQ(v5.rope_params(1).theta, 500000.f);
  EXPECT_EQ(v5.rope_params(1).freq_scale, 0.25f);
  EXPECT_EQ(std::vector<int64_t>({v5.window(0), v5.window(1)}), std::vector<int64_t>({4, 0}));

  const LlamaConfig w = LlamaConfig::load(fixture("gemma3_wrapper_bf16"));
  EXPECT_STREQ(w.architecture(), "Gemma3ForConditionalGeneration");
  EXPECT_EQ(w.model_type, "gemma3_text");
  EXPECT_EQ(w.wrapper, "gemma3");
  EXPECT_EQ(w.rope_theta, 1000000.0);  // Gemma3TextConfig's defaults for what the text_config omits
  EXPECT_EQ(w.local_rope_theta, 10000.0);
  EXPECT_EQ(w.rms_norm_eps, 1e-6);
  EXPECT_EQ(w.torch_dtype, "bfloat16");  // from the top level
  EXPECT_EQ(w.eos_token_id, 1);
  const LlamaConfig m3 = LlamaConfig::load(fixture("mistral3_wrapper_f32"));
  EXPECT_STREQ(m3.architecture(), "Mistral3ForConditionalGeneration");
  EXPECT_EQ(m3.model_type, "mistral");
  EXPECT_EQ(m3.head_dim(), 16);
  EXPECT_EQ(m3.window(0), 0);  // sliding_window null: no window
  EXPECT_EQ(load_model_spec(fixture("mistral3_wrapper_f32")).model_type, "mistral");

  const std::string good = test::read_file(fixture("gemma3_wrapper_bf16") + "/config.json");
  auto error_for = [&](const std::function<void(json::Value&)>& edit) {
    json::Value cfg = json::parse(good);
    edit(cfg);
    try {
      LlamaConfig::from_json(cfg, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_for([](json::Value&) {}), "");
  EXPECT_HAS(error_for([](json::Value& c) { c.set("text_config", json::Value()); }),
             "config.json: model_type \"gemma3\" needs a text_config object");
  EXPECT_HAS(error_for([](json::Value& c) {
               json::Value t = *c.find("text_config");
               t.set("model_type", "gemma2");
               c.set("text_config", t);
             }),
             "config.json: text_config model_type \"gemma2\" is not supported in a gemma3 checkpoint (gemma3_text)");
  EXPECT_HAS(error_for([](json::Value& c) {
               json::Value t = *c.find("text_config");
               t.set("hidden_activation", "relu2");
               c.set("text_config", t);
             }),
             "config.json: text_config: hidden_act \"relu2\" is not supported (silu, gelu, gelu_pytorch_tanh)");
  EXPECT_HAS(error_for([](json::Value& c) {
               json::Value t = *c.find("text_config");
               t.set("rope_parameters", json::parse(R"({"full_attention": {"rope_type": "default"},
                                                        "sliding_attention": {"rope_type": "yarn", "factor": 2}})"));
               c.set("text_config", t);
             }),
             "sliding layers' rope_type \"yarn\" is not supported (default)");
  EXPECT_HAS(error_for([](json::Value& c) {
               json::Value t = *c.find("text_config");
               t.set("attn_logit_softcapping", -1);
               c.set("text_config", t);
             }),
             "attn_logit_softcapping must be finite and not negative");
}

// A wrapper saved by transformers >= 4.52 (model.language_model.*, lm_head) and one as the hub
// first shipped it (language_model.model.*) both load; the vision weights beside them are not read.
TEST(Gemma, WrappersLoadTheirTextModelUnderEitherPrefix) {
  CpuBackend be;
  for (const char* name : {"gemma3_wrapper_bf16", "mistral3_wrapper_f32"}) {
    std::unique_ptr<Model> model = load_model(be, fixture(name));
    const LlamaConfig& c = dynamic_cast<LlamaModel&>(*model).config();
    // Every text weight, none of the vision tower's (8·3·2·2 + 8·hidden).
    int64_t expect = c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) + c.hidden_size;
    const int64_t hd = c.head_dim(), qw = c.q_width(), kvw = c.num_kv_heads * hd;
    const int64_t norms = c.gemma_norms ? 4 : 2;
    expect += c.num_layers * (norms * c.hidden_size + 2 * qw * c.hidden_size + 2 * kvw * c.hidden_size +
                              3 * c.intermediate_size * c.hidden_size + (c.qk_norm ? 2 * hd : 0));
    EXPECT_EQ(model->parameter_count(), expect) << name;
  }
}

// The sliding layers' ring under random schedules and preemption (kv_mode_check.h), on the CPU:
// Gemma 2's and gpt-oss's alternate layers, Gemma 3's 2 local : 1 global, Mistral's every layer.
TEST(Gemma, RingStoreUnderRandomSchedulesGivesResidentTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend be;
  for (const char* name : {"gemma/gemma2_f32", "gemma/gemma3_text_f32", "gpt_oss/mxfp4_bf16", "llama/mistral_sliding_window"})
    test::expect_ring_gives_resident_tokens(be, test::data_path(name), tok, name);
}

// A sliding layer's keys below the window are never read, so offload and kvpr move none of them:
// Mistral's layers (window 5) cost 2 x min(past, 4) K/V rows each per decode step, not 2 x past.
// Their store is a ring (its blocks below the window go back to the pool), so kvpr recomputes its
// first 3 tokens only while the window still holds the first token; after, it copies the window.
TEST(Gemma, SlidingLayersMoveOnlyTheirWindow) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend be;
  std::unique_ptr<Model> model = load_model(be, test::data_path("llama/mistral_sliding_window"));
  const ModelSpec& spec = model->spec();
  ASSERT_EQ(spec.windows, (std::vector<int64_t>{5, 5}));
  const int64_t row_bytes = spec.kv_hidden() * 4;  // f32
  for (KvMode mode : {KvMode::Offload, KvMode::Kvpr}) {
    GeneratorOptions o;
    o.kv_dtype = DType::F32;
    o.kv.mode = mode;
    if (mode == KvMode::Kvpr) o.kv.forced_split = 3;
    // A store of 40 blocks, which the ring of two sequences' windows and a step of 16 tokens beats.
    o.max_batch = 2;
    o.max_step_tokens = 16;
    KvRuntimeOptions kv = o.kv;
    kv.kv_dtype = DType::F32;
    o.kv_cache_bytes = 40 * KvRuntime::block_bytes(model->kv_shape(), KvLayout{1, o.block_tokens, 64}, kv);
    Generator gen(*model, tok, o);
    EXPECT_TRUE(gen.kv_runtime().layout().ring());
    GenerationParams p;
    p.max_new_tokens = 12;
    p.ignore_eos = true;
    gen.add({5, 17, 33, 2}, p);  // decode from past 4: the window passes kvpr's 3 recomputed tokens at past 7
    int64_t past = 0;
    for (int step = 0; !gen.idle(); ++step) {
      gen.step([](uint64_t, const float*, int64_t) {});
      const StepStats& st = gen.kv_runtime().last_step();
      const int64_t kv_rows = std::min<int64_t>(past, 4);  // keys past - 4 .. past - 1 of the query at past
      int64_t want = spec.num_layers * 2 * kv_rows * row_bytes;
      if (mode == KvMode::Kvpr && past > 0 && past + 1 - 5 <= 0)  // the window still holds token 0
        want = spec.num_layers * (3 * spec.hidden_size * 4 + 2 * (past - 3) * row_bytes);
      EXPECT_EQ(st.h2d_bytes, want) << kv_mode_name(mode) << " step " << step << " past " << past;
      past += step == 0 ? 4 : 1;
    }
  }
}
