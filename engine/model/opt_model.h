// OPT (Zhang et al. 2022; Hugging Face OPTForCausalLM) written once against the Backend.
// Pre-LN and post-LN (opt-350m) variants, word_embed_proj_dim projections, tied lm_head.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/model/opt_config.h"

namespace kvpr {

// The matrices are Weights: dense, or a quantized checkpoint's kept as stored (weight.h).
struct OptLayer {
  Tensor attn_ln_w, attn_ln_b;  // self_attn_layer_norm
  Weight wq, wk, wv, wo;
  Tensor bq, bk, bv, bo;
  // Q, K and V projections stacked ([3, h, h] and [3, h]; wq..bv are views into them) when
  // their dtypes (or quantized layouts) agree, for one batched GEMM per layer. Undefined otherwise.
  Weight wqkv;
  Tensor bqkv;
  Tensor ffn_ln_w, ffn_ln_b;    // final_layer_norm of the layer
  Weight fc1_w, fc2_w;
  Tensor fc1_b, fc2_b;
};

class OptModel : public Model {
 public:
  OptModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts = {});
  // A model of this config with random weights of `dtype`, generated on the device
  // (benchmarks: OPT-6.7B shapes without a 13 GB download); of `opts`, stream_weights and kv_plan
  // apply.
  OptModel(Backend& backend, const OptConfig& config, DType dtype, uint64_t seed, const ModelLoadOptions& opts = {});

  const OptConfig& config() const { return config_; }
  Tensor forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions = false) override;
  void project_kv(int64_t layer, const Tensor& x, const Tensor& kv, const Tensor& positions) override;
  DType kv_dtype_for(DType storage) const override;

 private:
  void reserve_scratch(const KvRuntime& kv);
  void decoder_layer(const OptLayer& L, int64_t li, int64_t g, const Tensor& xg, KvRuntime& kv);
  void load(const std::string& model_dir, const ModelLoadOptions& opts);
  void assemble(const WeightSource& fetch) override;
  // Stacks each layer's Q, K, V weights (and biases) into one tensor; after every weight
  // has its values (the broadcast included).
  void stack_weights() override;
  // Streamed weights: Q/K/V first, then the output projection and the MLP.
  void stream_layers() override;

  bool keeps_quantized() const override { return true; }

  OptConfig config_;
  Tensor embed_tokens_, embed_positions_, final_ln_w_, final_ln_b_;
  Weight project_in_, project_out_, lm_head_;
  std::vector<OptLayer> layers_;
};

}  // namespace kvpr
