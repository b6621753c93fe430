#include "engine/kv/kv_runtime.h"

#include <algorithm>
#include <cmath>

#include "engine/kv/kv_modes.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {
// Recomputing K/V from X saves link bytes only where X is smaller than K+V (not with GQA).
bool recompute_can_pay(const KvShape& shape) { return shape.hidden < 2 * shape.kv_hidden(); }
}  // namespace

KvRuntime::KvRuntime(Backend& backend, const KvShape& shape, KvProjector& projector, const KvLayout& layout,
                     const KvRuntimeOptions& opts, LayerWeightStream* weights)
    : st_(backend, shape, projector, layout, opts, weights) {
  KVPR_CHECK(layout.blocks > 0 && layout.block_tokens > 0 && layout.max_tokens > 0 && layout.blocks < (int64_t{1} << 31),
             "KV runtime needs 1 to 2^31 - 1 blocks of at least one token, not ", layout.blocks, " of ",
             layout.block_tokens);
  KVPR_CHECK(is_storage_float(opts.kv_dtype), "KV dtype must be F32, F16, BF16 or F8_E4M3");
  check_fits(backend, shape, layout, opts);
  mode_ = make_kv_mode(st_);
  const KvMode m = opts.mode;
  if (kv_mode_splits(m) && !opts.forced_split) {
    KVPR_CHECK(opts.profile, "kv mode ", kv_mode_name(m), " needs a link profile (run the profiler) or a forced --split");
    const int64_t es = static_cast<int64_t>(dtype_size(opts.kv_dtype));
    st_.scheduler = std::make_unique<SplitScheduler>(*opts.profile, shape.hidden * es, 2 * shape.kv_hidden() * es,
                                                     opts.split_granularity, opts.split_model);
    if (weights)
      st_.scheduler->set_fixed_link_bytes(static_cast<double>(weights->host_bytes()) /
                                          static_cast<double>(std::max<int64_t>(1, weights->layers())));
  }
}

KvRuntime::~KvRuntime() { st_.be.synchronize(); }

const DeviceBlockCache* KvRuntime::device_tier() const { return mode_->device_tier(); }

double KvRuntime::device_block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  return static_cast<double>(shape.layers) * 2.0 * static_cast<double>(shape.kv_hidden()) *
         static_cast<double>(layout.block_tokens) * static_cast<double>(dtype_size(opts.kv_dtype));
}

int64_t KvRuntime::device_tier_blocks(Backend& backend, const KvShape& shape, const KvLayout& layout,
                                      const KvRuntimeOptions& opts) {
  if (opts.mode != KvMode::Auto) return 0;
  const double block = device_block_bytes(shape, layout, opts);
  const size_t free = backend.device_bytes_free();
  const bool own_memory = free != SIZE_MAX && !backend.device_is_host();
  // What the step needs beside the tier: the staging buffers at their largest (K and V of two
  // layers of the whole host store, X where kept, grown by half again as they grow: whole
  // contexts, a sliding-window ring's layers too), the recomputed K/V in fp32, and a twentieth
  // for activations, logits and scratch.
  const double tokens = static_cast<double>(layout.blocks) * static_cast<double>(layout.block_tokens);
  KvLayout every_layer = layout;
  every_layer.window_blocks = 0;
  const double staging = 3.0 * store_bytes(shape, every_layer, opts) / static_cast<double>(std::max<int64_t>(1, shape.layers)) +
                         2.0 * tokens * static_cast<double>(shape.kv_hidden()) * 4.0;
  const double avail = own_memory ? std::max(0.0, static_cast<double>(free) * 0.95 - staging) : 0;
  double bytes = opts.gpu_kv_bytes;
  if (opts.gpu_kv_fraction >= 0) {
    KVPR_CHECK(opts.gpu_kv_fraction <= 1, "the GPU KV budget as a fraction must be in [0, 1], not ", opts.gpu_kv_fraction);
    // Without device memory of its own (the CPU backend): a share of what the store holds.
    bytes = opts.gpu_kv_fraction * (own_memory ? avail : static_cast<double>(layout.blocks) * block);
  } else {
    KVPR_CHECK(bytes >= 0, "the GPU KV budget must not be negative");
    const double room = own_memory ? avail : free == SIZE_MAX ? 1e300 : static_cast<double>(free);
    if (bytes > room && bytes >= block) {
      char msg[320];
      std::snprintf(msg, sizeof msg,
                    "a GPU KV budget of %.2f GiB exceeds the %.2f GiB of device memory free%s: lower gpu-kv-budget",
                    bytes / 1073741824.0, room / 1073741824.0, own_memory ? " beside the step's buffers" : "");
      KVPR_THROW(msg);
    }
  }
  return std::min(layout.blocks, static_cast<int64_t>(std::min(bytes / block, 2147483647.0)));
}

double KvRuntime::device_tier_bytes() const {
  const DeviceBlockCache* tier = device_tier();
  return tier ? static_cast<double>(tier->device_blocks()) * device_block_bytes(st_.shape, st_.layout, st_.opts) : 0;
}

double KvRuntime::device_tier_used_bytes() const {
  const DeviceBlockCache* tier = device_tier();
  return tier ? static_cast<double>(tier->mirrored()) * device_block_bytes(st_.shape, st_.layout, st_.opts) : 0;
}

double KvRuntime::block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  const double es = static_cast<double>(dtype_size(opts.kv_dtype)), layers = static_cast<double>(shape.layers);
  const int64_t x_rows = std::min(layout.block_tokens, x_capacity(shape, layout.max_tokens, opts));
  return layers * es *
         (2.0 * static_cast<double>(shape.kv_hidden()) * static_cast<double>(layout.block_tokens) +
          static_cast<double>(shape.hidden) * static_cast<double>(x_rows));
}

double KvRuntime::window_block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  int64_t sliding = 0;
  for (int64_t l = 0; l < shape.layers; ++l) sliding += shape.window(l) > 0;
  return block_bytes(shape, layout, opts) * static_cast<double>(sliding) / static_cast<double>(std::max<int64_t>(1, shape.layers));
}

double KvRuntime::store_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  if (!layout.ring()) return static_cast<double>(layout.blocks) * block_bytes(shape, layout, opts);
  const double ring = window_block_bytes(shape, layout, opts);
  return static_cast<double>(layout.blocks) * (block_bytes(shape, layout, opts) - ring) +
         static_cast<double>(layout.window_blocks) * ring;
}

double KvRuntime::host_store_bytes(const Backend& backend, const KvShape& shape, const KvPlan& plan) {
  if (!kv_mode_uses_host(plan.kv.mode) && !backend.device_is_host()) return 0;
  return store_bytes(shape, plan.layout, plan.kv);
}

std::string KvRuntime::describe(const KvLayout& layout, const KvRuntimeOptions& opts) {
  const std::string mode = std::string("kv mode ") + kv_mode_name(opts.mode) + ")";
  if (layout.block_tokens == layout.max_tokens)
    return "the KV cache of " + std::to_string(layout.blocks) + " sequences x " + std::to_string(layout.max_tokens) +
           " tokens (" + mode;
  return "the KV cache of " + std::to_string(layout.blocks) + " blocks x " + std::to_string(layout.block_tokens) +
         " tokens (room for " + std::to_string(layout.blocks / layout.blocks_for(layout.max_tokens)) + " sequences x " +
         std::to_string(layout.max_tokens) + " tokens, " + mode;
}

void KvRuntime::check_fits(Backend& backend, const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  // The cache is allocated whole, every block: say so before allocating what cannot fit (a
  // failed pinned allocation, or the OOM killer while zeroing it).
  const bool on_device = !kv_mode_uses_host(opts.mode);
  const double need = store_bytes(shape, layout, opts);
  const bool device_memory = on_device && !backend.device_is_host();
  const size_t avail = device_memory ? backend.device_bytes_free() : host_bytes_available();
  if (avail == SIZE_MAX || need <= static_cast<double>(avail)) return;
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s needs %.2f GiB of %s and %.2f GiB are available: lower kv-cache, max-batch or max-seq-len%s",
                describe(layout, opts).c_str(), need / 1073741824.0,
                device_memory ? "device memory" : on_device ? "memory" : "pinned host memory",
                static_cast<double>(avail) / 1073741824.0,
                device_memory ? ", or keep it in host memory (kv mode offload or kvpr)" : "");
  KVPR_THROW(msg);
}

int64_t KvRuntime::x_capacity(const KvShape& shape, int64_t capacity, const KvRuntimeOptions& opts) {
  if (!kv_mode_stores_x(opts.mode)) return 0;
  // kvpr keeps X only where recomputing from it can save bytes, or a split is forced.
  if (kv_mode_splits(opts.mode) && !opts.forced_split && !recompute_can_pay(shape)) return 0;
  return opts.activation_cap < 0 ? capacity : std::min(opts.activation_cap, capacity);
}

int64_t KvRuntime::host_bytes_per_token(KvMode mode, const KvShape& shape, DType dtype) {
  if (!kv_mode_uses_host(mode)) return 0;
  KvRuntimeOptions defaults;  // no forced split, no activation cap
  defaults.mode = mode;
  const bool x = x_capacity(shape, 1, defaults) > 0;
  int64_t per_layer = 2 * shape.kv_hidden() + (x ? shape.hidden : 0);
  return shape.layers * per_layer * static_cast<int64_t>(dtype_size(dtype));
}

void KvRuntime::set_host_attention_threads(int threads) {
  KVPR_CHECK(threads > 0, "host attention needs at least one thread");
  mode_->set_host_attention_threads(threads);
}

int64_t KvRuntime::host_bytes_per_token() const {
  if (!st_.host) return 0;
  const int64_t x = st_.host->x_capacity() > 0 ? st_.shape.hidden : 0;
  return st_.shape.layers * (2 * st_.shape.kv_hidden() + x) * static_cast<int64_t>(dtype_size(st_.opts.kv_dtype));
}

KvRuntime::Rows KvRuntime::group_rows(int64_t group) const {
  const GpuBatch& g = st_.batches.at(static_cast<size_t>(group));
  return Rows{g.q_begin, g.q_rows};
}

void KvRuntime::begin(const std::vector<ForwardChunk>& chunks) {
  if (step_open_) mode_->drop_unfinished_step();
  step_open_ = true;
  const KvLayout& layout = st_.layout;
  st_.plan.clear();
  st_.batches.clear();
  st_.stats.h2d_bytes = st_.stats.d2h_bytes = st_.stats.weight_h2d_bytes = 0;
  // Every chunk's block table: its own, or its slot's one block.
  slot_tables_.clear();
  for (const auto& c : chunks) {
    const int64_t n = c.past_len + c.count;
    KVPR_CHECK(c.past_len >= 0 && c.count >= 0 && n <= layout.max_tokens, "sequence of ", n,
               " tokens exceeds the KV capacity ", layout.max_tokens);
    if (c.blocks.empty()) {
      KVPR_CHECK(c.slot >= 0 && c.slot < layout.blocks, "KV slot ", c.slot, " out of range");
      KVPR_CHECK(n <= layout.block_tokens, "sequence of ", n, " tokens exceeds the KV capacity ", layout.block_tokens);
      slot_tables_.push_back(static_cast<int32_t>(c.slot));
      continue;
    }
    KVPR_CHECK(static_cast<int64_t>(c.blocks.size()) >= layout.blocks_for(n), "sequence of ", n, " tokens has ",
               c.blocks.size(), " KV blocks of ", layout.block_tokens);
    for (int64_t i = 0; i < layout.blocks_for(n); ++i)
      KVPR_CHECK(c.blocks[static_cast<size_t>(i)] >= 0 && c.blocks[static_cast<size_t>(i)] < layout.blocks, "KV block ",
                 c.blocks[static_cast<size_t>(i)], " out of range");
    if (!layout.ring()) continue;
    // The ring's table: blocks from the first its first token's widest window reads.
    KVPR_CHECK(static_cast<int64_t>(c.window_blocks.size()) >= layout.blocks_for(n), "sequence of ", n, " tokens has ",
               c.window_blocks.size(), " sliding-window KV blocks of ", layout.block_tokens);
    for (int64_t i = std::max<int64_t>(0, c.past_len + 1 - layout.window_tokens) / layout.block_tokens;
         i < layout.blocks_for(n); ++i)
      KVPR_CHECK(c.window_blocks[static_cast<size_t>(i)] >= 0 && c.window_blocks[static_cast<size_t>(i)] < layout.window_blocks,
                 "sliding-window KV block ", c.window_blocks[static_cast<size_t>(i)], " out of range");
  }
  // GPU batches of consecutive chunks with context tokens as even as can be: the largest sets
  // the device buffers, and every batch's copies should take as long as the others'.
  const size_t n = chunks.size();
  const size_t G = std::clamp<size_t>(static_cast<size_t>(std::max<int64_t>(1, st_.opts.gpu_batches)), 1, std::max<size_t>(n, 1));
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + chunks[i].past_len + chunks[i].count;
  std::vector<size_t> cut(G + 1, n);
  cut[0] = 0;
  for (size_t g = 1; g < G; ++g) {
    const double target = static_cast<double>(prefix[n]) * static_cast<double>(g) / static_cast<double>(G);
    const size_t lo = cut[g - 1] + 1, hi = n - (G - g);  // every batch keeps at least one chunk
    size_t best = lo;
    for (size_t i = lo; i <= hi; ++i)
      if (std::abs(static_cast<double>(prefix[i]) - target) < std::abs(static_cast<double>(prefix[best]) - target))
        best = i;
    cut[g] = best;
  }
  int64_t row = 0;
  size_t slot_index = 0;  // slot_tables_ is complete: spans into it stay valid
  for (size_t g = 0; g < G; ++g) {
    GpuBatch gr;
    gr.first = cut[g];
    gr.last = cut[g + 1];
    gr.q_begin = row;
    for (size_t i = gr.first; i < gr.last; ++i) {
      const ForwardChunk& c = chunks[i];
      std::span<const int32_t> table = c.blocks;
      if (table.empty()) table = std::span<const int32_t>(slot_tables_).subspan(slot_index++, 1);
      st_.plan.push_back(SeqPlan{table, c.past_len, c.count, gr.q_rows, gr.ctx_rows, c.past_len + c.count, {},
                                 c.past_len + c.count, {0, 0}, {0, 0}, c.long_rope, c.window_blocks});
      gr.ctx_rows += c.past_len + c.count;
      gr.q_rows += c.count;
    }
    row += gr.q_rows;
    st_.batches.push_back(gr);
  }
  st_.timing.assign(static_cast<size_t>(st_.shape.layers * groups()), LayerTiming{});
  mode_->plan_step();
  prefetch(0);
}

void KvRuntime::prefetch(int64_t u) {
  Backend& be = st_.be;
  LayerWeightStream* weights = st_.weights;
  const bool kv = mode_->copies_kv();
  const int64_t G = groups(), layer = u / G, group = u % G;
  if (layer >= st_.shape.layers || !(kv || weights)) return;
  const bool with_weights = weights && group == 0;  // a layer's weights come with its first unit
  const int b = static_cast<int>(u % 2);
  LayerTiming& t = st_.timing[static_cast<size_t>(u)];
  if (kv) mode_->wait_for_buffers(layer, b);
  if (with_weights) weights->reserve(layer);  // its weight slot must be free too
  be.set_trace_label(st_.unit_label(layer, group));
  t.h2d_start = be.record(Stream::H2D);
  int64_t weight_bytes = 0;
  // Q/K/V weights first: the projection and the recompute need them before attention's KV.
  if (with_weights) weight_bytes += static_cast<int64_t>(weights->issue(layer, LayerWeightStream::Part::Front));
  if (kv) mode_->copy_x(layer, group, b, t);
  t.x_ready = be.record(Stream::H2D);
  if (kv) mode_->copy_kv(layer, group, b, t);
  t.h2d_end = be.record(Stream::H2D);
  if (with_weights) {
    weight_bytes += static_cast<int64_t>(weights->issue(layer, LayerWeightStream::Part::Back));
    t.link_end = be.record(Stream::H2D);
  } else {
    t.link_end = t.h2d_end;
  }
  t.h2d_bytes += weight_bytes;
  st_.stats.h2d_bytes += t.h2d_bytes;
  st_.stats.weight_h2d_bytes += weight_bytes;
}

void KvRuntime::issue_weights(int64_t layer) {
  LayerWeightStream& weights = *st_.weights;
  weights.reserve(layer);
  st_.be.set_trace_label("L" + std::to_string(layer));  // whichever unit issues them: they are this layer's
  const auto n = static_cast<int64_t>(weights.issue(layer, LayerWeightStream::Part::Front) +
                                      weights.issue(layer, LayerWeightStream::Part::Back));
  st_.stats.weight_h2d_bytes += n;
  st_.stats.h2d_bytes += n;
}

void KvRuntime::prefetch_next(int64_t u) {
  // The copies are named for the unit they serve; what this unit computes next keeps its name.
  struct KeepLabel {
    Backend& be;
    std::string label = be.trace_label();
    ~KeepLabel() { be.set_trace_label(label); }
  } keep{st_.be};
  if (u + 1 < st_.shape.layers * groups()) {
    prefetch(u + 1);  // overlaps this unit's compute
  } else if (st_.weights) {
    // Weights do not depend on the step: the next step's layer 0 overlaps the last unit.
    issue_weights(0);
  }
}

void KvRuntime::prepare(int64_t layer, int64_t group) {
  Backend& be = st_.be;
  LayerWeightStream* weights = st_.weights;
  const int64_t G = groups(), u = st_.unit(layer, group);
  KVPR_CHECK(layer >= 0 && layer < st_.shape.layers && group >= 0 && group < G, "KV runtime: no unit (layer ", layer,
             ", GPU batch ", group, ") in this step");
  LayerTiming& t = st_.timing[static_cast<size_t>(u)];
  // The unit's compute time feeds the split scheduler's profile; resident has none to feed
  // (and a step without events can be replayed as a CUDA graph).
  if (mode_->times_units() || weights) {
    if (u > 0) st_.timing[static_cast<size_t>(u - 1)].compute_end = be.record(Stream::Compute);
    t.compute_start = be.record(Stream::Compute);
  }
  if (weights && group == 0) {
    if (layer > 0) weights->release(layer - 1);          // its slot takes layer + 1 next
    st_.stall(t, [&] { weights->bind(layer); });          // this layer's Q/K/V weights have arrived
  }
  if (!mode_->prefetch_after_attention()) {
    prefetch_next(u);
    // Several GPU batches: the next layer's weights follow the next batch's KV now, so they
    // arrive while this layer's batches run, not behind the next layer's first KV.
    if (weights && group == 0 && G > 1) issue_weights(layer + 1 < st_.shape.layers ? layer + 1 : 0);
  }
  be.set_trace_label(st_.unit_label(layer, group));
  if (Tracer* tr = be.tracer())
    tr->counter("split l", tr->now_us(), "l",
                static_cast<double>(layer == 0 ? st_.stats.split_total_layer0 : st_.stats.split_total));
}

void KvRuntime::attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, const AttentionParams& params) {
  const int64_t u = st_.unit(layer, group);
  const GpuBatch& batch = st_.batches.at(static_cast<size_t>(group));
  KVPR_CHECK(q.dim(0) == batch.q_rows, "KV runtime: GPU batch ", group, " has ", batch.q_rows, " query rows, not ", q.dim(0));
  mode_->attend(layer, group, x, q, k, v, out, params);
  if (mode_->prefetch_after_attention()) prefetch_next(u);
  // The rest of the layer (output projection, MLP) needs the back of its weights.
  if (LayerWeightStream* weights = st_.weights; weights && group == 0)
    st_.stall(st_.timing[static_cast<size_t>(u)], [&] { weights->wait_back(layer); });
}

void KvRuntime::end() {
  step_open_ = false;
  if (!st_.timing.empty() && (mode_->times_units() || st_.weights))
    st_.timing.back().compute_end = st_.be.record(Stream::Compute);
  if (st_.weights) st_.weights->release(st_.shape.layers - 1);
  st_.be.set_trace_label("");
  if (st_.scheduler && st_.opts.adapt && !st_.timing.empty() && st_.timing.back().link_end.impl()) observe_step();
  if (st_.scheduler) st_.stats.link_gbps_estimate = st_.scheduler->profile().h2d_gbps;
  ++step_;
}

void KvRuntime::observe_step() {
  Backend& be = st_.be;
  SplitScheduler& sched = *st_.scheduler;
  be.synchronize(st_.timing.back().link_end);
  const int64_t G = std::max<int64_t>(1, groups());
  for (size_t li = 0; li < st_.timing.size(); ++li) {
    const LayerTiming& t = st_.timing[li];
    if (!t.link_end.impl()) continue;
    const double link_ms = be.elapsed_ms(t.h2d_start, t.link_end);
    sched.observe_link(static_cast<double>(t.h2d_bytes), link_ms / 1e3);
    const double rec_ms = t.recompute_end.impl() ? be.elapsed_ms(t.recompute_start, t.recompute_end) : 0;
    const int64_t rx = st_.batches[static_cast<size_t>(static_cast<int64_t>(li) % G)]
                           .x_rows[KvStep::variant(static_cast<int64_t>(li) / G)];
    if (rx > 0) sched.observe_recompute(rx, rec_ms / 1e3);
    if (t.compute_end.impl()) {
      const double layer_ms = be.elapsed_ms(t.compute_start, t.compute_end);
      // The layer's device work other than the recompute: its time on the compute stream
      // less the waits for copies (which the pipeline model accounts for as link time).
      double stalled_ms = 0;
      for (const auto& [before, after] : t.stalls) stalled_ms += be.elapsed_ms(before, after);
      sched.observe_other(std::max(0.0, layer_ms - stalled_ms - rec_ms) / 1e3);
    }
  }
}

}  // namespace kvpr
