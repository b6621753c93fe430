// The Llama architecture's hyper-parameters (Llama-2 and the models built like it: Mistral,
// Qwen2/3, Mixtral, Qwen-MoE, Gemma 2/3, Phi-3/4), read from a Hugging Face config.json, or from the
// text_config of a ForConditionalGeneration wrapper (gemma3, mistral3) whose text model is one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/base/json.h"
#include "engine/model/model_spec.h"

namespace kvpr {

class ConfigFields;

// Whether model_type names Llama's architecture (and its variants above), or a wrapper of one.
bool is_llama_family(const std::string& model_type);
// The model_types is_llama_family accepts, for errors: "llama, mistral, ...".
const char* llama_family_names();

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double rope_freq_scale = 1.0;  // 1 / rope_scaling.factor for "linear" scaling
  // "llama3" scaling (Llama-3.1, 3.2): factor (0: none), the band's low and high frequency
  // factors and the original context the band is measured against (see RopeParams).
  double rope_llama3_factor = 0.0;
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  double rope_original_max_position = 8192.0;
  // "yarn" scaling (Qwen2.5's and Qwen3's long-context recipe): factor (0: none), the correction
  // range in element pairs from beta_fast/beta_slow against the original context (see RopeParams),
  // the attention factor cos and sin are multiplied by, and the context it extends to.
  double rope_yarn_factor = 0.0;
  double rope_yarn_low = 0.0, rope_yarn_high = 0.0;
  double rope_attention_factor = 1.0;
  int64_t rope_yarn_context = 0;
  // "longrope" scaling (Phi-3-128k, Phi-3.5, Phi-4-mini; "su" in the first configs): a factor per
  // rotary pair, the short ones while a sequence is at most original_max_position_embeddings
  // tokens long (longrope_original), the long ones once it is longer; cos and sin are scaled by
  // rope_attention_factor in both (see RopeParams).
  std::vector<double> longrope_short, longrope_long;
  int64_t longrope_original = 0;
  bool tie_word_embeddings = false;
  // Biases of the attention projections: Llama's attention_bias puts them on all four;
  // Qwen2 has them on q/k/v and not on o_proj.
  bool qkv_bias = false;
  bool o_bias = false;
  // Qwen3: an RMSNorm over each head of Q and of K (q_norm, k_norm: [head_dim] gains) after the
  // projection and before the rotation.
  bool qk_norm = false;
  // config.json's head_dim (0: absent). head_dim() is it, else hidden_size / num_attention_heads
  // (Qwen3-0.6B: 16 heads of 128 on a hidden size of 1024); Q and the attention output are
  // num_heads x head_dim() wide, which need not be hidden_size.
  int64_t config_head_dim = 0;
  bool mlp_bias = false;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = -1;
  std::string torch_dtype = "float32";
  std::string model_type = "llama";  // or "mistral", "qwen2", "qwen3": the same architecture; "mixtral",
                                     // "qwen2_moe", "qwen3_moe": the same with mixture-of-experts MLPs
  // Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): num_experts > 0 makes a layer's MLP a router
  // (gate [num_experts, hidden]) choosing experts_per_token of num_experts SwiGLU experts of width
  // moe_intermediate_size per token, their outputs summed with the router's softmax weights (over all
  // experts, then the chosen renormalised to sum 1 when norm_topk_prob). Qwen's layers i with
  // (i + 1) % decoder_sparse_step != 0 or listed in mlp_only_layers keep a dense MLP of
  // intermediate_size. Qwen2-MoE adds a shared expert of shared_expert_intermediate_size on every
  // token, scaled by sigmoid(shared_expert_gate · x).
  int64_t num_experts = 0, experts_per_token = 0, moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;
  bool moe() const { return num_experts > 0; }
  int64_t moe_layers() const {
    int64_t layers = 0;
    for (int64_t i = 0; i < num_layers; ++i) layers += moe_layer(i);
    return layers;
  }
  // Parameters of the experts a token does not use: (E - k) experts of every MoE layer.
  int64_t idle_expert_parameters() const {
    return moe_layers() * (num_experts - experts_per_token) * 3 * moe_intermediate_size * hidden_size;
  }
  bool moe_layer(int64_t i) const {
    return moe() && (i + 1) % decoder_sparse_step == 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) == mlp_only_layers.end();
  }
  // ---- per-layer attention ----
  // Sliding-window attention: a sliding layer's query at position i attends keys i - W < t <= i,
  // W = sliding_window (AttentionParams::window). Which layers slide: layer_types where the
  // config lists them, else the family's rule: every layer (Mistral-7B-v0.1), those from
  // max_window_layers on (Qwen2 with use_sliding_window), the even ones (Gemma 2), all but every
  // sliding_window_pattern-th (Gemma 3: 5 local to 1 global).
  int64_t sliding_window = 0;
  std::vector<uint8_t> sliding_layers;  // per layer, 1: sliding (empty: none slides)
  bool sliding(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[layer];
  }
  int64_t window(int64_t layer) const { return sliding(layer) ? sliding_window : 0; }
  // Gemma 3: sliding layers turn by this base with no scaling (rope_local_base_freq; 0: every
  // layer turns as rope_theta and rope_scaling say).
  double local_rope_theta = 0;
  // Scores are scaled by query_pre_attn_scalar^-1/2 (Gemma; 0: head_dim^-1/2) and soft-capped by
  // attn_softcap (Gemma 2's attn_logit_softcapping; 0: none); the logits by final_softcap.
  double query_pre_attn_scalar = 0;
  double attn_softcap = 0, final_softcap = 0;
  // The gated MLP's activation (hidden_act, Gemma's hidden_activation): SwiGLU or GeGLU.
  Activation mlp_activation = Activation::SiLU;
  // Gemma's layer: RMSNorm gains stored as offsets (y = x̂ · (1 + w), in fp32); the attention's
  // and the MLP's outputs normed again before the residual add (post_attention_layernorm,
  // post_feedforward_layernorm; the MLP's input norm is pre_feedforward_layernorm); embeddings
  // multiplied by sqrt(hidden_size) rounded to the weights' dtype (the tied head reads them
  // unscaled).
  bool gemma_norms = false;
  // Phi-3: Q, K and V in one matrix (qkv_proj, rows q then k then v) and gate and up in another
  // (gate_up_proj, gate's rows first).
  bool fused_projections = false;
  // gpt-oss: a sink logit per query head in every layer's softmax (self_attn.sinks), a bias on the
  // router, biases on the experts (their fused, MXFP4-packed tensors: gpt_oss_experts.h).
  bool attention_sinks = false;
  bool router_bias = false, expert_bias = false;
  // partial_rotary_factor (Phi-4-mini: 0.75): rope turns the first rope_dim() elements of a head.
  double partial_rotary_factor = 1.0;
  int64_t rope_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor); }
  // The ForConditionalGeneration wrapper read ("gemma3", "mistral3"; empty: none): its text
  // model's weights are under language_model.model. (or model.language_model.), its head under
  // language_model.lm_head. (or lm_head.); the vision tower's are not read.
  std::string wrapper;
  // The context served: max_position_embeddings, or YaRN's factor x original_max_position_embeddings
  // where that is longer (Qwen2.5: 32768 -> 131072), as vLLM serves it. A sliding window does not
  // shorten it: the attention masks every layer exactly.
  int64_t context() const { return std::max(max_position_embeddings, rope_yarn_context); }
  float attention_scale() const {
    return query_pre_attn_scalar > 0 ? static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar))
                                     : 1.f / std::sqrt(static_cast<float>(head_dim()));
  }

  // What Hugging Face calls the architecture (kvpr info).
  const char* architecture() const {
    return wrapper == "gemma3"         ? "Gemma3ForConditionalGeneration"
           : wrapper == "mistral3"     ? "Mistral3ForConditionalGeneration"
           : model_type == "mistral"     ? "MistralForCausalLM"
           : model_type == "mixtral"   ? "MixtralForCausalLM"
           : model_type == "qwen2"     ? "Qwen2ForCausalLM"
           : model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
           : model_type == "qwen3"     ? "Qwen3ForCausalLM"
           : model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
           : model_type == "gemma2"    ? "Gemma2ForCausalLM"
           : model_type == "gemma3_text" ? "Gemma3ForCausalLM"
           : model_type == "phi3"      ? "Phi3ForCausalLM"
           : model_type == "gpt_oss"   ? "GptOssForCausalLM"
                                       : "LlamaForCausalLM";
  }

  int64_t head_dim() const { return config_head_dim > 0 ? config_head_dim : hidden_size / num_heads; }
  int64_t q_width() const { return num_heads * head_dim(); }  // Q and the attention output
  RopeParams rope_params() const;  // what Backend::rope turns Q and K by
  RopeParams rope_params(int64_t layer) const;  // ... of this layer (Gemma 3's local layers' own)
  // Sets the rope_yarn_* fields and the attention factor from rope_scaling's yarn fields (zeros:
  // transformers' defaults); needs head_dim and rope_theta.
  void set_yarn(double factor, double original, double beta_fast, double beta_slow, double attention_factor,
                double mscale, double mscale_all_dim, bool truncate, const std::string& source);

  // Checks the longrope factors against the rotary pairs; sets the original context (default
  // max_position_embeddings) and the attention factor where the config gives none.
  void set_longrope(const std::string& source);

  // Parses and validates; errors name `source` and the offending field. What kvpr does not
  // run (KV heads that do not divide the heads, rope scaling other than linear, llama3, yarn and
  // longrope, activations other than silu, gelu and gelu_pytorch_tanh, layer types other than
  // sliding and full attention) is refused here, by name.
  static LlamaConfig from_json(const json::Value& v, const std::string& source);
  static LlamaConfig load(const std::string& model_dir);  // <dir>/config.json
  static void read_moe(const ConfigFields& f, LlamaConfig& c);  // the experts' fields, by model_type

  ModelSpec spec() const;
};

}  // namespace kvpr
