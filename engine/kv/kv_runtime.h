// The KV runtime: where each layer's past K/V come from at every step, written once against
// the Backend so the CPU backend verifies it and the CUDA backend runs it (docs/design.md §2-3).
// The runtime plans each step (its sequences' blocks and rows, the GPU batches), drives the
// copies a layer ahead (the mode's K/V and X, the streamed layer weights) and feeds the split
// scheduler its measurements; what each KV mode does at the model's calls is its own class
// (kv_modes.h: resident, offload, kvpr, recompute, cpu-attn, auto).
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
#include "engine/kv/kv_step.h"
#include "engine/kv/split_scheduler.h"
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
  // Its sequence is past ModelSpec::long_rope_after tokens: every rotation it makes, in the
  // forward and in kvpr's recompute, is by the long factors (its positions carry kRopeLong).
  bool long_rope = false;
  // With a ring for the sliding layers (KvLayout::ring): its table there, covering as `blocks`
  // does, negative below the window of its first token.
  std::span<const int32_t> window_blocks = {};
};

// A KV cache known before the model that holds it is loaded (Generator::kv_plan): the store's
// blocks in kv's mode and dtype. Loading a model with one (ModelLoadOptions::kv_plan) refuses a
// plan past host memory before allocating anything.
struct KvPlan {
  KvLayout layout;
  KvRuntimeOptions kv;
  std::string why;  // how its size was chosen, for the log
};

class KvModeRuntime;

class KvRuntime {
 public:
  // With `weights`, the layers' weights are streamed too: each layer's copies go on the H2D
  // stream with its KV (weights front, X[0:l], KV[l:s'], weights back), a layer ahead.
  KvRuntime(Backend& backend, const KvShape& shape, KvProjector& projector, const KvLayout& layout,
            const KvRuntimeOptions& opts, LayerWeightStream* weights = nullptr);
  ~KvRuntime();

  KvMode mode() const { return st_.opts.mode; }
  const KvLayout& layout() const { return st_.layout; }
  DType kv_dtype() const { return st_.opts.kv_dtype; }
  const HostKvStore* host_store() const { return st_.host.get(); }
  // auto: the device tier's bookkeeping (null in the other modes) and its bytes, allocated and
  // holding mirrors now.
  const DeviceBlockCache* device_tier() const;
  double device_tier_bytes() const;
  double device_tier_used_bytes() const;
  // Device bytes of one block of the device tier: K and V of every layer.
  static double device_block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
  // auto: the device blocks the budget buys on `backend` now (weights loaded).
  static int64_t device_tier_blocks(Backend& backend, const KvShape& shape, const KvLayout& layout,
                                    const KvRuntimeOptions& opts);
  SplitScheduler* scheduler() { return st_.scheduler.get(); }
  const StepStats& last_step() const { return st_.stats; }
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
  // Bytes of one block of every layer (store_bytes of a one-block layout without a ring), and of
  // one block of the sliding layers alone (their ring's blocks).
  static double window_block_bytes(const KvShape& shape, const KvLayout& layout, const KvRuntimeOptions& opts);
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
  int64_t groups() const { return st_.groups(); }
  Rows group_rows(int64_t group) const;
  void prepare(int64_t layer, int64_t group);
  // Of the group's tokens: x, the layer's post-norm input [n, hidden] F32; q [n, hidden], k and
  // v [n, kv_hidden] F32; out: [n, hidden] F32 attention output.
  void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& out, const AttentionParams& params);
  void end();

 private:
  void prefetch(int64_t u);       // the copies of unit u = layer * groups() + group
  void prefetch_next(int64_t u);  // unit u + 1's copies, or after the last one the next step's weights
  void issue_weights(int64_t layer);  // all of a layer's weights, ahead of its first unit
  void observe_step();                // the step's copies and compute, to the split scheduler

  KvStep st_;
  std::unique_ptr<KvModeRuntime> mode_;
  bool step_open_ = false;  // begin() without end(): a step failed part way
  std::vector<int32_t> slot_tables_;  // per step: the one-block tables of chunks given by slot
  int64_t step_ = 0;
};

}  // namespace kvpr
