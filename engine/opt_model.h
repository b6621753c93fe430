// OPT (Zhang et al. 2022; Hugging Face OPTForCausalLM) written once against the Backend.
// Pre-LN and post-LN (opt-350m) variants, word_embed_proj_dim projections, tied lm_head.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_runtime.h"
#include "engine/weight_broadcast.h"
#include "engine/opt_config.h"

namespace kvpr {

struct ModelLoadOptions {
  // Storage dtype for weights; unset keeps each tensor's checkpoint dtype.
  bool convert_weights = false;
  DType weight_dtype = DType::F32;
  // Called after each tensor is uploaded with the bytes done and the checkpoint's total.
  std::function<void(size_t done, size_t total)> progress;
  // Several GPUs: rank 0 reads the checkpoint, the others receive the weights from it.
  WeightBroadcaster* broadcast = nullptr;
};

struct OptLayer {
  Tensor attn_ln_w, attn_ln_b;  // self_attn_layer_norm
  Tensor wq, bq, wk, bk, wv, bv, wo, bo;
  // Q, K and V projections stacked ([3, h, h] and [3, h]; wq..bv are views into them) when
  // their dtypes agree, for one batched GEMM per layer. Undefined otherwise.
  Tensor wqkv, bqkv;
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

class OptModel : public KvProjector {
 public:
  OptModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts = {});
  // A model of this config with random weights of `dtype`, generated on the device
  // (benchmarks: OPT-6.7B shapes without a 13 GB download).
  OptModel(Backend& backend, const OptConfig& config, DType dtype, uint64_t seed);

  const OptConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  int64_t parameter_count() const { return parameter_count_; }
  size_t weight_bytes() const { return weight_bytes_; }
  DType weight_dtype() const { return weight_dtype_; }  // dtype of the big matrices
  const std::string& checkpoint_format() const { return format_; }

  // Runs the chunks through the model with the runtime providing each layer's past K/V
  // (and storing the new ones), and writes F32 logits to `logits` (host memory): one row per
  // chunk (its last token), or one row per token for chunks with all_rows and for every chunk
  // when all_positions; rows in chunk order. logits is [rows, vocab].
  void forward(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, const Tensor& logits,
               bool all_positions = false);
  // The same, leaving the logits in device memory: a view of a workspace buffer, valid until
  // the next forward, with the work possibly still running on the compute stream.
  Tensor forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions = false);

  KvShape kv_shape() const { return KvShape{config_.num_layers, config_.hidden_size, config_.num_heads}; }
  // Runtime for this model: `slots` sequences of up to `capacity` tokens.
  std::unique_ptr<KvRuntime> make_kv_runtime(int64_t slots, int64_t capacity, const KvRuntimeOptions& opts);

  void project_kv(int64_t layer, const Tensor& x, const Tensor& kv) override;

 private:
  enum class WeightRole { Matrix, Embedding, NormGain, Bias };
  // Returns the tensor `name` (without the decoder prefix) of the given shape, or an
  // undefined tensor when it is absent and not required.
  using WeightSource = std::function<Tensor(const std::string& name, const Shape& shape, bool required, WeightRole)>;
  void load(const std::string& model_dir, const ModelLoadOptions& opts);
  void assemble(const WeightSource& fetch);
  // Stacks each layer's Q, K, V weights (and biases) into one tensor; after every weight
  // has its values (the broadcast included).
  void stack_qkv();

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
