// Quantized checkpoints as the hub publishes them (engine/model/quantized_checkpoint.h) against
// float64 references on the weights dequantized independently (tests/scripts/
// make_quantized_fixtures.py, which quantizes and packs as AutoGPTQ, AutoAWQ, llm-compressor and
// DeepSeek's fp8 do): GPTQ int4 symmetric, asymmetric with desc_act, int8 per channel in the v2
// zeros; AWQ's GEMM layout; fp8 blocks (whole and partial); compressed-tensors fp8 per channel
// and int4/int8 packed, symmetric, asymmetric with actorder or int8 zero points, int8 codes
// (W8A8, run weight-only); a Mixtral whose experts are GPTQ; OPT in GPTQ and fp8.
// The weights are kept quantized, in kvpr's layout (engine/base/weight.h), and the GEMMs read them
// as stored (the emulated GPU's CudaModels tests run two of these fixtures too).
// Logits within 1e-3, the greedy tokens, every KV mode;
// an element of each packing computed by hand; what is not supported refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/model/checkpoint.h"
#include "engine/model/quantized_checkpoint.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/engine/model/reference_check.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

struct Case {
  const char* name;
  const char* method;
  const char* describe;
};
const Case kCases[] = {
    {"gptq_int4_g32_sym", "gptq", "gptq int4 g32 sym"},
    {"gptq_int4_g32_asym_desc_act", "gptq", "gptq int4 g32 asym desc_act"},
    {"gptq_int8_channel_v2", "gptq", "gptq int8 per channel asym (v2 zeros)"},
    {"awq_int4_g32", "awq", "awq int4 g32"},
    {"fp8_block32_bf16", "fp8", "fp8 e4m3, 32x32 blocks"},
    {"fp8_block_partial", "fp8", "fp8 e4m3, 32x32 blocks"},
    {"ct_fp8_channel", "compressed-tensors", "compressed-tensors fp8 e4m3 per channel"},
    {"ct_w4a16_g32", "compressed-tensors", "compressed-tensors int4 g32 sym"},
    {"ct_w4a16_asym_actorder", "compressed-tensors", "compressed-tensors int4 g32 asym"},
    {"ct_w8a16_channel", "compressed-tensors", "compressed-tensors int8 per channel sym"},
    {"ct_w8a8_int8_channel", "compressed-tensors", "compressed-tensors int8 per channel sym (w8a8 run as weight-only)"},
    {"ct_w4a16_asym_int8_zp", "compressed-tensors", "compressed-tensors int4 g32 asym"},
    {"gptq_mixtral_int4_g32", "gptq", "gptq int4 g32 sym"},
    {"gptq_int4_g32_lm_head", "gptq", "gptq int4 g32 sym, lm_head too"},
    // OPT: q/k/v stacked quantized; in act orders of their own (stacked dense), post-LN with
    // project_in/out; fp8 per channel in BF16.
    {"opt_gptq_int4_g32_sym", "gptq", "gptq int4 g32 sym"},
    {"opt_gptq_int4_g16_asym_desc_act", "gptq", "gptq int4 g16 asym desc_act"},
    {"opt_ct_fp8_channel_bf16", "compressed-tensors", "compressed-tensors fp8 e4m3 per channel"},
};

std::string fixture(const std::string& name) { return test::data_path("quantized/" + name); }

// The weights dequantized in F32 (what the reference computes on, exactly).
std::unique_ptr<Model> load_f32(Backend& be, const std::string& dir) {
  ModelLoadOptions lo;
  lo.convert_weights = true;
  lo.weight_dtype = DType::F32;
  return load_model(be, dir, lo);
}

}  // namespace

TEST(Quantized, LogitsAndGreedyTokensMatchFloat64Reference) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  for (const Case& c : kCases) {
    CpuBackend be;
    std::unique_ptr<Model> model = load_f32(be, fixture(c.name));
    EXPECT_EQ(model->quantization().method(), c.method) << c.name;
    EXPECT_EQ(model->quantization().describe(), c.describe) << c.name;
    EXPECT_TRUE(model->kept_quantized()) << c.name;  // the CPU's GEMMs read them as stored
    test::expect_logits_match_reference(*model, fixture(c.name), 1e-3);
    NpyArray ids = read_npy(fixture(c.name) + "/input_ids.npy");
    NpyArray greedy = read_npy(fixture(c.name) + "/greedy.npy");
    GeneratorOptions o;
    o.kv_dtype = DType::F32;
    GenerationParams p;
    p.max_new_tokens = 8;
    p.ignore_eos = true;
    auto r = Generator(*model, tok, o).generate_all({std::vector<int32_t>(ids.values.begin(), ids.values.begin() + 5)}, p);
    EXPECT_EQ(r[0].tokens, std::vector<int32_t>(greedy.values.begin(), greedy.values.end())) << c.name;
  }
}

// GPTQModel's lm_head=True: the head is kept quantized like the layers (the embedding stays dense).
// The same shapes with the head dense differ by exactly the head's F32 bytes less its int4 codes
// and its scales (96 rows of 64 inputs, groups of 32).
TEST(Quantized, AQuantizedHeadStaysQuantized) {
  CpuBackend be;
  const size_t head_dense = load_f32(be, fixture("gptq_int4_g32_sym"))->weight_bytes();
  const size_t head_int4 = load_f32(be, fixture("gptq_int4_g32_lm_head"))->weight_bytes();
  EXPECT_EQ(head_dense - head_int4, size_t{96 * 64 * 4 - (96 * 64 / 2 + 96 * 2 * 4)});
}

// Loaded as they come (kept quantized; GPTQ's q, k and v in act orders of their own stacked
// dense): every KV mode gives the same greedy tokens, the weights on the device and streamed.
TEST(Quantized, EveryKvModeGivesTheSameGreedyTokens) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend device;
  for (const char* name : {"gptq_int4_g32_asym_desc_act", "awq_int4_g32", "fp8_block_partial", "ct_w4a16_asym_actorder",
                           "gptq_mixtral_int4_g32", "opt_gptq_int4_g32_sym", "opt_ct_fp8_channel_bf16"})
    test::expect_every_kv_mode_gives_cpu_tokens(device, fixture(name), tok, test::kFixturePrompts, 10, 3, name);
}

// One element of each packing, computed by hand from the stored words.
TEST(Quantized, AnElementOfEachPackingByHand) {
  auto weight = [](const std::string& name, const std::string& module) {
    const std::string dir = fixture(name);
    CheckpointDir ckpt(dir);
    const QuantizedCheckpoint q =
        QuantizedCheckpoint::from_config(json::parse(test::read_file(dir + "/config.json")), "config.json");
    return std::make_pair(q.dequantize(ckpt, module + ".weight"), std::make_shared<CheckpointDir>(dir));
  };
  const std::string m = "model.layers.1.mlp.down_proj";  // [64, 96]: 96 inputs, three groups of 32
  {  // gptq v1, symmetric: input 37 of output 5: word row 37/8 = 4, nibble 37%8 = 5; group 1
    auto [w, ckpt] = weight("gptq_int4_g32_sym", m);
    const TensorRecord* qw = ckpt->find(m + ".qweight");
    const TensorRecord* qz = ckpt->find(m + ".qzeros");
    const TensorRecord* sc = ckpt->find(m + ".scales");
    const uint32_t word = static_cast<const uint32_t*>(qw->data)[4 * 64 + 5];
    const uint32_t q = (word >> 20) & 15;
    const uint32_t z = ((static_cast<const uint32_t*>(qz->data)[1 * 8 + 0] >> 20) & 15) + 1;  // output 5: word 0, nibble 5
    EXPECT_EQ(z, 8u);  // symmetric: 7 stored
    const float s = f16_to_f32(static_cast<const uint16_t*>(sc->data)[1 * 64 + 5]);
    EXPECT_EQ(w.data_as<float>()[5 * 96 + 37], s * (static_cast<float>(q) - static_cast<float>(z)));
  }
  {  // awq: output 5 of input 37 is nibble 6 of word 0 (AWQ's order 0 2 4 6 1 3 5 7); group 1
    auto [w, ckpt] = weight("awq_int4_g32", m);
    const uint32_t word = static_cast<const uint32_t*>(ckpt->find(m + ".qweight")->data)[37 * 8 + 0];
    const uint32_t zword = static_cast<const uint32_t*>(ckpt->find(m + ".qzeros")->data)[1 * 8 + 0];
    EXPECT_EQ(kAwqColumn[6], 5);
    const float q = static_cast<float>((word >> 24) & 15), z = static_cast<float>((zword >> 24) & 15);
    const float s = f16_to_f32(static_cast<const uint16_t*>(ckpt->find(m + ".scales")->data)[1 * 64 + 5]);
    EXPECT_EQ(w.data_as<float>()[5 * 96 + 37], (q - z) * s);
  }
  {  // compressed-tensors int4 asymmetric: code of output 5 input 37 at nibble 37%8 of word 37/8 of
     // row 5, minus 8; the zero point of output 5 at nibble 5 of word row 0 of its group's column
    auto [w, ckpt] = weight("ct_w4a16_asym_actorder", m);
    const int32_t g = static_cast<const int32_t*>(ckpt->find(m + ".weight_g_idx")->data)[37];
    const uint32_t word = static_cast<const uint32_t*>(ckpt->find(m + ".weight_packed")->data)[5 * 12 + 4];
    const uint32_t zword = static_cast<const uint32_t*>(ckpt->find(m + ".weight_zero_point")->data)[0 * 3 + g];
    const float q = static_cast<float>(static_cast<int>((word >> 20) & 15) - 8);
    const float z = static_cast<float>(static_cast<int>((zword >> 20) & 15) - 8);
    const float s = bf16_to_f32(static_cast<const uint16_t*>(ckpt->find(m + ".weight_scale")->data)[5 * 3 + g]);
    EXPECT_EQ(w.data_as<float>()[5 * 96 + 37], s * (q - z));
  }
  {  // fp8 blocks of 32 x 32: element (5, 37) is in block (0, 1)
    auto [w, ckpt] = weight("fp8_block32_bf16", m);
    const uint8_t code = static_cast<const uint8_t*>(ckpt->find(m + ".weight")->data)[5 * 96 + 37];
    const float s = static_cast<const float*>(ckpt->find(m + ".weight_scale_inv")->data)[0 * 3 + 1];
    EXPECT_EQ(w.data_as<float>()[5 * 96 + 37], e4m3_to_f32(code) * s);
  }
}

// What the methods do not define here is refused by name, at the config or at the tensor.
TEST(Quantized, WhatIsNotSupportedIsRefusedByName) {
  auto refused = [](const char* config, const char* what) {
    try {
      QuantizedCheckpoint::from_config(json::parse(config), "config.json");
      ADD_FAILURE() << config;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(R"({"quantization_config": {"quant_method": "bitsandbytes"}})", "quant_method \"bitsandbytes\"");
  refused(R"({"quantization_config": {"quant_method": "gptq", "bits": 3}})", "bits 3");
  refused(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "is_marlin_format": true}})",
          "is_marlin_format");
  refused(R"({"quantization_config": {"quant_method": "awq", "bits": 4, "version": "gemv"}})", "version \"gemv\"");
  refused(R"({"quantization_config": {"quant_method": "awq", "bits": 4, "zero_point": false}})", "zero_point");
  refused(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}})", "fmt \"e5m2\"");
  refused(R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}}})",
          "format \"int-quantized\" with num_bits 4");
  refused(R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "marlin-24",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}}})",
          "format \"marlin-24\"");
  refused(R"({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
      {"num_bits": 4, "type": "float"}}}}})", "float num_bits 4");
  // Unquantized: nothing to do.
  EXPECT_FALSE(QuantizedCheckpoint::from_config(json::parse(R"({"model_type": "llama"})"), "c").quantized());
  // A module whose tensors do not fit the config, named with its tensor: groups of 16 or 64 where
  // the scales hold groups of 32; desc_act without g_idx; compressed-tensors int4 tensors under
  // an int8 scheme.
  auto load_refused = [](const std::string& name, const char* key, const json::Value& value, const char* what) {
    test::TempDir tmp;
    const std::string src = fixture(name);
    for (const char* f : {"config.json", "model.safetensors"})
      std::filesystem::copy_file(src + "/" + f, tmp.path() + "/" + f);
    json::Value cfg = json::parse(test::read_file(src + "/config.json"));
    json::Value qc = *cfg.find("quantization_config");
    if (std::string(key) == "num_bits") {
      json::Value groups = *qc.find("config_groups");
      json::Value g = *groups.find("group_0");
      json::Value w = *g.find("weights");
      w.set("num_bits", value);
      g.set("weights", w);
      groups.set("group_0", g);
      qc.set("config_groups", groups);
    } else {
      qc.set(key, value);
    }
    cfg.set("quantization_config", qc);
    std::ofstream(tmp.path() + "/config.json") << cfg.dump();
    CpuBackend be;
    try {
      load_model(be, tmp.path());
      ADD_FAILURE() << name << " " << key << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  load_refused("awq_int4_g32", "group_size", json::Value(16), "in groups of 16 make");
  load_refused("awq_int4_g32", "group_size", json::Value(64), "in groups of 64 make");
  load_refused("ct_w4a16_g32", "num_bits", json::Value(8), "none of the config's integer schemes");
  // desc_act without the g_idx that orders its groups: one module of 8 x 32 weights.
  test::TempDir tmp;
  std::vector<int32_t> qw(4 * 8, 0), qz(1, 0);
  std::vector<uint16_t> sc(8, f32_to_f16(1.f));
  write_safetensors(tmp.path() + "/model.safetensors", {{"m.qweight", DType::I32, {4, 8}, qw.data()},
                                                        {"m.qzeros", DType::I32, {1, 1}, qz.data()},
                                                        {"m.scales", DType::F16, {1, 8}, sc.data()}});
  CheckpointDir ckpt(tmp.path());
  for (bool desc_act : {false, true}) {
    json::Value cfg = json::parse(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}})");
    json::Value qc = *cfg.find("quantization_config");
    qc.set("desc_act", desc_act);
    cfg.set("quantization_config", qc);
    const QuantizedCheckpoint q = QuantizedCheckpoint::from_config(cfg, "config.json");
    try {
      const Tensor w = q.dequantize(ckpt, "m.weight");
      EXPECT_FALSE(desc_act);
      EXPECT_EQ(w.shape(), (Shape{8, 32}));
    } catch (const Error& e) {
      EXPECT_TRUE(desc_act) << e.what();
      EXPECT_NE(std::string(e.what()).find("desc_act orders the groups"), std::string::npos) << e.what();
    }
  }
}
