#include "engine/kv/kv_runtime.h"

#include <algorithm>
#include <cmath>

#include "engine/backend/cpu/attention.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {
// Recomputing K/V from X saves link bytes only where X is smaller than K+V (not with GQA).
bool recompute_can_pay(const KvShape& shape) { return shape.hidden < 2 * shape.kv_hidden(); }
}  // namespace

// ------------------------------------------------------------------ runtime

KvRuntime::KvRuntime(Backend& backend, const KvShape& shape, KvProjector& projector, const KvLayout& layout,
                     const KvRuntimeOptions& opts, LayerWeightStream* weights)
    : be_(backend), shape_(shape), projector_(projector), layout_(layout), opts_(opts), weights_(weights) {
  KVPR_CHECK(layout.blocks > 0 && layout.block_tokens > 0 && layout.max_tokens > 0 && layout.blocks < (int64_t{1} << 31),
             "KV runtime needs 1 to 2^31 - 1 blocks of at least one token, not ", layout.blocks, " of ",
             layout.block_tokens);
  KVPR_CHECK(is_storage_float(opts.kv_dtype), "KV dtype must be F32, F16, BF16 or F8_E4M3");
  const KvMode m = opts_.mode;
  check_fits(backend, shape, layout, opts);
  if (m == KvMode::Resident) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      dev_k_.push_back(be_.alloc(opts.kv_dtype, {layout.blocks * layout.block_tokens, shape.kv_hidden()}));
      dev_v_.push_back(be_.alloc(opts.kv_dtype, {layout.blocks * layout.block_tokens, shape.kv_hidden()}));
    }
    return;
  }
  host_ = std::make_unique<HostKvStore>(be_, shape, layout, opts.kv_dtype, x_capacity(shape, layout.max_tokens, opts));
  store_done_.resize(shape.layers);
  if (m == KvMode::CpuAttn) {
    int threads = opts.host_attention_threads > 0 ? opts.host_attention_threads
                                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    host_pool_ = std::make_unique<ThreadPool>(threads);
  }
  if (m == KvMode::Auto) {
    const int64_t blocks = device_tier_blocks(backend, shape, layout, opts);
    cache_ = std::make_unique<DeviceBlockCache>(blocks, layout.blocks, layout.block_tokens);
    tier_read_.resize(static_cast<size_t>(shape.layers));
    if (blocks > 0)
      for (int64_t l = 0; l < shape.layers; ++l) {
        dev_k_.push_back(be_.alloc(opts.kv_dtype, {blocks * layout.block_tokens, shape.kv_hidden()}));
        dev_v_.push_back(be_.alloc(opts.kv_dtype, {blocks * layout.block_tokens, shape.kv_hidden()}));
      }
  }
  if (kv_mode_splits(m) && !opts.forced_split) {
    KVPR_CHECK(opts.profile, "kv mode ", kv_mode_name(m), " needs a link profile (run the profiler) or a forced --split");
    const int64_t es = static_cast<int64_t>(dtype_size(opts.kv_dtype));
    scheduler_ = std::make_unique<SplitScheduler>(*opts.profile, shape.hidden * es, 2 * shape.kv_hidden() * es,
                                                  opts.split_granularity, opts.split_model);
    if (weights_)
      scheduler_->set_fixed_link_bytes(static_cast<double>(weights_->host_bytes()) /
                                       static_cast<double>(std::max<int64_t>(1, weights_->layers())));
  }
}

KvRuntime::~KvRuntime() { be_.synchronize(); }

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
  // layers of the whole host store, X where kept, grown by half again as they grow), the
  // recomputed K/V in fp32, and a twentieth for activations, logits and scratch.
  const double tokens = static_cast<double>(layout.blocks) * static_cast<double>(layout.block_tokens);
  const double staging = 3.0 * store_bytes(shape, layout, opts) / static_cast<double>(std::max<int64_t>(1, shape.layers)) +
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
  if (!cache_) return 0;
  return static_cast<double>(cache_->device_blocks()) * device_block_bytes(shape_, layout_, opts_);
}

double KvRuntime::device_tier_used_bytes() const {
  if (!cache_) return 0;
  return static_cast<double>(cache_->mirrored()) * device_block_bytes(shape_, layout_, opts_);
}

double KvRuntime::block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  const double es = static_cast<double>(dtype_size(opts.kv_dtype)), layers = static_cast<double>(shape.layers);
  const int64_t x_rows = std::min(layout.block_tokens, x_capacity(shape, layout.max_tokens, opts));
  return layers * es *
         (2.0 * static_cast<double>(shape.kv_hidden()) * static_cast<double>(layout.block_tokens) +
          static_cast<double>(shape.hidden) * static_cast<double>(x_rows));
}

double KvRuntime::store_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts) {
  return static_cast<double>(layout.blocks) * block_bytes(shape, layout, opts);
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
  const bool on_device = opts.mode == KvMode::Resident;
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
  if (opts_.mode != KvMode::CpuAttn) return;
  be_.synchronize();  // no host attention queued on the old pool
  opts_.host_attention_threads = threads;
  host_pool_ = std::make_unique<ThreadPool>(threads);
}

int64_t KvRuntime::host_bytes_per_token() const {
  if (!host_) return 0;
  const int64_t x = host_->x_capacity() > 0 ? shape_.hidden : 0;
  return shape_.layers * (2 * shape_.kv_hidden() + x) * static_cast<int64_t>(dtype_size(opts_.kv_dtype));
}

Tensor KvRuntime::grow(Tensor& buf, DType dtype, int64_t rows, int64_t width) {
  rows = std::max<int64_t>(rows, 1);
  if (!buf.defined() || buf.dim(0) < rows || buf.dtype() != dtype || buf.dim(1) != width)
    buf = be_.alloc(dtype, {std::max(rows, buf.defined() ? buf.dim(0) * 3 / 2 : 0), width});
  return buf;
}

int64_t KvRuntime::x_avail(const SeqPlan& s) const {
  return host_ ? std::min({s.staged_past(), s.promote_from, host_->x_capacity()}) : 0;
}

// Shares a group's L among its sequences in proportion to their staged cached tokens, each a multiple
// of the granularity where its stored X allows; what rounding leaves goes to sequences with room.
std::vector<int64_t> KvRuntime::distribute(std::span<const SeqPlan> seqs, int64_t total, int64_t cached) const {
  const int64_t g = scheduler_ ? scheduler_->granularity() : 1;
  std::vector<int64_t> out(seqs.size(), 0);
  if (cached == 0 || total == 0) return out;
  int64_t given = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqPlan& s = seqs[i];
    int64_t want = static_cast<int64_t>(std::llround(static_cast<double>(total) * s.staged_past() / cached));
    int64_t l = std::min(x_avail(s), want);
    if (l < x_avail(s) || l % g) l = l / g * g;
    out[i] = l;
    given += l;
  }
  for (size_t i = 0; i < seqs.size() && given < total; ++i) {
    int64_t room = x_avail(seqs[i]) - out[i];
    int64_t add = std::min(room, total - given);
    if (add > 0 && add != room) add = add / g * g;
    out[i] += add;
    given += add;
  }
  return out;
}

void KvRuntime::decide_splits() {
  stats_.split_source = "none";
  stats_.predicted_layer_ms = 0;
  for (auto& s : plan_) s.split[0] = s.split[1] = 0;
  const KvMode m = opts_.mode;
  if (m == KvMode::Recompute) {
    for (auto& s : plan_) s.split[0] = s.split[1] = x_avail(s);
    stats_.split_source = "all";
  } else if (kv_mode_splits(m) && opts_.forced_split) {
    for (auto& s : plan_) s.split[0] = s.split[1] = std::clamp<int64_t>(*opts_.forced_split, 0, x_avail(s));
    stats_.split_source = "forced";
  } else if (kv_mode_splits(m)) {
    // Each GPU batch is a unit of the pipeline: its own split from its own staged cached tokens
    // (auto's resident tails cost no link time: the split is chosen for the rest).
    for (int64_t g = 0; g < groups(); ++g) {
      std::span<SeqPlan> sp = seqs(g);
      int64_t cached = 0, avail = 0;
      for (const auto& s : sp) {
        cached += s.staged_past();
        avail += x_avail(s);
      }
      // auto: the device tier holds what it can (DeviceBlockCache), which is what the tier model
      // says is best (SplitScheduler::choose_tiers, tested against brute force); the split is
      // chosen for the staged rest.
      SplitDecision rest = scheduler_->choose(cached, avail, scheduler_->other_s());
      SplitDecision first = scheduler_->choose(cached, avail, -1.0);  // nothing overlaps layer 0's copies
      stats_.split_source = std::string("scheduler:") + split_model_name(rest.model);
      stats_.predicted_layer_ms += rest.predicted_s * 1e3;
      std::vector<int64_t> l0 = distribute(sp, first.split, cached), l1 = distribute(sp, rest.split, cached);
      for (size_t i = 0; i < sp.size(); ++i) {
        sp[i].split[0] = l0[i];
        sp[i].split[1] = l1[i];
      }
    }
  }
  stats_.split.clear();
  stats_.split_total = stats_.split_total_layer0 = 0;
  int64_t pos = 0;  // positions of every group's recomputed rows, both variants, in xpos_
  for (int64_t g = 0; g < groups(); ++g) {
    Group& gr = groups_[g];
    int64_t off[2] = {0, 0};
    for (auto& s : seqs(g)) {
      for (int v = 0; v < 2; ++v) {
        s.x_off[v] = off[v];
        off[v] += s.split[v];
      }
      stats_.split.push_back(s.split[1]);
      stats_.split_total += s.split[1];
      stats_.split_total_layer0 += s.split[0];
    }
    for (int v = 0; v < 2; ++v) {
      gr.x_rows[v] = off[v];
      gr.xpos_off[v] = pos;
      pos += off[v];
    }
  }
}

KvRuntime::Rows KvRuntime::group_rows(int64_t group) const {
  const Group& g = groups_.at(static_cast<size_t>(group));
  return Rows{g.q_begin, g.q_rows};
}

void KvRuntime::begin(const std::vector<ForwardChunk>& chunks) {
  // A step that failed part way left the device tier's mirrors unknown: drop them (the host
  // store has every token).
  if (step_open_ && cache_) {
    be_.synchronize();  // nothing of it may still read or write the tier
    cache_->clear();
  }
  step_open_ = true;
  plan_.clear();
  groups_.clear();
  stats_.h2d_bytes = stats_.d2h_bytes = stats_.weight_h2d_bytes = 0;
  // Every chunk's block table: its own, or its slot's one block.
  slot_tables_.clear();
  for (const auto& c : chunks) {
    const int64_t n = c.past_len + c.count;
    KVPR_CHECK(c.past_len >= 0 && c.count >= 0 && n <= layout_.max_tokens, "sequence of ", n,
               " tokens exceeds the KV capacity ", layout_.max_tokens);
    if (c.blocks.empty()) {
      KVPR_CHECK(c.slot >= 0 && c.slot < layout_.blocks, "KV slot ", c.slot, " out of range");
      KVPR_CHECK(n <= layout_.block_tokens, "sequence of ", n, " tokens exceeds the KV capacity ", layout_.block_tokens);
      slot_tables_.push_back(static_cast<int32_t>(c.slot));
      continue;
    }
    KVPR_CHECK(static_cast<int64_t>(c.blocks.size()) >= layout_.blocks_for(n), "sequence of ", n, " tokens has ",
               c.blocks.size(), " KV blocks of ", layout_.block_tokens);
    for (int64_t i = 0; i < layout_.blocks_for(n); ++i)
      KVPR_CHECK(c.blocks[static_cast<size_t>(i)] >= 0 && c.blocks[static_cast<size_t>(i)] < layout_.blocks, "KV block ",
                 c.blocks[static_cast<size_t>(i)], " out of range");
  }
  // GPU batches of consecutive chunks with context tokens as even as can be: the largest sets
  // the device buffers, and every batch's copies should take as long as the others'.
  const size_t n = chunks.size();
  const size_t G = std::clamp<size_t>(static_cast<size_t>(std::max<int64_t>(1, opts_.gpu_batches)), 1, std::max<size_t>(n, 1));
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
    Group gr;
    gr.first = cut[g];
    gr.last = cut[g + 1];
    gr.q_begin = row;
    for (size_t i = gr.first; i < gr.last; ++i) {
      const ForwardChunk& c = chunks[i];
      std::span<const int32_t> table = c.blocks;
      if (table.empty()) table = std::span<const int32_t>(slot_tables_).subspan(slot_index++, 1);
      plan_.push_back(SeqPlan{table, c.past_len, c.count, gr.q_rows, gr.ctx_rows, c.past_len + c.count, {}, c.past_len + c.count, {0, 0}, {0, 0}});
      gr.ctx_rows += c.past_len + c.count;
      gr.q_rows += c.count;
    }
    row += gr.q_rows;
    groups_.push_back(gr);
  }
  if (cache_) place_on_device();
  timing_.assign(static_cast<size_t>(shape_.layers * groups()), LayerTiming{});
  if (opts_.mode != KvMode::Resident) allocate_step();
  prefetch(0);
}

void KvRuntime::place_on_device() {
  std::vector<DeviceBlockCache::Seq> seqs;
  for (const SeqPlan& s : plan_) seqs.push_back({s.table, s.past, s.q_len});
  cache_->plan(seqs, &placement_, &promotions_);
  stats_.resident_tokens = stats_.staged_tokens = 0;
  stats_.promoted_blocks = static_cast<int64_t>(promotions_.size());
  for (Group& g : groups_) {
    g.ctx_rows = 0;
    for (size_t i = g.first; i < g.last; ++i) {
      SeqPlan& s = plan_[i];
      s.head = placement_[i].head;
      s.dev_table = placement_[i].table;
      s.promote_from = s.head;
      s.ctx_off = g.ctx_rows;
      g.ctx_rows += s.head;
      stats_.staged_tokens += s.staged_past();
      stats_.resident_tokens += s.past - s.staged_past();
    }
  }
  for (const auto& pr : promotions_)
    plan_[pr.seq].promote_from = std::min(plan_[pr.seq].promote_from, pr.index * layout_.block_tokens);
}

void KvRuntime::allocate_step() {
  decide_splits();
  const int64_t w = shape_.kv_hidden();
  int64_t ctx = 0, q = 0, rx = 0;
  for (const Group& g : groups_) {
    ctx = std::max(ctx, g.ctx_rows);
    q = std::max(q, g.q_rows);
    rx = std::max({rx, g.x_rows[0], g.x_rows[1]});
  }
  for (int b = 0; b < 2; ++b) {
    grow(kbuf_[b], opts_.kv_dtype, ctx, w);
    grow(vbuf_[b], opts_.kv_dtype, ctx, w);
    if (host_ && host_->x_capacity() > 0) {
      grow(xbuf_[b], opts_.kv_dtype, rx, shape_.hidden);
      grow(xnew_[b], opts_.kv_dtype, q, shape_.hidden);
    }
  }
  if (rx > 0) {
    grow(kv_recomputed_, projector_.kv_dtype_for(opts_.kv_dtype), 2 * rx, w);
    if (projector_.needs_positions()) {
      // Stored X starts at a sequence's first token: recomputed row j of a sequence is position j.
      const Group& last = groups_.back();
      const int64_t total = last.xpos_off[1] + last.x_rows[1];
      Tensor host = Tensor::host(DType::I32, {std::max<int64_t>(total, 1)});
      int32_t* p = host.data_as<int32_t>();
      for (int64_t g = 0; g < groups(); ++g)
        for (int v = 0; v < 2; ++v)
          for (const auto& s : seqs(g))
            for (int64_t j = 0; j < s.split[v]; ++j) *p++ = static_cast<int32_t>(j);
      grow(xpos_, DType::I32, host.numel(), 1);
      be_.copy(xpos_.rows(0, host.numel()), host.reshape({host.numel(), 1}), Stream::Compute);
    }
  }
  if (opts_.mode == KvMode::CpuAttn) {
    grow(knew_, opts_.kv_dtype, q, w);
    grow(vnew_, opts_.kv_dtype, q, w);
    if (!host_q_.defined() || host_q_.dim(0) < q) {
      host_q_ = be_.alloc_pinned(DType::F32, {std::max<int64_t>(q, 1), shape_.q_width()});
      host_out_ = be_.alloc_pinned(DType::F32, {std::max<int64_t>(q, 1), shape_.q_width()});
    }
  }
}

void KvRuntime::prefetch(int64_t u) {
  const KvMode m = opts_.mode;
  const bool kv = m == KvMode::Offload || m == KvMode::Kvpr || m == KvMode::Recompute || m == KvMode::Auto;
  const int64_t G = groups(), layer = u / G, group = u % G;
  if (layer >= shape_.layers || !(kv || weights_)) return;
  const bool with_weights = weights_ && group == 0;  // a layer's weights come with its first unit
  const int b = static_cast<int>(u % 2);
  LayerTiming& t = timing_[u];
  if (kv) {
    // The buffer must be free (its attention done, its rows stored) and this layer's stores
    // from the previous step must have reached the host.
    if (buf_free_[b].impl()) be_.wait(Stream::H2D, buf_free_[b]);
    if (buf_stored_[b].impl()) be_.wait(Stream::H2D, buf_stored_[b]);
    if (store_done_[layer].impl()) be_.wait(Stream::H2D, store_done_[layer]);
  }
  if (with_weights) weights_->reserve(layer);  // its weight slot must be free too
  be_.set_trace_label(unit_label(layer, group));
  t.h2d_start = be_.record(Stream::H2D);
  int64_t weight_bytes = 0;
  // Q/K/V weights first: the projection and the recompute need them before attention's KV.
  if (with_weights) weight_bytes += static_cast<int64_t>(weights_->issue(layer, LayerWeightStream::Part::Front));
  const int v = variant(layer);
  const int64_t es = static_cast<int64_t>(dtype_size(opts_.kv_dtype));
  // The GPU batch's X[0:l], then its K[l:s'] and V[l:s']: one copy_spans each, of their runs
  // of blocks (one 2-D copy per run index for a batch whose blocks were handed out together).
  if (kv) {
    RunSpans xs;
    for (const auto& s : seqs(group))
      if (s.split[v] > 0) {
        x_runs(s, 0, s.split[v],
               [&](int64_t row, int64_t off, int64_t n, size_t k) { xs.add(k, RowSpan{row, s.x_off[v] + off, n}); });
        t.h2d_bytes += s.split[v] * shape_.hidden * es;
      }
    if (!xs.empty()) be_.copy_spans(xbuf_[b], host_->x_rows(layer), xs.spans(), Stream::H2D, "X[0:l]");
  }
  t.x_ready = be_.record(Stream::H2D);
  if (kv) {
    RunSpans kvs;
    for (const auto& s : seqs(group)) {
      const int64_t l = s.split[v], n = s.staged_past() - l;
      if (n <= 0) continue;
      kv_runs(s, l, n,
              [&](int64_t row, int64_t off, int64_t c, size_t k) { kvs.add(k, RowSpan{row, s.ctx_off + l + off, c}); });
      t.h2d_bytes += 2 * n * shape_.kv_hidden() * es;
    }
    if (!kvs.empty()) {
      const std::vector<RowSpan> spans = kvs.spans();
      be_.copy_spans(kbuf_[b], host_->k_rows(layer), spans, Stream::H2D, "K[l:s']");
      be_.copy_spans(vbuf_[b], host_->v_rows(layer), spans, Stream::H2D, "V[l:s']");
    }
  }
  t.h2d_end = be_.record(Stream::H2D);
  if (with_weights) {
    weight_bytes += static_cast<int64_t>(weights_->issue(layer, LayerWeightStream::Part::Back));
    t.link_end = be_.record(Stream::H2D);
  } else {
    t.link_end = t.h2d_end;
  }
  t.h2d_bytes += weight_bytes;
  stats_.h2d_bytes += t.h2d_bytes;
  stats_.weight_h2d_bytes += weight_bytes;
}

std::string KvRuntime::unit_label(int64_t layer, int64_t group) const {
  return "L" + std::to_string(layer) + (groups() > 1 ? "." + std::to_string(group) : "");
}

void KvRuntime::issue_weights(int64_t layer) {
  weights_->reserve(layer);
  be_.set_trace_label("L" + std::to_string(layer));  // whichever unit issues them: they are this layer's
  const auto n = static_cast<int64_t>(weights_->issue(layer, LayerWeightStream::Part::Front) +
                                      weights_->issue(layer, LayerWeightStream::Part::Back));
  stats_.weight_h2d_bytes += n;
  stats_.h2d_bytes += n;
}

void KvRuntime::prefetch_next(int64_t u) {
  // The copies are named for the unit they serve; what this unit computes next keeps its name.
  struct KeepLabel {
    Backend& be;
    std::string label = be.trace_label();
    ~KeepLabel() { be.set_trace_label(label); }
  } keep{be_};
  if (u + 1 < shape_.layers * groups()) {
    prefetch(u + 1);  // overlaps this unit's compute
  } else if (weights_) {
    // Weights do not depend on the step: the next step's layer 0 overlaps the last unit.
    issue_weights(0);
  }
}

void KvRuntime::prepare(int64_t layer, int64_t group) {
  const int64_t G = groups(), u = unit(layer, group);
  KVPR_CHECK(layer >= 0 && layer < shape_.layers && group >= 0 && group < G, "KV runtime: no unit (layer ", layer,
             ", GPU batch ", group, ") in this step");
  LayerTiming& t = timing_[u];
  // The unit's compute time feeds the split scheduler's profile; resident has none to feed
  // (and a step without events can be replayed as a CUDA graph).
  if (opts_.mode != KvMode::Resident || weights_) {
    if (u > 0) timing_[u - 1].compute_end = be_.record(Stream::Compute);
    t.compute_start = be_.record(Stream::Compute);
  }
  if (weights_ && group == 0) {
    if (layer > 0) weights_->release(layer - 1);        // its slot takes layer + 1 next
    stall(t, [&] { weights_->bind(layer); });           // this layer's Q/K/V weights have arrived
  }
  // cpu-attn sends its attention output up on the H2D stream: the next unit's copies go
  // after it (attend), or the output would queue behind them.
  if (opts_.mode != KvMode::CpuAttn) {
    prefetch_next(u);
    // Several GPU batches: the next layer's weights follow the next batch's KV now, so they
    // arrive while this layer's batches run, not behind the next layer's first KV.
    if (weights_ && group == 0 && G > 1) issue_weights(layer + 1 < shape_.layers ? layer + 1 : 0);
  }
  be_.set_trace_label(unit_label(layer, group));
  if (Tracer* tr = be_.tracer())
    tr->counter("split l", tr->now_us(), "l",
                static_cast<double>(layer == 0 ? stats_.split_total_layer0 : stats_.split_total));
}

template <typename F>
void KvRuntime::stall(LayerTiming& t, F&& wait) {
  Event before = be_.record(Stream::Compute);
  wait();
  t.stalls.emplace_back(std::move(before), be_.record(Stream::Compute));
}

void KvRuntime::wait_compute(const Event& e, LayerTiming& t) {
  if (!e.impl()) return;
  stall(t, [&] { be_.wait(Stream::Compute, e); });
}

AttentionSeq KvRuntime::resident_seq(const SeqPlan& s, const Tensor& k, const Tensor& v) const {
  const int64_t bt = layout_.block_tokens, n = s.past + s.q_len;
  if (layout_.blocks_for(n) <= 1)  // one block: its rows are the sequence's, in order
    return AttentionSeq{s.q_begin, s.q_len, s.past, k.rows(int64_t{s.table[0]} * bt, bt), v.rows(int64_t{s.table[0]} * bt, bt)};
  return AttentionSeq{s.q_begin, s.q_len, s.past, k, v, s.table.data(), layout_.blocks_for(n), bt};
}

void KvRuntime::attend_resident(int64_t layer, int64_t group, const Tensor& k, const Tensor& v, const Tensor& q,
                                const Tensor& out, float scale) {
  // The new rows of every sequence into its blocks: one op for K, one for V.
  std::vector<RowSpan> spans;
  for (const auto& s : this->seqs(group))
    kv_runs(s, s.past, s.q_len,
            [&](int64_t row, int64_t off, int64_t n, size_t) { spans.push_back(RowSpan{s.q_begin + off, row, n}); });
  be_.copy_rows(dev_k_[layer], k, spans);
  be_.copy_rows(dev_v_[layer], v, spans);
  // Attention reads the blocks in place: through the table, or a contiguous view of a
  // sequence's one block (the contiguous layout, and the attention kernels' fastest path).
  std::vector<AttentionSeq> seqs;
  for (const auto& s : this->seqs(group)) seqs.push_back(resident_seq(s, dev_k_[layer], dev_v_[layer]));
  be_.attention(out, q, seqs, static_cast<int>(shape_.heads), scale);
}

void KvRuntime::attend_cpu(int64_t layer, int64_t group, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, float scale) {
  LayerTiming& t = timing_[unit(layer, group)];
  const int64_t T = groups_[group].q_rows;
  // New K/V in storage dtype, then Q and them down to the host.
  be_.convert(knew_.rows(0, T), k);
  be_.convert(vnew_.rows(0, T), v);
  Event ready = be_.record(Stream::Compute);
  be_.wait(Stream::D2H, ready);
  be_.copy(host_q_.rows(0, T), q, Stream::D2H, "Q");
  stats_.d2h_bytes += static_cast<int64_t>(q.nbytes());
  RunSpans runs;
  for (const auto& s : this->seqs(group)) {
    kv_runs(s, s.past, s.q_len,
            [&](int64_t row, int64_t off, int64_t n, size_t run) { runs.add(run, RowSpan{s.q_begin + off, row, n}); });
    stats_.d2h_bytes += 2 * s.q_len * shape_.kv_hidden() * static_cast<int64_t>(dtype_size(opts_.kv_dtype));
  }
  const std::vector<RowSpan> kvs = runs.spans();
  be_.copy_spans(host_->k_rows(layer), knew_, kvs, Stream::D2H, "K new");
  be_.copy_spans(host_->v_rows(layer), vnew_, kvs, Stream::D2H, "V new");
  Event down = be_.record(Stream::D2H);
  be_.synchronize(down);
  // Attention on host threads over the host store.
  std::vector<AttentionSeq> seqs;
  for (const auto& s : this->seqs(group))
    seqs.push_back(resident_seq(s, host_->k_rows(layer), host_->v_rows(layer)));
  Tracer* tr = be_.tracer();
  double a0 = tr ? tr->now_us() : 0;
  cpu_attention(host_out_.rows(0, T), host_q_.rows(0, T), seqs, static_cast<int>(shape_.heads), scale, *host_pool_);
  if (tr) tr->span("host-attention", "L" + std::to_string(layer) + " attention", a0, tr->now_us());
  be_.copy(out, host_out_.rows(0, T), Stream::H2D, "attention out");
  stats_.h2d_bytes += static_cast<int64_t>(out.nbytes());
  wait_compute(be_.record(Stream::H2D), t);
  store_done_[layer] = down;
}

void KvRuntime::attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, float scale) {
  const KvMode m = opts_.mode;
  const int64_t u = unit(layer, group);
  KVPR_CHECK(q.dim(0) == groups_.at(static_cast<size_t>(group)).q_rows, "KV runtime: GPU batch ", group, " has ",
             groups_[group].q_rows, " query rows, not ", q.dim(0));
  if (m == KvMode::Resident) attend_resident(layer, group, k, v, q, out, scale);
  else if (m == KvMode::CpuAttn) {
    attend_cpu(layer, group, q, k, v, out, scale);
    prefetch_next(u);
  } else {
    attend_offloaded(layer, group, x, q, k, v, out, scale);
  }
  // The rest of the layer (output projection, MLP) needs the back of its weights.
  if (weights_ && group == 0) stall(timing_[u], [&] { weights_->wait_back(layer); });
}

void KvRuntime::attend_offloaded(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, float scale) {
  const int64_t u = unit(layer, group);
  const int b = static_cast<int>(u % 2);
  LayerTiming& t = timing_[u];
  // Rows of buffer b were last stored to the host two units ago; that must be done before
  // this unit writes them.
  if (buf_stored_[b].impl()) wait_compute(buf_stored_[b], t);
  recompute_head(layer, group, b, t);
  const bool store_x = kv_mode_stores_x(opts_.mode) && host_->x_capacity() > 0;
  join_new_rows(layer, group, b, k, v, t);
  if (store_x) be_.convert(xnew_[b].rows(0, groups_[group].q_rows), x);
  wait_compute(t.h2d_end, t);
  attend_staged(layer, group, b, q, out, scale);
  buf_free_[b] = be_.record(Stream::Compute);
  store_new_rows(layer, group, b, store_x);
}

// Recomputes K/V[0:l] from X[0:l] as soon as X has arrived, while KV[l:s'] is still copying.
void KvRuntime::recompute_head(int64_t layer, int64_t group, int b, LayerTiming& t) {
  const Group& gr = groups_[group];
  const int var = variant(layer);
  const int64_t rx = gr.x_rows[var];
  if (rx <= 0) return;
  wait_compute(t.x_ready, t);
  t.recompute_start = be_.record(Stream::Compute);
  // Stored X goes into the GEMM as it is; K/V come out in the store's dtype where the model
  // projects them so (OPT, fp16: one GEMM with its bias, no fp32 pass), else in F32.
  const int64_t w = shape_.kv_hidden();
  Tensor kv = kv_recomputed_.rows(0, 2 * rx).reshape({2, rx, w});
  Tensor pos;
  if (projector_.needs_positions()) pos = xpos_.rows(gr.xpos_off[var], rx).reshape({rx});
  be_.set_trace_label(unit_label(layer, group) + " recompute");
  projector_.project_kv(layer, xbuf_[b].rows(0, rx), kv, pos);
  be_.set_trace_label(unit_label(layer, group));
  std::vector<RowSpan> spans;
  for (const auto& s : this->seqs(group))
    if (s.split[var] > 0) spans.push_back(RowSpan{s.x_off[var], s.ctx_off, s.split[var]});
  be_.copy_rows(kbuf_[b], kv.rows(0, 1).reshape({rx, w}), spans);
  be_.copy_rows(vbuf_[b], kv.rows(1, 1).reshape({rx, w}), spans);
  t.recompute_end = be_.record(Stream::Compute);
}

// This step's new K/V join buffer b after the past ones, and auto's resident tails.
void KvRuntime::join_new_rows(int64_t layer, int64_t group, int b, const Tensor& k, const Tensor& v, LayerTiming& t) {
  const int64_t B = layout_.block_tokens;
  std::vector<RowSpan> fresh, fresh_tier;
  for (const auto& s : this->seqs(group)) {
    const int64_t staged_new = s.staged_new();
    if (staged_new > 0) fresh.push_back(RowSpan{s.q_begin, s.ctx_off + s.past, staged_new});
    for_each_run(s.dev_table, B, B, s.past + staged_new, s.q_len - staged_new, [&](int64_t row, int64_t off, int64_t n) {
      fresh_tier.push_back(RowSpan{s.q_begin + staged_new + off, row, n});
    });
  }
  be_.copy_rows(kbuf_[b], k, fresh);
  be_.copy_rows(vbuf_[b], v, fresh);
  // The device tier's rows the last step stored to the host from must have been read before
  // this step writes there (a block may mirror another host block now).
  if (!fresh_tier.empty() || !promotions_.empty()) wait_compute(tier_read_[static_cast<size_t>(layer)], t);
  if (!fresh_tier.empty()) {
    be_.copy_rows(dev_k_[layer], k, fresh_tier);
    be_.copy_rows(dev_v_[layer], v, fresh_tier);
  }
}

// Attention over buffer b's staged rows and the device tier's resident ones; then auto's
// promotions: staged blocks the device tier took this step, from the rows staged for attention.
void KvRuntime::attend_staged(int64_t layer, int64_t group, int b, const Tensor& q, const Tensor& out, float scale) {
  const int64_t B = layout_.block_tokens;
  std::vector<AttentionSeq> seqs;
  for (const auto& s : this->seqs(group)) {
    const int64_t n = s.past + s.q_len;
    if (s.head == n) {  // all staged
      seqs.push_back(AttentionSeq{s.q_begin, s.q_len, s.past, kbuf_[b].rows(s.ctx_off, n), vbuf_[b].rows(s.ctx_off, n)});
      continue;
    }
    // The resident tail in place, through the device table; the staged head before it.
    AttentionSeq a{s.q_begin, s.q_len, s.past, dev_k_[layer], dev_v_[layer], s.dev_table.data(), layout_.blocks_for(n), B};
    if (s.head > 0) a = a.with_head(kbuf_[b].rows(s.ctx_off, s.head), vbuf_[b].rows(s.ctx_off, s.head), s.head);
    seqs.push_back(std::move(a));
  }
  be_.attention(out, q, seqs, static_cast<int>(shape_.heads), scale);
  if (!cache_) return;
  const Group& gr = groups_[group];
  std::vector<RowSpan> promoted;
  for (const auto& pr : promotions_)
    if (pr.seq >= gr.first && pr.seq < gr.last)
      promoted.push_back(RowSpan{plan_[pr.seq].ctx_off + pr.index * B, int64_t{pr.device} * B, pr.rows});
  if (!promoted.empty()) {
    be_.copy_rows(dev_k_[layer], kbuf_[b], promoted);
    be_.copy_rows(dev_v_[layer], vbuf_[b], promoted);
  }
}

// Stores the step's new K, V (and X below the cap) to the host on the D2H stream, once buffer b
// is free: one gathered store per tensor for the whole GPU batch.
void KvRuntime::store_new_rows(int64_t layer, int64_t group, int b, bool store_x) {
  be_.wait(Stream::D2H, buf_free_[b]);
  const int64_t B = layout_.block_tokens;
  const int64_t es = static_cast<int64_t>(dtype_size(opts_.kv_dtype));
  RunSpans new_kv, new_x;
  std::vector<RowSpan> new_tier;  // auto: new rows from the device tier
  for (const auto& s : this->seqs(group)) {
    const int64_t staged_new = s.staged_new();
    kv_runs(s, s.past, staged_new, [&](int64_t row, int64_t off, int64_t n, size_t run) {
      new_kv.add(run, RowSpan{s.ctx_off + s.past + off, row, n});
    });
    for (int64_t t0 = s.past + staged_new; t0 < s.past + s.q_len;) {
      // Block by block: the device and host tables differ.
      const int64_t j = t0 / B, r = t0 % B, n = std::min(B - r, s.past + s.q_len - t0);
      new_tier.push_back(RowSpan{int64_t{s.dev_table[static_cast<size_t>(j)]} * B + r, int64_t{s.table[static_cast<size_t>(j)]} * B + r, n});
      t0 += n;
    }
    stats_.d2h_bytes += 2 * s.q_len * shape_.kv_hidden() * es;
    int64_t nx = store_x ? std::min(s.q_len, host_->x_capacity() - s.past) : 0;
    if (nx > 0) {
      x_runs(s, s.past, nx,
             [&](int64_t row, int64_t off, int64_t n, size_t run) { new_x.add(run, RowSpan{s.q_begin + off, row, n}); });
      stats_.d2h_bytes += nx * shape_.hidden * es;
    }
  }
  const std::vector<RowSpan> kvs = new_kv.spans();
  be_.copy_spans(host_->k_rows(layer), kbuf_[b], kvs, Stream::D2H, "K new");
  be_.copy_spans(host_->v_rows(layer), vbuf_[b], kvs, Stream::D2H, "V new");
  if (!new_tier.empty()) {
    be_.copy_spans(host_->k_rows(layer), dev_k_[layer], new_tier, Stream::D2H, "K new");
    be_.copy_spans(host_->v_rows(layer), dev_v_[layer], new_tier, Stream::D2H, "V new");
  }
  if (!new_x.empty()) be_.copy_spans(host_->x_rows(layer), xnew_[b], new_x.spans(), Stream::D2H, "X new");
  buf_stored_[b] = be_.record(Stream::D2H);
  store_done_[layer] = buf_stored_[b];
  if (cache_) tier_read_[static_cast<size_t>(layer)] = buf_stored_[b];  // D2H in order: covers the earlier batches
}

void KvRuntime::end() {
  step_open_ = false;
  if (!timing_.empty() && (opts_.mode != KvMode::Resident || weights_))
    timing_.back().compute_end = be_.record(Stream::Compute);
  if (weights_) weights_->release(shape_.layers - 1);
  be_.set_trace_label("");
  if (scheduler_ && opts_.adapt && !timing_.empty() && timing_.back().link_end.impl()) {
    be_.synchronize(timing_.back().link_end);
    for (size_t li = 0; li < timing_.size(); ++li) {
      const LayerTiming& t = timing_[li];
      if (!t.link_end.impl()) continue;
      double link_ms = be_.elapsed_ms(t.h2d_start, t.link_end);
      scheduler_->observe_link(static_cast<double>(t.h2d_bytes), link_ms / 1e3);
      double rec_ms = t.recompute_end.impl() ? be_.elapsed_ms(t.recompute_start, t.recompute_end) : 0;
      const int64_t G = std::max<int64_t>(1, groups());
      const int64_t rx = groups_[static_cast<size_t>(static_cast<int64_t>(li) % G)].x_rows[variant(static_cast<int64_t>(li) / G)];
      if (rx > 0) scheduler_->observe_recompute(rx, rec_ms / 1e3);
      if (t.compute_end.impl()) {
        double layer_ms = be_.elapsed_ms(t.compute_start, t.compute_end);
        // The layer's device work other than the recompute: its time on the compute stream
        // less the waits for copies (which the pipeline model accounts for as link time).
        double stalled_ms = 0;
        for (const auto& [before, after] : t.stalls) stalled_ms += be_.elapsed_ms(before, after);
        scheduler_->observe_other(std::max(0.0, layer_ms - stalled_ms - rec_ms) / 1e3);
      }
    }
  }
  if (scheduler_) stats_.link_gbps_estimate = scheduler_->profile().h2d_gbps;
  ++step_;
}

}  // namespace kvpr
