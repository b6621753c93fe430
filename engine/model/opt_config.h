// The OPT architecture's hyper-parameters, read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>

#include "engine/backend/backend.h"
#include "engine/base/json.h"
#include "engine/model/model_spec.h"

namespace kvpr {

struct OptConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t ffn_dim = 0;
  int64_t max_position_embeddings = 0;
  int64_t word_embed_proj_dim = 0;    // = hidden_size unless the model projects (opt-350m)
  bool do_layer_norm_before = true;   // pre-LN; opt-350m is post-LN
  bool remove_final_layer_norm = false;
  bool enable_bias = true;
  bool layer_norm_affine = true;
  Activation activation = Activation::ReLU;
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 1;
  std::string torch_dtype = "float32";

  static constexpr int64_t kPositionOffset = 2;  // OPT's learned positions start at index 2
  static constexpr float kLayerNormEps = 1e-5f;

  int64_t head_dim() const { return hidden_size / num_heads; }
  bool has_projection() const { return word_embed_proj_dim != hidden_size; }
  bool has_final_layer_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }

  // Parses and validates; errors name `source` and the offending field.
  static OptConfig from_json(const json::Value& v, const std::string& source);
  static OptConfig load(const std::string& model_dir);  // <dir>/config.json
  json::Value to_json() const;                           // the HF config.json form
  ModelSpec spec() const;
};

}  // namespace kvpr
