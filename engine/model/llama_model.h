// Llama (Touvron et al. 2023; Hugging Face LlamaForCausalLM) written once against the Backend:
// RMSNorm before attention and MLP, rotary position embeddings on Q and K, SwiGLU MLP, no
// biases unless the config asks for them; grouped-query attention (fewer K/V heads, each
// serving a group of query heads); Qwen3's per-head norms of Q and K and its own head width;
// per-layer attention (sliding windows, Gemma 3's local rope); Gemma's layer (norms of the
// attention's and MLP's outputs, (1 + w) gains, GeGLU, scaled embeddings, soft-capped scores
// and logits).
// KVPR stores X (the normalised attention input) and recomputes K from it with the rows'
// positions: K = rope(k_norm(X · W_Kᵀ), position).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/llama_config.h"
#include "engine/model/model.h"

namespace kvpr {

struct LlamaLayer {
  Tensor attn_norm;                       // input_layernorm
  Weight wqkv;                            // q_proj, k_proj, v_proj stacked: [3, qw, h] (and [3, qw]) (MHA)
  Tensor bqkv;
  Weight wq, wkv;                         // grouped-query attention: q_proj [qw, h]; k_proj, v_proj
  Tensor bq, bkv;
                                          // stacked [2, kv_h, h] (and biases)
  Tensor q_norm, k_norm;                  // Qwen3: per-head RMSNorm gains [head_dim]
  Weight wo;                              // o_proj [h, qw]
  Tensor bo;
                                          // (qw = heads x head_dim, h unless config.json sets head_dim)
  Tensor attn_out_norm;                   // Gemma: post_attention_layernorm, on o_proj's output
  Tensor mlp_norm;                        // post_attention_layernorm (Gemma: pre_feedforward_layernorm)
  Tensor mlp_out_norm;                    // Gemma: post_feedforward_layernorm, on down_proj's output
  Weight w_gate_up, w_down;               // gate_proj, up_proj stacked: [2, ffn, h]; down_proj
  Tensor b_gate_up, b_down;               // (and their biases, [2, ffn] and [h])
  // Mixture of experts (a layer with a router has no dense MLP above): the router [E, h], each
  // expert's gate/up stacked [2, fe, h] and down [h, fe]; Qwen2-MoE's shared expert likewise and
  // its gate [1, h].
  Weight router;
  Tensor router_bias;                     // (gpt-oss: the router has a bias)
  std::vector<Weight> expert_gate_up, expert_down;
  std::vector<Tensor> expert_gate_up_bias, expert_down_bias;  // gpt-oss's experts' biases
  Tensor sinks;                           // gpt-oss: self_attn.sinks, F32 [heads]
  Weight shared_gate_up, shared_down, shared_gate;
};

class LlamaModel : public Model {
 public:
  LlamaModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts = {});
  // A model of this config with random weights of `dtype`, generated on the device; of `opts`,
  // stream_weights and kv_plan apply.
  LlamaModel(Backend& backend, const LlamaConfig& config, DType dtype, uint64_t seed, const ModelLoadOptions& opts = {});

  const LlamaConfig& config() const { return config_; }
  Tensor forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions = false) override;
  void project_kv(int64_t layer, const Tensor& x, const Tensor& kv, const Tensor& positions) override;
  bool needs_positions() const override { return true; }
  bool keeps_quantized() const override { return true; }
  // A mixture of experts reads the router's choices back to the host every layer.
  bool graph_capturable() const override { return !config_.moe(); }

 private:
  void assemble(const WeightSource& fetch) override;
  // Q/K/V and gate/up stacked into one tensor each, for one batched GEMM apiece.
  void stack_weights() override;
  // Streamed weights: Q/K/V first, then the output projection and the MLP.
  void stream_layers() override;
  void rope(const Tensor& x, const Tensor& positions, int64_t layer);
  // w + add in fp32, in place of w: Gemma's norm gains 1 + w (GemmaRMSNorm multiplies by
  // (1 + w.float())), gpt-oss's sinks as the attention reads them (add 0).
  Tensor as_f32(const Tensor& w, float add);
  std::optional<DType> derived_dtype(const CheckpointDir& ckpt, const std::string& key) const override;
  Tensor derived_weight(const CheckpointDir& ckpt, const std::string& key) const override;
  double derived_quantized_bytes(const CheckpointDir& ckpt, const std::string& key) const override;
  Weight derived_quantized_weight(const CheckpointDir& ckpt, const std::string& key) const override;
  // x += norm(y) with the gain `out_norm` (Gemma's output norms), else x += y, where y = a · wᵀ + b.
  void add_output(const Tensor& x, const Tensor& a, const Weight& w, const Tensor& b, const Tensor& out_norm);
  // Qwen3's per-head RMSNorm of rows [n, heads x head_dim] with `gain` (in place); nothing for
  // models without it.
  void head_norm(const Tensor& x, const Tensor& gain);
  // x += the layer's experts on `a` (rows [n, h]): the router's logits come back to the host,
  // which picks each row's experts and weights; each expert then runs on its rows, gathered,
  // and adds them back weighted (plus Qwen2-MoE's shared expert on every row).
  void reserve_scratch(const KvRuntime& kv);
  void decoder_layer(const LlamaLayer& L, int64_t li, int64_t g, const Tensor& xg, const Tensor& pos, KvRuntime& kv);
  void mixture_of_experts(const LlamaLayer& L, const Tensor& a, const Tensor& x);
  // a SwiGLU MLP of stacked gate/up `w_gate_up` [2, f, h] and `w_down` [h, f] on rows `a` [m, h]
  // into out [m, h] (out = ... when `accumulate` is false, else out += ...).
  void swiglu(const Tensor& a, const Weight& w_gate_up, const Tensor& b_gate_up, const Weight& w_down,
              const Tensor& b_down, const Tensor& out, bool accumulate);

  LlamaConfig config_;
  std::vector<RopeParams> ropes_;  // each layer's, from config_, once
  float embed_scale_ = 0;          // Gemma: sqrt(hidden) in the weights' dtype (0: none)
  // The checkpoint's key prefixes: "model." and "" (a wrapper's: "language_model.model." or
  // "model.language_model.", and "language_model." or "").
  std::string prefix_ = "model.", head_prefix_;
  Tensor embed_tokens_, final_norm_;
  Weight lm_head_;
  // The separate checkpoint tensors until stack_weights() joins them.
  struct Parts {
    Weight wq, wk, wv, w_gate, w_up;
    Tensor bq, bk, bv, b_gate, b_up;
    Weight wqkv, w_gate_up;  // Phi-3's fused matrices
    std::vector<Weight> expert_gate, expert_up;
    std::vector<Tensor> expert_gate_bias, expert_up_bias;
    Weight shared_gate, shared_up;
  };
  // Routing: the router's logits (and the shared expert gate's) read back, and each expert's rows
  // and weights sent up, through pinned host buffers.
  Tensor route_logits_, route_ids_, route_scales_;
  // The host's routing scratch: each expert's (row, weight) pairs, the experts' order and softmax.
  std::vector<std::vector<std::pair<int32_t, float>>> route_rows_;
  std::vector<int32_t> route_order_;
  std::vector<float> route_probs_;
  std::vector<Parts> parts_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace kvpr
