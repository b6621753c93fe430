#include "engine/model/demo_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/model/checkpoint.h"
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/model/opt_model.h"

#ifndef KVPR_SOURCE_DIR
#define KVPR_SOURCE_DIR ""
#endif
#ifndef KVPR_INSTALL_DATADIR
#define KVPR_INSTALL_DATADIR "/usr/local/share/kvpr"
#endif

namespace kvpr {

namespace fs = std::filesystem;

DemoModelSpec default_demo_spec() {
  DemoModelSpec s;
  OptConfig& c = s.config;
  c.vocab_size = 50272;  // GPT-2's 50257 ids padded to a multiple of 8, as OPT does
  c.hidden_size = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.ffn_dim = 512;
  c.max_position_embeddings = 2048;
  c.word_embed_proj_dim = 128;
  c.bos_token_id = 50256;
  c.eos_token_id = 50256;
  c.pad_token_id = 50256;
  c.torch_dtype = "float16";
  return s;
}

std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("KVPR_DATA_DIR")) return std::string(env) + "/gpt2-tokenizer";
  std::string src = std::string(KVPR_SOURCE_DIR) + "/share/gpt2-tokenizer";
  if (!std::string(KVPR_SOURCE_DIR).empty() && fs::exists(src + "/vocab.json")) return src;
  return std::string(KVPR_INSTALL_DATADIR) + "/gpt2-tokenizer";
}

void write_demo_model(const std::string& out_dir, const DemoModelSpec& spec, const std::string& tokenizer_dir) {
  const OptConfig& c = spec.config;
  for (const char* f : {"vocab.json", "merges.txt"})
    KVPR_CHECK(fs::exists(fs::path(tokenizer_dir) / f), tokenizer_dir, ": missing ", f,
               " (set KVPR_DATA_DIR or pass --tokenizer-dir)");
  fs::create_directories(out_dir);
  Rng rng(spec.seed);
  auto normal = [&]() {  // Box-Muller
    double u1 = std::max(rng.uniform(), 1e-300), u2 = rng.uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  };
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, Shape shape, float stddev, float mean = 0.f) {
    int64_t n = shape_numel(shape);
    storage.emplace_back(static_cast<size_t>(n) * dtype_size(spec.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_f32(storage.back().data(), spec.dtype, i, mean + stddev * normal());
    tensors.push_back({name, spec.dtype, std::move(shape), storage.back().data()});
  };
  storage.reserve(16 * c.num_layers + 16);
  const int64_t h = c.hidden_size, d = c.word_embed_proj_dim, f = c.ffn_dim;
  const std::string p = "model.decoder.";
  add(p + "embed_tokens.weight", {c.vocab_size, d}, 0.1f);
  add(p + "embed_positions.weight", {c.max_position_embeddings + OptConfig::kPositionOffset, h}, 0.1f);
  const float w = 1.f / std::sqrt(static_cast<float>(h));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    std::string q = p + "layers." + std::to_string(l) + ".";
    add(q + "self_attn_layer_norm.weight", {h}, 0.05f, 1.f);
    add(q + "self_attn_layer_norm.bias", {h}, 0.05f);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(q + "self_attn." + proj + ".weight", {h, h}, w);
      add(q + "self_attn." + proj + ".bias", {h}, 0.02f);
    }
    add(q + "final_layer_norm.weight", {h}, 0.05f, 1.f);
    add(q + "final_layer_norm.bias", {h}, 0.05f);
    add(q + "fc1.weight", {f, h}, w);
    add(q + "fc1.bias", {f}, 0.02f);
    add(q + "fc2.weight", {h, f}, 1.f / std::sqrt(static_cast<float>(f)));
    add(q + "fc2.bias", {h}, 0.02f);
  }
  add(p + "final_layer_norm.weight", {h}, 0.05f, 1.f);
  add(p + "final_layer_norm.bias", {h}, 0.05f);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors);

  json::Value cfg = c.to_json();
  cfg.set("_name_or_path", "kvpr-demo-opt");
  auto write_json = [&](const char* name, const json::Value& v) {
    std::ofstream o(fs::path(out_dir) / name, std::ios::trunc);
    o << v.dump() << "\n";
    KVPR_CHECK(o.good(), out_dir, ": cannot write ", name);
  };
  write_json("config.json", cfg);
  json::Value tc(json::Object{});
  tc.set("tokenizer_class", "GPT2Tokenizer");
  tc.set("bos_token", "<|endoftext|>");
  tc.set("eos_token", "<|endoftext|>");
  tc.set("unk_token", "<|endoftext|>");
  tc.set("add_bos_token", false);
  tc.set("add_prefix_space", false);
  tc.set("model_max_length", c.max_position_embeddings);
  write_json("tokenizer_config.json", tc);
  for (const char* name : {"vocab.json", "merges.txt"})
    fs::copy_file(fs::path(tokenizer_dir) / name, fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
}

}  // namespace kvpr
