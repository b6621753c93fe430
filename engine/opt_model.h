// OPT (Zhang et al. 2022; Hugging Face OPTForCausalLM) written once against the Backend.
// Pre-LN and post-LN (opt-350m) variants, word_embed_proj_dim projections, tied lm_head.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/opt_config.h"

namespace kvpr {

struct ModelLoadOptions {
  // Storage dtype for weights; unset keeps each tensor's checkpoint dtype.
  bool convert_weights = false;
  DType weight_dtype = DType::F32;
};

struct OptLayer {
  Tensor attn_ln_w, attn_ln_b;  // self_attn_layer_norm
  Tensor wq, bq, wk, bk, wv, bv, wo, bo;
  Tensor ffn_ln_w, ffn_ln_b;    // final_layer_norm of the layer
  Tensor fc1_w, fc1_b, fc2_w, fc2_b;
};

// Scratch tensors reused across forward calls; grown on demand.
class Workspace {
 public:
  explicit Workspace(Backend& b) : backend_(b) {}
  Tensor get(const std::string& name, DType dtype, Shape shape);

 private:
  Backend& backend_;
  std::map<std::string, Tensor> buffers_;
};

// K and V of every layer for a fixed number of sequence slots, in device memory.
// Layout per layer: [slots, capacity, hidden].
class DeviceKvCache {
 public:
  DeviceKvCache(Backend& backend, int64_t layers, int64_t slots, int64_t capacity, int64_t hidden,
                DType dtype);
  Tensor k(int64_t layer, int64_t slot) const;  // [capacity, hidden]
  Tensor v(int64_t layer, int64_t slot) const;
  int64_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const;

 private:
  std::vector<Tensor> k_, v_;
  int64_t slots_, capacity_, hidden_;
  DType dtype_;
};

// One sequence's part of a forward call: `tokens` at positions past_len.. in cache `slot`.
struct ForwardChunk {
  const int32_t* tokens = nullptr;
  int64_t count = 0;
  int64_t past_len = 0;
  int64_t slot = 0;
};

class OptModel {
 public:
  OptModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts = {});

  const OptConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  int64_t parameter_count() const { return parameter_count_; }
  size_t weight_bytes() const { return weight_bytes_; }
  DType weight_dtype() const { return weight_dtype_; }  // dtype of the big matrices
  const std::string& checkpoint_format() const { return format_; }

  // Runs the chunks through the model, appending their K/V to `cache`, and writes F32
  // logits to `logits` (host memory): one row per chunk (its last token), or one row per
  // token when all_positions. logits is [rows, vocab_size].
  void forward(const std::vector<ForwardChunk>& chunks, DeviceKvCache& cache, const Tensor& logits,
               bool all_positions = false);

 private:
  void load(const std::string& model_dir, const ModelLoadOptions& opts);

  Backend& backend_;
  OptConfig config_;
  std::string format_;
  Tensor embed_tokens_, embed_positions_, project_in_, project_out_, final_ln_w_, final_ln_b_, lm_head_;
  std::vector<OptLayer> layers_;
  int64_t parameter_count_ = 0;
  size_t weight_bytes_ = 0;
  DType weight_dtype_ = DType::F32;
  Workspace ws_;
};

}  // namespace kvpr
