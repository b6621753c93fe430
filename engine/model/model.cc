#include "engine/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "engine/model/checkpoint.h"
#include "engine/model/config_fields.h"
#include "engine/base/error.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"

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

void Model::forward(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, const Tensor& logits,
                    bool all_positions) {
  Tensor out = forward_device(chunks, kv, all_positions);
  KVPR_CHECK(logits.dtype() == DType::F32 && logits.numel() == out.numel(), "logits buffer ", logits.describe(),
             " does not hold ", out.describe());
  backend_.copy(logits, out, Stream::Compute);
  backend_.synchronize();
}

std::unique_ptr<KvRuntime> Model::make_kv_runtime(const KvLayout& layout, const KvRuntimeOptions& opts) {
  KVPR_CHECK(layout.max_tokens <= spec_.max_position_embeddings, "KV capacity ", layout.max_tokens,
             " exceeds max_position_embeddings ", spec_.max_position_embeddings);
  return std::make_unique<KvRuntime>(backend_, kv_shape(), *this, layout, opts, weight_stream_.get());
}

std::unique_ptr<KvRuntime> Model::make_kv_runtime(int64_t slots, int64_t capacity, const KvRuntimeOptions& opts) {
  return make_kv_runtime(KvLayout::slots(slots, capacity), opts);
}

size_t Model::device_weight_bytes() const {
  if (!weight_stream_) return weight_bytes_;
  return weight_bytes_ - weight_stream_->host_bytes() + weight_stream_->device_bytes();
}

Tensor Model::alloc_weight(DType dtype, const Shape& shape, size_t model_bytes) {
  try {
    return backend_.alloc(dtype, shape);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (stream_weights_ || m.find("out of memory") == std::string::npos) throw;
    const std::string size = model_bytes > 0 ? " " + std::to_string(model_bytes >> 20) + " MiB of" : "";
    KVPR_THROW(m, "; the model's", size, " weights do not fit on the device: keep its layers in host memory with "
               "--weights host (kvprd: weights = host)");
  }
}

bool Model::streamed(const std::string& name, WeightRole role) const {
  return stream_weights_ && role == WeightRole::Matrix && name.rfind("layers.", 0) == 0;
}

Tensor Model::stack(std::initializer_list<const Tensor*> parts) { return stack_tensors(std::vector<const Tensor*>(parts)); }

Tensor Model::stack_tensors(const std::vector<const Tensor*>& parts) {
  const Tensor& first = **parts.begin();
  Shape shape{static_cast<int64_t>(parts.size())};
  for (int64_t d : first.shape()) shape.push_back(d);
  if (first.memory() != MemoryKind::PinnedHost) {
    Tensor out = backend_.alloc(first.dtype(), shape);
    int64_t i = 0;
    for (const Tensor* t : parts) backend_.convert(out.rows(i++, 1).reshape(first.shape()), *t);
    return out;
  }
  // Streamed weights are stacked on the host.
  backend_.synchronize();
  Tensor out = backend_.alloc_pinned(first.dtype(), shape);
  int64_t i = 0;
  for (const Tensor* t : parts) {
    KVPR_CHECK(t->memory() == MemoryKind::PinnedHost && t->numel() == first.numel(), "cannot stack ",
               t->describe(), " with ", first.describe());
    Tensor dst = out.rows(i++, 1);
    if (t->dtype() == first.dtype()) {
      std::memcpy(dst.data(), t->data(), t->nbytes());
    } else {
      for (int64_t j = 0; j < t->numel(); ++j)
        store_from_f32(dst.data(), first.dtype(), j, load_as_f32(t->data(), t->dtype(), j));
    }
  }
  return out;
}

namespace {
// dst (device or pinned memory) from a host tensor (a checkpoint's, or one dequantized), converted
// on the host first when the dtypes differ; queued on the H2D stream.
void upload_weight(Backend& backend, const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    backend.copy(dst, src, Stream::H2D, "weights");
    return;
  }
  Tensor tmp = Tensor::host(dst.dtype(), src.shape());
  for (int64_t i = 0; i < src.numel(); ++i)
    store_from_f32(tmp.data(), dst.dtype(), i, load_as_f32(src.data(), src.dtype(), i));
  backend.copy(dst, tmp, Stream::H2D, "weights");
}

// The weight's parts in host memory (copies when they are in the backend's).
Weight on_host(Backend& backend, const Weight& w) {
  Weight h = w;
  for (Tensor* t : h.parts()) {
    if (!t->defined() || t->memory() != MemoryKind::Device) continue;
    Tensor c = Tensor::host(t->dtype(), t->shape());
    backend.copy(c, *t, Stream::D2H, "weights");
    *t = c;
  }
  backend.synchronize();
  return h;
}

bool same_tensor_bytes(Backend& backend, const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Weight ha = on_host(backend, Weight(a)), hb = on_host(backend, Weight(b));
  return std::memcmp(ha.codes.data(), hb.codes.data(), ha.codes.nbytes()) == 0;
}
}  // namespace

Weight Model::upload(const Weight& host, bool pinned, size_t model_bytes) {
  Weight w = host;
  for (Tensor* t : w.parts()) {
    if (!t->defined()) continue;
    Tensor dst = pinned ? backend_.alloc_pinned(t->dtype(), t->shape()) : alloc_weight(t->dtype(), t->shape(), model_bytes);
    upload_weight(backend_, dst, *t);
    *t = dst;
  }
  backend_.synchronize();  // the host parts may go
  return w;
}

Weight Model::share_layout(WeightBroadcaster& bc, const Weight& sent, size_t model_bytes) {
  // [quantized, format, block_n, block_k, rank, dims x3], then per part [defined, dtype, rank, dims x3].
  constexpr int kHead = 8, kPart = 6, kWords = kHead + 4 * kPart;
  Tensor words = Tensor::host(DType::I64, {kWords});
  int64_t* d = words.data_as<int64_t>();
  std::fill(d, d + kWords, 0);
  auto put_shape = [](int64_t* at, const Shape& shape) {
    KVPR_CHECK(shape.size() <= 3, "broadcast of a weight of rank ", shape.size());
    at[0] = static_cast<int64_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) at[1 + i] = shape[i];
  };
  if (bc.rank() == 0 && sent.quantized()) {
    d[0] = 1;
    d[1] = static_cast<int64_t>(sent.format);
    d[2] = sent.block_n;
    d[3] = sent.block_k;
    put_shape(d + 4, sent.shape);
    int i = 0;
    for (const Tensor* t : sent.parts()) {
      int64_t* p = d + kHead + kPart * i++;
      if (!t->defined()) continue;
      p[0] = 1;
      p[1] = static_cast<int64_t>(t->dtype());
      put_shape(p + 2, t->shape());
    }
  }
  Tensor dev = backend_.alloc(DType::I64, {kWords});
  if (bc.rank() == 0) {
    backend_.copy(dev, words, Stream::H2D, "weight layout");
    backend_.synchronize();
  }
  bc.broadcast(dev);
  bc.finish();
  if (bc.rank() == 0) return sent;
  backend_.copy(words, dev, Stream::D2H, "weight layout");
  backend_.synchronize();
  if (d[0] == 0) return Weight();
  auto get_shape = [](const int64_t* at) {
    KVPR_CHECK(at[0] >= 0 && at[0] <= 3, "the broadcast's weight layout is malformed");
    return Shape(at + 1, at + 1 + at[0]);
  };
  Weight w;
  w.format = static_cast<WeightFormat>(d[1]);
  w.block_n = d[2];
  w.block_k = d[3];
  w.shape = get_shape(d + 4);
  int i = 0;
  for (Tensor* t : w.parts()) {
    const int64_t* p = d + kHead + kPart * i++;
    if (p[0] == 1) *t = alloc_weight(static_cast<DType>(p[1]), get_shape(p + 2), model_bytes);
  }
  return w;
}

Weight Model::stack(std::initializer_list<const Weight*> parts) {
  const Weight& first = **parts.begin();
  bool one_layout = true;
  for (const Weight* w : parts)
    one_layout = one_layout && w->format == first.format && w->shape == first.shape && w->block_n == first.block_n &&
                 w->block_k == first.block_k && w->zeros.defined() == first.zeros.defined() &&
                 (!w->zeros.defined() || w->zeros.dtype() == first.zeros.dtype()) &&
                 w->codes.dtype() == first.codes.dtype() && same_tensor_bytes(backend_, w->order, first.order);
  if (!first.quantized() && one_layout) {
    std::vector<const Tensor*> dense;
    for (const Weight* w : parts) dense.push_back(&w->codes);
    return Weight(stack_tensors(dense));
  }
  if (one_layout) {  // part by part
    auto stack_part = [&](Tensor Weight::*part) {
      std::vector<const Tensor*> ts;
      for (const Weight* w : parts) ts.push_back(&(w->*part));
      return stack_tensors(ts);
    };
    Weight out = first;
    out.shape.insert(out.shape.begin(), static_cast<int64_t>(parts.size()));
    out.codes = stack_part(&Weight::codes);
    out.scales = stack_part(&Weight::scales);
    if (first.zeros.defined()) out.zeros = stack_part(&Weight::zeros);
    return out;
  }
  // Parts of different layouts (q, k and v in different act orders, or one that loaded dense):
  // every one dense, in one dtype.
  const DType dt = first.quantized() ? dequantized_dtype_ : first.codes.dtype();
  const bool pinned = first.codes.memory() == MemoryKind::PinnedHost;
  std::vector<Tensor> dense;
  for (const Weight* w : parts) {
    const Tensor f32 = w->quantized() ? dequantize(on_host(backend_, *w)) : on_host(backend_, *w).codes;
    Tensor d = pinned ? backend_.alloc_pinned(dt, f32.shape()) : alloc_weight(dt, f32.shape(), weight_bytes_);
    upload_weight(backend_, d, f32);
    backend_.synchronize();  // (f32 goes)
    dense.push_back(d);
  }
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : dense) ptrs.push_back(&t);
  return Weight(stack_tensors(ptrs));
}

void Model::start_streaming(const std::function<void(LayerWeightStream&)>& register_fields) {
  if (!stream_weights_) return;
  backend_.synchronize();
  auto ws = std::make_unique<LayerWeightStream>(backend_);
  register_fields(*ws);
  ws->finalize();
  weight_stream_ = std::move(ws);
}

int64_t Model::check_chunks(const std::vector<ForwardChunk>& chunks, bool all_positions, int64_t* rows) const {
  int64_t T = 0;
  *rows = 0;
  for (const auto& ch : chunks) {
    KVPR_CHECK(ch.count > 0, "empty forward chunk");
    KVPR_CHECK(ch.past_len + ch.count <= spec_.max_position_embeddings, "sequence of ", ch.past_len + ch.count,
               " tokens exceeds max_position_embeddings ", spec_.max_position_embeddings);
    KVPR_CHECK(!ch.long_rope || spec_.long_rope_after > 0, "a chunk asks for longrope's long factors, which ",
               spec_.model_type, " does not have");
    for (int64_t j = 0; j < ch.count; ++j)
      KVPR_CHECK(ch.tokens[j] >= 0 && ch.tokens[j] < spec_.vocab_size, "token id ", ch.tokens[j],
                 " out of range for vocab_size ", spec_.vocab_size);
    T += ch.count;
    *rows += all_positions || ch.all_rows ? ch.count : 1;
  }
  return T;
}

Tensor Model::upload_ids(const std::vector<ForwardChunk>& chunks, int64_t T, int64_t rows, bool all_positions,
                         int32_t position_offset) {
  Tensor host_ids = Tensor::host(DType::I32, {2 * T + rows});
  int32_t* hi = host_ids.data_as<int32_t>();
  int64_t t = 0;
  for (const auto& ch : chunks)
    for (int64_t j = 0; j < ch.count; ++j, ++t) {
      hi[t] = ch.tokens[j];
      hi[T + t] = static_cast<int32_t>(ch.past_len + j + position_offset) | (ch.long_rope ? kRopeLong : 0);
    }
  for (int64_t r = 0, first = 0; const auto& ch : chunks) {  // token rows whose logits are wanted
    if (all_positions || ch.all_rows)
      for (int64_t j = 0; j < ch.count; ++j) hi[2 * T + r++] = static_cast<int32_t>(first + j);
    else
      hi[2 * T + r++] = static_cast<int32_t>(first + ch.count - 1);
    first += ch.count;
  }
  Tensor ids = ws_.get("ids", DType::I32, {2 * T + rows});
  backend_.copy(ids, host_ids, Stream::Compute);
  return ids;
}

namespace {

// Rank 0 sends `tensors`, the others receive them, in pieces of 1/64 of the model (1 MiB to
// 256 MiB) each waited for: a receiver's progress (in its log) is what it has received, and a
// failed peer is seen at the next piece. `progress` (a receiver's) counts from the `total` -
// `to_receive` checkpoint bytes it read itself.
void broadcast_weights(WeightBroadcaster& bc, const std::vector<Tensor>& tensors, size_t total, size_t to_receive,
                       const std::function<void(size_t, size_t)>& progress) {
  const size_t piece = std::clamp<size_t>(total / 64, size_t{1} << 20, size_t{256} << 20);
  size_t sent = 0, moved = 0;
  for (const auto& t : tensors) sent += t.nbytes();
  for (const auto& t : tensors) {
    const Tensor bytes = t.view_as(DType::U8, {static_cast<int64_t>(t.nbytes())});
    for (size_t off = 0; off < t.nbytes(); off += piece) {
      const size_t n = std::min(piece, t.nbytes() - off);
      bc.broadcast(bytes.rows(static_cast<int64_t>(off), static_cast<int64_t>(n)));
      bc.finish();
      moved += n;
      if (progress)
        progress(total - to_receive + static_cast<size_t>(static_cast<double>(to_receive) * static_cast<double>(moved) /
                                                          static_cast<double>(std::max<size_t>(sent, 1))),
                 total);
    }
  }
}

}  // namespace

void Model::load_checkpoint(const std::string& model_dir, const ModelLoadOptions& opts,
                            const std::function<void(const CheckpointDir&)>& prepare,
                            const std::function<std::string(const std::string&)>& key_of) {
  CheckpointDir ckpt(model_dir);
  stream_weights_ = opts.stream_weights;
  // Uploads read the mapped checkpoint asynchronously: finish them before it is unmapped,
  // also when loading fails half way.
  struct FinishUploads {
    Backend& b;
    ~FinishUploads() { b.synchronize(); }
  } finish_uploads{backend_};
  format_ = ckpt.format();
  quant_ = QuantizedCheckpoint::from_config(read_config_json(model_dir), model_dir + "/config.json");
  quant_.settle_dtype(ckpt);
  prepare(ckpt);
  // A weight stored quantized (quantized_checkpoint.h), one the architecture derives (gpt-oss's
  // packed experts), or the checkpoint's tensor as it is.
  auto derived_of = [&](const std::string& key, const TensorRecord* r) -> std::optional<DType> {
    if (std::optional<DType> q = quant_.dtype(ckpt, key)) return q;
    return r ? std::nullopt : derived_dtype(ckpt, key);
  };
  // Quantized matrices stay quantized when the architecture and the backend both compute on them
  // (a broadcast carries them as they are: share_layout).
  const bool keep_quantized = keeps_quantized() && backend_.reads_quantized_weights();
  check_host_memory(plan_weights([&](const std::string& name, bool) -> std::optional<PlannedWeight> {
                      const std::string key = key_of(name);
                      const TensorRecord* r = ckpt.find(key);
                      const std::optional<DType> derived = derived_of(key, r);
                      const std::optional<DType> stored = derived ? derived : r ? std::optional<DType>(r->dtype) : std::nullopt;
                      if (!stored) return std::nullopt;
                      const DType dt = opts.convert_weights ? opts.weight_dtype : *stored;
                      if (keep_quantized && quant_.dtype(ckpt, key)) return PlannedWeight{dt, quant_.bits_per_weight() / 8};
                      if (keep_quantized && derived)
                        if (const double b = derived_quantized_bytes(ckpt, key); b > 0) return PlannedWeight{dt, b};
                      return PlannedWeight{dt, static_cast<double>(dtype_size(dt))};
                    }),
                    opts);
  size_t total = 0, done = 0;
  for (const auto& r : ckpt.tensors()) total += r.nbytes();
  std::vector<Tensor> received;  // every checkpoint tensor, in load order (for the broadcast)
  std::vector<Tensor> loaded;    // every weight, in load order (for the digest)
  size_t to_receive = 0;         // a receiver's checkpoint bytes that come over the broadcast
  size_t read_here = 0;          // ... and those it reads itself (streamed layers)
  const bool receiver = opts.broadcast && opts.broadcast->rank() != 0;
  assemble([&](const std::string& name, const Shape& expect, bool required, WeightRole role) -> Weight {
    const std::string key = key_of(name);
    const bool quantized = quant_.dtype(ckpt, key).has_value();
    const std::optional<DType> derived = derived_of(key, ckpt.find(key));
    const TensorRecord* r = derived ? nullptr : ckpt.find(key);
    if (!r && !derived) {
      KVPR_CHECK(!required, model_dir, ": missing tensor '", key, "'");
      return Tensor();
    }
    const DType stored = r ? r->dtype : *derived;
    KVPR_CHECK(is_float(stored), r ? r->file : model_dir, ": tensor '", key, "' has dtype ", dtype_name(stored),
               ", expected F32, F16 or BF16");
    KVPR_CHECK(!r || r->shape == expect, r ? r->file : model_dir, ": tensor '", key, "' has shape ",
               shape_str(r ? r->shape : expect), ", expected ", shape_str(expect));
    DType dt = opts.convert_weights ? opts.weight_dtype : stored;
    if (quantized || derived_quantized_bytes(ckpt, key) > 0) dequantized_dtype_ = dt;
    // Streamed weights go to pinned host memory, read by every rank; the rest to the device.
    const bool host = streamed(name, role);
    if (derived && keep_quantized && role == WeightRole::Matrix) {
      // Repacked into kvpr's layout on the host and uploaded as it is (unless its groups loaded
      // dense, or the architecture derives it dense only: below). Over a broadcast rank 0
      // repacks and the receivers take its layout and then its bytes.
      const bool shared = opts.broadcast && !host;
      Weight hw;
      if (!receiver || host) hw = quantized ? quant_.weight(ckpt, key) : derived_quantized_weight(ckpt, key);
      if (shared) hw = share_layout(*opts.broadcast, hw, total);
      if (hw.quantized()) {
        KVPR_CHECK(hw.shape == expect, model_dir, ": tensor '", key, "' holds ", shape_str(hw.shape), " weights, expected ",
                   shape_str(expect));
        Weight w = shared && receiver ? hw : upload(hw, host, total);
        kept_quantized_ = true;
        for (const Tensor* t : w.parts()) {
          if (!t->defined()) continue;
          if (opts.verify_weights) loaded.push_back(*t);
          if (shared) received.push_back(*t);
          if (shared && receiver) to_receive += t->nbytes();
        }
        // (as the dense weights below: a receiver counts what it reads itself, the streamed layers)
        done = std::min(done + static_cast<size_t>(w.nbytes()), total);
        if (receiver && host) read_here = std::min(read_here + static_cast<size_t>(w.nbytes()), total);
        if (opts.progress && (!receiver || host)) opts.progress(receiver ? read_here : done, total);
        parameter_count_ += w.numel();
        weight_bytes_ += w.nbytes();
        return w;
      }
    }
    Tensor dst = host ? backend_.alloc_pinned(dt, expect) : alloc_weight(dt, expect, total);
    const size_t bytes = r ? r->nbytes() : static_cast<size_t>(shape_numel(expect)) * dtype_size(stored);
    if (opts.broadcast && !host) {
      received.push_back(dst);
      if (receiver) to_receive += bytes;
    }
    if (opts.verify_weights) loaded.push_back(dst);
    if (!receiver || host) {  // (a receiver's come over the broadcast below)
      if (r) {
        upload_weight(backend_, dst, Tensor::borrow(const_cast<void*>(r->data), r->dtype, r->shape));
      } else {
        const Tensor src = quantized ? quant_.dequantize(ckpt, key) : derived_weight(ckpt, key);
        KVPR_CHECK(src.defined() && src.shape() == expect, model_dir, ": tensor '", key, "' derives to shape ",
                   src.defined() ? shape_str(src.shape()) : "none", ", expected ", shape_str(expect));
        upload_weight(backend_, dst, src);
        backend_.synchronize();  // the upload has read `src`, which goes now (not every expert held at once)
      }
    }
    done = std::min(done + bytes, total);  // (derived weights are larger than the packed bytes they come from)
    if (receiver && host) read_here += bytes;
    if (opts.progress && (!receiver || host)) opts.progress(receiver ? read_here : done, total);
    parameter_count_ += dst.numel();
    weight_bytes_ += dst.nbytes();
    return dst;
  });
  if (opts.broadcast) {
    backend_.synchronize();  // rank 0's uploads have landed
    // (repacked layouts may hold more bytes than the checkpoint's: F32 scales for 8-bit ones)
    broadcast_weights(*opts.broadcast, received, total, std::min(to_receive, total - std::min(read_here, total)),
                      receiver ? opts.progress : nullptr);
    received = {};  // its references would keep the parts stack_weights replaces on the device
    if (opts.progress) opts.progress(total, total);
  }
  checkpoint_bytes_read_ = ckpt.bytes_read();
  if (opts.verify_weights) {
    verify_weights(loaded, opts.broadcast);
    loaded = {};  // (as `received`)
  }
  stack_weights();
  stream_layers();
}

namespace {
// 64 bits of every byte of the tensors in order (with their sizes): equal weights give equal
// digests; a flipped bit anywhere, a different one with all but certainty.
uint64_t digest_of(Backend& backend, const std::vector<Tensor>& tensors) {
  uint64_t h = 0x243f6a8885a308d3ull;
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  };
  for (const Tensor& t : tensors) {
    Tensor host = Tensor::host(t.dtype(), t.shape());
    backend.copy(host, t, Stream::D2H, "verify weights");
    backend.synchronize();
    const auto* p = static_cast<const uint8_t*>(host.data());
    const size_t n = host.nbytes();
    mix(n);
    size_t i = 0;
    for (uint64_t w; i + 8 <= n; i += 8) {
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    if (n > i) std::memcpy(&tail, p + i, n - i);
    mix(tail);
  }
  return h;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}
}  // namespace

void Model::verify_weights(const std::vector<Tensor>& loaded, WeightBroadcaster* broadcast) {
  backend_.synchronize();
  const uint64_t mine = digest_of(backend_, loaded);
  weights_digest_ = hex64(mine);
  if (!broadcast) return;
  // Rank 0's digest, over the same communicator: what every rank's weights must hash to.
  Tensor host = Tensor::host(DType::U8, {8}), dev = backend_.alloc(DType::U8, {8});
  std::memcpy(host.data(), &mine, 8);
  backend_.copy(dev, host, Stream::H2D, "weights digest");
  backend_.synchronize();
  broadcast->broadcast(dev);
  broadcast->finish();
  backend_.copy(host, dev, Stream::D2H, "weights digest");
  backend_.synchronize();
  uint64_t root = 0;
  std::memcpy(&root, host.data(), 8);
  KVPR_CHECK(root == mine, "the weights received over NCCL differ from rank 0's (digest ", weights_digest_, ", rank 0's ",
             hex64(root), ")");
}

void Model::init_random(DType dtype, uint64_t seed, const ModelLoadOptions& opts) {
  format_ = "random";
  stream_weights_ = opts.stream_weights;
  // The layers' matrices (routers included) quantized when asked; lm_head and the embedding stay
  // dense, as the quantizers leave them.
  const WeightFormat q = opts.random_format;
  KVPR_CHECK(q == WeightFormat::Dense || (keeps_quantized() && backend_.reads_quantized_weights()), "random weights in ",
             weight_format_name(q), ": this model on this backend computes on dense weights only");
  KVPR_CHECK(opts.random_group >= 0, "random weights: a group of ", opts.random_group, " inputs");
  const bool head = q != WeightFormat::Dense && opts.random_quantized_head;
  auto quantized = [q, head](const std::string& name, WeightRole role) {
    return q != WeightFormat::Dense && role == WeightRole::Matrix &&
           (name.rfind("layers.", 0) == 0 || (head && name == "lm_head.weight"));
  };
  const double q_bytes = weight_format_is_nibbles(q) ? 0.5 : 1.0,
               scale_bytes = opts.random_group > 0 ? 4.0 / static_cast<double>(opts.random_group) : 0.0;
  check_host_memory(plan_weights([&](const std::string& name, bool required) -> std::optional<PlannedWeight> {
                      if (!required && !head && name == "lm_head.weight") return std::nullopt;  // tied, as below
                      return PlannedWeight{dtype, quantized(name, WeightRole::Matrix) ? q_bytes + scale_bytes
                                                                                      : static_cast<double>(dtype_size(dtype))};
                    }),
                    opts);
  auto n = std::make_shared<uint64_t>(0);
  const int64_t group = opts.random_group;
  dequantized_dtype_ = dtype;
  assemble([this, dtype, seed, n, quantized, q, group, head](const std::string& name, const Shape& shape,
                                                             bool required, WeightRole role) -> Weight {
    if (!required && !head && name == "lm_head.weight") return Weight();  // tied
    const bool host = streamed(name, role);
    Tensor t = alloc_weight(dtype, shape, 0);
    const float fan_in = static_cast<float>(shape.size() == 2 ? shape[1] : 1);
    const uint64_t s = seed + (*n)++;
    switch (role) {
      case WeightRole::Matrix: backend_.fill_random(t, s, 0.f, 1.f / std::sqrt(fan_in)); break;
      case WeightRole::Embedding: backend_.fill_random(t, s, 0.f, 0.1f); break;
      case WeightRole::NormGain: backend_.fill_random(t, s, 1.f, 0.05f); break;
      case WeightRole::Bias: backend_.fill_random(t, s, 0.f, 0.02f); break;
    }
    if (quantized(name, role)) {
      Tensor dense = Tensor::host(dtype, shape);
      backend_.copy(dense, t, Stream::Compute);
      backend_.synchronize();
      Weight w = upload(quantize_rtn(dense, q, group), host, 0);
      kept_quantized_ = true;
      parameter_count_ += w.numel();
      weight_bytes_ += w.nbytes();
      return w;
    }
    parameter_count_ += t.numel();
    weight_bytes_ += t.nbytes();
    if (!host) return t;
    Tensor pinned = backend_.alloc_pinned(dtype, shape);  // generated on the device, kept on the host
    backend_.copy(pinned, t, Stream::Compute);
    backend_.synchronize();
    return pinned;
  });
  stack_weights();
  stream_layers();
}

Model::WeightPlan Model::plan_weights(
    const std::function<std::optional<PlannedWeight>(const std::string& name, bool required)>& plan_of) {
  WeightPlan plan;
  bool have_dtype = false;
  std::map<std::string, double> layer_bytes;  // streamed, by "layers.N."
  assemble([&](const std::string& name, const Shape& shape, bool required, WeightRole role) {
    const std::optional<PlannedWeight> w = plan_of(name, required);
    if (!w) return Weight();
    const double bytes = static_cast<double>(shape_numel(shape)) * w->bytes_per_element;
    plan.all += bytes;
    if (role == WeightRole::Embedding && !have_dtype) plan.dtype = w->dtype, have_dtype = true;
    if (streamed(name, role)) {
      plan.streamed += bytes;
      const size_t dot = name.find('.', std::strlen("layers."));
      plan.largest_streamed_layer = std::max(plan.largest_streamed_layer, layer_bytes[name.substr(0, dot)] += bytes);
    }
    return Weight();
  });
  return plan;
}

void Model::check_host_memory(const WeightPlan& plan, const ModelLoadOptions& opts) {
  // Pinned host memory: the streamed layers (one of them twice while it is stacked) and the
  // host KV store; on a backend whose device is the host, every weight and any KV cache.
  const bool host_device = backend_.device_is_host();
  const double weights = host_device ? plan.all + plan.largest_streamed_layer
                                     : plan.streamed > 0 ? plan.streamed + plan.largest_streamed_layer : 0.0;
  host_weight_bytes_ = weights;
  if (!opts.kv_plan) return;
  const KvPlan kv = opts.kv_plan(spec_, plan.dtype, backend_, weights);
  const double cache = KvRuntime::host_store_bytes(backend_, kv_shape(), kv);
  const size_t avail = host_bytes_available();
  if (avail == SIZE_MAX || weights + cache <= static_cast<double>(avail)) return;
  char msg[768];
  std::snprintf(msg, sizeof msg, "%s %.2f GiB and %s %.2f GiB of host memory, %.2f GiB together, and %.2f GiB are "
                "available: %s",
                host_device ? "the weights need" : "the layers' weights streamed from host memory need",
                weights / 1073741824.0, KvRuntime::describe(kv.layout, kv.kv).c_str(), cache / 1073741824.0,
                (weights + cache) / 1073741824.0, static_cast<double>(avail) / 1073741824.0,
                weights > static_cast<double>(avail) ? "the weights alone do not fit this host"
                                                     : "lower kv-cache, max-batch or max-seq-len");
  KVPR_THROW(msg);
}

std::string model_type(const std::string& model_dir) {
  json::Value v = read_config_json(model_dir);
  ConfigFields f(v, "config.json");
  std::string mt;
  f.get_string("model_type", &mt, true);
  KVPR_CHECK(mt == "opt" || is_llama_family(mt), "config.json: model_type \"", mt,
             "\" is not supported (supported: opt, ", llama_family_names(), ")");
  return mt;
}

ModelSpec load_model_spec(const std::string& model_dir) {
  if (model_type(model_dir) != "opt") return LlamaConfig::load(model_dir).spec();
  return OptConfig::load(model_dir).spec();
}

std::unique_ptr<Model> load_model(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts) {
  if (model_type(model_dir) != "opt") return std::make_unique<LlamaModel>(backend, model_dir, opts);
  return std::make_unique<OptModel>(backend, model_dir, opts);
}

}  // namespace kvpr
