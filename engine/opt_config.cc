#include "engine/opt_config.h"

#include <filesystem>

#include "engine/error.h"

namespace kvpr {

OptConfig OptConfig::from_json(const json::Value& v, const std::string& source) {
  KVPR_CHECK(v.is_object(), source, ": not a JSON object");
  OptConfig c;
  auto field = [&](const char* name) -> const json::Value* { return v.find(name); };
  auto get_int = [&](const char* name, int64_t* out, bool required) {
    const json::Value* f = field(name);
    if (!f || f->is_null()) {
      KVPR_CHECK(!required, source, ": missing \"", name, "\"");
      return;
    }
    try {
      *out = f->as_int();
    } catch (const Error& e) {
      KVPR_THROW(source, ": \"", name, "\": ", e.what());
    }
  };
  auto get_bool = [&](const char* name, bool* out) {
    const json::Value* f = field(name);
    if (!f || f->is_null()) return;
    try {
      *out = f->as_bool();
    } catch (const Error& e) {
      KVPR_THROW(source, ": \"", name, "\": ", e.what());
    }
  };
  const json::Value* mt = field("model_type");
  KVPR_CHECK(mt && mt->is_string(), source, ": missing \"model_type\"");
  KVPR_CHECK(mt->as_string() == "opt", source, ": model_type \"", mt->as_string(),
             "\" is not supported (supported: opt)");
  get_int("vocab_size", &c.vocab_size, true);
  get_int("hidden_size", &c.hidden_size, true);
  get_int("num_hidden_layers", &c.num_layers, true);
  get_int("num_attention_heads", &c.num_heads, true);
  get_int("ffn_dim", &c.ffn_dim, true);
  get_int("max_position_embeddings", &c.max_position_embeddings, true);
  c.word_embed_proj_dim = c.hidden_size;
  get_int("word_embed_proj_dim", &c.word_embed_proj_dim, false);
  get_bool("do_layer_norm_before", &c.do_layer_norm_before);
  get_bool("_remove_final_layer_norm", &c.remove_final_layer_norm);
  get_bool("enable_bias", &c.enable_bias);
  get_bool("layer_norm_elementwise_affine", &c.layer_norm_affine);
  get_int("bos_token_id", &c.bos_token_id, false);
  get_int("eos_token_id", &c.eos_token_id, false);
  get_int("pad_token_id", &c.pad_token_id, false);
  if (const json::Value* a = field("activation_function"); a && a->is_string()) {
    const std::string& s = a->as_string();
    if (s == "relu") c.activation = Activation::ReLU;
    else if (s == "gelu" || s == "gelu_new" || s == "gelu_pytorch_tanh") c.activation = Activation::GELU;
    else KVPR_THROW(source, ": activation_function \"", s, "\" is not supported (relu, gelu)");
  }
  if (const json::Value* d = field("torch_dtype"); d && d->is_string()) c.torch_dtype = d->as_string();
  KVPR_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 &&
                 c.ffn_dim > 0 && c.max_position_embeddings > 0 && c.word_embed_proj_dim > 0,
             source, ": sizes must be positive");
  KVPR_CHECK(c.hidden_size % c.num_heads == 0, source, ": hidden_size ", c.hidden_size,
             " is not divisible by num_attention_heads ", c.num_heads);
  KVPR_CHECK(c.vocab_size < (int64_t{1} << 31), source, ": vocab_size too large");
  return c;
}

OptConfig OptConfig::load(const std::string& model_dir) {
  KVPR_CHECK(std::filesystem::is_directory(model_dir), model_dir, ": not a directory");
  std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  KVPR_CHECK(std::filesystem::exists(path), model_dir, ": no config.json");
  return from_json(json::parse_file(path), "config.json");
}

json::Value OptConfig::to_json() const {
  json::Value v(json::Object{});
  v.set("architectures", json::Array{json::Value("OPTForCausalLM")});
  v.set("model_type", "opt");
  v.set("vocab_size", vocab_size);
  v.set("hidden_size", hidden_size);
  v.set("num_hidden_layers", num_layers);
  v.set("num_attention_heads", num_heads);
  v.set("ffn_dim", ffn_dim);
  v.set("max_position_embeddings", max_position_embeddings);
  v.set("word_embed_proj_dim", word_embed_proj_dim);
  v.set("do_layer_norm_before", do_layer_norm_before);
  v.set("_remove_final_layer_norm", remove_final_layer_norm);
  v.set("enable_bias", enable_bias);
  v.set("layer_norm_elementwise_affine", layer_norm_affine);
  v.set("activation_function", activation == Activation::GELU ? "gelu" : "relu");
  v.set("bos_token_id", bos_token_id);
  v.set("eos_token_id", eos_token_id);
  v.set("pad_token_id", pad_token_id);
  v.set("torch_dtype", torch_dtype);
  return v;
}

}  // namespace kvpr
