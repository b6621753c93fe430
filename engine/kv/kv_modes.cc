#include "engine/kv/kv_modes.h"

#include <thread>

#include "engine/backend/cpu/attention.h"
#include "engine/base/error.h"
#include "engine/kv/kv_runtime.h"

namespace kvpr {

std::unique_ptr<KvModeRuntime> make_kv_mode(KvStep& st) {
  const KvMode m = st.opts.mode;
  if (m == KvMode::Resident) return std::make_unique<ResidentKv>(st);
  st.host = std::make_unique<HostKvStore>(st.be, st.shape, st.layout, st.opts.kv_dtype,
                                          KvRuntime::x_capacity(st.shape, st.layout.max_tokens, st.opts));
  st.store_done.resize(static_cast<size_t>(st.shape.layers));
  switch (m) {
    case KvMode::Offload: return std::make_unique<OffloadKv>(st);
    case KvMode::Kvpr: return std::make_unique<KvprKv>(st);
    case KvMode::Recompute: return std::make_unique<RecomputeKv>(st);
    case KvMode::CpuAttn: return std::make_unique<CpuAttnKv>(st);
    case KvMode::Auto:
      return std::make_unique<AutoKv>(st, KvRuntime::device_tier_blocks(st.be, st.shape, st.layout, st.opts));
    case KvMode::Resident: break;
  }
  KVPR_THROW("no KV mode ", static_cast<int>(m));
}

// ------------------------------------------------------------------ resident

ResidentKv::ResidentKv(KvStep& st) : KvModeRuntime(st) {
  for (int64_t l = 0; l < st.shape.layers; ++l) {
    k_.push_back(st.be.alloc(st.opts.kv_dtype, {st.layout.blocks * st.layout.block_tokens, st.shape.kv_hidden()}));
    v_.push_back(st.be.alloc(st.opts.kv_dtype, {st.layout.blocks * st.layout.block_tokens, st.shape.kv_hidden()}));
  }
}

void ResidentKv::attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const AttentionParams& params) {
  (void)x;
  // The new rows of every sequence into its blocks: one op for K, one for V.
  std::vector<RowSpan> spans;
  for (const auto& s : st_.seqs(group))
    st_.kv_runs(s, layer, s.past, s.q_len,
                [&](int64_t row, int64_t off, int64_t n, size_t) { spans.push_back(RowSpan{s.q_begin + off, row, n}); });
  st_.be.copy_rows(k_[static_cast<size_t>(layer)], k, spans);
  st_.be.copy_rows(v_[static_cast<size_t>(layer)], v, spans);
  // Attention reads the blocks in place: through the table, or a contiguous view of a
  // sequence's one block (the contiguous layout, and the attention kernels' fastest path).
  std::vector<AttentionSeq> seqs;
  for (const auto& s : st_.seqs(group))
    seqs.push_back(st_.in_place(s, layer, k_[static_cast<size_t>(layer)], v_[static_cast<size_t>(layer)]));
  st_.be.attention(out, q, seqs, static_cast<int>(st_.shape.heads), params);
}

// ------------------------------------------------------------------ cpu-attn

CpuAttnKv::CpuAttnKv(KvStep& st) : KvModeRuntime(st) {
  const int threads = st.opts.host_attention_threads > 0 ? st.opts.host_attention_threads
                                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  pool_ = std::make_unique<ThreadPool>(threads);
}

void CpuAttnKv::set_host_attention_threads(int threads) {
  KVPR_CHECK(threads > 0, "host attention needs at least one thread");
  st_.be.synchronize();  // no host attention queued on the old pool
  st_.opts.host_attention_threads = threads;
  pool_ = std::make_unique<ThreadPool>(threads);
}

void CpuAttnKv::plan_step() {
  StepStats& stats = st_.stats;  // nothing is recomputed
  stats.split_source = "none";
  stats.predicted_layer_ms = 0;
  stats.split.assign(st_.plan.size(), 0);
  stats.split_total = stats.split_total_layer0 = 0;
  int64_t q = 0;
  for (const GpuBatch& g : st_.batches) q = std::max(q, g.q_rows);
  const int64_t w = st_.shape.kv_hidden();
  st_.grow(knew_, st_.opts.kv_dtype, q, w);
  st_.grow(vnew_, st_.opts.kv_dtype, q, w);
  if (!host_q_.defined() || host_q_.dim(0) < q) {
    host_q_ = st_.be.alloc_pinned(DType::F32, {std::max<int64_t>(q, 1), st_.shape.q_width()});
    host_out_ = st_.be.alloc_pinned(DType::F32, {std::max<int64_t>(q, 1), st_.shape.q_width()});
  }
}

void CpuAttnKv::attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, const AttentionParams& params) {
  (void)x;
  Backend& be = st_.be;
  LayerTiming& t = st_.timing[static_cast<size_t>(st_.unit(layer, group))];
  const int64_t T = st_.batches[static_cast<size_t>(group)].q_rows;
  // New K/V in storage dtype, then Q and them down to the host.
  be.convert(knew_.rows(0, T), k);
  be.convert(vnew_.rows(0, T), v);
  Event ready = be.record(Stream::Compute);
  be.wait(Stream::D2H, ready);
  be.copy(host_q_.rows(0, T), q, Stream::D2H, "Q");
  st_.stats.d2h_bytes += static_cast<int64_t>(q.nbytes());
  AttentionParams host_params = params;  // the layer's sink logits (gpt-oss) read on the host
  if (params.sinks.defined()) {
    if (!host_sinks_.defined() || host_sinks_.numel() != params.sinks.numel())
      host_sinks_ = be.alloc_pinned(DType::F32, params.sinks.shape());
    be.copy(host_sinks_, params.sinks, Stream::D2H, "sinks");
    host_params.sinks = host_sinks_;
  }
  RunSpans runs;
  for (const auto& s : st_.seqs(group)) {
    st_.kv_runs(s, layer, s.past, s.q_len,
                [&](int64_t row, int64_t off, int64_t n, size_t run) { runs.add(run, RowSpan{s.q_begin + off, row, n}); });
    st_.stats.d2h_bytes += 2 * s.q_len * st_.shape.kv_hidden() * static_cast<int64_t>(dtype_size(st_.opts.kv_dtype));
  }
  HostKvStore& host = *st_.host;
  const std::vector<RowSpan> kvs = runs.spans();
  be.copy_spans(host.k_rows(layer), knew_, kvs, Stream::D2H, "K new");
  be.copy_spans(host.v_rows(layer), vnew_, kvs, Stream::D2H, "V new");
  Event down = be.record(Stream::D2H);
  be.synchronize(down);
  // Attention on host threads over the host store.
  std::vector<AttentionSeq> seqs;
  for (const auto& s : st_.seqs(group)) seqs.push_back(st_.in_place(s, layer, host.k_rows(layer), host.v_rows(layer)));
  Tracer* tr = be.tracer();
  double a0 = tr ? tr->now_us() : 0;
  cpu_attention(host_out_.rows(0, T), host_q_.rows(0, T), seqs, static_cast<int>(st_.shape.heads), host_params, *pool_);
  if (tr) tr->span("host-attention", "L" + std::to_string(layer) + " attention", a0, tr->now_us());
  be.copy(out, host_out_.rows(0, T), Stream::H2D, "attention out");
  st_.stats.h2d_bytes += static_cast<int64_t>(out.nbytes());
  st_.wait_compute(be.record(Stream::H2D), t);
  st_.store_done[static_cast<size_t>(layer)] = down;
}

}  // namespace kvpr
