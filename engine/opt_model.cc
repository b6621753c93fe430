#include "engine/opt_model.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/checkpoint.h"
#include "engine/error.h"

namespace kvpr {

Tensor Workspace::get(const std::string& name, DType dtype, Shape shape) {
  int64_t need = std::max<int64_t>(1, shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype)));
  auto it = buffers_.find(name);
  if (it == buffers_.end() || it->second.numel() < need) {
    int64_t grown = it == buffers_.end() ? 0 : it->second.numel() * 3 / 2;
    buffers_[name] = backend_.alloc(DType::U8, {std::max(need, grown)});
    it = buffers_.find(name);
  }
  return it->second.view_as(dtype, std::move(shape));
}

OptModel::OptModel(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts)
    : backend_(backend), ws_(backend) {
  config_ = OptConfig::load(model_dir);
  load(model_dir, opts);
}

void OptModel::load(const std::string& model_dir, const ModelLoadOptions& opts) {
  CheckpointDir ckpt(model_dir);
  // Uploads read the mapped checkpoint asynchronously: finish them before it is unmapped,
  // also when loading fails half way.
  struct FinishUploads {
    Backend& b;
    ~FinishUploads() { b.synchronize(); }
  } finish_uploads{backend_};
  format_ = ckpt.format();
  // The hub uses two prefixes: "model.decoder." (with lm_head.weight) and "decoder.".
  std::string prefix;
  if (ckpt.find("model.decoder.embed_tokens.weight")) prefix = "model.decoder.";
  else if (ckpt.find("decoder.embed_tokens.weight")) prefix = "decoder.";
  else
    KVPR_THROW(model_dir, ": missing tensor 'model.decoder.embed_tokens.weight' (nor "
                          "'decoder.embed_tokens.weight') in ", ckpt.format(), " checkpoint");

  size_t total = 0, done = 0;
  for (const auto& r : ckpt.tensors()) total += r.nbytes();
  std::vector<Tensor> received;  // every checkpoint tensor, in load order (for the broadcast)
  assemble([&](const std::string& name, const Shape& expect, bool required, WeightRole) -> Tensor {
    const std::string key = name == "lm_head.weight" ? name : prefix + name;
    const TensorRecord* r = ckpt.find(key);
    if (!r) {
      KVPR_CHECK(!required, model_dir, ": missing tensor '", key, "'");
      return Tensor();
    }
    KVPR_CHECK(is_float(r->dtype), r->file, ": tensor '", key, "' has dtype ", dtype_name(r->dtype),
               ", expected F32, F16 or BF16");
    KVPR_CHECK(r->shape == expect, r->file, ": tensor '", key, "' has shape ", shape_str(r->shape),
               ", expected ", shape_str(expect));
    Tensor src = Tensor::borrow(const_cast<void*>(r->data), r->dtype, r->shape);
    DType dt = opts.convert_weights ? opts.weight_dtype : r->dtype;
    Tensor dst = backend_.alloc(dt, r->shape);
    if (opts.broadcast) received.push_back(dst);
    if (opts.broadcast && opts.broadcast->rank() != 0) {
      // Filled by the broadcast from rank 0 below; only the header was read here.
    } else if (dt == r->dtype) {
      backend_.copy(dst, src, Stream::H2D, "weights");
    } else {
      // Convert on the host, then upload.
      Tensor tmp = Tensor::host(dt, r->shape);
      for (int64_t i = 0; i < src.numel(); ++i)
        store_from_f32(tmp.data(), dt, i, load_as_f32(src.data(), src.dtype(), i));
      backend_.copy(dst, tmp, Stream::H2D, "weights");
    }
    done += r->nbytes();
    if (opts.progress && (!opts.broadcast || opts.broadcast->rank() == 0)) opts.progress(done, total);
    return dst;
  });
  if (opts.broadcast) {
    backend_.synchronize();  // rank 0's uploads have landed
    for (const auto& t : received) opts.broadcast->broadcast(t);
    opts.broadcast->finish();
    if (opts.progress) opts.progress(total, total);
  }
  stack_qkv();
}

OptModel::OptModel(Backend& backend, const OptConfig& config, DType dtype, uint64_t seed)
    : backend_(backend), config_(config), ws_(backend) {
  format_ = "random";
  uint64_t n = 0;
  assemble([&](const std::string& name, const Shape& shape, bool required, WeightRole role) -> Tensor {
    if (!required && name == "lm_head.weight") return Tensor();  // tied
    Tensor t = backend_.alloc(dtype, shape);
    const float fan_in = static_cast<float>(shape.size() == 2 ? shape[1] : 1);
    switch (role) {
      case WeightRole::Matrix: backend_.fill_random(t, seed + n, 0.f, 1.f / std::sqrt(fan_in)); break;
      case WeightRole::Embedding: backend_.fill_random(t, seed + n, 0.f, 0.1f); break;
      case WeightRole::NormGain: backend_.fill_random(t, seed + n, 1.f, 0.05f); break;
      case WeightRole::Bias: backend_.fill_random(t, seed + n, 0.f, 0.02f); break;
    }
    ++n;
    return t;
  });
  stack_qkv();
}

void OptModel::assemble(const WeightSource& fetch) {
  const OptConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.word_embed_proj_dim, f = c.ffn_dim;
  auto take = [&](const std::string& name, Shape shape, bool required, WeightRole role) {
    Tensor t = fetch(name, shape, required, role);
    if (t.defined()) {
      parameter_count_ += t.numel();
      weight_bytes_ += t.nbytes();
    }
    return t;
  };
  auto matrix = [&](const std::string& name, Shape shape) { return take(name, shape, true, WeightRole::Matrix); };
  auto bias = [&](const std::string& name, int64_t n) { return take(name, {n}, c.enable_bias, WeightRole::Bias); };
  auto gain = [&](const std::string& name) { return take(name, {h}, c.layer_norm_affine, WeightRole::NormGain); };
  auto shift = [&](const std::string& name) { return take(name, {h}, c.layer_norm_affine, WeightRole::Bias); };
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
  lm_head_ = take("lm_head.weight", {c.vocab_size, d}, false, WeightRole::Matrix);
  if (!lm_head_.defined()) lm_head_ = embed_tokens_;
  // Layer norms without elementwise affine parameters use gamma = 1, beta = 0.
  auto unit = [&](Tensor& w, Tensor& b) {
    if (w.defined()) return;
    Tensor one = Tensor::host(DType::F32, {h});
    for (int64_t j = 0; j < h; ++j) one.data_as<float>()[j] = 1.f;
    w = backend_.alloc(DType::F32, {h});
    backend_.copy(w, one, Stream::H2D);
    b = backend_.alloc(DType::F32, {h});
  };
  if (c.has_final_layer_norm()) unit(final_ln_w_, final_ln_b_);
  for (auto& L : layers_) {
    unit(L.attn_ln_w, L.attn_ln_b);
    unit(L.ffn_ln_w, L.ffn_ln_b);
  }
  backend_.synchronize();
}

std::unique_ptr<KvRuntime> OptModel::make_kv_runtime(int64_t slots, int64_t capacity,
                                                     const KvRuntimeOptions& opts) {
  KVPR_CHECK(capacity <= config_.max_position_embeddings, "KV capacity ", capacity,
             " exceeds max_position_embeddings ", config_.max_position_embeddings);
  return std::make_unique<KvRuntime>(backend_, kv_shape(), *this, slots, capacity, opts);
}

void OptModel::project_kv(int64_t layer, const Tensor& x, const Tensor& kv) {
  const OptLayer& L = layers_.at(layer);
  const int64_t n = kv.dim(1), w = kv.dim(2);
  if (L.wqkv.defined()) {  // K and V at once: [wk; wv] are rows 1..2 of the stack
    backend_.linear_batched(kv, x, L.wqkv.rows(1, 2), L.bqkv.defined() ? L.bqkv.rows(1, 2) : Tensor(),
                            Activation::None);
    return;
  }
  backend_.linear(kv.rows(0, 1).reshape({n, w}), x, L.wk, L.bk, Activation::None);
  backend_.linear(kv.rows(1, 1).reshape({n, w}), x, L.wv, L.bv, Activation::None);
}

void OptModel::stack_qkv() {
  const int64_t h = config_.hidden_size;
  backend_.synchronize();  // every weight has landed (uploads, random fills, broadcast)
  for (OptLayer& L : layers_) {
    const DType dt = L.wq.dtype();
    if (L.wk.dtype() != dt || L.wv.dtype() != dt) continue;  // mixed checkpoint: three GEMMs
    Tensor w = backend_.alloc(dt, {3, h, h});
    backend_.copy(w.rows(0, 1).reshape({h, h}), L.wq, Stream::Compute, "stack q");
    backend_.copy(w.rows(1, 1).reshape({h, h}), L.wk, Stream::Compute, "stack k");
    backend_.copy(w.rows(2, 1).reshape({h, h}), L.wv, Stream::Compute, "stack v");
    Tensor b;
    const bool biases = L.bq.defined() && L.bk.defined() && L.bv.defined() && L.bk.dtype() == L.bq.dtype() &&
                        L.bv.dtype() == L.bq.dtype();
    if (biases) {
      b = backend_.alloc(L.bq.dtype(), {3, h});
      backend_.copy(b.rows(0, 1).reshape({h}), L.bq, Stream::Compute, "stack q bias");
      backend_.copy(b.rows(1, 1).reshape({h}), L.bk, Stream::Compute, "stack k bias");
      backend_.copy(b.rows(2, 1).reshape({h}), L.bv, Stream::Compute, "stack v bias");
    } else if (L.bq.defined() || L.bk.defined() || L.bv.defined()) {
      continue;  // some biases but not three of one dtype: keep the separate GEMMs
    }
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

void OptModel::forward(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, const Tensor& logits,
                       bool all_positions) {
  Tensor out = forward_device(chunks, kv, all_positions);
  KVPR_CHECK(logits.dtype() == DType::F32 && logits.numel() == out.numel(), "logits buffer ", logits.describe(),
             " does not hold ", out.describe());
  backend_.copy(logits, out, Stream::Compute);
  backend_.synchronize();
}

Tensor OptModel::forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions) {
  const OptConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.word_embed_proj_dim, V = c.vocab_size;
  Backend& be = backend_;
  int64_t T = 0;
  for (const auto& ch : chunks) {
    KVPR_CHECK(ch.count > 0, "empty forward chunk");
    KVPR_CHECK(ch.past_len + ch.count <= c.max_position_embeddings, "sequence of ",
               ch.past_len + ch.count, " tokens exceeds max_position_embeddings ",
               c.max_position_embeddings);
    T += ch.count;
  }
  int64_t rows = 0;
  for (const auto& ch : chunks) rows += all_positions || ch.all_rows ? ch.count : 1;

  // Token ids, positions and the rows whose logits we want, uploaded together.
  Tensor host_ids = Tensor::host(DType::I32, {2 * T + rows});
  int32_t* hi = host_ids.data_as<int32_t>();
  int64_t t = 0;
  for (const auto& ch : chunks) {
    for (int64_t j = 0; j < ch.count; ++j, ++t) {
      KVPR_CHECK(ch.tokens[j] >= 0 && ch.tokens[j] < V, "token id ", ch.tokens[j],
                 " out of range for vocab_size ", V);
      hi[t] = ch.tokens[j];
      hi[T + t] = static_cast<int32_t>(ch.past_len + j + OptConfig::kPositionOffset);
    }
  }
  for (int64_t r = 0, first = 0; const auto& ch : chunks) {  // token rows whose logits are wanted
    if (all_positions || ch.all_rows)
      for (int64_t j = 0; j < ch.count; ++j) hi[2 * T + r++] = static_cast<int32_t>(first + j);
    else
      hi[2 * T + r++] = static_cast<int32_t>(first + ch.count - 1);
    first += ch.count;
  }
  Tensor ids = ws_.get("ids", DType::I32, {2 * T + rows});
  be.copy(ids, host_ids, Stream::Compute);
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

  Tensor a = ws_.get("a", DType::F32, {T, h});     // normalised input of a sub-block
  Tensor qkv = ws_.get("qkv", DType::F32, {3, T, h});
  Tensor q = qkv.rows(0, 1).reshape({T, h});
  Tensor k = qkv.rows(1, 1).reshape({T, h});
  Tensor v = qkv.rows(2, 1).reshape({T, h});
  Tensor att = ws_.get("att", DType::F32, {T, h});
  Tensor ff = ws_.get("ff", DType::F32, {T, c.ffn_dim});
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim()));
  const float eps = OptConfig::kLayerNormEps;
  kv.begin(chunks);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const OptLayer& L = layers_[li];
    kv.prepare_layer(li);
    // Self-attention block. attn_in is X, the post-norm input of the QKV projection.
    const Tensor& attn_in = c.do_layer_norm_before ? a : x;
    if (c.do_layer_norm_before) be.layer_norm(a, x, L.attn_ln_w, L.attn_ln_b, eps);
    if (L.wqkv.defined()) {
      be.linear_batched(qkv, attn_in, L.wqkv, L.bqkv, Activation::None);
    } else {
      be.linear(q, attn_in, L.wq, L.bq, Activation::None);
      be.linear(k, attn_in, L.wk, L.bk, Activation::None);
      be.linear(v, attn_in, L.wv, L.bv, Activation::None);
    }
    kv.attend(li, attn_in, q, k, v, att, scale);
    be.linear_accumulate(x, att, L.wo, L.bo);  // x += att · Woᵀ + bo
    if (!c.do_layer_norm_before) be.layer_norm(x, x, L.attn_ln_w, L.attn_ln_b, eps);
    // Feed-forward block.
    const Tensor& ffn_in = c.do_layer_norm_before ? a : x;
    if (c.do_layer_norm_before) be.layer_norm(a, x, L.ffn_ln_w, L.ffn_ln_b, eps);
    be.linear(ff, ffn_in, L.fc1_w, L.fc1_b, c.activation);
    be.linear_accumulate(x, ff, L.fc2_w, L.fc2_b);
    if (!c.do_layer_norm_before) be.layer_norm(x, x, L.ffn_ln_w, L.ffn_ln_b, eps);
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
