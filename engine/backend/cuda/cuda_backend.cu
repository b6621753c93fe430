// The CUDA backend: memory, streams, events, cuBLAS GEMMs and the kernel launches.
#include "engine/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/base/error.h"

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

// Holds back frees while a graph step is recorded: the recorded work still refers to the
// memory (a scratch buffer grown mid-step, a temporary released before the step is issued).
struct FreeGate {
  std::mutex mu;
  bool holding = false;
  std::vector<std::function<void()>> held;
  void release(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (holding) {
        held.push_back(std::move(f));
        return;
      }
    }
    f();
  }
  void hold() {
    std::lock_guard<std::mutex> lock(mu);
    holding = true;
  }
  void open() {
    std::vector<std::function<void()>> h;
    {
      std::lock_guard<std::mutex> lock(mu);
      holding = false;
      h.swap(held);
    }
    for (auto& f : h) f();
  }
};

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
    max_pitch_ = prop.memPitch;
    sm_count_ = prop.multiProcessorCount;
    for (auto& s : streams_) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream(Stream::Compute)));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    // cuBLAS's workspace, ours: a captured GEMM then allocates nothing, whatever the version.
    cublas_workspace_ = alloc(DType::U8, {kCublasWorkspaceBytes});
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.data(), kCublasWorkspaceBytes));
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    gate_->open();
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
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
    st->release = [counter, bytes, dev, gate = gate_](void* q) {
      gate->release([counter, bytes, dev, q] {
        counter->fetch_sub(bytes);
        if (q) {
          cudaSetDevice(dev);
          cudaFree(q);
        }
      });
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
      st->release = [a = host_allocator_, bytes, gate = gate_](void* q) {
        gate->release([a, bytes, q] {
          cudaHostUnregister(q);
          a->deallocate(q, bytes);
        });
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
    st->release = [gate = gate_](void* q) {
      if (q) gate->release([q] { cudaFreeHost(q); });
    };
    return Tensor(std::move(st), 0, dtype, std::move(shape));
  }

  size_t device_bytes_in_use() const override { return in_use_->load(); }
  size_t device_bytes_free() const override {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }

  void copy(const Tensor& dst, const Tensor& src, Stream s, const char* what) override {
    KVPR_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy from ", src.describe(), " to ",
               dst.describe(), ": dtype or size differ");
    if (src.nbytes() == 0 || dst.data() == src.data()) return;
    if (rec_.on) {
      // A graph holds copies on the compute stream into device or pinned memory; a pageable
      // source is taken now, as CUDA does, into the step's uploaded parameters.
      if (s == Stream::Compute && dst.memory() != MemoryKind::Host) {
        const void* from = src.memory() == MemoryKind::Host ? record_upload(src.data(), src.nbytes()) : src.data();
        if (from) {
          issue("copy", &copy_call, dst.data(), from, src.nbytes(), compute());
          return;
        }
      }
      interrupt();
    }
    Traced t(*this, s, what, src.nbytes(), 0);
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream(s)));
    // A pageable host destination is only valid once the copy ran: make it synchronous.
    if (dst.memory() == MemoryKind::Host) CUDA_CHECK(cudaStreamSynchronize(stream(s)));
  }

  void copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans, Stream s,
                  const char* what) override {
    check_copy_spans(dst, src, spans);
    // Pageable memory and graph recording keep to copy()'s rules, span by span.
    if (rec_.on || dst.memory() == MemoryKind::Host || src.memory() == MemoryKind::Host)
      return Backend::copy_spans(dst, src, spans, s, what);
    const size_t rb = static_cast<size_t>(src.dim(1)) * dtype_size(src.dtype());
    char* d = static_cast<char*>(dst.data());
    const char* from = static_cast<const char*>(src.data());
    size_t total = 0;
    for (const RowSpan& r : spans) total += static_cast<size_t>(r.count) * rb;
    if (total == 0) return;
    Traced t(*this, s, what, total, 0);
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (size_t i = 0; i < spans.size();) {
      const RowSpan& a = spans[i];
      if (a.count == 0) {
        ++i;
        continue;
      }
      // The run of spans from i of a's size at one src and one dst stride, each past the span.
      size_t j = i + 1;
      if (j < spans.size() && spans[j].count == a.count) {
        const int64_t ds = spans[j].dst_row - a.dst_row, ss = spans[j].src_row - a.src_row;
        const bool pitch_ok = ds >= a.count && ss >= a.count && static_cast<size_t>(ds) * rb <= max_pitch_ &&
                              static_cast<size_t>(ss) * rb <= max_pitch_;
        while (pitch_ok && j < spans.size() && spans[j].count == a.count &&
               spans[j].dst_row - spans[j - 1].dst_row == ds && spans[j].src_row - spans[j - 1].src_row == ss)
          ++j;
        if (j - i >= 2) {
          CUDA_CHECK(cudaMemcpy2DAsync(d + a.dst_row * rb, static_cast<size_t>(ds) * rb, from + a.src_row * rb,
                                       static_cast<size_t>(ss) * rb, static_cast<size_t>(a.count) * rb, j - i,
                                       cudaMemcpyDefault, stream(s)));
          i = j;
          continue;
        }
        j = i + 1;
      }
      dsts.push_back(d + a.dst_row * rb);
      srcs.push_back(from + a.src_row * rb);
      sizes.push_back(static_cast<size_t>(a.count) * rb);
      i = j;
    }
#if CUDART_VERSION >= 13000
    if (sizes.size() > 1 && batch_copies_) {
      // The ragged rest in one call: the copies of one batch read their sources in stream
      // order (after what the stream ran before) and may run in any order among themselves.
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t first = 0;
      const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), sizes.size(), &attr, &first,
                                                 1, stream(s));
      if (e == cudaSuccess) return;
      // A driver without batched copies: one copy each from now on (nothing was queued).
      KVPR_CHECK(e == cudaErrorNotSupported || e == cudaErrorCallRequiresNewerDriver, "cudaMemcpyBatchAsync: ",
                 cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
      (void)cudaGetLastError();
      batch_copies_ = false;
    }
#endif
    for (size_t i = 0; i < sizes.size(); ++i)
      CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream(s)));
  }

  Event record(Stream s) override {
    if (rec_.on) interrupt();
    auto ev = std::make_shared<CudaEvent>();
    CUDA_CHECK(cudaEventRecord(ev->ev, stream(s)));
    return Event(ev);
  }
  void wait(Stream s, const Event& e) override {
    if (rec_.on) interrupt();
    CUDA_CHECK(cudaStreamWaitEvent(stream(s), cuda_event(e), 0));
  }
  void synchronize(const Event& e) override {
    if (rec_.on) interrupt();
    CUDA_CHECK(cudaEventSynchronize(cuda_event(e)));
    if (tracer_) flush_trace();  // the spans that are complete (a decode step waits here only)
  }
  void synchronize() override {
    if (rec_.on) interrupt();
    for (auto& st : streams_) CUDA_CHECK(cudaStreamSynchronize(st));
    flush_trace();
  }
  double elapsed_ms(const Event& start, const Event& end) override {
    float ms = 0.f;
    if (rec_.on) interrupt();
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
  void scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales) override {
    check_scatter_add_rows(out, src, ids, scales);
    Traced t(*this, Stream::Compute, "scatter_add_rows", 0, 0);
    issue("scatter_add_rows", &cuda::scatter_add_rows, out.data_as<float>(), src.data_as<float>(),
          ids.data_as<int32_t>(), scales.data_as<float>(), out.dim(0), src.dim(0), out.dim(1), compute());
  }

  void layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) override {
    check_f32(out, "layer_norm output");
    check_f32(x, "layer_norm input");
    const int64_t d = x.dim(-1), n = x.numel() / d;
    KVPR_CHECK(out.numel() == x.numel() && gamma.numel() == d && beta.numel() == d && gamma.dtype() == beta.dtype(),
               "layer_norm: shapes ", out.describe(), " ", x.describe(), " ", gamma.describe(), " ", beta.describe());
    Traced t(*this, Stream::Compute, "layer_norm", 0, 0);
    issue("layer_norm", &cuda::layer_norm, out.data_as<float>(), x.data_as<float>(), gamma.data(), beta.data(),
          gamma.dtype(), n, d, eps, compute());
  }

  void rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, float eps) override {
    check_rms_norm(out, x, gamma);
    const int64_t d = x.dim(-1), n = x.numel() / d;
    Traced t(*this, Stream::Compute, "rms_norm", 0, 0);
    issue("rms_norm", &cuda::rms_norm, out.data_as<float>(), x.data_as<float>(), gamma.data(), gamma.dtype(), n, d,
          eps, compute());
  }

  void rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params) override {
    const int64_t T = check_rope(x, positions, head_dim, params), W = x.dim(-1);
    Traced t(*this, Stream::Compute, "rope", 0, 0);
    issue("rope", &cuda::rope, x.data_as<float>(), positions.data_as<int32_t>(), x.numel() / W, T, W, head_dim, params,
          compute());
  }

  void gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act) override {
    check_gated_mul(out, gate, up, act);
    Traced t(*this, Stream::Compute, "gated_mul", 0, 0);
    issue("gated_mul", &cuda::gated_mul, out.data_as<float>(), gate.data_as<float>(), up.data_as<float>(), out.numel(),
          cuda::activation_code(act), compute());
  }

  void scale(const Tensor& out, const Tensor& x, float factor, float cap) override {
    check_scale(out, x, cap);
    Traced t(*this, Stream::Compute, "scale", 0, 0);
    issue("scale", &cuda::scale, out.data_as<float>(), x.data_as<float>(), out.numel(), factor, cap, compute());
  }

  // Quantized weights (weight.h) are read as stored: a few rows take quantized_gemv (the codes
  // dequantized in registers), more a tile of dequantized rows at a time through cuBLAS.
  bool reads_quantized_weights() const override { return true; }

  void linear(const Tensor& out, const Tensor& x, const Weight& weight, const Tensor& bias, Activation act) override {
    const auto [M, N, K] = check_linear(out, x, weight, bias, "linear");
    if (M == 0) return;
    Traced t(*this, Stream::Compute, "linear", 0, 2.0 * M * N * K);
    if (weight.quantized())
      quantized_gemm(out, x, weight, M, 0.f);
    else
      gemm(out, x, weight.codes, 1, M, N, K, 0.f);
    bias_act(out, bias, act, 1, M, N);
  }

  void linear_accumulate(const Tensor& out, const Tensor& x, const Weight& weight, const Tensor& bias) override {
    const auto [M, N, K] = check_linear(out, x, weight, bias, "linear_accumulate");
    if (M == 0) return;
    Traced t(*this, Stream::Compute, "linear_accumulate", 0, 2.0 * M * N * K);
    if (weight.quantized())
      quantized_gemm(out, x, weight, M, 1.f);
    else
      gemm(out, x, weight.codes, 1, M, N, K, 1.f);  // out += x · wᵀ
    bias_act(out, bias, Activation::None, 1, M, N);
  }

  void linear_batched(const Tensor& out, const Tensor& x, const Weight& weight, const Tensor& bias,
                      Activation act) override {
    // x in any stored float dtype (X read from the KV store goes into the GEMM as it is when
    // it has the weights' dtype); out in F32 or the weights' dtype (quantized ones: F16, BF16).
    check_linear_batched_dtypes(out, x, weight);
    KVPR_CHECK(weight.rank() == 3 && out.rank() == 3, "linear_batched: w ", weight.describe(), " out ", out.describe());
    const int64_t B = weight.dim(0), N = weight.dim(1), K = weight.dim(2), M = x.numel() / std::max<int64_t>(K, 1);
    KVPR_CHECK(x.dim(-1) == K && out.dim(0) == B && out.dim(1) == M && out.dim(2) == N &&
                   (!bias.defined() || (bias.rank() == 2 && bias.dim(0) == B && bias.dim(1) == N)),
               "linear_batched: shapes x ", x.describe(), " w ", weight.describe(), " bias ", bias.describe(), " out ",
               out.describe());
    if (M == 0 || B == 0) return;
    Traced t(*this, Stream::Compute, "linear_batched", 0, 2.0 * B * M * N * K);
    if (weight.quantized()) {
      quantized_batched(out, x, weight, bias, act);
      return;
    }
    const Tensor& w = weight.codes;
    if (out.dtype() != DType::F32 && bias.defined() && bias.dtype() == out.dtype() && act == Activation::None) {
      // A reduced-precision output takes the bias (of its dtype: exact in C) inside the GEMM
      // (C = bias, beta = 1): rounded once, as the fp32 path's result is when it is stored.
      issue("fill_bias", &cuda::fill_bias, out.data(), out.dtype(), bias.data(), bias.dtype(), B, M, N, compute());
      gemm(out, x, w, B, M, N, K, 1.f);
      return;
    }
    gemm(out, x, w, B, M, N, K, 0.f);
    bias_act(out, bias, act, B, M, N);
  }

  // linear_batched (checked) on a stack of quantized matrices: x widened to F32 once, each
  // matrix's product in F32, then the bias and the output's dtype.
  void quantized_batched(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias, Activation act) {
    const int64_t B = w.dim(0), N = w.dim(1), K = w.dim(2), M = x.numel() / K;
    Tensor xf = x, of = out;
    if (x.dtype() != DType::F32) {
      xf = scratch_named(quant_x_buf_, DType::F32, M * K).reshape({M, K});
      issue("convert", &cuda::convert, xf.data(), DType::F32, x.data(), x.dtype(), M * K, compute());
    }
    if (out.dtype() != DType::F32) of = scratch_named(quant_out_buf_, DType::F32, B * M * N).reshape({B, M, N});
    for (int64_t b = 0; b < B; ++b) quantized_gemm(of.rows(b, 1).reshape({M, N}), xf, w.item(b), M, 0.f);
    bias_act(of, bias, act, B, M, N);
    if (of.data() != out.data())
      issue("convert", &cuda::convert, out.data(), out.dtype(), of.data(), DType::F32, B * M * N, compute());
  }

  // out [M, N] F32 = x [M, K] F32 · wᵀ + beta · out for a quantized matrix w [N, K]. Up to 64
  // rows (decode batches): quantized_gemv on 8 rows at a time, the codes read once per 8 rows
  // (at 64 rows, 8 passes: twice a bf16 matrix's bytes for int4, unless L2 holds the matrix). More
  // (prefill, KVPR's recompute): tiles dequantized to F32 for cuBLAS in TF32.
  void quantized_gemm(const Tensor& out, const Tensor& x, const Weight& w, int64_t M, float beta) {
    cuda::QuantDesc d = quant_desc(w);
    const float* xin = x.data_as<float>();
    if (d.order) {  // x in the codes' input order, once: the GEMMs then read the codes in order
      Tensor xg = scratch_named(quant_order_buf_, DType::F32, M * d.k);
      issue("gather_columns", &cuda::gather_columns, xg.data_as<float>(), xin, d.order, M, d.k, compute());
      xin = xg.data_as<float>();
      d.order = nullptr;
    }
    if (M <= 64) {
      for (int64_t m0 = 0; m0 < M; m0 += 8)
        issue("quantized_gemv", &cuda::quantized_gemv, out.data_as<float>() + m0 * d.n, xin + m0 * d.k,
              std::min<int64_t>(8, M - m0), d, beta, compute());
      return;
    }
    // Tiles of about 16 Mi weights, each dequantized to F32 and multiplied by cuBLAS into its
    // columns of out.
    const int64_t tile = std::min<int64_t>(d.n, std::max<int64_t>(16, (int64_t{1} << 24) / d.k));
    Tensor buf = scratch_named(quant_tile_buf_, DType::F32, tile * d.k);
    for (int64_t n0 = 0; n0 < d.n; n0 += tile) {
      const int64_t nt = std::min(tile, d.n - n0);
      issue("dequantize_rows", &cuda::dequantize_rows, buf.data_as<float>(), d, n0, nt, compute());
      issue("gemm", &gemm_tile_call, cublas_, static_cast<int>(nt), static_cast<int>(M), static_cast<int>(d.k),
            static_cast<const float*>(buf.data_as<float>()), xin, beta, out.data_as<float>() + n0, static_cast<int>(d.n));
    }
  }
  static void gemm_tile_call(cublasHandle_t h, int n, int m, int k, const float* w, const float* x, float beta,
                             float* out, int ldc) {
    const float alpha = 1.f;
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F, k, &beta,
                              out, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
  }
  static cuda::QuantDesc quant_desc(const Weight& w) {
    KVPR_CHECK(w.rank() == 2, "a quantized GEMM of ", w.describe(), ", not a matrix");
    cuda::QuantDesc d{};
    d.codes = w.codes.data_as<uint8_t>();
    d.scales = w.scales.data_as<float>();
    d.zeros = w.zeros.defined() ? w.zeros.data() : nullptr;
    d.zeros_i32 = w.zeros.defined() && w.zeros.dtype() == DType::I32;
    d.order = w.order.defined() ? w.order.data_as<int32_t>() : nullptr;
    d.n = w.dim(0), d.k = w.dim(1), d.row_bytes = w.codes.dim(-1);
    d.block_n = w.block_n, d.block_k = w.block_k, d.cols = w.scale_cols();
    d.format = w.format == WeightFormat::Int4 ? 1 : w.format == WeightFormat::Int8 ? 2 : w.format == WeightFormat::Fp8 ? 3 : 4;
    d.middle = static_cast<float>(weight_middle_code(w.format));
    return d;
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    check_f32(out, "add output");
    check_f32(a, "add input");
    check_f32(b, "add input");
    KVPR_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add: shapes ", out.describe(), " ",
               a.describe(), " ", b.describe());
    Traced t(*this, Stream::Compute, "add", 0, 0);
    issue("add", &cuda::add, out.data_as<float>(), a.data_as<float>(), b.data_as<float>(), out.numel(), compute());
  }

  void convert(const Tensor& dst, const Tensor& src) override {
    KVPR_CHECK(dst.numel() == src.numel(), "convert: sizes ", dst.describe(), " ", src.describe());
    if (dst.dtype() == src.dtype()) {
      copy(dst, src, Stream::Compute, "convert");
      return;
    }
    Traced t(*this, Stream::Compute, "convert", 0, 0);
    issue("convert", &cuda::convert, dst.data(), dst.dtype(), src.data(), src.dtype(), src.numel(), compute());
  }

  void copy_rows(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) override {
    check_row_spans(dst, src, spans);
    int64_t rows = 0;
    const std::vector<cuda::SpanDesc> descs = cuda::span_descs(spans, &rows);
    if (rows == 0) return;
    Traced t(*this, Stream::Compute, "copy_rows",
             static_cast<size_t>(rows * src.dim(1)) * (dtype_size(src.dtype()) + dtype_size(dst.dtype())), 0);
    const void* d = upload_small(descs.data(), descs.size() * sizeof(cuda::SpanDesc));
    issue("copy_rows", &cuda::copy_rows, dst.data(), dst.dtype(), src.data(), src.dtype(),
          static_cast<const cuda::SpanDesc*>(d), static_cast<int64_t>(descs.size()), rows, src.dim(1), compute());
  }

  void fill_random(const Tensor& t, uint64_t seed, float mean, float stddev) override {
    KVPR_CHECK(is_storage_float(t.dtype()), "fill_random needs a float tensor, got ", t.describe());
    issue("fill_random", &cuda::fill_random, t.data(), t.dtype(), t.numel(), seed, mean, stddev, compute());
  }

  void argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) override {
    const int64_t R = check_argmax_lse(ids, stats, logits, valid), V = logits.dim(-1);
    Traced t(*this, Stream::Compute, "argmax_lse", logits.nbytes(), 0);
    issue("argmax_lse", &cuda::argmax_lse, ids.data_as<int32_t>(), stats.data_as<float>(), logits.data_as<float>(), R,
          V, valid, compute());
  }

  void attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads,
                 const AttentionParams& params) override {
    check_attention_params(params, heads);
    check_f32(out, "attention output");
    check_f32(q, "attention query");
    const cuda::AttnBatch ab = cuda::describe_attention(q, seqs, heads);
    if (ab.descs.empty()) return;
    const int64_t hd = ab.head_dim;
    Traced t(*this, Stream::Compute, "attention", ab.kv_bytes, 0);
    const std::vector<char> up = ab.upload();
    const void* dd = upload_small(up.data(), up.size());
    const int64_t n = static_cast<int64_t>(ab.descs.size());
    const void* tiles = nullptr;
    int64_t n_tiles = 0;
    if (!ab.all_decode && hd <= 128) {
      std::vector<cuda::AttnTile> tv = cuda::attention_tiles(ab.descs.data(), n);
      n_tiles = static_cast<int64_t>(tv.size());
      tiles = upload_small(tv.data(), tv.size() * sizeof(cuda::AttnTile));
    }
    float* work = nullptr;
    if (ab.all_decode) {
      int64_t wf = cuda::attention_work_floats(n, ab.max_ctx, heads, static_cast<int>(hd));
      work = scratch_named(work_buf_, DType::F32, wf).data_as<float>();
    }
    issue("attention", &cuda::attention, out.data_as<float>(), q.data_as<float>(),
          static_cast<const cuda::AttnDesc*>(dd), n, ab.total_q, ab.max_ctx, ab.max_q, ab.all_decode, heads,
          ab.kv_heads, static_cast<int>(hd), ab.kv_dtype, params.scale, params.softcap, params.window,
          params.sinks.defined() ? params.sinks.data_as<float>() : nullptr, work, ab.aligned,
          static_cast<const cuda::AttnTile*>(tiles), n_tiles, sm_count_, compute());
  }

 private:
  // Records start/end events around an op or copy when a tracer is attached; resolved into
  // trace spans at synchronize().
  struct Traced {
    CudaBackend& b;
    bool on;
    size_t idx = 0;
    Traced(CudaBackend& be, Stream s, const char* what, size_t bytes, double flops)
        : b(be), on(be.tracer_ != nullptr && !be.rec_.on) {  // a recorded step is traced as one span
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

  // x as the GEMM reads it: in the weights' dtype, converted only when it is not already.
  const void* gemm_input(const Tensor& x, DType dt, int64_t n) {
    if (x.dtype() == dt) return x.data();
    Tensor xh = scratch(dt, n);
    issue("convert", &cuda::convert, xh.data(), dt, x.data(), x.dtype(), n, compute());
    return xh.data();
  }

  // Row-major out[b][M,N] = x[M,K] · w[b][N,K]ᵀ + beta · out[b] for each of B weight matrices
  // (x shared), as column-major outᵀ[N,M] = wᵀ[N,K] · xᵀ[K,M]: fp32 accumulation; fp16/bf16
  // weights take the activations rounded to their dtype.
  void gemm(const Tensor& out, const Tensor& x, const Tensor& w, int64_t B, int64_t M, int64_t N, int64_t K,
            float beta) {
    const void* xin = gemm_input(x, w.dtype(), M * K);
    issue("gemm", &gemm_call, cublas_, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), w.data(),
          cuda_type(w.dtype()), xin, beta, out.data(), cuda_type(out.dtype()), static_cast<int>(B));
  }
  static void gemm_call(cublasHandle_t h, int n, int m, int k, const void* w, cudaDataType_t wt, const void* x,
                        float beta, void* out, cudaDataType_t ot, int batch) {
    const float alpha = 1.f;
    if (batch == 1)
      CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, wt, k, x, wt, k, &beta, out, ot, n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else  // weights [batch, n, k] one after another, x shared (stride 0), out [batch, m, n]
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, wt, k,
                                              static_cast<long long>(n) * k, x, wt, k, 0, &beta, out, ot, n,
                                              static_cast<long long>(m) * n, batch, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
  }
  static void copy_call(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  }
  // out = act(out + bias) over B×M rows of N, when there is a bias or an activation.
  void bias_act(const Tensor& out, const Tensor& bias, Activation act, int64_t B, int64_t M, int64_t N) {
    KVPR_CHECK(act != Activation::ClampedSwiGLU, "linear: clamped_swiglu is a gate (gated_mul), not an activation");
    const int a = cuda::activation_code(act);
    if (!bias.defined() && !a) return;
    issue("bias_act", &cuda::bias_act, out.data(), out.dtype(), bias.defined() ? bias.data() : nullptr,
          bias.defined() ? bias.dtype() : DType::F32, B, M, N, a, compute());
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
    issue(what, &cuda::gather_rows, out.data_as<float>(), table.data(), table.dtype(), ids.data_as<int32_t>(),
          table.dim(0), ids.numel(), out.dim(1), accumulate, compute());
  }

  // Small per-call parameters (attention descriptors, copy_rows spans) go up through a ring of
  // pinned staging slots: an upload from pageable memory may make the host wait for the compute
  // stream, which would stall the layer loop the runtime keeps ahead of the device. A slot is
  // reused once its copy has run (its event). The ring holds a whole decode step's uploads
  // (up to 4 per layer with KVPR, 128 layers), so reusing a slot never makes the host wait
  // inside a step: with 32 slots a 7-layer KVPR step already waited 3 times (found on the
  // emulated device). 2 MiB of pinned and of device memory in all.
  const void* upload_small(const void* src, size_t bytes) {
    if (rec_.on) {
      if (const void* d = record_upload(src, bytes)) return d;
      interrupt();
    }
    return upload(src, bytes, nullptr);
  }
  // Copies `bytes` from the host through a ring slot to `dst` (nullptr: the slot's own device
  // room) on the compute stream; returns the device address.
  const void* upload(const void* src, size_t bytes, void* dst) {
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
      // A large upload (a big prefill's tiles, a graph step's parameters): the slot's own
      // buffers, grown as needed.
      if (!st.host.defined() || st.host.nbytes() < bytes) {
        const int64_t cap = static_cast<int64_t>(bytes * 2);
        st.host = Tensor();
        st.host = cuda_pinned(cap);
        st.dev = Tensor();
      }
      if (!dst && (!st.dev.defined() || st.dev.nbytes() < bytes))
        st.dev = alloc(DType::U8, {st.host.numel()});  // the old one is freed only after the device is idle
      h = static_cast<char*>(st.host.data());
      d = st.dev.defined() ? static_cast<char*>(st.dev.data()) : nullptr;
    }
    if (dst) d = static_cast<char*>(dst);
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
    st->release = [gate = gate_](void* q) { gate->release([q] { cudaFreeHost(q); }); };
    return Tensor(std::move(st), 0, DType::U8, {bytes});
  }

  // ---- graph steps (Backend::begin_graph_step) ----
  // While a step is recorded, every op's launch goes through issue(): the launch function and
  // all its arguments (pointers, sizes, dtypes, launch shapes: every value the launch depends
  // on) are kept, and appended to the step's key. Small parameters the ops upload (attention
  // descriptors, copy_rows spans, token ids) go to one device area, uploaded before the step
  // runs; only their contents differ between steps whose keys are equal.
  struct Recording {
    bool open = false;  // between begin_graph_step and end_graph_step
    bool on = false;    // recording (not interrupted)
    std::vector<std::function<void()>> cmds;
    std::string key;
    std::vector<char> args;  // parameter bytes for graph_args_
    int64_t ops = 0;
  };
  struct CachedGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;
  };

  template <typename T>
  struct Same {  // std::type_identity (C++20; CUDA sources are C++17): P from f only
    using type = T;
  };
  template <typename... P>
  void issue(const char* tag, void (*f)(P...), typename Same<P>::type... args) {
    if (!rec_.on) {
      f(args...);
      return;
    }
    key_bytes(tag, std::strlen(tag) + 1);
    const auto fn = reinterpret_cast<uintptr_t>(f);
    key_bytes(&fn, sizeof fn);
    (key_value(args), ...);
    rec_.cmds.push_back([f, args...] { f(args...); });
    ++rec_.ops;
  }
  template <typename T>
  void key_value(const T& v) {
    static_assert(std::is_scalar_v<T>, "a recorded launch's arguments are scalars: pointers, sizes, enums");
    key_bytes(&v, sizeof v);
  }
  void key_value(const RopeParams& r) {  // a struct of scalars, field by field
    for (float f : {r.theta, r.freq_scale, r.llama3_factor, r.low_freq_factor, r.high_freq_factor,
                    r.original_max_position, r.yarn_factor, r.yarn_low, r.yarn_high, r.attention_scale})
      key_value(f);
    key_value(r.rotary_dim);
    key_value(r.longrope_pairs);
    for (int i = 0; i < r.longrope_pairs; ++i) key_value(r.longrope[0][i]), key_value(r.longrope[1][i]);
  }
  void key_value(const cuda::QuantDesc& d) {  // field by field
    for (const void* p : {static_cast<const void*>(d.codes), static_cast<const void*>(d.scales), d.zeros,
                          static_cast<const void*>(d.order)})
      key_value(p);
    for (int64_t v : {d.n, d.k, d.row_bytes, d.block_n, d.block_k, d.cols}) key_value(v);
    key_value(d.format), key_value(d.zeros_i32), key_value(d.middle);
  }
  void key_bytes(const void* p, size_t n) { rec_.key.append(static_cast<const char*>(p), n); }

  // The device address `bytes` of parameters will have when the recorded step runs, or null
  // when the step's parameter area is full.
  const void* record_upload(const void* src, size_t bytes) {
    const size_t off = (rec_.args.size() + 15) / 16 * 16;
    if (off + bytes > kGraphArgBytes) return nullptr;
    if (!graph_args_.defined()) graph_args_ = alloc(DType::U8, {static_cast<int64_t>(kGraphArgBytes)});
    rec_.args.resize(off + bytes);
    std::memcpy(rec_.args.data() + off, src, bytes);
    return static_cast<char*>(graph_args_.data()) + off;
  }
  void upload_args() {
    if (!rec_.args.empty()) upload(rec_.args.data(), rec_.args.size(), graph_args_.data());
  }
  void run_recorded() {
    for (auto& c : rec_.cmds) c();
  }
  // A call a graph cannot hold: what was recorded is issued op by op, the rest of the step too.
  void interrupt() {
    rec_.on = false;
    upload_args();
    run_recorded();
    rec_.cmds.clear();
    rec_.args.clear();
  }

 public:
  void begin_graph_step() override {
    KVPR_CHECK(!rec_.open, "begin_graph_step: a graph step is already open");
    rec_ = Recording{};
    rec_.open = rec_.on = true;
    gate_->hold();
  }

  GraphStep end_graph_step() override {
    GraphStep r;
    if (!rec_.open) return r;
    struct OpenGate {  // memory released during the step is freed once its work is issued
      FreeGate& g;
      ~OpenGate() { g.open(); }
    } open_gate{*gate_};
    rec_.open = false;
    r.ops = rec_.ops;
    if (!rec_.on) {
      r.outcome = GraphOutcome::Interrupted;
      ++counters_.interrupted;
      return r;
    }
    rec_.on = false;
    auto it = graphs_.find(rec_.key);
    r.outcome = it != graphs_.end()                                   ? GraphOutcome::Replayed
                : rec_.key == last_key_ && !uncapturable_.count(rec_.key) ? GraphOutcome::Captured
                                                                      : GraphOutcome::Eager;
    const std::string span = std::string("step (") + graph_outcome_name(r.outcome) + ", " + std::to_string(r.ops) + " ops)";
    Traced t(*this, Stream::Compute, span.c_str(), 0, 0);
    upload_args();  // before the step's work, on the same stream
    if (r.outcome == GraphOutcome::Captured) {
      cudaGraphExec_t exec = capture(&r.capture_error);
      if (exec) {
        evict_graphs();
        it = graphs_.emplace(rec_.key, CachedGraph{exec, 0}).first;
      } else {
        ++counters_.capture_failed;
        uncapturable_.insert(rec_.key);
        r.outcome = GraphOutcome::Eager;
      }
    }
    if (r.outcome == GraphOutcome::Eager) {
      run_recorded();
      ++counters_.eager;
      last_key_ = std::move(rec_.key);
    } else {
      it->second.used = ++graph_clock_;
      CUDA_CHECK(cudaGraphLaunch(it->second.exec, compute()));
      ++(r.outcome == GraphOutcome::Replayed ? counters_.replayed : counters_.captured);
    }
    rec_.cmds.clear();
    return r;
  }

  GraphCounters graph_counters() const override { return counters_; }

 private:
  // The recorded step as an executable graph, or null (with the reason) when CUDA refused to
  // capture it; nothing has run then, and the caller issues the step op by op.
  cudaGraphExec_t capture(std::string* error) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    try {
      CUDA_CHECK(cudaStreamBeginCapture(compute(), cudaStreamCaptureModeThreadLocal));
      try {
        run_recorded();
      } catch (...) {
        cudaStreamEndCapture(compute(), &g);
        throw;
      }
      CUDA_CHECK(cudaStreamEndCapture(compute(), &g));
      CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    } catch (const std::exception& e) {
      *error = e.what();
      exec = nullptr;
    }
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // a refused capture is reported through *error
    return exec;
  }
  void evict_graphs() {
    while (graphs_.size() >= kMaxGraphs) {
      auto lru = std::min_element(graphs_.begin(), graphs_.end(),
                                  [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      CUDA_CHECK(cudaGraphExecDestroy(lru->second.exec));  // one in flight is freed when it completes
      graphs_.erase(lru);
    }
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
  size_t max_pitch_ = 0;  // the largest pitch of a 2-D copy (cudaDeviceProp::memPitch)
  int sm_count_ = 1;      // streaming multiprocessors (decode attention's split count)
  bool batch_copies_ = true;  // cudaMemcpyBatchAsync works (CUDA 13 runtime and driver)
  cudaStream_t streams_[3] = {nullptr, nullptr, nullptr};
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<std::atomic<size_t>> in_use_ = std::make_shared<std::atomic<size_t>>(0);
  Tensor gemm_buf_, work_buf_;
  Tensor quant_x_buf_, quant_out_buf_, quant_order_buf_, quant_tile_buf_;  // the quantized GEMMs
  static constexpr size_t kStagingSlotBytes = 4096;
  std::array<Staging, 512> staging_;
  Tensor ring_host_, ring_dev_;  // kStagingSlotBytes per slot
  size_t staging_next_ = 0;
  static constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
  Tensor cublas_workspace_;
  // Graph steps. Parameters of a decode step: about 6 KB a layer at batch 64.
  static constexpr size_t kGraphArgBytes = size_t{4} << 20;
  static constexpr size_t kMaxGraphs = 32;  // batch sizes × context classes a server meets
  std::shared_ptr<FreeGate> gate_ = std::make_shared<FreeGate>();
  Recording rec_;
  Tensor graph_args_;
  std::map<std::string, CachedGraph> graphs_;
  std::set<std::string> uncapturable_;
  std::string last_key_;  // of the last step issued op by op
  uint64_t graph_clock_ = 0;
  GraphCounters counters_;
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
