// The CPU backend: device memory is host memory, streams execute in order on the calling
// thread, kernels are multi-threaded (ThreadPool) and vectorised; GEMMs use OpenBLAS.
// It is the reference every other backend is compared with, and what CI runs.
#pragma once

#include <atomic>
#include <memory>

#include "engine/backend.h"

namespace kvpr {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool device_is_host() const override { return true; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor alloc_pinned(DType dtype, Shape shape) override;
  size_t device_bytes_in_use() const override { return bytes_in_use_->load(); }

  void copy(const Tensor& dst, const Tensor& src, Stream s) override;
  Event record(Stream s) override;
  void wait(Stream s, const Event& e) override;
  void synchronize(const Event& e) override;
  void synchronize() override;

  void gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  float eps) override;
  void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
              Activation act) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void convert(const Tensor& dst, const Tensor& src) override;
  void attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs,
                 int heads, float scale) override;

 private:
  std::shared_ptr<std::atomic<size_t>> bytes_in_use_;
  Tensor weight_scratch_;  // F32 copy of a F16/BF16 weight for large-M GEMMs
};

}  // namespace kvpr
