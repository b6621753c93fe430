// auto: kvpr's host store and staging, and a device tier of blocks mirroring host blocks within
// a GPU budget (docs/kv-modes.md "Auto").
#include "engine/base/error.h"
#include "engine/kv/kv_modes.h"

namespace kvpr {

AutoKv::AutoKv(KvStep& st, int64_t device_blocks)
    : KvprKv(st), cache_(device_blocks, st.layout.blocks, st.layout.block_tokens) {
  tier_read_.resize(static_cast<size_t>(st.shape.layers));
  if (device_blocks > 0)
    for (int64_t l = 0; l < st.shape.layers; ++l) {
      k_.push_back(st.be.alloc(st.opts.kv_dtype, {device_blocks * st.layout.block_tokens, st.shape.kv_hidden()}));
      v_.push_back(st.be.alloc(st.opts.kv_dtype, {device_blocks * st.layout.block_tokens, st.shape.kv_hidden()}));
    }
}

// A step that failed part way left the tier's mirrors unknown: they go (the host store has
// every token).
void AutoKv::drop_unfinished_step() {
  st_.be.synchronize();  // nothing of it may still read or write the tier
  cache_.clear();
}

// The tier's plan for the step (which tails it reads in place, which blocks it promotes), and
// the staged rows that leaves; then kvpr's splits for the staged rest.
void AutoKv::plan_step() {
  // A ring's sliding layers hold (and the step stages) the blocks from their first query's widest
  // window: the tier promotes none below it (a mirror holds every layer's rows).
  const KvLayout& L = st_.layout;
  std::vector<DeviceBlockCache::Seq> seqs;
  for (const SeqPlan& s : st_.plan)
    seqs.push_back({s.table, s.past, s.q_len,
                    L.ring() ? std::max<int64_t>(0, s.past + 1 - L.window_tokens) / L.block_tokens : 0});
  cache_.plan(seqs, &placement_, &promotions_);
  StepStats& stats = st_.stats;
  stats.resident_tokens = stats.staged_tokens = 0;
  stats.promoted_blocks = static_cast<int64_t>(promotions_.size());
  for (GpuBatch& g : st_.batches) {
    g.ctx_rows = 0;
    for (size_t i = g.first; i < g.last; ++i) {
      SeqPlan& s = st_.plan[i];
      s.head = placement_[i].head;
      s.dev_table = placement_[i].table;
      s.promote_from = s.head;
      s.ctx_off = g.ctx_rows;
      g.ctx_rows += s.head;
      stats.staged_tokens += s.staged_past();
      stats.resident_tokens += s.past - s.staged_past();
    }
  }
  for (const auto& pr : promotions_)
    st_.plan[pr.seq].promote_from = std::min(st_.plan[pr.seq].promote_from, pr.index * st_.layout.block_tokens);
  KvprKv::plan_step();
}

// The new rows past each sequence's staged head, in place in the tier.
void AutoKv::write_tier_rows(int64_t layer, int64_t group, const Tensor& k, const Tensor& v, LayerTiming& t) {
  const int64_t B = st_.layout.block_tokens;
  std::vector<RowSpan> fresh;
  for (const auto& s : st_.seqs(group)) {
    const int64_t staged_new = s.staged_new();
    for_each_run(s.dev_table, B, B, s.past + staged_new, s.q_len - staged_new,
                 [&](int64_t row, int64_t off, int64_t n) { fresh.push_back(RowSpan{s.q_begin + staged_new + off, row, n}); });
  }
  // The tier's rows the last step stored to the host from must have been read before this step
  // writes there (a block may mirror another host block now).
  if (!fresh.empty() || !promotions_.empty()) st_.wait_compute(tier_read_[static_cast<size_t>(layer)], t);
  if (fresh.empty()) return;
  st_.be.copy_rows(k_[static_cast<size_t>(layer)], k, fresh);
  st_.be.copy_rows(v_[static_cast<size_t>(layer)], v, fresh);
}

// The resident tail in place, through the device table; the staged head before it.
AttentionSeq AutoKv::staged_seq(int64_t layer, const SeqPlan& s, int b) const {
  const int64_t n = s.past + s.q_len;
  if (s.head == n) return StagedKv::staged_seq(layer, s, b);  // all staged
  const auto l = static_cast<size_t>(layer);
  AttentionSeq a{s.q_begin, s.q_len, s.past, k_[l], v_[l], s.dev_table.data(), st_.layout.blocks_for(n), st_.layout.block_tokens};
  if (s.head > 0) a = a.with_head(kbuf_[b].rows(s.ctx_off, s.head), vbuf_[b].rows(s.ctx_off, s.head), s.head);
  return a;
}

// Staged blocks the tier took this step, from the rows staged for attention.
void AutoKv::promote(int64_t layer, int64_t group, int b) {
  const int64_t B = st_.layout.block_tokens;
  const GpuBatch& gr = st_.batches[static_cast<size_t>(group)];
  std::vector<RowSpan> promoted;
  for (const auto& pr : promotions_)
    if (pr.seq >= gr.first && pr.seq < gr.last)
      promoted.push_back(RowSpan{st_.plan[pr.seq].ctx_off + pr.index * B, int64_t{pr.device} * B, pr.rows});
  if (promoted.empty()) return;
  st_.be.copy_rows(k_[static_cast<size_t>(layer)], kbuf_[b], promoted);
  st_.be.copy_rows(v_[static_cast<size_t>(layer)], vbuf_[b], promoted);
}

void AutoKv::store_tier_rows(int64_t layer, int64_t group) {
  const int64_t B = st_.layout.block_tokens;
  std::vector<RowSpan> spans;
  for (const auto& s : st_.seqs(group)) {
    const std::span<const int32_t> host = st_.table(s, layer);  // (a sliding layer's ring)
    for (int64_t t0 = s.past + s.staged_new(); t0 < s.past + s.q_len;) {
      // Block by block: the device and host tables differ.
      const int64_t j = t0 / B, r = t0 % B, n = std::min(B - r, s.past + s.q_len - t0);
      spans.push_back(RowSpan{int64_t{s.dev_table[static_cast<size_t>(j)]} * B + r, int64_t{host[static_cast<size_t>(j)]} * B + r, n});
      t0 += n;
    }
  }
  if (spans.empty()) return;
  st_.be.copy_spans(st_.host->k_rows(layer), k_[static_cast<size_t>(layer)], spans, Stream::D2H, "K new");
  st_.be.copy_spans(st_.host->v_rows(layer), v_[static_cast<size_t>(layer)], spans, Stream::D2H, "V new");
}

// D2H in order: this store covers the earlier batches' too.
void AutoKv::stored(int64_t layer, const Event& e) { tier_read_[static_cast<size_t>(layer)] = e; }

}  // namespace kvpr
