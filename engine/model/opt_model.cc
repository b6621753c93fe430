#include "engine/model/opt_model.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/model/checkpoint.h"
#include "engine/base/error.h"

namespace kvpr {

OptModel::OptModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts)
    : Model(backend) {
  config_ = OptConfig::load(model_dir);
  spec_ = config_.spec();
  load(model_dir, opts);
}

void OptModel::load(const std::string& model_dir, const ModelLoadOptions& opts) {
  // The hub uses two prefixes: "model.decoder." (with lm_head.weight) and "decoder.".
  std::string prefix;
  load_checkpoint(
      model_dir, opts,
      [&](const CheckpointDir& ckpt) {
        if (ckpt.find("model.decoder.embed_tokens.weight")) prefix = "model.decoder.";
        else if (ckpt.find("decoder.embed_tokens.weight")) prefix = "decoder.";
        else
          KVPR_THROW(model_dir, ": missing tensor 'model.decoder.embed_tokens.weight' (nor "
                                "'decoder.embed_tokens.weight') in ", ckpt.format(), " checkpoint");
      },
      [&](const std::string& name) { return name == "lm_head.weight" ? name : prefix + name; });
}

OptModel::OptModel(Backend& backend, const OptConfig& config, DType dtype, uint64_t seed,
                   const ModelLoadOptions& opts)
    : Model(backend), config_(config) {
  spec_ = config_.spec();
  init_random(dtype, seed, opts);
}

void OptModel::stream_layers() {
  start_streaming([&](LayerWeightStream& ws) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      OptLayer& L = layers_[i];
      const int64_t li = static_cast<int64_t>(i);
      if (L.wqkv.defined()) {
        ws.add(li, &L.wqkv, LayerWeightStream::Part::Front);
        L.wq = L.wk = L.wv = Weight();  // views of the host stack; the forward uses wqkv
      } else {
        for (Weight* w : {&L.wq, &L.wk, &L.wv}) ws.add(li, w, LayerWeightStream::Part::Front);
      }
      for (Weight* w : {&L.wo, &L.fc1_w, &L.fc2_w}) ws.add(li, w, LayerWeightStream::Part::Back);
    }
  });
}

void OptModel::assemble(const WeightSource& fetch) {
  const OptConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.word_embed_proj_dim, f = c.ffn_dim;
  // Matrices may come quantized (kept as stored); everything else is dense.
  auto take = [&](const std::string& name, Shape shape, bool required, WeightRole role) {
    return fetch(name, shape, required, role).dense("opt");
  };
  auto matrix = [&](const std::string& name, Shape shape) { return fetch(name, shape, true, WeightRole::Matrix); };
  auto bias = [&](const std::string& name, int64_t n) { return take(name, {n}, c.enable_bias, WeightRole::Bias); };
  auto gain = [&](const std::string& name) { return take(name, {h}, c.layer_norm_affine, WeightRole::NormGain); };
  auto shift = [&](const std::string& name) { return take(name, {h}, c.layer_norm_affine, WeightRole::Bias); };
  layers_.clear();
  embed_tokens_ = take("embed_tokens.weight", {c.vocab_size, d}, true, WeightRole::Embedding);
  embed_positions_ = take("embed_positions.weight", {c.max_position_embeddings + OptConfig::kPositionOffset, h},
                          true, WeightRole::Embedding);
  weight_dtype_ = embed_tokens_.dtype();
  if (c.has_projection()) {
    project_in_ = matrix("project_in.weight", {h, d});
    project_out_ = matrix("project_out.weight", {d, h});
  }
  if (c.has_final_layer_norm()) {
    final_ln_w_ = gain("final_layer_norm.weight");
    final_ln_b_ = shift("final_layer_norm.bias");
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    OptLayer L;
    L.attn_ln_w = gain(p + "self_attn_layer_norm.weight");
    L.attn_ln_b = shift(p + "self_attn_layer_norm.bias");
    L.wq = matrix(p + "self_attn.q_proj.weight", {h, h});
    L.bq = bias(p + "self_attn.q_proj.bias", h);
    L.wk = matrix(p + "self_attn.k_proj.weight", {h, h});
    L.bk = bias(p + "self_attn.k_proj.bias", h);
    L.wv = matrix(p + "self_attn.v_proj.weight", {h, h});
    L.bv = bias(p + "self_attn.v_proj.bias", h);
    L.wo = matrix(p + "self_attn.out_proj.weight", {h, h});
    L.bo = bias(p + "self_attn.out_proj.bias", h);
    L.ffn_ln_w = gain(p + "final_layer_norm.weight");
    L.ffn_ln_b = shift(p + "final_layer_norm.bias");
    L.fc1_w = matrix(p + "fc1.weight", {f, h});
    L.fc1_b = bias(p + "fc1.bias", f);
    L.fc2_w = matrix(p + "fc2.weight", {h, f});
    L.fc2_b = bias(p + "fc2.bias", h);
    layers_.push_back(std::move(L));
  }
  // lm_head is tied to embed_tokens when the checkpoint has none.
  lm_head_ = fetch("lm_head.weight", {c.vocab_size, d}, false, WeightRole::Matrix);
  if (!lm_head_.defined()) lm_head_ = embed_tokens_;
}

void OptModel::project_kv(int64_t layer, const Tensor& x, const Tensor& kv, const Tensor&) {
  const OptLayer& L = layers_.at(layer);
  const int64_t n = kv.dim(1), w = kv.dim(2);
  if (L.wqkv.defined()) {  // K and V at once: [wk; wv] are rows 1..2 of the stack
    backend_.linear_batched(kv, x, L.wqkv.rows(1, 2), L.bqkv.defined() ? L.bqkv.rows(1, 2) : Tensor(),
                            Activation::None);
    return;
  }
  // A mixed checkpoint's separate GEMMs (kv_dtype_for gave F32): X widened here if it is not.
  KVPR_CHECK(kv.dtype() == DType::F32, "OPT project_kv: K/V of layer ", layer, " are projected in F32, not ",
             kv.describe());
  Tensor xf = x;
  if (x.dtype() != DType::F32) {
    xf = ws_.get("recompute_x", DType::F32, x.shape());
    backend_.convert(xf, x);
  }
  backend_.linear(kv.rows(0, 1).reshape({n, w}), xf, L.wk, L.bk, Activation::None);
  backend_.linear(kv.rows(1, 1).reshape({n, w}), xf, L.wv, L.bv, Activation::None);
}

DType OptModel::kv_dtype_for(DType storage) const {
  // One stacked K/V GEMM in the store's dtype per layer: it writes K/V as the store keeps them
  // (dense weights of that dtype, and a bias of that dtype: the GEMM's C preset to it, the sum
  // rounded once). Quantized weights' GEMMs sum in F32.
  if (storage != DType::F16 && storage != DType::BF16) return DType::F32;
  for (const OptLayer& L : layers_)
    if (!L.wqkv.defined() || L.wqkv.quantized() || L.wqkv.codes.dtype() != storage ||
        (L.bqkv.defined() && L.bqkv.dtype() != storage))
      return DType::F32;
  return storage;
}

void OptModel::stack_weights() {
  const int64_t h = config_.hidden_size;
  // Layer norms without elementwise affine parameters use gamma = 1, beta = 0.
  auto unit = [&](Tensor& w, Tensor& b) {
    if (w.defined()) return;
    Tensor one = Tensor::host(DType::F32, {h});
    for (int64_t j = 0; j < h; ++j) one.data_as<float>()[j] = 1.f;
    w = backend_.alloc(DType::F32, {h});
    backend_.copy(w, one, Stream::H2D);
    b = backend_.alloc(DType::F32, {h});
  };
  if (config_.has_final_layer_norm()) unit(final_ln_w_, final_ln_b_);
  for (auto& L : layers_) {
    unit(L.attn_ln_w, L.attn_ln_b);
    unit(L.ffn_ln_w, L.ffn_ln_b);
  }
  backend_.synchronize();  // every weight has landed (uploads, random fills, broadcast)
  for (OptLayer& L : layers_) {
    // A mixed checkpoint's dense dtypes: three GEMMs. (Quantized ones stack as they are when of one
    // layout, else dense: Model::stack.)
    const bool quantized = L.wq.quantized() && L.wk.quantized() && L.wv.quantized();
    const DType dt = L.wq.codes.dtype();
    if (!quantized && (L.wq.quantized() || L.wk.quantized() || L.wv.quantized() || L.wk.codes.dtype() != dt ||
                       L.wv.codes.dtype() != dt))
      continue;
    const bool biases = L.bq.defined() && L.bk.defined() && L.bv.defined() && L.bk.dtype() == L.bq.dtype() &&
                        L.bv.dtype() == L.bq.dtype();
    // Some biases but not three of one dtype: keep the separate GEMMs.
    if (!biases && (L.bq.defined() || L.bk.defined() || L.bv.defined())) continue;
    Weight w = stack({&L.wq, &L.wk, &L.wv});  // in host memory when the layers are streamed
    Tensor b = biases ? stack({&L.bq, &L.bk, &L.bv}) : Tensor();
    backend_.synchronize();  // the copies are done before the separate tensors go
    L.wqkv = w;
    L.wq = w.rows(0, 1).reshape({h, h});
    L.wk = w.rows(1, 1).reshape({h, h});
    L.wv = w.rows(2, 1).reshape({h, h});
    if (biases) {
      L.bqkv = b;
      L.bq = b.rows(0, 1).reshape({h});
      L.bk = b.rows(1, 1).reshape({h});
      L.bv = b.rows(2, 1).reshape({h});
    }
  }
}

// Scratch for one GPU batch (kv.groups() of them per layer; one unless asked for), sized once
// for the largest so no buffer moves during the step.
void OptModel::reserve_scratch(const KvRuntime& kv) {
  const int64_t h = config_.hidden_size;
  int64_t rows_max = 0;
  for (int64_t g = 0; g < kv.groups(); ++g) rows_max = std::max(rows_max, kv.group_rows(g).count);
  for (auto [name, width] : {std::pair{"a", h}, {"qkv", 3 * h}, {"att", h}, {"ff", config_.ffn_dim}})
    ws_.get(name, DType::F32, {rows_max, width});
}

// Layer li for GPU batch g; xg: its rows of the residual stream.
void OptModel::decoder_layer(const OptLayer& L, int64_t li, int64_t g, const Tensor& xg, KvRuntime& kv) {
  const OptConfig& c = config_;
  const int64_t h = c.hidden_size, n = xg.dim(0);
  Backend& be = backend_;
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim()));
  const float eps = OptConfig::kLayerNormEps;
  Tensor a = ws_.get("a", DType::F32, {n, h});         // normalised input of a sub-block
  Tensor qkv = ws_.get("qkv", DType::F32, {3, n, h});
  Tensor q = qkv.rows(0, 1).reshape({n, h});
  Tensor k = qkv.rows(1, 1).reshape({n, h});
  Tensor v = qkv.rows(2, 1).reshape({n, h});
  Tensor att = ws_.get("att", DType::F32, {n, h});
  Tensor ff = ws_.get("ff", DType::F32, {n, c.ffn_dim});
  kv.prepare(li, g);
  // Self-attention block. attn_in is X, the post-norm input of the QKV projection.
  const Tensor& attn_in = c.do_layer_norm_before ? a : xg;
  if (c.do_layer_norm_before) be.layer_norm(a, xg, L.attn_ln_w, L.attn_ln_b, eps);
  if (L.wqkv.defined()) {
    be.linear_batched(qkv, attn_in, L.wqkv, L.bqkv, Activation::None);
  } else {
    be.linear(q, attn_in, L.wq, L.bq, Activation::None);
    be.linear(k, attn_in, L.wk, L.bk, Activation::None);
    be.linear(v, attn_in, L.wv, L.bv, Activation::None);
  }
  kv.attend(li, g, attn_in, q, k, v, att, scale);
  be.linear_accumulate(xg, att, L.wo, L.bo);  // x += att · Woᵀ + bo
  if (!c.do_layer_norm_before) be.layer_norm(xg, xg, L.attn_ln_w, L.attn_ln_b, eps);
  // Feed-forward block.
  const Tensor& ffn_in = c.do_layer_norm_before ? a : xg;
  if (c.do_layer_norm_before) be.layer_norm(a, xg, L.ffn_ln_w, L.ffn_ln_b, eps);
  be.linear(ff, ffn_in, L.fc1_w, L.fc1_b, c.activation);
  be.linear_accumulate(xg, ff, L.fc2_w, L.fc2_b);
  if (!c.do_layer_norm_before) be.layer_norm(xg, xg, L.ffn_ln_w, L.ffn_ln_b, eps);
}

Tensor OptModel::forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions) {
  const OptConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.word_embed_proj_dim, V = c.vocab_size;
  Backend& be = backend_;
  int64_t rows = 0;
  const int64_t T = check_chunks(chunks, all_positions, &rows);
  // Token ids, positions and the rows whose logits we want, uploaded together.
  Tensor ids = upload_ids(chunks, T, rows, all_positions, static_cast<int32_t>(OptConfig::kPositionOffset));
  Tensor tok_ids = ids.rows(0, T), pos_ids = ids.rows(T, T), out_rows = ids.rows(2 * T, rows);

  Tensor x = ws_.get("x", DType::F32, {T, h});  // residual stream [T, hidden]
  if (c.has_projection()) {
    Tensor e = ws_.get("embed", DType::F32, {T, d});
    be.gather_rows(e, embed_tokens_, tok_ids);
    be.linear(x, e, project_in_, Tensor(), Activation::None);
  } else {
    be.gather_rows(x, embed_tokens_, tok_ids);
  }
  be.add_gathered_rows(x, embed_positions_, pos_ids);

  const float eps = OptConfig::kLayerNormEps;
  kv.begin(chunks);
  reserve_scratch(kv);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const OptLayer& L = layers_[li];
    for (int64_t g = 0; g < kv.groups(); ++g) {
      const auto [r0, n] = kv.group_rows(g);
      decoder_layer(L, li, g, x.rows(r0, n), kv);
    }
  }
  kv.end();
  if (c.has_final_layer_norm()) be.layer_norm(x, x, final_ln_w_, final_ln_b_, eps);

  Tensor sel = ws_.get("sel", DType::F32, {rows, h});
  be.gather_rows(sel, x, out_rows);
  Tensor head_in = sel;
  if (c.has_projection()) {
    head_in = ws_.get("proj", DType::F32, {rows, d});
    be.linear(head_in, sel, project_out_, Tensor(), Activation::None);
  }
  Tensor out = ws_.get("logits", DType::F32, {rows, V});
  be.linear(out, head_in, lm_head_, Tensor(), Activation::None);
  return out;
}

}  // namespace kvpr
