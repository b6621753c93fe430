// The staged modes: offload, kvpr and recompute (auto adds its device tier: auto_kv.cc).
#include <cmath>

#include "engine/base/error.h"
#include "engine/kv/kv_modes.h"

namespace kvpr {

StagedKv::StagedKv(KvStep& st) : KvModeRuntime(st) {}

void StagedKv::plan_step() {
  st_.stats.split_source = "none";
  st_.stats.predicted_layer_ms = 0;
  for (auto& s : st_.plan) s.split[0] = s.split[1] = 0;
  choose_splits();
  place_splits();
  allocate();
}

void OffloadKv::choose_splits() {}

void RecomputeKv::choose_splits() {
  for (auto& s : st_.plan) s.split[0] = s.split[1] = st_.x_avail(s);
  st_.stats.split_source = "all";
}

void KvprKv::choose_splits() {
  if (st_.opts.forced_split) {
    for (auto& s : st_.plan) s.split[0] = s.split[1] = std::clamp<int64_t>(*st_.opts.forced_split, 0, st_.x_avail(s));
    st_.stats.split_source = "forced";
    return;
  }
  SplitScheduler& sched = *st_.scheduler;
  // Each GPU batch is a unit of the pipeline: its own split from its own staged cached tokens
  // (auto's resident tails cost no link time: the split is chosen for the rest).
  for (int64_t g = 0; g < st_.groups(); ++g) {
    std::span<SeqPlan> sp = st_.seqs(g);
    int64_t cached = 0, avail = 0;
    for (const auto& s : sp) {
      cached += s.staged_past();
      avail += st_.x_avail(s);
    }
    // auto: the device tier holds what it can (DeviceBlockCache), which is what the tier model
    // says is best (SplitScheduler::choose_tiers, tested against brute force); the split is
    // chosen for the staged rest.
    SplitDecision rest = sched.choose(cached, avail, sched.other_s());
    SplitDecision first = sched.choose(cached, avail, -1.0);  // nothing overlaps layer 0's copies
    st_.stats.split_source = std::string("scheduler:") + split_model_name(rest.model);
    st_.stats.predicted_layer_ms += rest.predicted_s * 1e3;
    std::vector<int64_t> l0 = distribute(sp, first.split, cached), l1 = distribute(sp, rest.split, cached);
    for (size_t i = 0; i < sp.size(); ++i) {
      sp[i].split[0] = l0[i];
      sp[i].split[1] = l1[i];
    }
  }
}

// Each sequence's share of a batch's L in proportion to its staged cached tokens, each a multiple
// of the granularity where its stored X allows; what rounding leaves goes to sequences with room.
std::vector<int64_t> KvprKv::distribute(std::span<const SeqPlan> seqs, int64_t total, int64_t cached) const {
  const int64_t g = st_.scheduler ? st_.scheduler->granularity() : 1;
  std::vector<int64_t> out(seqs.size(), 0);
  if (cached == 0 || total == 0) return out;
  int64_t given = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqPlan& s = seqs[i];
    int64_t want = static_cast<int64_t>(std::llround(static_cast<double>(total) * s.staged_past() / cached));
    int64_t l = std::min(st_.x_avail(s), want);
    if (l < st_.x_avail(s) || l % g) l = l / g * g;
    out[i] = l;
    given += l;
  }
  for (size_t i = 0; i < seqs.size() && given < total; ++i) {
    int64_t room = st_.x_avail(seqs[i]) - out[i];
    int64_t add = std::min(room, total - given);
    if (add > 0 && add != room) add = add / g * g;
    out[i] += add;
    given += add;
  }
  return out;
}

void StagedKv::place_splits() {
  StepStats& stats = st_.stats;
  stats.split.clear();
  stats.split_total = stats.split_total_layer0 = 0;
  int64_t pos = 0;  // positions of every batch's recomputed rows, both variants, in xpos_
  for (int64_t g = 0; g < st_.groups(); ++g) {
    GpuBatch& gr = st_.batches[static_cast<size_t>(g)];
    int64_t off[2] = {0, 0};
    for (auto& s : st_.seqs(g)) {
      for (int v = 0; v < 2; ++v) {
        s.x_off[v] = off[v];
        off[v] += s.split[v];
      }
      stats.split.push_back(s.split[1]);
      stats.split_total += s.split[1];
      stats.split_total_layer0 += s.split[0];
    }
    for (int v = 0; v < 2; ++v) {
      gr.x_rows[v] = off[v];
      gr.xpos_off[v] = pos;
      pos += off[v];
    }
  }
}

void StagedKv::allocate() {
  const int64_t w = st_.shape.kv_hidden();
  int64_t ctx = 0, q = 0, rx = 0;
  for (const GpuBatch& g : st_.batches) {
    ctx = std::max(ctx, g.ctx_rows);
    q = std::max(q, g.q_rows);
    rx = std::max({rx, g.x_rows[0], g.x_rows[1]});
  }
  const DType dt = st_.opts.kv_dtype;
  for (int b = 0; b < 2; ++b) {
    st_.grow(kbuf_[b], dt, ctx, w);
    st_.grow(vbuf_[b], dt, ctx, w);
    if (st_.host->x_capacity() > 0) {
      st_.grow(xbuf_[b], dt, rx, st_.shape.hidden);
      st_.grow(xnew_[b], dt, q, st_.shape.hidden);
    }
  }
  if (rx <= 0) return;
  st_.grow(kv_recomputed_, st_.projector.kv_dtype_for(dt), 2 * rx, w);
  if (!st_.projector.needs_positions()) return;
  // Stored X starts at a sequence's first token: recomputed row j of a sequence is position j
  // (with kRopeLong where its sequence turns by longrope's long factors).
  const GpuBatch& last = st_.batches.back();
  const int64_t total = last.xpos_off[1] + last.x_rows[1];
  Tensor host = Tensor::host(DType::I32, {std::max<int64_t>(total, 1)});
  int32_t* p = host.data_as<int32_t>();
  for (int64_t g = 0; g < st_.groups(); ++g)
    for (int v = 0; v < 2; ++v)
      for (const auto& s : st_.seqs(g))
        for (int64_t j = 0; j < s.split[v]; ++j) *p++ = static_cast<int32_t>(j) | (s.long_rope ? kRopeLong : 0);
  st_.grow(xpos_, DType::I32, host.numel(), 1);
  st_.be.copy(xpos_.rows(0, host.numel()), host.reshape({host.numel(), 1}), Stream::Compute);
}

// The buffer must be free (its attention done, its rows stored) and this layer's stores from
// the previous step must have reached the host.
void StagedKv::wait_for_buffers(int64_t layer, int b) {
  Backend& be = st_.be;
  if (buf_free_[b].impl()) be.wait(Stream::H2D, buf_free_[b]);
  if (buf_stored_[b].impl()) be.wait(Stream::H2D, buf_stored_[b]);
  if (const Event& e = st_.store_done[static_cast<size_t>(layer)]; e.impl()) be.wait(Stream::H2D, e);
}

// A sliding layer's first key the sequence's step reads (its first query's window), below which
// nothing is copied; never above the first row auto promotes to its device tier this step (the
// tier takes copied rows only). 0 for a full layer.
int64_t StagedKv::first_read(int64_t layer, const SeqPlan& s) const {
  const int64_t w = st_.shape.window(layer);
  return w > 0 ? std::min(std::max<int64_t>(0, s.past + 1 - w), s.promote_from) : 0;
}

// The tokens of s whose K/V `layer` recomputes from X: the split, but none in a sliding layer's
// ring once its window has left the first token (the blocks of its X may have gone back to the
// pool; its K/V then come from the copied window alone).
int64_t StagedKv::split_at(int64_t layer, const SeqPlan& s) const {
  if (st_.layout.ring() && st_.shape.window(layer) > 0 && first_read(layer, s) > 0) return 0;
  return s.split[KvStep::variant(layer)];
}

// Whether no sequence of the group reads a row it would recompute: every split below its window
// (a sliding layer at long contexts). Then neither X[0:l] nor its recompute is needed.
bool StagedKv::head_unread(int64_t layer, int64_t group) const {
  if (st_.shape.window(layer) == 0) return false;
  for (const auto& s : st_.seqs(group))
    if (split_at(layer, s) > first_read(layer, s)) return false;
  return true;
}

// The GPU batch's X[0:l], then (copy_kv) its K[l:s'] and V[l:s']: one copy_spans each, of their
// runs of blocks (one 2-D copy per run index for a batch whose blocks were handed out together).
void StagedKv::copy_x(int64_t layer, int64_t group, int b, LayerTiming& t) {
  const int v = KvStep::variant(layer);
  if (head_unread(layer, group)) return;
  const int64_t es = static_cast<int64_t>(dtype_size(st_.opts.kv_dtype));
  RunSpans xs;
  for (const auto& s : st_.seqs(group))
    if (const int64_t l = split_at(layer, s); l > 0) {
      st_.x_runs(s, layer, 0, l,
                 [&](int64_t row, int64_t off, int64_t n, size_t k) { xs.add(k, RowSpan{row, s.x_off[v] + off, n}); });
      t.h2d_bytes += l * st_.shape.hidden * es;
    }
  if (!xs.empty()) st_.be.copy_spans(xbuf_[b], st_.host->x_rows(layer), xs.spans(), Stream::H2D, "X[0:l]");
}

void StagedKv::copy_kv(int64_t layer, int64_t group, int b, LayerTiming& t) {
  const int64_t es = static_cast<int64_t>(dtype_size(st_.opts.kv_dtype));
  RunSpans kvs;
  for (const auto& s : st_.seqs(group)) {
    const int64_t from = std::max(split_at(layer, s), first_read(layer, s)), n = s.staged_past() - from;
    if (n <= 0) continue;
    st_.kv_runs(s, layer, from, n,
                [&](int64_t row, int64_t off, int64_t c, size_t k) { kvs.add(k, RowSpan{row, s.ctx_off + from + off, c}); });
    t.h2d_bytes += 2 * n * st_.shape.kv_hidden() * es;
  }
  if (kvs.empty()) return;
  const std::vector<RowSpan> spans = kvs.spans();
  st_.be.copy_spans(kbuf_[b], st_.host->k_rows(layer), spans, Stream::H2D, "K[l:s']");
  st_.be.copy_spans(vbuf_[b], st_.host->v_rows(layer), spans, Stream::H2D, "V[l:s']");
}

void StagedKv::attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const AttentionParams& params) {
  const int b = static_cast<int>(st_.unit(layer, group) % 2);
  LayerTiming& t = st_.timing[static_cast<size_t>(st_.unit(layer, group))];
  // Rows of buffer b were last stored to the host two units ago; that must be done before
  // this unit writes them.
  if (buf_stored_[b].impl()) st_.wait_compute(buf_stored_[b], t);
  recompute_head(layer, group, b, t);
  const bool store_x = st_.host->x_capacity() > 0;  // (none in the modes that keep no X)
  join_new_rows(layer, group, b, k, v, t);
  if (store_x) st_.be.convert(xnew_[b].rows(0, st_.batches[static_cast<size_t>(group)].q_rows), x);
  st_.wait_compute(t.h2d_end, t);
  // Attention over buffer b's staged rows (and auto's resident ones); then auto's promotions.
  std::vector<AttentionSeq> seqs;
  for (const auto& s : st_.seqs(group)) seqs.push_back(staged_seq(layer, s, b));
  st_.be.attention(out, q, seqs, static_cast<int>(st_.shape.heads), params);
  promote(layer, group, b);
  buf_free_[b] = st_.be.record(Stream::Compute);
  store_new_rows(layer, group, b, store_x);
}

AttentionSeq StagedKv::staged_seq(int64_t layer, const SeqPlan& s, int b) const {
  (void)layer;
  const int64_t n = s.past + s.q_len;
  return AttentionSeq{s.q_begin, s.q_len, s.past, kbuf_[b].rows(s.ctx_off, n), vbuf_[b].rows(s.ctx_off, n)};
}

// Recomputes K/V[0:l] from X[0:l] as soon as X has arrived, while KV[l:s'] is still copying.
void StagedKv::recompute_head(int64_t layer, int64_t group, int b, LayerTiming& t) {
  const GpuBatch& gr = st_.batches[static_cast<size_t>(group)];
  const int var = KvStep::variant(layer);
  const int64_t rx = gr.x_rows[var];
  if (rx <= 0 || head_unread(layer, group)) return;
  st_.wait_compute(t.x_ready, t);
  t.recompute_start = st_.be.record(Stream::Compute);
  // Stored X goes into the GEMM as it is; K/V come out in the store's dtype where the model
  // projects them so (OPT, fp16: one GEMM with its bias, no fp32 pass), else in F32.
  const int64_t w = st_.shape.kv_hidden();
  Tensor kv = kv_recomputed_.rows(0, 2 * rx).reshape({2, rx, w});
  Tensor pos;
  if (st_.projector.needs_positions()) pos = xpos_.rows(gr.xpos_off[var], rx).reshape({rx});
  st_.be.set_trace_label(st_.unit_label(layer, group) + " recompute");
  st_.projector.project_kv(layer, xbuf_[b].rows(0, rx), kv, pos);
  st_.be.set_trace_label(st_.unit_label(layer, group));
  std::vector<RowSpan> spans;  // (rows of sequences this layer does not recompute are left out)
  for (const auto& s : st_.seqs(group))
    if (const int64_t l = split_at(layer, s); l > 0) spans.push_back(RowSpan{s.x_off[var], s.ctx_off, l});
  st_.be.copy_rows(kbuf_[b], kv.rows(0, 1).reshape({rx, w}), spans);
  st_.be.copy_rows(vbuf_[b], kv.rows(1, 1).reshape({rx, w}), spans);
  t.recompute_end = st_.be.record(Stream::Compute);
}

// This step's new K/V join buffer b after the past ones (and auto's resident tails).
void StagedKv::join_new_rows(int64_t layer, int64_t group, int b, const Tensor& k, const Tensor& v, LayerTiming& t) {
  std::vector<RowSpan> fresh;
  for (const auto& s : st_.seqs(group))
    if (const int64_t staged_new = s.staged_new(); staged_new > 0)
      fresh.push_back(RowSpan{s.q_begin, s.ctx_off + s.past, staged_new});
  st_.be.copy_rows(kbuf_[b], k, fresh);
  st_.be.copy_rows(vbuf_[b], v, fresh);
  write_tier_rows(layer, group, k, v, t);
}

// Stores the step's new K, V (and X below the cap) to the host on the D2H stream, once buffer b
// is free: one gathered store per tensor for the whole GPU batch.
void StagedKv::store_new_rows(int64_t layer, int64_t group, int b, bool store_x) {
  Backend& be = st_.be;
  HostKvStore& host = *st_.host;
  be.wait(Stream::D2H, buf_free_[b]);
  const int64_t es = static_cast<int64_t>(dtype_size(st_.opts.kv_dtype));
  RunSpans new_kv, new_x;
  for (const auto& s : st_.seqs(group)) {
    st_.kv_runs(s, layer, s.past, s.staged_new(), [&](int64_t row, int64_t off, int64_t n, size_t run) {
      new_kv.add(run, RowSpan{s.ctx_off + s.past + off, row, n});
    });
    st_.stats.d2h_bytes += 2 * s.q_len * st_.shape.kv_hidden() * es;  // (auto's tier rows included)
    const int64_t nx = store_x ? std::min(s.q_len, host.x_capacity() - s.past) : 0;
    if (nx > 0) {
      st_.x_runs(s, layer, s.past, nx,
                 [&](int64_t row, int64_t off, int64_t n, size_t run) { new_x.add(run, RowSpan{s.q_begin + off, row, n}); });
      st_.stats.d2h_bytes += nx * st_.shape.hidden * es;
    }
  }
  const std::vector<RowSpan> kvs = new_kv.spans();
  be.copy_spans(host.k_rows(layer), kbuf_[b], kvs, Stream::D2H, "K new");
  be.copy_spans(host.v_rows(layer), vbuf_[b], kvs, Stream::D2H, "V new");
  store_tier_rows(layer, group);
  if (!new_x.empty()) be.copy_spans(host.x_rows(layer), xnew_[b], new_x.spans(), Stream::D2H, "X new");
  buf_stored_[b] = be.record(Stream::D2H);
  st_.store_done[static_cast<size_t>(layer)] = buf_stored_[b];
  stored(layer, buf_stored_[b]);
}

}  // namespace kvpr
