#include "engine/model/opt_config.h"

#include "engine/model/config_fields.h"
#include "engine/base/error.h"

namespace kvpr {

OptConfig OptConfig::from_json(const json::Value& v, const std::string& source) {
  ConfigFields f(v, source);
  OptConfig c;
  f.expect_model_type("opt");
  f.get_int("vocab_size", &c.vocab_size, true);
  f.get_int("hidden_size", &c.hidden_size, true);
  f.get_int("num_hidden_layers", &c.num_layers, true);
  f.get_int("num_attention_heads", &c.num_heads, true);
  f.get_int("ffn_dim", &c.ffn_dim, true);
  f.get_int("max_position_embeddings", &c.max_position_embeddings, true);
  c.word_embed_proj_dim = c.hidden_size;
  f.get_int("word_embed_proj_dim", &c.word_embed_proj_dim, false);
  f.get_bool("do_layer_norm_before", &c.do_layer_norm_before);
  f.get_bool("_remove_final_layer_norm", &c.remove_final_layer_norm);
  f.get_bool("enable_bias", &c.enable_bias);
  f.get_bool("layer_norm_elementwise_affine", &c.layer_norm_affine);
  f.get_int("bos_token_id", &c.bos_token_id, false);
  f.get_int("eos_token_id", &c.eos_token_id, false);
  f.get_int("pad_token_id", &c.pad_token_id, false);
  if (std::string s; f.get_string("activation_function", &s), !s.empty()) {
    if (s == "relu") c.activation = Activation::ReLU;
    else if (s == "gelu") c.activation = Activation::GELU;  // transformers' ACT2FN: erf's
    else if (s == "gelu_new" || s == "gelu_pytorch_tanh") c.activation = Activation::GELUTanh;  // tanh's
    else KVPR_THROW(source, ": activation_function \"", s, "\" is not supported (relu, gelu, gelu_new, gelu_pytorch_tanh)");
  }
  // transformers >= 4.56 writes "dtype"; earlier ones "torch_dtype" (read last: it wins when both are there).
  f.get_string("dtype", &c.torch_dtype);
  f.get_string("torch_dtype", &c.torch_dtype);
  KVPR_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 &&
                 c.ffn_dim > 0 && c.max_position_embeddings > 0 && c.word_embed_proj_dim > 0,
             source, ": sizes must be positive");
  KVPR_CHECK(c.hidden_size % c.num_heads == 0, source, ": hidden_size ", c.hidden_size,
             " is not divisible by num_attention_heads ", c.num_heads);
  KVPR_CHECK(c.vocab_size < (int64_t{1} << 31), source, ": vocab_size too large");
  return c;
}

OptConfig OptConfig::load(const std::string& model_dir) {
  return from_json(read_config_json(model_dir), "config.json");
}

ModelSpec OptConfig::spec() const {
  ModelSpec s;
  s.model_type = "opt";
  s.vocab_size = vocab_size;
  s.hidden_size = hidden_size;
  s.num_layers = num_layers;
  s.num_heads = s.num_kv_heads = num_heads;
  s.head_dim = head_dim();
  s.ffn_dim = ffn_dim;
  s.max_position_embeddings = max_position_embeddings;
  s.bos_token_id = bos_token_id;
  s.eos_token_id = eos_token_id;
  s.pad_token_id = pad_token_id;
  s.torch_dtype = torch_dtype;
  return s;
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
  v.set("activation_function", activation == Activation::GELU       ? "gelu"
                               : activation == Activation::GELUTanh ? "gelu_pytorch_tanh"
                                                                    : "relu");
  v.set("bos_token_id", bos_token_id);
  v.set("eos_token_id", eos_token_id);
  v.set("pad_token_id", pad_token_id);
  v.set("torch_dtype", torch_dtype);
  return v;
}

}  // namespace kvpr
