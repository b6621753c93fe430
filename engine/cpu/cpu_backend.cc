#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "engine/cpu/vec.h"
#include "engine/error.h"
#include "engine/thread_pool.h"

#ifdef KVPR_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace kvpr {

namespace {

using cpu::BF16Tag;
using cpu::F16Tag;
using cpu::F32Tag;

// Calls fn with the storage tag of a float dtype.
template <typename Fn>
void dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: fn(F32Tag{}); return;
    case DType::F16: fn(F16Tag{}); return;
    case DType::BF16: fn(BF16Tag{}); return;
    default: KVPR_THROW("expected a float tensor, got ", dtype_name(t));
  }
}

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
  }
  return v;
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

namespace {
std::shared_ptr<Storage> zeroed_storage(size_t bytes, MemoryKind kind, const std::string& what) {
  auto st = std::make_shared<Storage>();
  size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  st->data = std::aligned_alloc(64, rounded);
  KVPR_CHECK(st->data, "out of memory allocating ", bytes, " bytes for ", what);
  std::memset(st->data, 0, rounded);
  st->bytes = bytes;
  st->kind = kind;
  st->release = [](void* p) { std::free(p); };
  return st;
}
}  // namespace

Tensor CpuBackend::alloc(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto st = zeroed_storage(bytes, MemoryKind::Device, dtype_name(dtype) + shape_str(shape));
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
  auto st = zeroed_storage(bytes, MemoryKind::PinnedHost, dtype_name(dtype) + shape_str(shape));
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
    auto start = std::chrono::steady_clock::now();
    if (dst.data() != src.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    double gbps = link_gbps_.load();
    if (gbps > 0) {  // pace like a link of that bandwidth
      auto target = std::chrono::duration<double>(static_cast<double>(src.nbytes()) / (gbps * 1e9));
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(target));
    }
    if (tr)
      tr->span(stream_name(s), name, t0, tr->now_us(),
               json::Object{{"bytes", json::Value(static_cast<int64_t>(src.nbytes()))}});
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

void CpuBackend::gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) {
  check_f32(out, "gather_rows output");
  KVPR_CHECK(ids.dtype() == DType::I32 && ids.numel() == out.dim(0) && table.dim(1) == out.dim(1),
             "gather_rows: shapes ", out.describe(), " ", table.describe(), " ", ids.describe());
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
        cpu::to_f32<decltype(tag)>(o + i * d, tab + r * d, d);
      }
    });
  });
}

void CpuBackend::add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) {
  check_f32(out, "add_gathered_rows output");
  KVPR_CHECK(ids.dtype() == DType::I32 && ids.numel() == out.dim(0) && table.dim(1) == out.dim(1),
             "add_gathered_rows: shapes ", out.describe(), " ", table.describe(), " ", ids.describe());
  const int64_t d = out.dim(1), rows = table.dim(0);
  const int32_t* id = ids.data_as<int32_t>();
  float* o = out.data_as<float>();
  dispatch_float(table.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::T;
    const T* tab = table.data_as<T>();
    ThreadPool::global().parallel_for(out.dim(0), 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t r = id[i];
        if (r < 0 || r >= rows) r = 0;
        cpu::axpy<decltype(tag)>(o + i * d, 1.f, tab + r * d, d);
      }
    });
  });
}

void CpuBackend::layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, float eps) {
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
}

void CpuBackend::linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                        Activation act) {
  check_f32(out, "linear output");
  check_f32(x, "linear input");
  const int64_t K = x.dim(-1), M = x.numel() / K, N = w.dim(0);
  KVPR_CHECK(w.rank() == 2 && w.dim(1) == K && out.numel() == M * N &&
                 (!bias.defined() || bias.numel() == N),
             "linear: shapes x ", x.describe(), " w ", w.describe(), " out ", out.describe());
  const float* xp = x.data_as<float>();
  float* op = out.data_as<float>();
  ThreadPool& pool = ThreadPool::global();

  // Few rows (decode): one pass over the weight in its own dtype, memory-bound.
  constexpr int64_t kSmallM = 8;
  bool done = false;
#ifdef KVPR_HAVE_OPENBLAS
  if (M > kSmallM) {
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
  // Epilogue: bias and activation.
  if (bias.defined() || act != Activation::None) {
    std::vector<float> bv(bias.defined() ? N : 0);
    for (int64_t n = 0; n < static_cast<int64_t>(bv.size()); ++n)
      bv[n] = load_as_f32(bias.data(), bias.dtype(), n);
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
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
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

namespace {

// Decode attention (one query per sequence) in the flash-decoding style: each sequence's
// context is cut into chunks processed in parallel; a chunk streams its K rows and then its
// V rows front to back (all heads of a row together, so memory is read sequentially) and
// leaves per-head (max, sum, unnormalised output) that are merged afterwards.
template <typename Tag>
void decode_attention_chunk(const float* q, const typename Tag::T* k, const typename Tag::T* v, int64_t t0,
                            int64_t t1, int64_t hidden, int heads, int64_t hd, float scale, float* scores,
                            float* m_out, float* l_out, float* acc) {
  const int64_t n = t1 - t0;
  for (int64_t t = 0; t < n; ++t) {
    const typename Tag::T* krow = k + (t0 + t) * hidden;
    for (int h = 0; h < heads; ++h) scores[h * n + t] = cpu::dot<Tag>(q + h * hd, krow + h * hd, hd) * scale;
  }
  for (int h = 0; h < heads; ++h) {
    float* sc = scores + h * n;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, sc[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) sum += sc[t] = std::exp(sc[t] - mx);
    m_out[h] = mx;
    l_out[h] = sum;
  }
  std::fill(acc, acc + heads * hd, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const typename Tag::T* vrow = v + (t0 + t) * hidden;
    for (int h = 0; h < heads; ++h) cpu::axpy<Tag>(acc + h * hd, scores[h * n + t], vrow + h * hd, hd);
  }
}

}  // namespace

void CpuBackend::attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs,
                           int heads, float scale) {
  check_f32(out, "attention output");
  check_f32(q, "attention query");
  const int64_t hidden = q.dim(-1);
  KVPR_CHECK(heads > 0 && hidden % heads == 0, "attention: hidden ", hidden, " not divisible by ",
             heads, " heads");
  const int64_t hd = hidden / heads;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSeq& a = seqs[s];
    KVPR_CHECK(a.k.dim(0) >= a.past_len + a.q_len && a.v.dim(0) >= a.past_len + a.q_len &&
                   a.k.dim(1) == hidden && a.v.dim(1) == hidden && a.k.dtype() == a.v.dtype() &&
                   a.q_begin + a.q_len <= q.dim(0),
               "attention: sequence ", s, " has k ", a.k.describe(), " v ", a.v.describe(),
               " for past ", a.past_len, " + ", a.q_len, " queries");
  }
  const float* qp = q.data_as<float>();
  float* op = out.data_as<float>();
  ThreadPool& pool = ThreadPool::global();

  // Decode rows (q_len == 1): chunked over the context.
  constexpr int64_t kChunk = 256;
  struct Piece {
    size_t seq;
    int64_t t0, t1;
  };
  std::vector<Piece> pieces;
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (seqs[s].q_len != 1) continue;
    int64_t n = seqs[s].past_len + 1;
    for (int64_t t0 = 0; t0 < n; t0 += kChunk) pieces.push_back({s, t0, std::min(n, t0 + kChunk)});
  }
  if (!pieces.empty()) {
    const int64_t stride = heads * (hd + 2);  // m, l, acc per head
    std::vector<float> partial(pieces.size() * stride);
    pool.parallel_for(static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e) {
      std::vector<float> scores(heads * kChunk);
      for (int64_t i = b; i < e; ++i) {
        const Piece& pc = pieces[i];
        const AttentionSeq& a = seqs[pc.seq];
        float* part = partial.data() + i * stride;
        dispatch_float(a.k.dtype(), [&](auto tag) {
          using T = typename decltype(tag)::T;
          decode_attention_chunk<decltype(tag)>(qp + a.q_begin * hidden, a.k.data_as<T>(), a.v.data_as<T>(), pc.t0,
                                                pc.t1, hidden, heads, hd, scale, scores.data(), part, part + heads,
                                                part + 2 * heads);
        });
      }
    });
    // Merge the chunks of each sequence.
    for (size_t i = 0; i < pieces.size();) {
      size_t j = i;
      while (j < pieces.size() && pieces[j].seq == pieces[i].seq) ++j;
      float* o = op + seqs[pieces[i].seq].q_begin * hidden;
      for (int h = 0; h < heads; ++h) {
        float mx = -std::numeric_limits<float>::infinity();
        for (size_t c = i; c < j; ++c) mx = std::max(mx, partial[c * stride + h]);
        float denom = 0.f;
        std::fill(o + h * hd, o + (h + 1) * hd, 0.f);
        for (size_t c = i; c < j; ++c) {
          const float* part = partial.data() + c * stride;
          float w = std::exp(part[h] - mx);
          denom += w * part[heads + h];
          const float* acc = part + 2 * heads + h * hd;
          for (int64_t d = 0; d < hd; ++d) o[h * hd + d] += w * acc[d];
        }
        float inv = 1.f / denom;
        for (int64_t d = 0; d < hd; ++d) o[h * hd + d] *= inv;
      }
      i = j;
    }
  }

  // Prefill rows (q_len > 1): one work item per (sequence, query row, head).
  std::vector<int64_t> first_item(seqs.size() + 1, 0);
  for (size_t s = 0; s < seqs.size(); ++s)
    first_item[s + 1] = first_item[s] + (seqs[s].q_len > 1 ? seqs[s].q_len * heads : 0);
  pool.parallel_for(first_item.back(), 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    size_t s = std::upper_bound(first_item.begin(), first_item.end(), b) - first_item.begin() - 1;
    for (int64_t item = b; item < e; ++item) {
      while (item >= first_item[s + 1]) ++s;
      const AttentionSeq& a = seqs[s];
      int64_t local = item - first_item[s];
      int64_t j = local / heads, h = local % heads;
      int64_t n = a.past_len + j + 1;  // keys visible to this query
      const float* qr = qp + (a.q_begin + j) * hidden + h * hd;
      float* orow = op + (a.q_begin + j) * hidden + h * hd;
      scores.resize(n);
      dispatch_float(a.k.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::T;
        const T* kp = a.k.data_as<T>() + h * hd;
        const T* vp = a.v.data_as<T>() + h * hd;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < n; ++t) {
          scores[t] = cpu::dot<decltype(tag)>(qr, kp + t * hidden, hd) * scale;
          mx = std::max(mx, scores[t]);
        }
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          scores[t] = std::exp(scores[t] - mx);
          sum += scores[t];
        }
        float inv = 1.f / sum;
        std::fill(orow, orow + hd, 0.f);
        for (int64_t t = 0; t < n; ++t) cpu::axpy<decltype(tag)>(orow, scores[t] * inv, vp + t * hidden, hd);
      });
    }
  });
}

}  // namespace kvpr
