// The CUDA backend: memory, streams, events, cuBLAS GEMMs and the kernel launches.
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels.h"
#include "engine/error.h"

namespace kvpr {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

namespace {

struct CudaEvent : Event::Impl {
  cudaEvent_t ev = nullptr;
  int device = 0;
  CudaEvent() { CUDA_CHECK(cudaEventCreate(&ev)); }
  ~CudaEvent() override {
    if (ev) cudaEventDestroy(ev);
  }
};

cudaEvent_t cuda_event(const Event& e) {
  auto* impl = dynamic_cast<CudaEvent*>(e.impl());
  KVPR_CHECK(impl, "event does not belong to the CUDA backend");
  return impl->ev;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: KVPR_THROW("no CUDA data type for ", dtype_name(t));
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int n = cuda_device_count();
    KVPR_CHECK(device >= 0 && device < n, "CUDA device ", device, " does not exist (", n, " visible)");
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = std::string("cuda:") + std::to_string(device) + " (" + prop.name + ")";
    for (auto& s : streams_) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream(Stream::Compute)));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    for (auto& st : staging_)
      if (st.done) cudaEventDestroy(st.done);
    cublasDestroy(cublas_);
    for (auto& s : streams_) cudaStreamDestroy(s);
  }

  std::string name() const override { return name_; }
  bool device_is_host() const override { return false; }

  Tensor alloc(DType dtype, Shape shape) override {
    size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    void* p = nullptr;
    if (bytes > 0) {
      cudaError_t e = cudaMalloc(&p, bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        KVPR_THROW("CUDA out of memory allocating ", bytes, " bytes for ", dtype_name(dtype), shape_str(shape),
                   " on ", name_, " (", free_b >> 20, " MiB free of ", total_b >> 20, " MiB)");
      }
      // cudaMemset runs on the legacy default stream, which our non-blocking streams do not
      // wait for: finish it here, or a copy into the new buffer could land before the zeros.
      CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy));
      CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    }
    auto st = std::make_shared<Storage>();
    st->data = p;
    st->bytes = bytes;
    st->kind = MemoryKind::Device;
    auto counter = in_use_;
    counter->fetch_add(bytes);
    int dev = device_;
    st->release = [counter, bytes, dev](void* q) {
      counter->fetch_sub(bytes);
      if (q) {
        cudaSetDevice(dev);
        cudaFree(q);
      }
    };
    return Tensor(std::move(st), 0, dtype, std::move(shape));
  }

  Tensor alloc_pinned(DType dtype, Shape shape) override {
    size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    void* p = nullptr;
    if (bytes > 0 && host_allocator_) {
      // Memory placed by the allocator (NUMA-local), then page-locked for async copies.
      p = host_allocator_->allocate(bytes);
      cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
      if (e != cudaSuccess) {
        cudaGetLastError();
        host_allocator_->deallocate(p, bytes);
        KVPR_THROW("cannot pin ", bytes, " bytes of host memory from ", host_allocator_->describe(), ": ",
                   cudaGetErrorString(e));
      }
      auto st = std::make_shared<Storage>();
      st->data = p;
      st->bytes = bytes;
      st->kind = MemoryKind::PinnedHost;
      st->release = [a = host_allocator_, bytes](void* q) {
        cudaHostUnregister(q);
        a->deallocate(q, bytes);
      };
      return Tensor(std::move(st), 0, dtype, std::move(shape));
    }
    if (bytes > 0) {
      cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        cudaGetLastError();
        KVPR_THROW("cannot allocate ", bytes, " bytes of pinned host memory for ", dtype_name(dtype),
                   shape_str(shape), ": ", cudaGetErrorString(e));
      }
      std::memset(p, 0, bytes);
    }
    auto st = std::make_shared<Storage>();
    st->data = p;
    st->bytes = bytes;
    st->kind = MemoryKind::PinnedHost;
    st->release = [](void* q) {
      if (q) cudaFreeHost(q);
    };
    return Tensor(std::move(st), 0, dtype, std::move(shape));
  }

  size_t device_bytes_in_use() const override { return in_use_->load(); }

  void copy(const Tensor& dst, const Tensor& src, Stream s, const char* what) override {
    KVPR_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy from ", src.describe(), " to ",
               dst.describe(), ": dtype or size differ");
    if (src.nbytes() == 0 || dst.data() == src.data()) return;
    Traced t(*this, s, what, src.nbytes(), 0);
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream(s)));
    // A pageable host destination is only valid once the copy ran: make it synchronous.
    if (dst.memory() == MemoryKind::Host) CUDA_CHECK(cudaStreamSynchronize(stream(s)));
  }

  Event record(Stream s) override {
    auto ev = std::make_shared<CudaEvent>();
    CUDA_CHECK(cudaEventRecord(ev->ev, stream(s)));
    return Event(ev);
  }
  void wait(Stream s, const Event& e) override { CUDA_CHECK(cudaStreamWaitEvent(stream(s), cuda_event(e), 0)); }
  void synchronize(const Event& e) override {
    CUDA_CHECK(cudaEventSynchronize(cuda_event(e)));
    if (tracer_) flush_trace();  // the spans that are complete (a decode step waits here only)
  }
  void synchronize() override {
    for (auto& st : streams_) CUDA_CHECK(cudaStreamSynchronize(st));
    flush_trace();
  }
  double elapsed_ms(const Event& start, const Event& end) override {
    float ms = 0.f;
    CUDA_CHECK(cudaEventSynchronize(cuda_event(end)));
    CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_event(start), cuda_event(end)));
    return ms;
  }

  void gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override {
    gather(out, table, ids, false, "gather_rows");
  }
  void add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) override {
    gather(out, table, ids, true, "add_gathered_rows");
  }

  void layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) override {
    check_f32(out, "layer_norm output");
    check_f32(x, "layer_norm input");
    const int64_t d = x.dim(-1), n = x.numel() / d;
    KVPR_CHECK(out.numel() == x.numel() && gamma.numel() == d && beta.numel() == d && gamma.dtype() == beta.dtype(),
               "layer_norm: shapes ", out.describe(), " ", x.describe(), " ", gamma.describe(), " ", beta.describe());
    Traced t(*this, Stream::Compute, "layer_norm", 0, 0);
    cuda::layer_norm(out.data_as<float>(), x.data_as<float>(), gamma.data(), beta.data(), gamma.dtype(), n, d, eps,
                     compute());
  }

  void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) override {
    const auto [M, N, K] = check_linear(out, x, w, bias, "linear");
    if (M == 0) return;
    Traced t(*this, Stream::Compute, "linear", 0, 2.0 * M * N * K);
    gemm(out, x, w, M, N, K, 0.f);
    int a = act == Activation::ReLU ? 1 : act == Activation::GELU ? 2 : 0;
    if (bias.defined() || a)
      cuda::bias_act(out.data_as<float>(), bias.defined() ? bias.data() : nullptr,
                     bias.defined() ? bias.dtype() : DType::F32, 1, M, N, a, compute());
  }

  void linear_accumulate(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) override {
    const auto [M, N, K] = check_linear(out, x, w, bias, "linear_accumulate");
    if (M == 0) return;
    Traced t(*this, Stream::Compute, "linear_accumulate", 0, 2.0 * M * N * K);
    gemm(out, x, w, M, N, K, 1.f);  // out += x · wᵀ
    if (bias.defined())
      cuda::bias_act(out.data_as<float>(), bias.data(), bias.dtype(), 1, M, N, 0, compute());
  }

  void linear_batched(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                      Activation act) override {
    check_f32(out, "linear_batched output");
    check_f32(x, "linear_batched input");
    KVPR_CHECK(w.rank() == 3 && out.rank() == 3, "linear_batched: w ", w.describe(), " out ", out.describe());
    const int64_t B = w.dim(0), N = w.dim(1), K = w.dim(2), M = x.numel() / std::max<int64_t>(K, 1);
    KVPR_CHECK(x.dim(-1) == K && out.dim(0) == B && out.dim(1) == M && out.dim(2) == N &&
                   (!bias.defined() || (bias.rank() == 2 && bias.dim(0) == B && bias.dim(1) == N)),
               "linear_batched: shapes x ", x.describe(), " w ", w.describe(), " bias ", bias.describe(), " out ",
               out.describe());
    if (M == 0 || B == 0) return;
    Traced t(*this, Stream::Compute, "linear_batched", 0, 2.0 * B * M * N * K);
    const float alpha = 1.f, beta = 0.f;
    const void* xin = gemm_input(x, w.dtype(), M * K);
    // Column-major outᵀ[b] (N×M) = w[b] (as K×N, transposed) · xᵀ (K×M); x is shared (stride 0).
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
        w.data(), cuda_type(w.dtype()), static_cast<int>(K), N * K, xin, cuda_type(w.dtype()), static_cast<int>(K), 0,
        &beta, out.data(), CUDA_R_32F, static_cast<int>(N), M * N, static_cast<int>(B), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    int a = act == Activation::ReLU ? 1 : act == Activation::GELU ? 2 : 0;
    if (bias.defined() || a)
      cuda::bias_act(out.data_as<float>(), bias.defined() ? bias.data() : nullptr,
                     bias.defined() ? bias.dtype() : DType::F32, B, M, N, a, compute());
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    check_f32(out, "add output");
    check_f32(a, "add input");
    check_f32(b, "add input");
    KVPR_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add: shapes ", out.describe(), " ",
               a.describe(), " ", b.describe());
    Traced t(*this, Stream::Compute, "add", 0, 0);
    cuda::add(out.data_as<float>(), a.data_as<float>(), b.data_as<float>(), out.numel(), compute());
  }

  void convert(const Tensor& dst, const Tensor& src) override {
    KVPR_CHECK(dst.numel() == src.numel(), "convert: sizes ", dst.describe(), " ", src.describe());
    if (dst.dtype() == src.dtype()) {
      copy(dst, src, Stream::Compute, "convert");
      return;
    }
    Traced t(*this, Stream::Compute, "convert", 0, 0);
    cuda::convert(dst.data(), dst.dtype(), src.data(), src.dtype(), src.numel(), compute());
  }

  void copy_rows(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) override {
    check_row_spans(dst, src, spans);
    int64_t rows = 0;
    const std::vector<cuda::SpanDesc> descs = cuda::span_descs(spans, &rows);
    if (rows == 0) return;
    Traced t(*this, Stream::Compute, "copy_rows",
             static_cast<size_t>(rows * src.dim(1)) * (dtype_size(src.dtype()) + dtype_size(dst.dtype())), 0);
    const void* d = upload_small(descs.data(), descs.size() * sizeof(cuda::SpanDesc));
    cuda::copy_rows(dst.data(), dst.dtype(), src.data(), src.dtype(), static_cast<const cuda::SpanDesc*>(d),
                    static_cast<int64_t>(descs.size()), rows, src.dim(1), compute());
  }

  void fill_random(const Tensor& t, uint64_t seed, float mean, float stddev) override {
    KVPR_CHECK(is_float(t.dtype()), "fill_random needs a float tensor, got ", t.describe());
    cuda::fill_random(t.data(), t.dtype(), t.numel(), seed, mean, stddev, compute());
  }

  void argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) override {
    const int64_t R = check_argmax_lse(ids, stats, logits, valid), V = logits.dim(-1);
    Traced t(*this, Stream::Compute, "argmax_lse", logits.nbytes(), 0);
    cuda::argmax_lse(ids.data_as<int32_t>(), stats.data_as<float>(), logits.data_as<float>(), R, V, valid, compute());
  }

  void attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads,
                 float scale) override {
    check_f32(out, "attention output");
    check_f32(q, "attention query");
    const int64_t hidden = q.dim(-1);
    KVPR_CHECK(heads > 0 && hidden % heads == 0, "attention: hidden ", hidden, " not divisible by ", heads, " heads");
    if (seqs.empty()) return;
    const int64_t hd = hidden / heads;
    std::vector<cuda::AttnDesc> descs;
    int64_t max_ctx = 0, max_q = 0, total_q = 0;
    bool all_decode = true, aligned = true;
    DType kv = seqs.front().k.dtype();
    int64_t kv_bytes = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const AttentionSeq& a = seqs[s];
      KVPR_CHECK(a.k.dim(0) >= a.past_len + a.q_len && a.v.dim(0) >= a.past_len + a.q_len && a.k.dim(1) == hidden &&
                     a.v.dim(1) == hidden && a.k.dtype() == kv && a.v.dtype() == kv &&
                     a.q_begin + a.q_len <= q.dim(0) && (s == 0 || a.q_begin >= seqs[s - 1].q_begin),
                 "attention: sequence ", s, " has k ", a.k.describe(), " v ", a.v.describe(), " for past ",
                 a.past_len, " + ", a.q_len, " queries");
      descs.push_back(cuda::AttnDesc{a.k.data(), a.v.data(), a.q_begin, static_cast<int32_t>(a.q_len),
                                     static_cast<int32_t>(a.past_len)});
      max_ctx = std::max(max_ctx, a.past_len + a.q_len);
      max_q = std::max(max_q, a.q_len);
      total_q = std::max(total_q, a.q_begin + a.q_len);
      all_decode = all_decode && a.q_len == 1;
      aligned = aligned && reinterpret_cast<uintptr_t>(a.k.data()) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(a.v.data()) % 16 == 0;
      kv_bytes += 2 * (a.past_len + a.q_len) * hidden * static_cast<int64_t>(dtype_size(kv));
    }
    Traced t(*this, Stream::Compute, "attention", kv_bytes, 0);
    const void* dd = upload_small(descs.data(), descs.size() * sizeof(cuda::AttnDesc));
    const void* tiles = nullptr;
    int64_t n_tiles = 0;
    if (!all_decode && hd <= 128) {
      std::vector<cuda::AttnTile> tv = cuda::attention_tiles(descs.data(), static_cast<int64_t>(descs.size()));
      n_tiles = static_cast<int64_t>(tv.size());
      tiles = upload_small(tv.data(), tv.size() * sizeof(cuda::AttnTile));
    }
    float* work = nullptr;
    if (all_decode) {
      int64_t wf = cuda::attention_work_floats(static_cast<int64_t>(descs.size()), max_ctx, heads, static_cast<int>(hd));
      work = scratch_named(work_buf_, DType::F32, wf).data_as<float>();
    }
    cuda::attention(out.data_as<float>(), q.data_as<float>(), static_cast<const cuda::AttnDesc*>(dd),
                    static_cast<int64_t>(descs.size()), total_q, max_ctx, max_q, all_decode, heads, static_cast<int>(hd),
                    kv, scale, work, aligned, static_cast<const cuda::AttnTile*>(tiles), n_tiles, compute());
  }

 private:
  // Records start/end events around an op or copy when a tracer is attached; resolved into
  // trace spans at synchronize().
  struct Traced {
    CudaBackend& b;
    bool on;
    size_t idx = 0;
    Traced(CudaBackend& be, Stream s, const char* what, size_t bytes, double flops) : b(be), on(be.tracer_ != nullptr) {
      if (!on) return;
      std::lock_guard<std::mutex> lock(b.trace_mu_);
      b.ensure_trace_base();
      PendingSpan p;
      p.stream = s;
      p.name = b.trace_label_.empty() ? what : b.trace_label_ + " " + what;
      p.bytes = bytes;
      p.flops = flops;
      CUDA_CHECK(cudaEventCreate(&p.start));
      CUDA_CHECK(cudaEventCreate(&p.end));
      CUDA_CHECK(cudaEventRecord(p.start, b.stream(s)));
      b.pending_.push_back(p);
      idx = b.pending_.size() - 1;
    }
    ~Traced() {
      if (!on) return;
      std::lock_guard<std::mutex> lock(b.trace_mu_);
      const PendingSpan& p = b.pending_[idx];
      cudaEventRecord(p.end, b.stream(p.stream));
    }
  };
  struct PendingSpan {
    Stream stream;
    std::string name;
    size_t bytes;
    double flops;
    cudaEvent_t start, end;
  };

  void ensure_trace_base() {
    if (trace_base_) return;
    CUDA_CHECK(cudaEventCreate(&trace_base_));
    CUDA_CHECK(cudaEventRecord(trace_base_, stream(Stream::Compute)));
    CUDA_CHECK(cudaEventSynchronize(trace_base_));
    trace_base_us_ = tracer_->now_us();
  }

  // Turns the pending spans whose end the device has reached into trace spans; the others stay
  // pending (a span still running on a copy stream) until a later flush.
  void flush_trace() {
    std::lock_guard<std::mutex> lock(trace_mu_);
    if (!tracer_ || pending_.empty()) return;
    std::vector<PendingSpan> keep;
    for (const auto& p : pending_) {
      const cudaError_t done = cudaEventQuery(p.end);
      if (done == cudaErrorNotReady) {
        keep.push_back(p);
        continue;
      }
      float a = 0, b = 0;
      if (done == cudaSuccess && cudaEventElapsedTime(&a, trace_base_, p.start) == cudaSuccess &&
          cudaEventElapsedTime(&b, trace_base_, p.end) == cudaSuccess) {
        json::Value args(json::Object{});
        if (p.bytes) args.set("bytes", static_cast<int64_t>(p.bytes));
        if (p.flops > 0) args.set("flops", p.flops);
        tracer_->span(stream_name(p.stream), p.name, trace_base_us_ + a * 1e3, trace_base_us_ + b * 1e3,
                      std::move(args));
      }
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.end);
    }
    cudaGetLastError();  // a not-ready query is not an error to keep
    pending_ = std::move(keep);
  }

  // The F32 activations x (n values) as a GEMM input next to weights of dtype `dt`: x itself, or
  // x rounded to fp16/bf16 in the GEMM scratch buffer.
  const void* gemm_input(const Tensor& x, DType dt, int64_t n) {
    if (dt == DType::F32) return x.data();
    Tensor xh = scratch(dt, n);
    cuda::convert(xh.data(), dt, x.data(), DType::F32, n, compute());
    return xh.data();
  }

  // Row-major out[M,N] = x[M,K] · w[N,K]ᵀ + beta · out, as column-major outᵀ[N,M] = wᵀ[N,K] · xᵀ[K,M]:
  // fp32 accumulation; fp16/bf16 weights take the activations rounded to their dtype.
  void gemm(const Tensor& out, const Tensor& x, const Tensor& w, int64_t M, int64_t N, int64_t K, float beta) {
    const float alpha = 1.f;
    const void* xin = gemm_input(x, w.dtype(), M * K);
    CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                              static_cast<int>(K), &alpha, w.data(), cuda_type(w.dtype()), static_cast<int>(K), xin,
                              cuda_type(w.dtype()), static_cast<int>(K), &beta, out.data(), CUDA_R_32F,
                              static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  cudaStream_t stream(Stream s) const { return streams_[static_cast<int>(s)]; }
  cudaStream_t compute() const { return stream(Stream::Compute); }

  static void check_f32(const Tensor& t, const char* what) {
    KVPR_CHECK(t.dtype() == DType::F32, what, " must be F32, got ", t.describe());
  }

  void gather(const Tensor& out, const Tensor& table, const Tensor& ids, bool accumulate, const char* what) {
    check_f32(out, "gather output");
    KVPR_CHECK(ids.dtype() == DType::I32 && ids.numel() == out.dim(0) && table.dim(1) == out.dim(1), what,
               ": shapes ", out.describe(), " ", table.describe(), " ", ids.describe());
    Traced t(*this, Stream::Compute, what, 0, 0);
    cuda::gather_rows(out.data_as<float>(), table.data(), table.dtype(), ids.data_as<int32_t>(), table.dim(0),
                      ids.numel(), out.dim(1), accumulate, compute());
  }

  // Small per-call parameters (attention descriptors, copy_rows spans) go up through a ring of
  // pinned staging slots: an upload from pageable memory may make the host wait for the compute
  // stream, which would stall the layer loop the runtime keeps ahead of the device. A slot is
  // reused once its copy has run (its event). The ring holds a whole decode step's uploads
  // (up to 4 per layer with KVPR, 128 layers), so reusing a slot never makes the host wait
  // inside a step: with 32 slots a 7-layer KVPR step already waited 3 times (found on the
  // emulated device). 2 MiB of pinned and of device memory in all.
  const void* upload_small(const void* src, size_t bytes) {
    const size_t i = staging_next_++ % staging_.size();
    Staging& st = staging_[i];
    if (!st.done) CUDA_CHECK(cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming));
    else CUDA_CHECK(cudaEventSynchronize(st.done));
    char *h = nullptr, *d = nullptr;
    if (bytes <= kStagingSlotBytes) {
      // Every slot's usual room, allocated once: a new slot costs no allocation (a device
      // allocation is zeroed in order, which would make the host wait).
      if (!ring_host_.defined()) {
        ring_host_ = cuda_pinned(static_cast<int64_t>(staging_.size() * kStagingSlotBytes));
        ring_dev_ = alloc(DType::U8, {static_cast<int64_t>(staging_.size() * kStagingSlotBytes)});
      }
      h = static_cast<char*>(ring_host_.data()) + i * kStagingSlotBytes;
      d = static_cast<char*>(ring_dev_.data()) + i * kStagingSlotBytes;
    } else {
      // A large upload (a big prefill's tiles): the slot's own buffers, grown as needed.
      if (!st.host.defined() || st.host.nbytes() < bytes) {
        const int64_t cap = static_cast<int64_t>(bytes * 2);
        st.host = Tensor();
        st.host = cuda_pinned(cap);
        st.dev = alloc(DType::U8, {cap});  // the old one is freed only after the device is idle
      }
      h = static_cast<char*>(st.host.data());
      d = static_cast<char*>(st.dev.data());
    }
    std::memcpy(h, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, compute()));
    CUDA_CHECK(cudaEventRecord(st.done, compute()));
    return d;
  }
  Tensor cuda_pinned(int64_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable));
    auto st = std::make_shared<Storage>();
    st->data = p;
    st->bytes = static_cast<size_t>(bytes);
    st->kind = MemoryKind::PinnedHost;
    st->release = [](void* q) { cudaFreeHost(q); };
    return Tensor(std::move(st), 0, DType::U8, {bytes});
  }
  struct Staging {
    Tensor host, dev;
    cudaEvent_t done = nullptr;
  };

  // Grow-only device scratch. Work on the compute stream is in order, so reusing a scratch
  // buffer for the next op is safe.
  Tensor scratch(DType dt, int64_t n) { return scratch_named(gemm_buf_, dt, n); }
  Tensor scratch_named(Tensor& buf, DType dt, int64_t n) {
    int64_t bytes = std::max<int64_t>(1, n * static_cast<int64_t>(dtype_size(dt)));
    if (!buf.defined() || buf.numel() < bytes) {
      CUDA_CHECK(cudaStreamSynchronize(compute()));  // the old buffer may still be in use
      buf = alloc(DType::U8, {std::max<int64_t>(bytes, buf.defined() ? buf.numel() * 3 / 2 : 0)});
    }
    return buf.view_as(dt, {n});
  }

  int device_;
  std::string name_;
  cudaStream_t streams_[3] = {nullptr, nullptr, nullptr};
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<std::atomic<size_t>> in_use_ = std::make_shared<std::atomic<size_t>>(0);
  Tensor gemm_buf_, work_buf_;
  static constexpr size_t kStagingSlotBytes = 4096;
  std::array<Staging, 512> staging_;
  Tensor ring_host_, ring_dev_;  // kStagingSlotBytes per slot
  size_t staging_next_ = 0;
  std::mutex trace_mu_;
  std::vector<PendingSpan> pending_;
  cudaEvent_t trace_base_ = nullptr;
  double trace_base_us_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

std::string cuda_pci_bus_id(int device) {
  char buf[64] = {0};
  CUDA_CHECK(cudaDeviceGetPCIBusId(buf, sizeof buf, device));
  return buf;
}

}  // namespace kvpr
