// The KV modes, one class each, behind the calls the runtime makes for the model
// (kv_runtime.h): where a layer's past K/V come from, and how attention reads them. They share
// the step (kv_step.h): the host store, the block tables, the link's scheduler. make_kv_mode is
// the one place that chooses among them by KvMode.
//
//   ResidentKv   K/V stay in device memory; attention reads the blocks in place
//   OffloadKv    K/V in host memory; all of KV[0:s'] copied per layer, the next layer prefetched
//   KvprKv       X[0:l] copied first and K/V[0:l] recomputed while KV[l:s'] is copied (l: the
//                split scheduler's, or forced)
//   RecomputeKv  l = every cached token with stored X
//   CpuAttnKv    Q goes to the host, host threads attend over the host store, the output comes back
//   AutoKv       kvpr, and a device tier of blocks mirroring host blocks: each sequence's tail is
//                read and written in place on the device, its head staged as kvpr stages it
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/kv/device_block_cache.h"
#include "engine/kv/kv_step.h"

namespace kvpr {

class KvModeRuntime {
 public:
  explicit KvModeRuntime(KvStep& st) : st_(st) {}
  virtual ~KvModeRuntime() = default;
  KvModeRuntime(const KvModeRuntime&) = delete;
  KvModeRuntime& operator=(const KvModeRuntime&) = delete;

  // The step's plan is made (KvStep::plan, batches): the mode's part of it (where each token's
  // K/V come from, the splits, the buffers).
  virtual void plan_step() {}
  // Whether units record compute events (the split scheduler's measurements): resident records
  // none, so that its decode steps can be CUDA graphs.
  virtual bool times_units() const { return true; }
  // Whether the next unit's copies go after this unit's attention (cpu-attn sends its output up
  // on the H2D stream; before it, the output would queue behind them).
  virtual bool prefetch_after_attention() const { return false; }
  // Whether the mode copies past K/V (and X) to the device each unit; then, on the H2D stream:
  // wait_for_buffers first, copy_x before t.x_ready is recorded, copy_kv after it.
  virtual bool copies_kv() const { return false; }
  virtual void wait_for_buffers(int64_t layer, int b) {
    (void)layer;
    (void)b;
  }
  virtual void copy_x(int64_t layer, int64_t group, int b, LayerTiming& t) {
    (void)layer, (void)group, (void)b, (void)t;
  }
  virtual void copy_kv(int64_t layer, int64_t group, int b, LayerTiming& t) {
    (void)layer, (void)group, (void)b, (void)t;
  }
  // Of the group's tokens: x, the layer's post-norm input [n, hidden] F32; q [n, hidden], k and
  // v [n, kv_hidden] F32; out: [n, hidden] F32 attention output. Stores the new K/V.
  virtual void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const AttentionParams& params) = 0;
  // cpu-attn: the host attention's threads from now on.
  virtual void set_host_attention_threads(int threads) { (void)threads; }
  // A step that failed part way: what the mode keeps on the device from it is unknown.
  virtual void drop_unfinished_step() {}
  // auto: the device tier (null in the other modes).
  virtual const DeviceBlockCache* device_tier() const { return nullptr; }

 protected:
  KvStep& st_;
};

// The one choice among the modes, by st.opts.mode; allocates what the mode keeps (the device
// store, the host store, the device tier, the host threads).
std::unique_ptr<KvModeRuntime> make_kv_mode(KvStep& st);

class ResidentKv : public KvModeRuntime {
 public:
  explicit ResidentKv(KvStep& st);
  bool times_units() const override { return false; }
  void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& out, const AttentionParams& params) override;

 private:
  std::vector<Tensor> k_, v_;  // [blocks * block_tokens, kv_hidden] per layer
};

class CpuAttnKv : public KvModeRuntime {
 public:
  explicit CpuAttnKv(KvStep& st);
  void plan_step() override;
  bool prefetch_after_attention() const override { return true; }
  void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& out, const AttentionParams& params) override;
  void set_host_attention_threads(int threads) override;

 private:
  std::unique_ptr<ThreadPool> pool_;
  Tensor knew_, vnew_;         // device: the new K/V in the store's dtype
  Tensor host_q_, host_out_;   // pinned
  Tensor host_sinks_;          // pinned: the layer's sink logits, when it has them
};

// The modes that stage past K/V in two per-step device buffers (a layer's and the next one's),
// copied from the host store, with K/V[0:l] recomputed from X where the mode splits; they
// differ in how l is chosen (choose_splits).
class StagedKv : public KvModeRuntime {
 public:
  explicit StagedKv(KvStep& st);
  void plan_step() override;
  bool copies_kv() const override { return true; }
  void wait_for_buffers(int64_t layer, int b) override;
  void copy_x(int64_t layer, int64_t group, int b, LayerTiming& t) override;
  void copy_kv(int64_t layer, int64_t group, int b, LayerTiming& t) override;
  void attend(int64_t layer, int64_t group, const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& out, const AttentionParams& params) override;

 protected:
  // Sets every sequence's split[0], split[1] and the step's split_source.
  virtual void choose_splits() = 0;
  // The device tier's part (auto): its new rows written in place, its promotions, its stores.
  virtual void write_tier_rows(int64_t layer, int64_t group, const Tensor& k, const Tensor& v, LayerTiming& t) {
    (void)layer, (void)group, (void)k, (void)v, (void)t;
  }
  virtual AttentionSeq staged_seq(int64_t layer, const SeqPlan& s, int b) const;
  int64_t first_read(int64_t layer, const SeqPlan& s) const;
  int64_t split_at(int64_t layer, const SeqPlan& s) const;
  bool head_unread(int64_t layer, int64_t group) const;
  virtual void promote(int64_t layer, int64_t group, int b) { (void)layer, (void)group, (void)b; }
  // On the D2H stream after the staged rows' stores: the tier's new rows to the host.
  virtual void store_tier_rows(int64_t layer, int64_t group) { (void)layer, (void)group; }
  virtual void stored(int64_t layer, const Event& e) { (void)layer, (void)e; }
  Tensor kbuf_[2], vbuf_[2];  // device, kv dtype: past K/V of a unit, then its new rows

 private:
  void place_splits();  // the X buffer's rows of every sequence, from its splits
  void allocate();
  void recompute_head(int64_t layer, int64_t group, int b, LayerTiming& t);
  void join_new_rows(int64_t layer, int64_t group, int b, const Tensor& k, const Tensor& v, LayerTiming& t);
  void store_new_rows(int64_t layer, int64_t group, int b, bool store_x);

  Tensor xbuf_[2], xnew_[2];  // device, kv dtype: X[0:l] copied, the new X to store
  Tensor kv_recomputed_;      // device scratch [2 * rows, kv_hidden]
  Tensor xpos_;               // device: positions of the X rows of both variants
  Event buf_free_[2], buf_stored_[2];
};

class OffloadKv : public StagedKv {
 public:
  using StagedKv::StagedKv;

 protected:
  void choose_splits() override;
};

class RecomputeKv : public StagedKv {
 public:
  using StagedKv::StagedKv;

 protected:
  void choose_splits() override;
};

class KvprKv : public StagedKv {
 public:
  using StagedKv::StagedKv;

 protected:
  void choose_splits() override;

 private:
  // Shares a batch's l among its sequences in proportion to their staged cached tokens.
  std::vector<int64_t> distribute(std::span<const SeqPlan> seqs, int64_t total, int64_t cached) const;
};

class AutoKv : public KvprKv {
 public:
  AutoKv(KvStep& st, int64_t device_blocks);
  void plan_step() override;
  void drop_unfinished_step() override;
  const DeviceBlockCache* device_tier() const override { return &cache_; }

 protected:
  void write_tier_rows(int64_t layer, int64_t group, const Tensor& k, const Tensor& v, LayerTiming& t) override;
  AttentionSeq staged_seq(int64_t layer, const SeqPlan& s, int b) const override;
  void promote(int64_t layer, int64_t group, int b) override;
  void store_tier_rows(int64_t layer, int64_t group) override;
  void stored(int64_t layer, const Event& e) override;

 private:
  DeviceBlockCache cache_;
  std::vector<Tensor> k_, v_;  // the tier: [device blocks * block_tokens, kv_hidden] per layer
  std::vector<DeviceBlockCache::Placement> placement_;
  std::vector<DeviceBlockCache::Promotion> promotions_;
  std::vector<Event> tier_read_;  // per layer: the last step's stores from the tier
};

}  // namespace kvpr
