// The CPU backend: device memory is host memory, kernels are multi-threaded (ThreadPool)
// and vectorised, GEMMs use OpenBLAS. It is the reference every other backend is compared
// with, and what CI runs. The compute stream runs on the calling thread; the H2D and D2H
// streams are copy engines with a thread each, so copies really overlap compute, and an
// emulated link (set_emulated_link_gbps) paces them like a PCIe link for tests and
// experiments with the KVPR runtime.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/quantized_linear.h"

namespace kvpr {

// One in-order queue of work on its own thread.
class CopyEngine {
 public:
  CopyEngine();
  ~CopyEngine();
  void push(std::function<void()> task);
  void drain();  // waits until every queued task has run

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool device_is_host() const override { return true; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor alloc_pinned(DType dtype, Shape shape) override;
  size_t device_bytes_in_use() const override { return bytes_in_use_->load(); }
  size_t device_bytes_free() const override { return host_bytes_available(); }

  void copy(const Tensor& dst, const Tensor& src, Stream s, const char* what = "copy") override;
  // On a copy stream, every span in one task of its engine (as one batched copy on a GPU): a
  // batch's copies cost one hand-off, however many sequences or KV blocks they cover.
  void copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans, Stream s,
                  const char* what = "copy") override;
  Event record(Stream s) override;
  void wait(Stream s, const Event& e) override;
  void synchronize(const Event& e) override;
  void synchronize() override;
  double elapsed_ms(const Event& start, const Event& end) override;

  // Paces H2D and D2H copies to `gbps` GB/s each way (0 = unpaced). May change at any time.
  void set_emulated_link_gbps(double gbps) { link_gbps_.store(gbps); }
  double emulated_link_gbps() const { return link_gbps_.load(); }

  void gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales) override;
  void layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  float eps) override;
  void rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, float eps) override;
  void rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params) override;
  void gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act) override;
  void scale(const Tensor& out, const Tensor& x, float factor, float cap) override;
  bool reads_quantized_weights() const override { return true; }
  // Bytes of weights, as stored, the GEMMs have read so far: each linear call's weight once
  // (kvpr-bench weights counts them per token).
  double weight_bytes_read() const { return weight_bytes_read_; }
  void linear(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias,
              Activation act) override;
  void linear_batched(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias,
                      Activation act) override;
  void linear_accumulate(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void convert(const Tensor& dst, const Tensor& src) override;
  void copy_rows(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) override;
  void fill_random(const Tensor& t, uint64_t seed, float mean, float stddev) override;
  void attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs,
                 int heads, const AttentionParams& params) override;
  void argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) override;

 private:
  CopyEngine& engine(Stream s) { return s == Stream::H2D ? h2d_ : d2h_; }
  // On stream s's engine thread, after its copy of `bytes` that could start at `start`: waits
  // until the emulated link would have carried them (nothing without --emulate-link-gbps).
  void pace_link(Stream s, size_t bytes, std::chrono::steady_clock::time_point start);
  void trace_op(const char* op, double t0, json::Value args);

  std::shared_ptr<std::atomic<size_t>> bytes_in_use_;
  std::atomic<double> link_gbps_{0.0};
  // When the emulated link of each direction (H2D, D2H) is next free; used only by that
  // direction's copy engine thread.
  std::chrono::steady_clock::time_point link_free_at_[2];
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  CopyEngine h2d_, d2h_;
  Tensor weight_scratch_;  // F32 copy of a F16/BF16 weight for large-M GEMMs
  Tensor accumulate_scratch_;  // linear_accumulate's product before it is added
  cpu::QuantizedScratch quantized_scratch_;  // the GEMM on quantized weights' buffers
  double weight_bytes_read_ = 0;
};

}  // namespace kvpr
