#include "engine/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/vec.h"
#include "engine/base/error.h"
#include "engine/backend/argmax_lse.h"
#include "engine/base/thread_pool.h"

#ifdef KVPR_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace kvpr {

namespace {

using cpu::BF16Tag;
using cpu::F16Tag;
using cpu::F32Tag;
using cpu::dispatch_float;

void check_f32(const Tensor& t, const char* what) {
  KVPR_CHECK(t.dtype() == DType::F32, what, " must be F32, got ", t.describe());
}

// Completion of a point in a stream, with the time it completed.
struct CpuEvent : Event::Impl {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::chrono::steady_clock::time_point when;
  void complete() {
    std::lock_guard<std::mutex> lock(mu);
    when = std::chrono::steady_clock::now();
    done = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

CpuEvent& cpu_event(const Event& e) {
  auto* impl = dynamic_cast<CpuEvent*>(e.impl());
  KVPR_CHECK(impl, "event does not belong to the CPU backend");
  return *impl;
}

float apply_act(float v, Activation act) {
  switch (act) {
    case Activation::None: return v;
    case Activation::ReLU: return v > 0.f ? v : 0.f;
    case Activation::GELU: return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
    case Activation::GELUTanh: return 0.5f * v * (1.f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case Activation::SiLU: return v / (1.f + std::exp(-v));
    case Activation::ClampedSwiGLU: break;  // gated_mul's, with its up
  }
  return v;
}

// The linear's epilogue on out [M, N]: + bias (when defined), then the activation.
void add_bias_activate(float* op, int64_t M, int64_t N, const Tensor& bias, Activation act, ThreadPool& pool) {
  KVPR_CHECK(act != Activation::ClampedSwiGLU, "linear: clamped_swiglu is a gate (gated_mul), not an activation");
  std::vector<float> bv(bias.defined() ? N : 0);
  for (int64_t n = 0; n < static_cast<int64_t>(bv.size()); ++n) bv[n] = load_as_f32(bias.data(), bias.dtype(), n);
  pool.parallel_for(M, 4, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      float* row = op + m * N;
      if (!bv.empty())
        for (int64_t n = 0; n < N; ++n) row[n] += bv[n];
      if (act != Activation::None)
        for (int64_t n = 0; n < N; ++n) row[n] = apply_act(row[n], act);
    }
  });
}

}  // namespace

CopyEngine::CopyEngine() : thread_([this] { loop(); }) {}

CopyEngine::~CopyEngine() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CopyEngine::push(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void CopyEngine::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void CopyEngine::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop requested and nothing left
    auto task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    task();
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

CpuBackend::CpuBackend() : bytes_in_use_(std::make_shared<std::atomic<size_t>>(0)) {
#ifdef KVPR_HAVE_OPENBLAS
  // OpenBLAS uses its own threads for large GEMMs; keep it to our thread count.
  openblas_set_num_threads(ThreadPool::global().size());
#endif
}

CpuBackend::~CpuBackend() { synchronize(); }

Tensor CpuBackend::alloc(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto st = zeroed_host_storage(bytes, MemoryKind::Device, "a CPU backend tensor");
  auto counter = bytes_in_use_;
  counter->fetch_add(bytes);
  st->release = [counter, bytes](void* p) {
    counter->fetch_sub(bytes);
    std::free(p);
  };
  return Tensor(std::move(st), 0, dtype, std::move(shape));
}

// On the CPU backend every host buffer can be copied asynchronously; "pinned" is a label.
Tensor CpuBackend::alloc_pinned(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (host_allocator_ && bytes > 0) {
    auto st = std::make_shared<Storage>();
    st->data = host_allocator_->allocate(bytes);
    st->bytes = bytes;
    st->kind = MemoryKind::PinnedHost;
    st->release = [a = host_allocator_, bytes](void* p) { a->deallocate(p, bytes); };
    return Tensor(std::move(st), 0, dtype, std::move(shape));
  }
  auto st = zeroed_host_storage(bytes, MemoryKind::PinnedHost, "a pinned host tensor");
  return Tensor(std::move(st), 0, dtype, std::move(shape));
}

void CpuBackend::trace_op(const char* op, double t0, json::Value args) {
  if (!tracer_) return;
  std::string name = trace_label_.empty() ? op : trace_label_ + " " + op;
  tracer_->span("compute", name, t0, tracer_->now_us(), std::move(args));
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src, Stream s, const char* what) {
  KVPR_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy from ",
             src.describe(), " to ", dst.describe(), ": dtype or size differ");
  if (s == Stream::Compute) {
    double t0 = tracer_ ? tracer_->now_us() : 0;
    if (dst.data() != src.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    if (tracer_) trace_op(what, t0, json::Object{{"bytes", json::Value(static_cast<int64_t>(src.nbytes()))}});
    return;
  }
  std::string name = trace_label_.empty() ? what : trace_label_ + " " + what;
  engine(s).push([this, dst, src, s, name] {
    Tracer* tr = tracer_;
    double t0 = tr ? tr->now_us() : 0;
    const auto start = std::chrono::steady_clock::now();
    if (dst.data() != src.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    pace_link(s, src.nbytes(), start);
    if (tr)
      tr->span(stream_name(s), name, t0, tr->now_us(),
               json::Object{{"bytes", json::Value(static_cast<int64_t>(src.nbytes()))}});
  });
}

void CpuBackend::pace_link(Stream s, size_t bytes, std::chrono::steady_clock::time_point start) {
  const double gbps = link_gbps_.load();
  if (gbps <= 0) return;
  // Pace like a link: this copy ends bytes/rate after it could start (the engine reached it and
  // the link was free). Sleeping stops short and the last stretch is spun, so a queue of small
  // copies keeps the rate.
  using namespace std::chrono;
  auto& busy = link_free_at_[s == Stream::H2D ? 0 : 1];
  auto begin = std::max(start, busy);
  auto target = begin + duration_cast<steady_clock::duration>(duration<double>(static_cast<double>(bytes) / (gbps * 1e9)));
  busy = target;
  if (target - steady_clock::now() > microseconds(200)) std::this_thread::sleep_until(target - microseconds(100));
  while (steady_clock::now() < target) {
  }
}

void CpuBackend::copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans, Stream s,
                            const char* what) {
  if (s == Stream::Compute) return Backend::copy_spans(dst, src, spans, s, what);
  check_copy_spans(dst, src, spans);
  const size_t row_bytes = static_cast<size_t>(src.dim(1)) * dtype_size(src.dtype());
  size_t bytes = 0;
  for (const RowSpan& r : spans) bytes += static_cast<size_t>(r.count) * row_bytes;
  if (bytes == 0) return;
  std::string name = trace_label_.empty() ? what : trace_label_ + " " + what;
  engine(s).push([this, dst, src, spans, s, name, row_bytes, bytes] {
    Tracer* tr = tracer_;
    double t0 = tr ? tr->now_us() : 0;
    const auto start = std::chrono::steady_clock::now();
    char* d = static_cast<char*>(dst.data());
    const char* from = static_cast<const char*>(src.data());
    for (const RowSpan& r : spans)
      if (r.count > 0)
        std::memmove(d + static_cast<size_t>(r.dst_row) * row_bytes, from + static_cast<size_t>(r.src_row) * row_bytes,
                     static_cast<size_t>(r.count) * row_bytes);
    pace_link(s, bytes, start);
    if (tr) tr->span(stream_name(s), name, t0, tr->now_us(), json::Object{{"bytes", json::Value(static_cast<int64_t>(bytes))}});
  });
}

Event CpuBackend::record(Stream s) {
  auto ev = std::make_shared<CpuEvent>();
  if (s == Stream::Compute) ev->complete();  // compute work runs synchronously
  else engine(s).push([ev] { ev->complete(); });
  return Event(ev);
}

void CpuBackend::wait(Stream s, const Event& e) {
  CpuEvent& ev = cpu_event(e);
  if (s == Stream::Compute) {
    ev.wait();  // the compute stream is this thread
    return;
  }
  auto keep = e;
  engine(s).push([keep] { cpu_event(keep).wait(); });
}

void CpuBackend::synchronize(const Event& e) { cpu_event(e).wait(); }

void CpuBackend::synchronize() {
  h2d_.drain();
  d2h_.drain();
}

double CpuBackend::elapsed_ms(const Event& start, const Event& end) {
  CpuEvent& a = cpu_event(start);
  CpuEvent& b = cpu_event(end);
  a.wait();
  b.wait();
  return std::chrono::duration<double, std::milli>(b.when - a.when).count();
}

namespace {

// out[i] = table[ids[i]] (add: out[i] += table[ids[i]]), any float table, F32 out.
void gather_rows_into(const Tensor& out, const Tensor& table, const Tensor& ids, bool add, const char* what) {
  check_f32(out, add ? "add_gathered_rows output" : "gather_rows output");
  KVPR_CHECK(ids.dtype() == DType::I32 && ids.numel() == out.dim(0) && table.dim(1) == out.dim(1), what,
             ": shapes ", out.describe(), " ", table.describe(), " ", ids.describe());
  const int64_t d = out.dim(1), rows = table.dim(0);
  const int32_t* id = ids.data_as<int32_t>();
  float* o = out.data_as<float>();
  dispatch_float(table.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::T;
    const T* tab = table.data_as<T>();
    ThreadPool::global().parallel_for(out.dim(0), 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t r = id[i];
        if (r < 0 || r >= rows) r = 0;  // ids are validated by the caller; never read out of bounds
        if (add) cpu::axpy<decltype(tag)>(o + i * d, 1.f, tab + r * d, d);
        else cpu::to_f32<decltype(tag)>(o + i * d, tab + r * d, d);
      }
    });
  });
}

}  // namespace

void CpuBackend::gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  gather_rows_into(out, table, ids, false, "gather_rows");
  if (tracer_) trace_op("gather_rows", trace_t0, json::Value());
}

void CpuBackend::add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) {
  gather_rows_into(out, table, ids, true, "add_gathered_rows");
}

void CpuBackend::scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_scatter_add_rows(out, src, ids, scales);
  const int64_t d = out.dim(1), rows = out.dim(0);
  const int32_t* id = ids.data_as<int32_t>();
  const float* sc = scales.data_as<float>();
  const float* in = src.data_as<float>();
  float* o = out.data_as<float>();
  ThreadPool::global().parallel_for(src.dim(0), 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = id[i];
      if (r < 0 || r >= rows) continue;  // ids are validated by the caller; never write out of bounds
      cpu::axpy<cpu::F32Tag>(o + r * d, sc[i], in + i * d, d);
    }
  });
  if (tracer_) trace_op("scatter_add_rows", trace_t0, json::Value());
}

void CpuBackend::layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, float eps) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_f32(out, "layer_norm output");
  check_f32(x, "layer_norm input");
  const int64_t d = x.dim(-1), n = x.numel() / d;
  KVPR_CHECK(out.numel() == x.numel() && gamma.numel() == d && beta.numel() == d,
             "layer_norm: shapes ", out.describe(), " ", x.describe(), " ", gamma.describe(), " ",
             beta.describe());
  std::vector<float> g(d), bt(d);
  for (int64_t j = 0; j < d; ++j) {
    g[j] = load_as_f32(gamma.data(), gamma.dtype(), j);
    bt[j] = load_as_f32(beta.data(), beta.dtype(), j);
  }
  const float* xi = x.data_as<float>();
  float* o = out.data_as<float>();
  ThreadPool::global().parallel_for(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = xi + r * d;
      double mean = 0;
      for (int64_t j = 0; j < d; ++j) mean += row[j];
      mean /= static_cast<double>(d);
      double var = 0;
      for (int64_t j = 0; j < d; ++j) {
        double c = row[j] - mean;
        var += c * c;
      }
      var /= static_cast<double>(d);
      float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
      float m = static_cast<float>(mean);
      float* orow = o + r * d;
      for (int64_t j = 0; j < d; ++j) orow[j] = (row[j] - m) * inv * g[j] + bt[j];
    }
  });
  if (tracer_) trace_op("layer_norm", trace_t0, json::Value());
}

void CpuBackend::rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, float eps) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_rms_norm(out, x, gamma);
  const int64_t d = x.dim(-1), n = x.numel() / d;
  std::vector<float> g(d);
  for (int64_t j = 0; j < d; ++j) g[j] = load_as_f32(gamma.data(), gamma.dtype(), j);
  const float* xi = x.data_as<float>();
  float* o = out.data_as<float>();
  ThreadPool::global().parallel_for(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = xi + r * d;
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(row[j]) * row[j];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      float* orow = o + r * d;
      for (int64_t j = 0; j < d; ++j) orow[j] = row[j] * inv * g[j];
    }
  });
  if (tracer_) trace_op("rms_norm", trace_t0, json::Value());
}

void CpuBackend::rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  const int64_t T = check_rope(x, positions, head_dim, params), W = x.dim(-1), rows = x.numel() / W;
  const int dims = rope_dims(head_dim, params), half = dims / 2;
  const int32_t* pos = positions.data_as<int32_t>();
  float* xp = x.data_as<float>();
  ThreadPool::global().parallel_for(rows, 4, [&](int64_t b, int64_t e) {
    std::vector<float> c(half), s(half);
    for (int64_t r = b; r < e; ++r) {
      for (int i = 0; i < half; ++i) {
        const double a = rope_angle(pos[r % T], i, dims, params);
        c[i] = static_cast<float>(std::cos(a)) * params.attention_scale;
        s[i] = static_cast<float>(std::sin(a)) * params.attention_scale;
      }
      for (int64_t h0 = 0; h0 < W; h0 += head_dim) {
        float* v = xp + r * W + h0;
        for (int i = 0; i < half; ++i) {
          const float lo = v[i], hi = v[i + half];
          v[i] = lo * c[i] - hi * s[i];
          v[i + half] = hi * c[i] + lo * s[i];
        }
      }
    }
  });
  if (tracer_) trace_op("rope", trace_t0, json::Value());
}

void CpuBackend::gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_gated_mul(out, gate, up, act);
  float* o = out.data_as<float>();
  const float* g = gate.data_as<float>();
  const float* u = up.data_as<float>();
  ThreadPool::global().parallel_for(out.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    if (act == Activation::SiLU) {  // the common case, without the switch per element
      for (int64_t i = s; i < e; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    } else if (act == Activation::ClampedSwiGLU) {
      for (int64_t i = s; i < e; ++i) {
        const float x = std::min(g[i], 7.f), y = std::clamp(u[i], -7.f, 7.f);
        o[i] = (y + 1.f) * (x / (1.f + std::exp(-1.702f * x)));
      }
    } else
      for (int64_t i = s; i < e; ++i) o[i] = apply_act(g[i], act) * u[i];
  });
  if (tracer_) trace_op("gated_mul", trace_t0, json::Value());
}

void CpuBackend::scale(const Tensor& out, const Tensor& x, float factor, float cap) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_scale(out, x, cap);
  float* o = out.data_as<float>();
  const float* v = x.data_as<float>();
  ThreadPool::global().parallel_for(out.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    if (cap > 0)
      for (int64_t i = s; i < e; ++i) o[i] = cap * std::tanh(factor * v[i] / cap);
    else
      for (int64_t i = s; i < e; ++i) o[i] = factor * v[i];
  });
  if (tracer_) trace_op("scale", trace_t0, json::Value());
}

void CpuBackend::linear(const Tensor& out, const Tensor& x, const Weight& weight, const Tensor& bias,
                        Activation act) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  const auto [M, N, K] = check_linear(out, x, weight, bias, "linear");
  const float* xp = x.data_as<float>();
  float* op = out.data_as<float>();
  ThreadPool& pool = ThreadPool::global();
  const Tensor& w = weight.codes;
  weight_bytes_read_ += static_cast<double>(weight.nbytes());

  bool done = weight.quantized();
  if (done) cpu::quantized_linear(op, xp, M, weight, quantized_scratch_);
#ifdef KVPR_HAVE_OPENBLAS
  // Few rows (decode): one pass over the weight in its own dtype, memory-bound (below).
  constexpr int64_t kSmallM = 8;
  if (!done && M > kSmallM) {
    const float* wf = nullptr;
    if (w.dtype() == DType::F32) {
      wf = w.data_as<float>();
    } else {
      if (!weight_scratch_.defined() || weight_scratch_.numel() < w.numel())
        weight_scratch_ = Tensor::host(DType::F32, {w.numel()});
      float* s = weight_scratch_.data_as<float>();
      dispatch_float(w.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::T;
        const T* wp = w.data_as<T>();
        pool.parallel_for(N, 64, [&](int64_t b, int64_t e) {
          cpu::to_f32<decltype(tag)>(s + b * K, wp + b * K, (e - b) * K);
        });
      });
      wf = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.f, xp, static_cast<int>(K), wf, static_cast<int>(K), 0.f, op,
                static_cast<int>(N));
    done = true;
  }
#endif
  if (!done) {
    // Dot-product kernel, tiled over rows of x so a tile stays in cache while the weight streams.
    dispatch_float(w.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::T;
      const T* wp = w.data_as<T>();
      // Blocks of 4 weight rows: each block is widened to fp32 once (for F16/BF16) and
      // multiplied with all rows of x in a register tile.
      const int64_t blocks = (N + 3) / 4;
      pool.parallel_for(blocks, 4, [&](int64_t b, int64_t e) {
        std::vector<float> wbuf(w.dtype() == DType::F32 ? 0 : 4 * K);
        for (int64_t blk = b; blk < e; ++blk) {
          const int64_t n0 = blk * 4, nn = std::min<int64_t>(4, N - n0);
          if (nn < 4 || M == 1) {  // one row or tail rows: plain dots on the stored dtype
            for (int64_t n = n0; n < n0 + nn; ++n)
              for (int64_t m = 0; m < M; ++m) op[m * N + n] = cpu::dot<decltype(tag)>(xp + m * K, wp + n * K, K);
            continue;
          }
          const float* rows[4];
          for (int j = 0; j < 4; ++j) {
            if constexpr (std::is_same_v<decltype(tag), F32Tag>) {
              rows[j] = wp + (n0 + j) * K;
            } else {
              cpu::to_f32<decltype(tag)>(wbuf.data() + j * K, wp + (n0 + j) * K, K);
              rows[j] = wbuf.data() + j * K;
            }
          }
          cpu::dot_4xm(xp, 0, M, rows[0], rows[1], rows[2], rows[3], K, op, N, n0);
        }
      });
    });
  }
  if (bias.defined() || act != Activation::None) add_bias_activate(op, M, N, bias, act, pool);
  if (tracer_)
    trace_op("linear", trace_t0,
             json::Object{{"flops", json::Value(2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K))},
                          {"weight_bytes", json::Value(static_cast<double>(weight.nbytes()))},
                          {"shape", json::Value(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K))}});
}

void CpuBackend::linear_batched(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias,
                                Activation act) {
  KVPR_CHECK(w.rank() == 3 && out.rank() == 3 && out.dim(0) == w.dim(0) && (!bias.defined() || bias.rank() == 2),
             "linear_batched: shapes x ", x.describe(), " w ", w.describe(), " out ", out.describe());
  check_linear_batched_dtypes(out, x, w);
  const int64_t B = w.dim(0), N = w.dim(1);
  // X from the KV store (fp16, fp8) is widened once; an fp16 output is rounded once, after the
  // bias, from the fp32 product.
  Tensor xf = x, of = out;
  if (x.dtype() != DType::F32) {
    xf = Tensor::host(DType::F32, x.shape());
    convert(xf, x);
  }
  if (out.dtype() != DType::F32) of = Tensor::host(DType::F32, out.shape());
  for (int64_t b = 0; b < B; ++b)
    linear(of.rows(b, 1).reshape({of.dim(1), of.dim(2)}), xf, w.item(b),
           bias.defined() ? bias.rows(b, 1).reshape({N}) : Tensor(), act);
  if (of.data() != out.data()) convert(out, of);
}

void CpuBackend::linear_accumulate(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias) {
  const auto [M, N, K] = check_linear(out, x, w, bias, "linear_accumulate");
  (void)K;
  if (!accumulate_scratch_.defined() || accumulate_scratch_.numel() < M * N)
    accumulate_scratch_ = Tensor::host(DType::F32, {std::max<int64_t>(M * N, 1)});
  Tensor t = accumulate_scratch_.view_as(DType::F32, {M, N});
  linear(t, x, w, bias, Activation::None);
  add(out, out, t);
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  check_f32(out, "add output");
  check_f32(a, "add input");
  check_f32(b, "add input");
  KVPR_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add: shapes ", out.describe(), " ",
             a.describe(), " ", b.describe());
  float* o = out.data_as<float>();
  const float* ap = a.data_as<float>();
  const float* bp = b.data_as<float>();
  ThreadPool::global().parallel_for(out.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) o[i] = ap[i] + bp[i];
  });
  if (tracer_) trace_op("add", trace_t0, json::Value());
}

void CpuBackend::argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) {
  const double trace_t0 = tracer_ ? tracer_->now_us() : 0;
  const int64_t R = check_argmax_lse(ids, stats, logits, valid), V = logits.dim(-1);
  const float* lp = logits.data_as<float>();
  int32_t* ip = ids.data_as<int32_t>();
  float* sp = stats.data_as<float>();
  ThreadPool& pool = ThreadPool::global();
  auto put = [&](int64_t r, const RowStats& st) {
    ip[r] = st.token;
    sp[2 * r] = st.max;
    sp[2 * r + 1] = static_cast<float>(st.lse);
  };
  if (R >= pool.size()) {
    pool.parallel_for(R, 1, [&](int64_t s, int64_t e) {
      for (int64_t r = s; r < e; ++r) put(r, row_argmax_lse(lp + r * V, valid));
    });
  } else {
    // Fewer rows than threads (a decode step's few): each row's ids in a part a thread, joined
    // in order (the first largest stays first) with the parts' sums rescaled to the row's max.
    const int64_t parts = pool.size();
    std::vector<RowStats> part(static_cast<size_t>(R * parts));
    pool.parallel_for(R * parts, 1, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const int64_t r = i / parts, b = i % parts * valid / parts, n = (i % parts + 1) * valid / parts - b;
        part[static_cast<size_t>(i)] = n > 0 ? row_argmax_lse(lp + r * V + b, static_cast<int32_t>(n))
                                             : RowStats{0, -std::numeric_limits<float>::infinity(), 0.0};  // (none: whole)
        part[static_cast<size_t>(i)].token += static_cast<int32_t>(b);
      }
    });
    for (int64_t r = 0; r < R; ++r) {
      const RowStats* p = part.data() + r * parts;
      RowStats best = p[0];
      bool whole = false;  // a part of no finite logit (masked ids, or NaN): the row's own definition
      for (int64_t j = 0; j < parts; ++j) {
        whole = whole || !(p[j].max > -std::numeric_limits<float>::infinity());
        if (p[j].max > best.max) best.token = p[j].token, best.max = p[j].max;
      }
      if (whole) {
        put(r, row_argmax_lse(lp + r * V, valid));
        continue;
      }
      double sum = 0;
      for (int64_t j = 0; j < parts; ++j) sum += std::exp(p[j].lse - best.max);
      best.lse = best.max + std::log(sum);
      put(r, best);
    }
  }
  if (tracer_) trace_op("argmax_lse", trace_t0, json::Value());
}

void CpuBackend::convert(const Tensor& dst, const Tensor& src) {
  KVPR_CHECK(dst.numel() == src.numel(), "convert: sizes ", dst.describe(), " ", src.describe());
  if (dst.dtype() == src.dtype()) {
    copy(dst, src, Stream::Compute);
    return;
  }
  ThreadPool::global().parallel_for(src.numel(), 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i)
      store_from_f32(dst.data(), dst.dtype(), i, load_as_f32(src.data(), src.dtype(), i));
  });
}

void CpuBackend::copy_rows(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) {
  check_row_spans(dst, src, spans);
  for (const RowSpan& s : spans)
    if (s.count > 0) convert(dst.rows(s.dst_row, s.count), src.rows(s.src_row, s.count));
}

void CpuBackend::fill_random(const Tensor& t, uint64_t seed, float mean, float stddev) {
  KVPR_CHECK(is_storage_float(t.dtype()), "fill_random needs a float tensor, got ", t.describe());
  ThreadPool::global().parallel_for(t.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      store_from_f32(t.data(), t.dtype(), i, mean + stddev * random_normal(seed, static_cast<uint64_t>(i)));
  });
}

void CpuBackend::attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs,
                           int heads, const AttentionParams& params) {
  double t0 = tracer_ ? tracer_->now_us() : 0;
  cpu_attention(out, q, seqs, heads, params, ThreadPool::global());
  if (tracer_) {
    int64_t bytes = 0;
    for (const auto& a : seqs) bytes += 2 * (a.past_len + a.q_len) * a.k.dim(1) * static_cast<int64_t>(dtype_size(a.k.dtype()));
    trace_op("attention", t0, json::Object{{"kv_bytes", json::Value(bytes)}});
  }
}

}  // namespace kvpr
