#include "engine/kv/kv_step.h"

namespace kvpr {

std::string KvStep::unit_label(int64_t layer, int64_t group) const {
  return "L" + std::to_string(layer) + (groups() > 1 ? "." + std::to_string(group) : "");
}

int64_t KvStep::x_avail(const SeqPlan& s) const {
  return host ? std::min({s.staged_past(), s.promote_from, host->x_capacity()}) : 0;
}

Tensor KvStep::grow(Tensor& buf, DType dtype, int64_t rows, int64_t width) {
  rows = std::max<int64_t>(rows, 1);
  if (!buf.defined() || buf.dim(0) < rows || buf.dtype() != dtype || buf.dim(1) != width)
    buf = be.alloc(dtype, {std::max(rows, buf.defined() ? buf.dim(0) * 3 / 2 : 0), width});
  return buf;
}

void KvStep::wait_compute(const Event& e, LayerTiming& t) {
  if (!e.impl()) return;
  stall(t, [&] { be.wait(Stream::Compute, e); });
}

AttentionSeq KvStep::in_place(const SeqPlan& s, int64_t layer, const Tensor& k, const Tensor& v) const {
  const int64_t bt = layout.block_tokens, n = s.past + s.q_len;
  const std::span<const int32_t> t = table(s, layer);
  if (layout.blocks_for(n) <= 1)  // one block: its rows are the sequence's, in order
    return AttentionSeq{s.q_begin, s.q_len, s.past, k.rows(int64_t{t[0]} * bt, bt), v.rows(int64_t{t[0]} * bt, bt)};
  return AttentionSeq{s.q_begin, s.q_len, s.past, k, v, t.data(), layout.blocks_for(n), bt};
}

}  // namespace kvpr
