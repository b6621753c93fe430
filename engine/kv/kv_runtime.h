// The KV runtime: where each layer's past K/V come from at every step, written once against
// the Backend so the CPU backend verifies it and the CUDA backend runs it (docs/design.md §2-3).
//
//   resident   K/V stay in device memory                         (upper bound when KV fits)
//   offload    K/V in host memory; all of KV[0:s'] copied per layer, next layer prefetched
//   kvpr       X[0:l] copied first and K/V[0:l] recomputed on the device while KV[l:s'] is
//              copied; both land in one buffer so attention sees contiguous K/V
//   recompute  l = every cached token with stored X
//   cpu-attn   Q goes to the host, host threads attend over the host KV, the output comes back
//   auto       kvpr's host store, and a device tier of blocks mirroring host blocks within a GPU
//              budget: each sequence's tail is read and written in place on the device, its
//              head recomputed or copied as kvpr does (docs/kv-modes.md "Auto")
//
// Device memory for past K/V is two per-step buffers (layer i and i+1), whatever the number
// of sequences. New K, V (and X below the activation cap) are stored back on the D2H stream.
// The store, host or resident, is cut into blocks (KvLayout): a sequence's tokens are found
// through its block table; copies move runs of adjacent blocks, attention over resident KV reads
// through the tables in place.
// Not thread-safe: one thread drives a runtime.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/base/error.h"
#include "engine/kv/device_block_cache.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_options.h"
#include "engine/kv/split_scheduler.h"
#include "engine/base/thread_pool.h"
#include "engine/kv/weight_stream.h"

namespace kvpr {

// One sequence's part of a forward call: `tokens` at positions past_len.. . Its KV lives in the
// blocks `blocks` lists (at least blocks_for(past_len + count) of them, kept by the caller until
// the step ends), or, without a table, in block `slot` alone (the contiguous layout).
struct ForwardChunk {
  const int32_t* tokens = nullptr;
  int64_t count = 0;
  int64_t past_len = 0;
  int64_t slot = 0;
  std::span<const int32_t> blocks = {};
  bool all_rows = false;  // logits for every token of the chunk (else only its last)
};

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


// A KV cache known before the model that holds it is loaded (Generator::kv_plan): the store's
// blocks in kv's mode and dtype. Loading a model with one (ModelLoadOptions::kv_plan) refuses a
// plan past host memory before allocating anything.
struct KvPlan {
  KvLayout layout;
  KvRuntimeOptions kv;
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

class KvRuntime {
 public:
  // With `weights`, the layers' weights are streamed too: each layer's copies go on the H2D
  // stream with its KV (weights front, X[0:l], KV[l:s'], weights back), a layer ahead.
  KvRuntime(Backend& backend, const KvShape& shape, KvProjector& projector, const KvLayout& layout,
            const KvRuntimeOptions& opts, LayerWeightStream* weights = nullptr);
  ~KvRuntime();

  KvMode mode() const { return opts_.mode; }
  const KvLayout& layout() const { return layout_; }
  DType kv_dtype() const { return opts_.kv_dtype; }
  const HostKvStore* host_store() const { return host_.get(); }
  // auto: the device tier's bookkeeping (null in the other modes) and its bytes, allocated and
  // holding mirrors now.
  const DeviceBlockCache* device_tier() const { return cache_.get(); }
  double device_tier_bytes() const;
  double device_tier_used_bytes() const;
  // Device bytes of one block of the device tier: K and V of every layer.
  static double device_block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
  // auto: the device blocks the budget buys on `backend` now (weights loaded).
  static int64_t device_tier_blocks(Backend& backend, const KvShape& shape, const KvLayout& layout,
                                    const KvRuntimeOptions& opts);
  SplitScheduler* scheduler() { return scheduler_.get(); }
  const StepStats& last_step() const { return stats_; }
  // Host bytes per token of a sequence in this runtime's mode (K, V and X where stored).
  int64_t host_bytes_per_token() const;
  // cpu-attn: the host attention on `threads` threads from now on (a worker moved to another
  // cpuset between steps); a no-op in the other modes.
  void set_host_attention_threads(int threads);
  // Throws a one-line error naming the sizes when the KV cache of `layout` (on the device for
  // resident, else in pinned host memory) exceeds what is free there.
  static void check_fits(Backend& backend, const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
  // Bytes of the KV cache of `layout`, allocated whole: K and V of every layer, and X where the
  // mode keeps it.
  static double store_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
  // Bytes of one block (store_bytes of a one-block layout).
  static double block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
  // Of them, what lands in host memory: all in the modes that keep KV on the host, and on a
  // backend whose device is the host; none for resident KV on a GPU.
  static double host_store_bytes(const Backend& backend, const KvShape& shape, const KvPlan& plan);
  // "the KV cache of S sequences x T tokens (kv mode M)", or of N blocks of B tokens: what the
  // refusals name.
  static std::string describe(const KvLayout& layout, const KvRuntimeOptions& opts);
  // Host bytes per token a runtime of `mode` takes by default (no forced split): K and V, and X
  // for recompute, and for kvpr where recomputing from X can pay (X smaller than K+V: not with
  // grouped-query attention, where kvpr stores no X and moves the KV as offload does).
  static int64_t host_bytes_per_token(KvMode mode, const KvShape& shape, DType dtype);
  // Tokens of X each sequence keeps: activation_cap (all when negative) where X is kept, else 0.
  static int64_t x_capacity(const KvShape& shape, int64_t capacity, const KvRuntimeOptions& opts);

  // The model's forward calls these, in order: begin, then per layer and per GPU batch
  // (groups(), of consecutive chunks: rows group_rows(g) of the step's tokens) prepare and
  // attend, then end.
  void begin(const std::vector<ForwardChunk>& chunks);
  struct Rows {
    int64_t begin = 0, count = 0;
  };
  int64_t groups() const { return static_cast<int64_t>(groups_.size()); }
  Rows group_rows(int64_t group) const;
  void prepare(int64_t layer, int64_t group);
  // Of the group's tokens: x, the layer's post-norm input [n, hidden] F32; q [n, hidden], k and
  // v [n, kv_hidden] F32; out: [n, hidden] F32 attention output.
  void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& out, float scale);
  void end();

 private:
  struct SeqPlan {
    std::span<const int32_t> table;      // its blocks
    int64_t past, q_len, q_begin;  // q_begin: first row among its group's tokens
    int64_t ctx_off;   // first row in the per-step K/V buffers
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
  };
  // A GPU batch: plan_[first, last), its tokens' rows, and its buffer extents.
  struct Group {
    size_t first = 0, last = 0;
    int64_t q_begin = 0, q_rows = 0, ctx_rows = 0;
    int64_t x_rows[2] = {0, 0};    // X rows recomputed for layer 0 and for the others
    int64_t xpos_off[2] = {0, 0};  // where their positions start in xpos_
  };
  static int variant(int64_t layer) { return layer == 0 ? 0 : 1; }
  std::span<SeqPlan> seqs(int64_t group) { return {plan_.data() + groups_[group].first, plan_.data() + groups_[group].last}; }
  int64_t unit(int64_t layer, int64_t group) const { return layer * groups() + group; }
  int64_t x_avail(const SeqPlan& s) const;  // cached tokens of s whose X is stored
  std::vector<int64_t> distribute(std::span<const SeqPlan> seqs, int64_t total, int64_t cached) const;
  struct LayerTiming {
    // h2d_end: the layer's KV has arrived; link_end: its weights too.
    Event h2d_start, x_ready, h2d_end, link_end, compute_start, compute_end, recompute_start, recompute_end;
    // The compute stream's waits for copies, as events around each wait: on a GPU the stream,
    // not the host, waits, so the layer's device time includes them; they are not device work.
    std::vector<std::pair<Event, Event>> stalls;
    int64_t h2d_bytes = 0;
  };
  void decide_splits();
  void place_on_device();  // auto: the device tier's plan for the step, and the staged rows
  void allocate_step();  // splits and buffers of a step that moves KV
  void prefetch(int64_t u);       // the copies of unit u = layer * groups() + group
  void prefetch_next(int64_t u);  // unit u + 1's copies, or after the last one the next step's weights
  void issue_weights(int64_t layer);  // all of a layer's weights, ahead of its first unit
  // "L<layer>" and ".<group>" with several GPU batches: the trace's name of a unit's work.
  std::string unit_label(int64_t layer, int64_t group) const;
  void wait_compute(const Event& e, LayerTiming& t);
  // Runs `wait` (which makes the compute stream wait) between two compute-stream events.
  template <typename F>
  void stall(LayerTiming& t, F&& wait);
  Tensor grow(Tensor& buf, DType dtype, int64_t rows, int64_t width);
  // A sequence's attention over a block store's K and V rows (resident, or the host's for cpu-attn).
  AttentionSeq resident_seq(const SeqPlan& s, const Tensor& k, const Tensor& v) const;
  void attend_resident(int64_t layer, int64_t group, const Tensor& k, const Tensor& v, const Tensor& q,
                       const Tensor& out, float scale);
  void attend_offloaded(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, float scale);
  // attend_offloaded's parts, on buffer b (unit u % 2) of GPU batch `group`:
  void recompute_head(int64_t layer, int64_t group, int b, LayerTiming& t);
  void join_new_rows(int64_t layer, int64_t group, int b, const Tensor& k, const Tensor& v, LayerTiming& t);
  void attend_staged(int64_t layer, int64_t group, int b, const Tensor& q, const Tensor& out, float scale);
  void store_new_rows(int64_t layer, int64_t group, int b, bool store_x);
  void attend_cpu(int64_t layer, int64_t group, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, float scale);

  Backend& be_;
  KvShape shape_;
  KvProjector& projector_;
  KvLayout layout_;
  KvRuntimeOptions opts_;
  LayerWeightStream* weights_;
  std::unique_ptr<HostKvStore> host_;
  std::vector<Tensor> dev_k_, dev_v_;  // [blocks * block_tokens, width] per layer: resident's, auto's tier
  std::unique_ptr<DeviceBlockCache> cache_;  // auto
  std::vector<DeviceBlockCache::Placement> placement_;
  std::vector<DeviceBlockCache::Promotion> promotions_;
  std::vector<Event> tier_read_;  // auto, per layer: the last step's stores from the device tier
  bool step_open_ = false;        // begin() without end(): a step failed part way
  std::unique_ptr<SplitScheduler> scheduler_;
  std::unique_ptr<ThreadPool> host_pool_;

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
  // Runs of a sequence's tokens [first, first + count) in the K/V store's rows, or X's:
  // f(row, token offset, n, run index).
  template <typename F>
  void kv_runs(const SeqPlan& s, int64_t first, int64_t count, F&& f) const {
    size_t k = 0;
    for_each_run(s.table, layout_.block_tokens, layout_.block_tokens, first, count,
                 [&](int64_t row, int64_t off, int64_t n) { f(row, off, n, k++); });
  }
  template <typename F>
  void x_runs(const SeqPlan& s, int64_t first, int64_t count, F&& f) const {
    size_t k = 0;
    for_each_run(s.table, layout_.block_tokens, host_->x_block_rows(), first, count,
                 [&](int64_t row, int64_t off, int64_t n) { f(row, off, n, k++); });
  }

  // Per step.
  std::vector<int32_t> slot_tables_;  // the one-block tables of chunks given by slot
  std::vector<SeqPlan> plan_;
  std::vector<Group> groups_;
  Tensor kbuf_[2], vbuf_[2], xbuf_[2], xnew_[2];  // device, kv dtype
  Tensor kv_recomputed_, knew_, vnew_;       // device scratch (kv_recomputed_: [2 * rows, kv_hidden])
  Tensor xpos_;                                   // device: positions of the X rows of both variants
  Tensor host_q_, host_out_;                      // pinned (cpu-attn)
  Event buf_free_[2], buf_stored_[2];
  std::vector<Event> store_done_;                 // per layer: last store to the host finished
  std::vector<LayerTiming> timing_;               // per unit (layer, group)
  StepStats stats_;
  int64_t step_ = 0;
};

}  // namespace kvpr
