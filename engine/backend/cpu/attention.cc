// Multi-head causal attention on host threads: used by the CPU backend and by the cpu-attn
// KV mode (FastDecode-style attention over the host KV store).
#include "engine/backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/backend/cpu/vec.h"
#include "engine/base/error.h"

namespace kvpr {

using cpu::dispatch_float;
using cpu::F32Tag;

namespace {

// Decode attention (one query per sequence) in the flash-decoding style: each sequence's
// context is cut into chunks processed in parallel; a chunk streams its K rows and then its
// V rows front to back (all heads of a row together, so memory is read sequentially) and
// leaves per-head (max, sum, unnormalised output) that are merged afterwards.
// Where a sequence's key t and its value are: row t of k and v, or rows[t] (paged KV), and for
// keys below head (two segments) row t of hk and hv.
template <typename T>
struct KvRowPtrs {
  const T *k, *v, *hk, *hv;
  const int64_t* rows;  // null: row t
  int64_t head, width;
  KvRowPtrs(const AttentionSeq& a, const std::vector<int64_t>& r, int64_t kv_width)
      : k(a.k.data_as<T>()),
        v(a.v.data_as<T>()),
        hk(a.head > 0 ? a.head_k.data_as<T>() : nullptr),
        hv(a.head > 0 ? a.head_v.data_as<T>() : nullptr),
        rows(r.empty() ? nullptr : r.data()),
        head(a.head),
        width(kv_width) {}
  int64_t row(int64_t t) const { return rows ? rows[t] : t; }
  const T* key(int64_t t) const { return (t < head ? hk : k) + row(t) * width; }
  const T* value(int64_t t) const { return (t < head ? hv : v) + row(t) * width; }
};

// A query's score of a key from their dot product (AttentionParams).
inline float score(float dot, const AttentionParams& p) {
  const float s = dot * p.scale;
  return p.softcap > 0 ? p.softcap * std::tanh(s / p.softcap) : s;
}

template <typename Tag>
void decode_attention_chunk(const float* q, const KvRowPtrs<typename Tag::T>& kv, int64_t t0, int64_t t1, int heads,
                            int group, int64_t hd, const AttentionParams& p, float* scores, float* m_out, float* l_out,
                            float* acc) {
  const int64_t n = t1 - t0;
  for (int64_t t = 0; t < n; ++t) {
    const typename Tag::T* krow = kv.key(t0 + t);
    for (int h = 0; h < heads; ++h) scores[h * n + t] = score(cpu::dot<Tag>(q + h * hd, krow + (h / group) * hd, hd), p);
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
    const typename Tag::T* vrow = kv.value(t0 + t);
    for (int h = 0; h < heads; ++h) cpu::axpy<Tag>(acc + h * hd, scores[h * n + t], vrow + (h / group) * hd, hd);
  }
}

// The shapes every sequence shares: query heads of hd, K/V rows of kv_width (fewer heads than q
// with grouped-query attention: query head h reads KV head h / group).
struct AttentionGeometry {
  int heads;
  int64_t hidden, hd, kv_width;
  int group;
  AttentionParams params;
  const float* sinks;  // params.sinks' values (null: none)
};

// Each paged or two-segment sequence's key rows (AttentionSeq::row of every key), empty for the
// others.
using KeyRows = std::vector<std::vector<int64_t>>;

// Decode rows (q_len == 1): chunked over the context, the chunks merged per sequence.
void decode_attention(float* op, const float* qp, const std::vector<AttentionSeq>& seqs, const KeyRows& rows,
                      const AttentionGeometry& g, ThreadPool& pool) {
  const int heads = g.heads, group = g.group;
  const int64_t hidden = g.hidden, hd = g.hd, kv_width = g.kv_width;
  constexpr int64_t kChunk = 256;
  struct Piece {
    size_t seq;
    int64_t t0, t1;
  };
  std::vector<Piece> pieces;
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (seqs[s].q_len != 1) continue;
    const int64_t n = seqs[s].past_len + 1;  // keys [first, n): the window's
    for (int64_t t0 = g.params.first_key(n - 1); t0 < n; t0 += kChunk) pieces.push_back({s, t0, std::min(n, t0 + kChunk)});
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
          decode_attention_chunk<decltype(tag)>(qp + a.q_begin * hidden, KvRowPtrs<T>(a, rows[pc.seq], kv_width), pc.t0,
                                                pc.t1, heads, group, hd, g.params, scores.data(), part, part + heads,
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
        // The sink's column (no value) among the pieces.
        const float sink = g.sinks ? g.sinks[h] : -std::numeric_limits<float>::infinity();
        float mx = sink;
        for (size_t c = i; c < j; ++c) mx = std::max(mx, partial[c * stride + h]);
        float denom = g.sinks ? std::exp(sink - mx) : 0.f;
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
}

// Prefill rows (q_len > 1): one work item per (sequence, query row, head).
void prefill_attention(float* op, const float* qp, const std::vector<AttentionSeq>& seqs, const KeyRows& rows,
                       const AttentionGeometry& g, ThreadPool& pool) {
  const int heads = g.heads, group = g.group;
  const int64_t hidden = g.hidden, hd = g.hd, kv_width = g.kv_width;
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
      const int64_t n = a.past_len + j + 1, first = g.params.first_key(n - 1);  // keys [first, n) visible to it
      const float* qr = qp + (a.q_begin + j) * hidden + h * hd;
      float* orow = op + (a.q_begin + j) * hidden + h * hd;
      scores.resize(n);
      dispatch_float(a.k.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::T;
        const KvRowPtrs<T> kv(a, rows[s], kv_width);
        const int64_t col = (h / group) * hd;
        const float sink = g.sinks ? g.sinks[h] : -std::numeric_limits<float>::infinity();
        float mx = sink;
        for (int64_t t = first; t < n; ++t) {
          scores[t] = score(cpu::dot<decltype(tag)>(qr, kv.key(t) + col, hd), g.params);
          mx = std::max(mx, scores[t]);
        }
        float sum = g.sinks ? std::exp(sink - mx) : 0.f;
        for (int64_t t = first; t < n; ++t) {
          scores[t] = std::exp(scores[t] - mx);
          sum += scores[t];
        }
        float inv = 1.f / sum;
        std::fill(orow, orow + hd, 0.f);
        for (int64_t t = first; t < n; ++t) cpu::axpy<decltype(tag)>(orow, scores[t] * inv, kv.value(t) + col, hd);
      });
    }
  });
}

}  // namespace

void cpu_attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads,
                   const AttentionParams& params, ThreadPool& pool) {
  check_attention_params(params, heads);
  KVPR_CHECK(out.dtype() == DType::F32 && q.dtype() == DType::F32, "attention: q and out must be F32");
  const int64_t hidden = q.dim(-1);
  KVPR_CHECK(heads > 0 && hidden % heads == 0, "attention: hidden ", hidden, " not divisible by ",
             heads, " heads");
  const int64_t hd = hidden / heads;
  if (seqs.empty()) return;
  const int64_t kv_width = seqs.front().k.dim(-1);
  KVPR_CHECK(kv_width % hd == 0 && heads % (kv_width / hd) == 0, "attention: K/V width ", kv_width,
             " is not a whole number of KV heads of ", hd, " dividing ", heads, " heads");
  const int group = static_cast<int>(heads / (kv_width / hd));
  KeyRows rows(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSeq& a = seqs[s];
    const int64_t first = params.first_key(a.past_len);  // no query reads a key below it
    check_attention_seq(a, s, kv_width, q.dim(0), first);
    if (!a.paged() && a.head == 0) continue;
    rows[s].assign(static_cast<size_t>(a.past_len + a.q_len), 0);
    for (int64_t t = first; t < a.past_len + a.q_len; ++t) rows[s][static_cast<size_t>(t)] = a.row(t);
  }
  const AttentionGeometry g{heads, hidden, hd, kv_width, group, params,
                                 params.sinks.defined() ? params.sinks.data_as<float>() : nullptr};
  decode_attention(out.data_as<float>(), q.data_as<float>(), seqs, rows, g, pool);
  prefill_attention(out.data_as<float>(), q.data_as<float>(), seqs, rows, g, pool);
}

}  // namespace kvpr
