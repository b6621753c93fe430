// What every KV mode works with during a step (kv_runtime.h drives it, kv_modes.h are the
// modes): the runtime's fixed parts (backend, shape, the host store, the split scheduler), the
// step's plan (each sequence's blocks and rows, the GPU batches), the units' timing and the
// step's statistics, and the helpers over them. Not thread-safe, as the runtime.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_options.h"
#include "engine/kv/split_scheduler.h"
#include "engine/kv/weight_stream.h"

namespace kvpr {

// The model's K/V projection, used to recompute K/V[0:l] from X.
class KvProjector {
 public:
  virtual ~KvProjector() = default;
  // x [n, hidden] (the post-norm layer input, F32 or as the KV store holds it) -> kv [2, n,
  // kv_hidden]: K, then V, in kv_dtype_for(the store's dtype). positions (I32 [n], device
  // memory) holds each row's position in its sequence when needs_positions() (rotary models
  // turn K by it); else it is undefined.
  virtual void project_kv(int64_t layer, const Tensor& x, const Tensor& kv, const Tensor& positions) = 0;
  virtual bool needs_positions() const { return false; }
  // The dtype project_kv writes K/V in when the store holds `storage`: `storage` itself when
  // the projection's GEMM can write it directly (one GEMM from stored X to stored K/V, the
  // bias fused), else F32 (K is normalized or turned in fp32 first).
  virtual DType kv_dtype_for(DType storage) const {
    (void)storage;
    return DType::F32;
  }
};

// What one step did: the split and the bytes that crossed the link.
struct StepStats {
  std::vector<int64_t> split;  // l of each chunk for layers 1.. (0 where nothing was recomputed)
  int64_t split_total = 0;
  // Layer 0's copies have no earlier layer to hide behind, so the scheduler chooses its split
  // with the paper's model; the other layers use the pipeline model.
  int64_t split_total_layer0 = 0;
  std::string split_source;    // "scheduler:pipeline", "scheduler:paper", "forced", "all", "none"
  double predicted_layer_ms = 0;
  int64_t h2d_bytes = 0;       // all layers (streamed weights included)
  int64_t d2h_bytes = 0;
  int64_t weight_h2d_bytes = 0;  // of h2d_bytes: streamed layer weights
  // auto: cached tokens attention read in place on the device, and those staged (recomputed or
  // copied); blocks promoted to the device tier from staged rows.
  int64_t resident_tokens = 0, staged_tokens = 0, promoted_blocks = 0;
  double link_gbps_estimate = 0;
};

// One sequence of the step.
struct SeqPlan {
  std::span<const int32_t> table;  // its blocks
  int64_t past, q_len, q_begin;    // q_begin: first row among its group's tokens
  int64_t ctx_off;                 // first row in the per-step K/V buffers
  // Tokens [0, head) are staged in the per-step buffers; auto reads [head, past + q_len) in
  // place, through dev_table (device blocks), and writes its new rows there.
  int64_t head;
  std::span<const int32_t> dev_table;
  // Its first staged token that is promoted to the device tier this step (head when none):
  // the tier takes copied rows only, never recomputed ones, so that it mirrors the host exactly.
  int64_t promote_from;
  int64_t staged_past() const { return std::min(past, head); }
  int64_t staged_new() const { return std::clamp<int64_t>(head - past, 0, q_len); }  // new rows below head
  int64_t split[2];  // l for layer 0 and for the other layers
  int64_t x_off[2];  // first row in the X buffer, likewise
  bool long_rope;    // its recomputed keys turn by the long factors (ForwardChunk::long_rope)
  std::span<const int32_t> window_table;  // its blocks in the sliding layers' ring (KvLayout::ring)
};

// A GPU batch: plan[first, last), its tokens' rows, and its buffer extents.
struct GpuBatch {
  size_t first = 0, last = 0;
  int64_t q_begin = 0, q_rows = 0, ctx_rows = 0;
  int64_t x_rows[2] = {0, 0};    // X rows recomputed for layer 0 and for the others
  int64_t xpos_off[2] = {0, 0};  // where their positions start in the positions buffer
};

// A unit's (a layer of a GPU batch) copies and compute, as events.
struct LayerTiming {
  // h2d_end: the layer's KV has arrived; link_end: its weights too.
  Event h2d_start, x_ready, h2d_end, link_end, compute_start, compute_end, recompute_start, recompute_end;
  // The compute stream's waits for copies, as events around each wait: on a GPU the stream,
  // not the host, waits, so the layer's device time includes them; they are not device work.
  std::vector<std::pair<Event, Event>> stalls;
  int64_t h2d_bytes = 0;
};

// The spans of a batch's runs ordered by run index: every sequence's first run, then every
// second run, ... Sequences whose blocks were handed out together (a batch admitted at once,
// growing in step) then make each run index one strided 2-D copy, as the contiguous layout's
// batch was (Backend::copy_spans); the rest goes as one batched copy.
struct RunSpans {
  std::vector<std::vector<RowSpan>> by_run;
  void add(size_t run, const RowSpan& s) {
    if (by_run.size() <= run) by_run.resize(run + 1);
    by_run[run].push_back(s);
  }
  std::vector<RowSpan> spans() const {
    std::vector<RowSpan> out;
    for (const auto& v : by_run) out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  bool empty() const { return by_run.empty(); }
};

struct KvStep {
  KvStep(Backend& backend, const KvShape& kv_shape, KvProjector& kv_projector, const KvLayout& kv_layout,
         const KvRuntimeOptions& options, LayerWeightStream* layer_weights)
      : be(backend), shape(kv_shape), projector(kv_projector), layout(kv_layout), opts(options), weights(layer_weights) {}

  Backend& be;
  const KvShape shape;
  KvProjector& projector;
  const KvLayout layout;
  KvRuntimeOptions opts;
  LayerWeightStream* weights;                 // streamed layer weights, driven with the KV (or none)
  std::unique_ptr<HostKvStore> host;          // the host modes' store
  std::unique_ptr<SplitScheduler> scheduler;  // kvpr and auto without a forced split
  std::vector<Event> store_done;              // per layer: the last store to the host finished

  // Per step.
  std::vector<SeqPlan> plan;
  std::vector<GpuBatch> batches;
  std::vector<LayerTiming> timing;  // per unit (layer, batch)
  StepStats stats;

  int64_t groups() const { return static_cast<int64_t>(batches.size()); }
  std::span<SeqPlan> seqs(int64_t group) {
    return {plan.data() + batches[static_cast<size_t>(group)].first, plan.data() + batches[static_cast<size_t>(group)].last};
  }
  int64_t unit(int64_t layer, int64_t group) const { return layer * groups() + group; }
  static int variant(int64_t layer) { return layer == 0 ? 0 : 1; }
  // "L<layer>" and ".<group>" with several GPU batches: the trace's name of a unit's work.
  std::string unit_label(int64_t layer, int64_t group) const;
  int64_t x_avail(const SeqPlan& s) const;  // cached tokens of s whose X is stored
  // buf, grown (by half again) to at least rows x width of dtype.
  Tensor grow(Tensor& buf, DType dtype, int64_t rows, int64_t width);
  // Runs `wait` (which makes the compute stream wait) between two compute-stream events.
  template <typename F>
  void stall(LayerTiming& t, F&& wait) {
    Event before = be.record(Stream::Compute);
    wait();
    t.stalls.emplace_back(std::move(before), be.record(Stream::Compute));
  }
  void wait_compute(const Event& e, LayerTiming& t);
  // A sequence's blocks in `layer`'s store: its ring's for a sliding layer (KvLayout::ring).
  std::span<const int32_t> table(const SeqPlan& s, int64_t layer) const {
    return layout.ring() && shape.window(layer) > 0 ? s.window_table : s.table;
  }
  // Runs of a sequence's tokens [first, first + count) in `layer`'s K/V store rows, or X's:
  // f(row, token offset, n, run index).
  template <typename F>
  void kv_runs(const SeqPlan& s, int64_t layer, int64_t first, int64_t count, F&& f) const {
    size_t k = 0;
    for_each_run(table(s, layer), layout.block_tokens, layout.block_tokens, first, count,
                 [&](int64_t row, int64_t off, int64_t n) { f(row, off, n, k++); });
  }
  template <typename F>
  void x_runs(const SeqPlan& s, int64_t layer, int64_t first, int64_t count, F&& f) const {
    size_t k = 0;
    for_each_run(table(s, layer), layout.block_tokens, host->x_block_rows(), first, count,
                 [&](int64_t row, int64_t off, int64_t n) { f(row, off, n, k++); });
  }
  // A sequence's attention over `layer`'s block store's K and V rows (resident, or the host's for
  // cpu-attn).
  AttentionSeq in_place(const SeqPlan& s, int64_t layer, const Tensor& k, const Tensor& v) const;
};

}  // namespace kvpr
