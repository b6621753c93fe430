#include "engine/llama_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/checkpoint.h"
#include "engine/error.h"

namespace kvpr {


LlamaModel::LlamaModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts)
    : Model(backend) {
  config_ = LlamaConfig::load(model_dir);
  spec_ = config_.spec();
  rope_ = config_.rope_params();
  load_checkpoint(
      model_dir, opts,
      [&](const CheckpointDir& ckpt) {
        KVPR_CHECK(ckpt.find("model.embed_tokens.weight"), model_dir,
                   ": missing tensor 'model.embed_tokens.weight' in ", ckpt.format(), " checkpoint");
      },
      [](const std::string& name) { return name == "lm_head.weight" ? name : "model." + name; },
      [&](const WeightSource& fetch) { assemble(fetch); });
  stack_weights();
  stream_layers();
}

LlamaModel::LlamaModel(Backend& backend, const LlamaConfig& config, DType dtype, uint64_t seed, bool stream_weights)
    : Model(backend), config_(config), rope_(config.rope_params()) {
  spec_ = config_.spec();
  format_ = "random";
  stream_weights_ = stream_weights;
  assemble(random_weights(dtype, seed));
  stack_weights();
  stream_layers();
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
      for (Tensor* w : {&L.wo, &L.w_gate_up, &L.w_down}) ws.add(li, w, LayerWeightStream::Part::Back);
    }
  });
}

void LlamaModel::assemble(const WeightSource& fetch) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, kvh = c.num_kv_heads * c.head_dim(), qw = c.q_width();
  auto matrix = [&](const std::string& name, Shape shape) { return fetch(name, shape, true, WeightRole::Matrix); };
  auto bias = [&](const std::string& name, int64_t n, bool on) {
    return on ? fetch(name, {n}, true, WeightRole::Bias) : Tensor();
  };
  auto gain = [&](const std::string& name) { return fetch(name, {h}, true, WeightRole::NormGain); };
  embed_tokens_ = fetch("embed_tokens.weight", {c.vocab_size, h}, true, WeightRole::Embedding);
  weight_dtype_ = embed_tokens_.dtype();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LlamaLayer L;
    Parts P;
    L.attn_norm = gain(p + "input_layernorm.weight");
    P.wq = matrix(p + "self_attn.q_proj.weight", {qw, h});
    P.wk = matrix(p + "self_attn.k_proj.weight", {kvh, h});
    P.wv = matrix(p + "self_attn.v_proj.weight", {kvh, h});
    L.wo = matrix(p + "self_attn.o_proj.weight", {h, qw});
    if (c.qk_norm) {
      L.q_norm = fetch(p + "self_attn.q_norm.weight", {c.head_dim()}, true, WeightRole::NormGain);
      L.k_norm = fetch(p + "self_attn.k_norm.weight", {c.head_dim()}, true, WeightRole::NormGain);
    }
    P.bq = bias(p + "self_attn.q_proj.bias", qw, c.qkv_bias);
    P.bk = bias(p + "self_attn.k_proj.bias", kvh, c.qkv_bias);
    P.bv = bias(p + "self_attn.v_proj.bias", kvh, c.qkv_bias);
    L.bo = bias(p + "self_attn.o_proj.bias", h, c.o_bias);
    L.mlp_norm = gain(p + "post_attention_layernorm.weight");
    P.w_gate = matrix(p + "mlp.gate_proj.weight", {f, h});
    P.w_up = matrix(p + "mlp.up_proj.weight", {f, h});
    L.w_down = matrix(p + "mlp.down_proj.weight", {h, f});
    P.b_gate = bias(p + "mlp.gate_proj.bias", f, c.mlp_bias);
    P.b_up = bias(p + "mlp.up_proj.bias", f, c.mlp_bias);
    L.b_down = bias(p + "mlp.down_proj.bias", h, c.mlp_bias);
    layers_.push_back(std::move(L));
    parts_.push_back(std::move(P));
  }
  final_norm_ = gain("norm.weight");
  // Tied models may still ship lm_head.weight; use it when present.
  lm_head_ = fetch("lm_head.weight", {c.vocab_size, h}, !c.tie_word_embeddings, WeightRole::Matrix);
  if (!lm_head_.defined()) lm_head_ = embed_tokens_;
  backend_.synchronize();
}

void LlamaModel::stack_weights() {
  backend_.synchronize();  // every weight has landed (uploads, random fills, broadcast)
  for (size_t i = 0; i < layers_.size(); ++i) {
    LlamaLayer& L = layers_[i];
    Parts& P = parts_[i];
    if (config_.num_kv_heads == config_.num_heads) {
      L.wqkv = stack({&P.wq, &P.wk, &P.wv});
      if (P.bq.defined()) L.bqkv = stack({&P.bq, &P.bk, &P.bv});
    } else {  // K and V are narrower than Q: Q alone, K and V stacked
      L.wq = P.wq;
      L.bq = P.bq;
      L.wkv = stack({&P.wk, &P.wv});
      if (P.bk.defined()) L.bkv = stack({&P.bk, &P.bv});
    }
    L.w_gate_up = stack({&P.w_gate, &P.w_up});
    if (P.b_gate.defined()) L.b_gate_up = stack({&P.b_gate, &P.b_up});
    // Streamed weights were stacked on the host, synchronously: free the parts now, so loading
    // never holds two copies of the model in pinned memory.
    if (L.w_gate_up.memory() == MemoryKind::PinnedHost) P.wq = P.wk = P.wv = P.w_gate = P.w_up = Tensor();
  }
  backend_.synchronize();  // the copies are done before the separate tensors go
  parts_.clear();
}

void LlamaModel::rope(const Tensor& x, const Tensor& positions) {
  backend_.rope(x, positions, static_cast<int>(config_.head_dim()), rope_);
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
  rope(k, positions);  // K turns; V does not
}

Tensor LlamaModel::forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions) {
  const LlamaConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, V = c.vocab_size, kvh = c.num_kv_heads * c.head_dim();
  const int64_t qw = c.q_width();
  Backend& be = backend_;
  int64_t rows = 0;
  const int64_t T = check_chunks(chunks, all_positions, &rows);
  // Token ids, positions (from 0) and the rows whose logits we want, uploaded together.
  Tensor ids = upload_ids(chunks, T, rows, all_positions, 0);
  Tensor tok_ids = ids.rows(0, T), pos_ids = ids.rows(T, T), out_rows = ids.rows(2 * T, rows);

  Tensor x = ws_.get("x", DType::F32, {T, h});  // residual stream [T, hidden]
  be.gather_rows(x, embed_tokens_, tok_ids);
  const bool mha = c.num_kv_heads == c.num_heads;  // Q, K and V equally wide: stacked
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim()));
  const float eps = static_cast<float>(c.rms_norm_eps);
  kv.begin(chunks);
  // Scratch for one GPU batch (kv.groups() of them per layer; one unless asked for), sized
  // once for the largest so no buffer moves during the step.
  int64_t rows_max = 0;
  for (int64_t g = 0; g < kv.groups(); ++g) rows_max = std::max(rows_max, kv.group_rows(g).count);
  for (auto [name, width] : {std::pair{"a", h}, {"qkv", qw + 2 * kvh}, {"att", qw}, {"gate_up", 2 * f}})
    ws_.get(name, DType::F32, {rows_max, width});
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const LlamaLayer& L = layers_[li];
    for (int64_t g = 0; g < kv.groups(); ++g) {
      const auto [r0, n] = kv.group_rows(g);
      Tensor xg = x.rows(r0, n), pos = pos_ids.rows(r0, n);  // this batch's residual stream and positions
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
        rope(qkv.rows(0, 2 * n * qw).reshape({2, n, qw}), pos);  // Q and K, [2, n, qw]: one launch
      } else {
        rope(q, pos);
        rope(k, pos);
      }
      kv.attend(li, g, a, q, k, v, att, scale);
      be.linear_accumulate(xg, att, L.wo, L.bo);  // x += att · Woᵀ
      // SwiGLU MLP: x += (silu(a · Wgᵀ) * (a · Wuᵀ)) · Wdᵀ
      be.rms_norm(a, xg, L.mlp_norm, eps);
      be.linear_batched(gate_up, a, L.w_gate_up, L.b_gate_up, Activation::None);
      be.silu_mul(gate, gate, up);
      be.linear_accumulate(xg, gate, L.w_down, L.b_down);
    }
  }
  kv.end();
  Tensor sel = ws_.get("sel", DType::F32, {rows, h});
  be.gather_rows(sel, x, out_rows);
  be.rms_norm(sel, sel, final_norm_, eps);  // the final norm is per row: only the rows we need
  Tensor out = ws_.get("logits", DType::F32, {rows, V});
  be.linear(out, sel, lm_head_, Tensor(), Activation::None);
  return out;
}

}  // namespace kvpr
