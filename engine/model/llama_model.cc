#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/model/checkpoint.h"
#include "engine/base/error.h"
#include "engine/base/dtype.h"
#include "engine/model/gpt_oss_experts.h"

namespace kvpr {

namespace {
std::vector<RopeParams> layer_ropes(const LlamaConfig& c) {
  std::vector<RopeParams> r;
  for (int64_t i = 0; i < c.num_layers; ++i) r.push_back(c.rope_params(i));
  return r;
}
}  // namespace

LlamaModel::LlamaModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts)
    : Model(backend) {
  config_ = LlamaConfig::load(model_dir);
  spec_ = config_.spec();
  ropes_ = layer_ropes(config_);
  load_checkpoint(
      model_dir, opts,
      [&](const CheckpointDir& ckpt) {
        // A wrapper's text model: under the names transformers wrote first, or under those it
        // has saved since 4.52 (its _checkpoint_conversion_mapping), head included.
        if (!config_.wrapper.empty()) {
          const bool renamed = ckpt.find("model.language_model.embed_tokens.weight") != nullptr;
          prefix_ = renamed ? "model.language_model." : "language_model.model.";
          head_prefix_ = renamed ? "" : "language_model.";
        }
        KVPR_CHECK(ckpt.find(prefix_ + "embed_tokens.weight"), model_dir, ": missing tensor '", prefix_,
                   "embed_tokens.weight' in ", ckpt.format(), " checkpoint");
      },
      [&](const std::string& name) { return name == "lm_head.weight" ? head_prefix_ + name : prefix_ + name; });
}

LlamaModel::LlamaModel(Backend& backend, const LlamaConfig& config, DType dtype, uint64_t seed,
                       const ModelLoadOptions& opts)
    : Model(backend), config_(config), ropes_(layer_ropes(config)) {
  spec_ = config_.spec();
  init_random(dtype, seed, opts);
}

void LlamaModel::stream_layers() {
  start_streaming([&](LayerWeightStream& ws) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      LlamaLayer& L = layers_[i];
      const int64_t li = static_cast<int64_t>(i);
      if (L.wqkv.defined()) {
        ws.add(li, &L.wqkv, LayerWeightStream::Part::Front);
      } else {
        ws.add(li, &L.wq, LayerWeightStream::Part::Front);
        ws.add(li, &L.wkv, LayerWeightStream::Part::Front);
      }
      for (Weight* w : {&L.wo, &L.w_gate_up, &L.w_down, &L.router, &L.shared_gate_up, &L.shared_down, &L.shared_gate})
        if (w->defined()) ws.add(li, w, LayerWeightStream::Part::Back);
      for (std::vector<Weight>* ws_experts : {&L.expert_gate_up, &L.expert_down})
        for (Weight& w : *ws_experts) ws.add(li, &w, LayerWeightStream::Part::Back);
    }
  });
}

void LlamaModel::assemble(const WeightSource& fetch) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, kvh = c.num_kv_heads * c.head_dim(), qw = c.q_width();
  auto matrix = [&](const std::string& name, Shape shape) { return fetch(name, shape, true, WeightRole::Matrix); };
  auto bias = [&](const std::string& name, int64_t n, bool on) {
    return on ? fetch(name, {n}, true, WeightRole::Bias).dense("bias") : Tensor();
  };
  auto vector = [&](const std::string& name, int64_t n) { return fetch(name, {n}, true, WeightRole::NormGain).dense("gain"); };
  auto gain = [&](const std::string& name) { return vector(name, h); };
  layers_.clear();
  parts_.clear();
  embed_tokens_ = fetch("embed_tokens.weight", {c.vocab_size, h}, true, WeightRole::Embedding).dense("embedding");
  weight_dtype_ = embed_tokens_.dtype();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LlamaLayer L;
    Parts P;
    L.attn_norm = gain(p + "input_layernorm.weight");
    if (c.fused_projections) {  // Phi-3: rows q, k, v of one matrix
      P.wqkv = matrix(p + "self_attn.qkv_proj.weight", {qw + 2 * kvh, h});
    } else {
      P.wq = matrix(p + "self_attn.q_proj.weight", {qw, h});
      P.wk = matrix(p + "self_attn.k_proj.weight", {kvh, h});
      P.wv = matrix(p + "self_attn.v_proj.weight", {kvh, h});
    }
    L.wo = matrix(p + "self_attn.o_proj.weight", {h, qw});
    if (c.qk_norm) {
      L.q_norm = vector(p + "self_attn.q_norm.weight", c.head_dim());
      L.k_norm = vector(p + "self_attn.k_norm.weight", c.head_dim());
    }
    P.bq = bias(p + "self_attn.q_proj.bias", qw, c.qkv_bias);
    P.bk = bias(p + "self_attn.k_proj.bias", kvh, c.qkv_bias);
    P.bv = bias(p + "self_attn.v_proj.bias", kvh, c.qkv_bias);
    L.bo = bias(p + "self_attn.o_proj.bias", h, c.o_bias);
    if (c.attention_sinks) L.sinks = bias(p + "self_attn.sinks", c.num_heads, true);
    if (c.gemma_norms) {  // Gemma's four: the attention's and the MLP's inputs and outputs
      L.attn_out_norm = gain(p + "post_attention_layernorm.weight");
      L.mlp_norm = gain(p + "pre_feedforward_layernorm.weight");
      L.mlp_out_norm = gain(p + "post_feedforward_layernorm.weight");
    } else {
      L.mlp_norm = gain(p + "post_attention_layernorm.weight");
    }
    if (c.moe_layer(i)) {
      // Mixtral's block_sparse_moe (experts' w1 gate, w3 up, w2 down), Qwen's mlp.experts, or
      // gpt-oss's mlp.router and experts (with biases; derived from its fused tensors).
      const bool mixtral = c.model_type == "mixtral";
      const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const int64_t fe = c.moe_intermediate_size;
      const std::string router = c.router_bias ? "router." : "gate.";
      L.router = matrix(m + router + "weight", {c.num_experts, h});
      L.router_bias = bias(m + router + "bias", c.num_experts, c.router_bias);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        P.expert_gate.push_back(matrix(x + (mixtral ? "w1.weight" : "gate_proj.weight"), {fe, h}));
        P.expert_up.push_back(matrix(x + (mixtral ? "w3.weight" : "up_proj.weight"), {fe, h}));
        L.expert_down.push_back(matrix(x + (mixtral ? "w2.weight" : "down_proj.weight"), {h, fe}));
        if (c.expert_bias) {
          P.expert_gate_bias.push_back(bias(x + "gate_proj.bias", fe, true));
          P.expert_up_bias.push_back(bias(x + "up_proj.bias", fe, true));
          L.expert_down_bias.push_back(bias(x + "down_proj.bias", h, true));
        }
      }
      if (const int64_t fs = c.shared_expert_intermediate_size; fs > 0) {
        P.shared_gate = matrix(m + "shared_expert.gate_proj.weight", {fs, h});
        P.shared_up = matrix(m + "shared_expert.up_proj.weight", {fs, h});
        L.shared_down = matrix(m + "shared_expert.down_proj.weight", {h, fs});
        L.shared_gate = matrix(m + "shared_expert_gate.weight", {1, h});
      }
    } else if (c.fused_projections) {  // Phi-3: gate's rows, then up's
      P.w_gate_up = matrix(p + "mlp.gate_up_proj.weight", {2 * f, h});
      L.w_down = matrix(p + "mlp.down_proj.weight", {h, f});
    } else {
      P.w_gate = matrix(p + "mlp.gate_proj.weight", {f, h});
      P.w_up = matrix(p + "mlp.up_proj.weight", {f, h});
      L.w_down = matrix(p + "mlp.down_proj.weight", {h, f});
      P.b_gate = bias(p + "mlp.gate_proj.bias", f, c.mlp_bias);
      P.b_up = bias(p + "mlp.up_proj.bias", f, c.mlp_bias);
      L.b_down = bias(p + "mlp.down_proj.bias", h, c.mlp_bias);
    }
    layers_.push_back(std::move(L));
    parts_.push_back(std::move(P));
  }
  final_norm_ = gain("norm.weight");
  // Tied models may still ship lm_head.weight; use it when present.
  lm_head_ = fetch("lm_head.weight", {c.vocab_size, h}, !c.tie_word_embeddings, WeightRole::Matrix);
  if (!lm_head_.defined()) lm_head_ = embed_tokens_;
  backend_.synchronize();
}

Tensor LlamaModel::as_f32(const Tensor& w, float add) {
  if (!w.defined()) return w;
  Tensor stored = Tensor::host(w.dtype(), w.shape()), gain = Tensor::host(DType::F32, w.shape());
  backend_.copy(stored, w, Stream::D2H, "to f32");
  backend_.synchronize();
  for (int64_t i = 0; i < w.numel(); ++i)
    gain.data_as<float>()[i] = add + load_as_f32(stored.data(), w.dtype(), static_cast<size_t>(i));
  Tensor dev = backend_.alloc(DType::F32, w.shape());
  backend_.copy(dev, gain, Stream::H2D, "to f32");
  backend_.synchronize();
  return dev;
}

std::optional<DType> LlamaModel::derived_dtype(const CheckpointDir& ckpt, const std::string& key) const {
  return config_.model_type == "gpt_oss" ? gpt_oss_expert_dtype(ckpt, key) : std::nullopt;
}

Tensor LlamaModel::derived_weight(const CheckpointDir& ckpt, const std::string& key) const {
  return config_.model_type == "gpt_oss" ? gpt_oss_expert_weight(ckpt, key) : Tensor();
}

double LlamaModel::derived_quantized_bytes(const CheckpointDir& ckpt, const std::string& key) const {
  return config_.model_type == "gpt_oss" ? gpt_oss_expert_fp4_bytes(ckpt, key) : 0;
}

Weight LlamaModel::derived_quantized_weight(const CheckpointDir& ckpt, const std::string& key) const {
  return config_.model_type == "gpt_oss" ? gpt_oss_expert_fp4(ckpt, key) : Weight();
}

void LlamaModel::stack_weights() {
  backend_.synchronize();  // every weight has landed (uploads, random fills, broadcast)
  if (config_.gemma_norms) {
    for (LlamaLayer& L : layers_)
      for (Tensor* g : {&L.attn_norm, &L.attn_out_norm, &L.mlp_norm, &L.mlp_out_norm, &L.q_norm, &L.k_norm})
        *g = as_f32(*g, 1.f);
    final_norm_ = as_f32(final_norm_, 1.f);
    // sqrt(hidden) as transformers multiplies by it: a tensor of the weights' dtype.
    const float s = std::sqrt(static_cast<float>(config_.hidden_size));
    const DType dt = embed_tokens_.dtype();
    embed_scale_ = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : dt == DType::F16 ? f16_to_f32(f32_to_f16(s)) : s;
  }
  for (LlamaLayer& L : layers_) L.sinks = as_f32(L.sinks, 0.f);
  for (size_t i = 0; i < layers_.size(); ++i) {
    LlamaLayer& L = layers_[i];
    Parts& P = parts_[i];
    const int64_t qw = config_.q_width(), kvh = config_.num_kv_heads * config_.head_dim(), h = config_.hidden_size;
    if (P.wqkv.defined()) {  // fused: Q's rows, then K's and V's, already stacked as the GEMMs read them
      if (config_.num_kv_heads == config_.num_heads) {
        L.wqkv = P.wqkv.reshape({3, qw, h});
      } else {
        L.wq = P.wqkv.rows(0, qw);
        L.wkv = P.wqkv.rows(qw, 2 * kvh).reshape({2, kvh, h});
      }
    } else if (config_.num_kv_heads == config_.num_heads) {
      L.wqkv = stack({&P.wq, &P.wk, &P.wv});
      if (P.bq.defined()) L.bqkv = stack({&P.bq, &P.bk, &P.bv});
    } else {  // K and V are narrower than Q: Q alone, K and V stacked
      L.wq = P.wq;
      L.bq = P.bq;
      L.wkv = stack({&P.wk, &P.wv});
      if (P.bk.defined()) L.bkv = stack({&P.bk, &P.bv});
    }
    if (P.w_gate.defined()) L.w_gate_up = stack({&P.w_gate, &P.w_up});
    if (P.w_gate_up.defined()) L.w_gate_up = P.w_gate_up.reshape({2, config_.intermediate_size, h});
    if (P.b_gate.defined()) L.b_gate_up = stack({&P.b_gate, &P.b_up});
    if (P.shared_gate.defined()) L.shared_gate_up = stack({&P.shared_gate, &P.shared_up});
    for (size_t e = 0; e < P.expert_gate.size(); ++e) L.expert_gate_up.push_back(stack({&P.expert_gate[e], &P.expert_up[e]}));
    for (size_t e = 0; e < P.expert_gate_bias.size(); ++e)
      L.expert_gate_up_bias.push_back(stack({&P.expert_gate_bias[e], &P.expert_up_bias[e]}));
    // Free the layer's parts once its copies are done, so loading never holds two copies of the
    // model (in pinned memory when streamed, on the device otherwise).
    backend_.synchronize();
    P = Parts();
  }
  backend_.synchronize();  // the copies are done before the separate tensors go
  parts_.clear();
}

void LlamaModel::rope(const Tensor& x, const Tensor& positions, int64_t layer) {
  backend_.rope(x, positions, static_cast<int>(config_.head_dim()), ropes_[static_cast<size_t>(layer)]);
}

void LlamaModel::add_output(const Tensor& x, const Tensor& a, const Weight& w, const Tensor& b, const Tensor& out_norm) {
  if (!out_norm.defined()) {
    backend_.linear_accumulate(x, a, w, b);
    return;
  }
  Tensor y = ws_.get("out", DType::F32, {x.dim(0), x.dim(1)});
  backend_.linear(y, a, w, b, Activation::None);
  backend_.rms_norm(y, y, out_norm, static_cast<float>(config_.rms_norm_eps));
  backend_.add(x, x, y);
}

void LlamaModel::head_norm(const Tensor& x, const Tensor& gain) {
  if (!gain.defined()) return;
  const int64_t hd = config_.head_dim(), heads = x.numel() / hd;
  Tensor rows = x.reshape({heads, hd});
  backend_.rms_norm(rows, rows, gain, static_cast<float>(config_.rms_norm_eps));
}

void LlamaModel::project_kv(int64_t layer, const Tensor& x, const Tensor& kv, const Tensor& positions) {
  const LlamaLayer& L = layers_.at(layer);
  KVPR_CHECK(positions.defined() && positions.numel() == kv.dim(1), "llama project_kv needs the rows' positions");
  if (L.wqkv.defined())
    backend_.linear_batched(kv, x, L.wqkv.rows(1, 2), L.bqkv.defined() ? L.bqkv.rows(1, 2) : Tensor(),
                            Activation::None);
  else
    backend_.linear_batched(kv, x, L.wkv, L.bkv, Activation::None);
  const int64_t n = kv.dim(1), w = kv.dim(2);
  Tensor k = kv.rows(0, 1).reshape({n, w});
  head_norm(k, L.k_norm);
  rope(k, positions, layer);  // K turns; V does not
}

void LlamaModel::swiglu(const Tensor& a, const Weight& w_gate_up, const Tensor& b_gate_up, const Weight& w_down,
                        const Tensor& b_down, const Tensor& out, bool accumulate) {
  const int64_t m = a.dim(0), f = w_gate_up.dim(1);
  Tensor gate_up = ws_.get("moe_gu", DType::F32, {2, m, f});
  Tensor gate = gate_up.rows(0, 1).reshape({m, f}), up = gate_up.rows(1, 1).reshape({m, f});
  backend_.linear_batched(gate_up, a, w_gate_up, b_gate_up, Activation::None);
  backend_.gated_mul(gate, gate, up, config_.mlp_activation);
  if (accumulate)
    backend_.linear_accumulate(out, gate, w_down, b_down);
  else
    backend_.linear(out, gate, w_down, b_down, Activation::None);
}

void LlamaModel::mixture_of_experts(const LlamaLayer& L, const Tensor& a, const Tensor& x) {
  const LlamaConfig& c = config_;
  Backend& be = backend_;
  const int64_t n = a.dim(0), h = c.hidden_size, E = c.num_experts, k = c.experts_per_token;
  const bool shared = L.shared_gate.defined();
  // The router's logits [n, E] (and the shared expert's gate logits [n]) to the host.
  const int64_t width = E + (shared ? 1 : 0);
  Tensor buf = ws_.get("router", DType::F32, {n * width});
  be.linear(buf.rows(0, n * E).reshape({n, E}), a, L.router, L.router_bias, Activation::None);
  if (shared) be.linear(buf.rows(n * E, n).reshape({n, 1}), a, L.shared_gate, Tensor(), Activation::None);
  // Both ways on the compute stream: the copy streams carry the KV runtime's transfers of other
  // layers (offload, kvpr), which these few bytes must not queue behind.
  Tensor host = route_logits_.rows(0, n * width);
  be.copy(host, buf, Stream::Compute, "router logits");
  be.synchronize(be.record(Stream::Compute));

  // Each row's experts: softmax over all E in fp32, the k most likely (the lower index first
  // among equals), their weights renormalised to sum 1 with norm_topk_prob (Mixtral, Qwen3-MoE).
  const float* lg = host.data_as<float>();
  auto& rows_of = route_rows_;  // reused from layer to layer: no allocation per layer once warm
  rows_of.resize(static_cast<size_t>(E));
  for (auto& rows : rows_of) rows.clear();
  std::vector<int32_t>& order = route_order_;
  std::vector<float>& p = route_probs_;
  order.resize(static_cast<size_t>(E));
  p.resize(static_cast<size_t>(E));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = lg + r * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t i, int32_t j) { return p[i] > p[j] || (p[i] == p[j] && i < j); });
    float chosen = 0.f;
    for (int64_t j = 0; j < k; ++j) chosen += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[j];
      rows_of[e].push_back({static_cast<int32_t>(r), c.norm_topk_prob ? p[e] / chosen : p[e]});
    }
  }
  // Every expert's rows and weights in one upload, expert by expert (then the shared expert's).
  int32_t* ids = route_ids_.data_as<int32_t>();
  float* scales = route_scales_.data_as<float>();
  int64_t total = 0;
  for (const auto& rows : rows_of)
    for (const auto& [r, w] : rows) ids[total] = r, scales[total++] = w;
  if (shared) {
    const float* g = lg + n * E;
    for (int64_t r = 0; r < n; ++r) ids[total] = static_cast<int32_t>(r), scales[total++] = 1.f / (1.f + std::exp(-g[r]));
  }
  Tensor dev_ids = ws_.get("moe_ids", DType::I32, {total}), dev_scales = ws_.get("moe_scales", DType::F32, {total});
  be.copy(dev_ids, route_ids_.rows(0, total), Stream::Compute, "expert rows");
  be.copy(dev_scales, route_scales_.rows(0, total), Stream::Compute, "expert weights");

  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = static_cast<int64_t>(rows_of[e].size());
    if (m == 0) continue;
    Tensor ae = ws_.get("moe_a", DType::F32, {m, h}), out = ws_.get("moe_out", DType::F32, {m, h});
    be.gather_rows(ae, a, dev_ids.rows(at, m));
    const bool biased = !L.expert_down_bias.empty();
    swiglu(ae, L.expert_gate_up[e], biased ? L.expert_gate_up_bias[e] : Tensor(), L.expert_down[e],
           biased ? L.expert_down_bias[e] : Tensor(), out, false);
    be.scatter_add_rows(x, out, dev_ids.rows(at, m), dev_scales.rows(at, m));
    at += m;
  }
  if (shared) {  // sigmoid(gate · a) * shared_expert(a), on every row
    Tensor out = ws_.get("moe_out", DType::F32, {n, h});
    swiglu(a, L.shared_gate_up, Tensor(), L.shared_down, Tensor(), out, false);
    be.scatter_add_rows(x, out, dev_ids.rows(at, n), dev_scales.rows(at, n));
  }
}

// Scratch for one GPU batch (kv.groups() of them per layer; one unless asked for), sized once
// for the largest so no buffer moves during the step.
void LlamaModel::reserve_scratch(const KvRuntime& kv) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, kvh = c.num_kv_heads * c.head_dim(), qw = c.q_width();
  Backend& be = backend_;
  int64_t rows_max = 0;
  for (int64_t g = 0; g < kv.groups(); ++g) rows_max = std::max(rows_max, kv.group_rows(g).count);
  for (auto [name, width] : {std::pair{"a", h}, {"qkv", qw + 2 * kvh}, {"att", qw}, {"gate_up", 2 * f}})
    ws_.get(name, DType::F32, {rows_max, width});
  if (c.gemma_norms) ws_.get("out", DType::F32, {rows_max, h});
  if (c.moe()) {  // the experts' scratch, for up to every row of a batch per expert
    const int64_t k = c.experts_per_token + 1, fe = std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size);
    for (auto [name, width] : {std::pair{"moe_a", h}, {"moe_gu", 2 * fe}, {"moe_out", h}, {"router", c.num_experts + 1}})
      ws_.get(name, DType::F32, {rows_max, width});
    ws_.get("moe_ids", DType::I32, {rows_max * k});
    ws_.get("moe_scales", DType::F32, {rows_max * k});
    if (!route_logits_.defined() || route_logits_.numel() < rows_max * (c.num_experts + 1)) {
      be.synchronize();  // the previous step's uploads from the old buffers are done
      route_logits_ = be.alloc_pinned(DType::F32, {rows_max * (c.num_experts + 1)});
      route_ids_ = be.alloc_pinned(DType::I32, {rows_max * k});
      route_scales_ = be.alloc_pinned(DType::F32, {rows_max * k});
    }
  }
}

// Layer li for GPU batch g: xg, its rows of the residual stream, and pos, their positions.
void LlamaModel::decoder_layer(const LlamaLayer& L, int64_t li, int64_t g, const Tensor& xg, const Tensor& pos,
                               KvRuntime& kv) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, kvh = c.num_kv_heads * c.head_dim(), qw = c.q_width();
  const int64_t n = xg.dim(0);
  Backend& be = backend_;
  const bool mha = c.num_kv_heads == c.num_heads;  // Q, K and V equally wide: stacked
  AttentionParams attention(c.attention_scale(), c.window(li), static_cast<float>(c.attn_softcap));
  attention.sinks = L.sinks;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor a = ws_.get("a", DType::F32, {n, h});            // normalised input of a sub-block
  // Q, K, V: stacked [3, n, qw] (MHA, one batched GEMM); with grouped-query attention Q
  // [n, qw] and K, V stacked [2, n, kv_h].
  Tensor qkv = ws_.get("qkv", DType::F32, {n * qw + 2 * n * kvh});
  Tensor q = qkv.rows(0, n * qw).reshape({n, qw});
  Tensor kv_new = qkv.rows(n * qw, 2 * n * kvh).reshape({2, n, kvh});
  Tensor k = kv_new.rows(0, 1).reshape({n, kvh});
  Tensor v = kv_new.rows(1, 1).reshape({n, kvh});
  Tensor att = ws_.get("att", DType::F32, {n, qw});
  Tensor gate_up = ws_.get("gate_up", DType::F32, {2, n, f});  // [gate; up]
  Tensor gate = gate_up.rows(0, 1).reshape({n, f}), up = gate_up.rows(1, 1).reshape({n, f});
  kv.prepare(li, g);
  // Self-attention. `a` is X, the post-norm input of the QKV projection.
  be.rms_norm(a, xg, L.attn_norm, eps);
  if (mha) {
    be.linear_batched(qkv.reshape({3, n, qw}), a, L.wqkv, L.bqkv, Activation::None);
  } else {
    be.linear(q, a, L.wq, L.bq, Activation::None);
    be.linear_batched(kv_new, a, L.wkv, L.bkv, Activation::None);
  }
  head_norm(q, L.q_norm);
  head_norm(k, L.k_norm);
  if (mha) {
    rope(qkv.rows(0, 2 * n * qw).reshape({2, n, qw}), pos, li);  // Q and K, [2, n, qw]: one launch
  } else {
    rope(q, pos, li);
    rope(k, pos, li);
  }
  kv.attend(li, g, a, q, k, v, att, attention);
  add_output(xg, att, L.wo, L.bo, L.attn_out_norm);  // x += att · Woᵀ (Gemma: normed first)
  // Gated MLP: x += (act(a · Wgᵀ) * (a · Wuᵀ)) · Wdᵀ (SwiGLU, Gemma's GeGLU), or a mixture of
  // SwiGLU experts.
  be.rms_norm(a, xg, L.mlp_norm, eps);
  if (L.router.defined()) {
    mixture_of_experts(L, a, xg);
  } else {
    be.linear_batched(gate_up, a, L.w_gate_up, L.b_gate_up, Activation::None);
    be.gated_mul(gate, gate, up, c.mlp_activation);
    add_output(xg, gate, L.w_down, L.b_down, L.mlp_out_norm);
  }
}

Tensor LlamaModel::forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, V = c.vocab_size;
  Backend& be = backend_;
  int64_t rows = 0;
  const int64_t T = check_chunks(chunks, all_positions, &rows);
  // Token ids, positions (from 0) and the rows whose logits we want, uploaded together.
  Tensor ids = upload_ids(chunks, T, rows, all_positions, 0);
  Tensor tok_ids = ids.rows(0, T), pos_ids = ids.rows(T, T), out_rows = ids.rows(2 * T, rows);

  Tensor x = ws_.get("x", DType::F32, {T, h});  // residual stream [T, hidden]
  be.gather_rows(x, embed_tokens_, tok_ids);
  if (embed_scale_ > 0) be.scale(x, x, embed_scale_, 0.f);  // Gemma
  const float eps = static_cast<float>(c.rms_norm_eps);
  kv.begin(chunks);
  reserve_scratch(kv);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const LlamaLayer& L = layers_[li];
    for (int64_t g = 0; g < kv.groups(); ++g) {
      const auto [r0, n] = kv.group_rows(g);
      decoder_layer(L, li, g, x.rows(r0, n), pos_ids.rows(r0, n), kv);
    }
  }
  kv.end();
  Tensor sel = ws_.get("sel", DType::F32, {rows, h});
  be.gather_rows(sel, x, out_rows);
  be.rms_norm(sel, sel, final_norm_, eps);  // the final norm is per row: only the rows we need
  Tensor out = ws_.get("logits", DType::F32, {rows, V});
  be.linear(out, sel, lm_head_, Tensor(), Activation::None);
  if (c.final_softcap > 0) be.scale(out, out, 1.f, static_cast<float>(c.final_softcap));  // Gemma 2
  return out;
}

}  // namespace kvpr
