// Attention kernels of the CUDA backend.
//
// Both kernels give each warp a (query row, head) and let every lane own one key at a time:
// the lane reads its key's head slice (contiguous; 16-byte loads when head_dim is a multiple
// of 8 and the rows are 16-byte aligned, which every real model has) and dots it with the query
// held in shared memory; the warp keeps an online softmax (max m, sum l) and the output
// accumulator, each lane owning head_dim/32 contiguous dimensions so V rows are read
// coalesced. Partial results (m, l, acc) merge exactly.
//
// * attention_rows_kernel: any query row (prefill chunks, mixed batches): one warp walks all
//   keys visible to its row (causal).
// * decode_split_kernel + decode_merge_kernel: one query per sequence (decode). The context
//   is cut into splits processed by separate blocks of 4 warps (flash-decoding), so long
//   contexts keep every SM busy; a second kernel merges the splits.
// * decode_group_kernel (+ decode_merge_kernel when it splits): decode over 1- and 2-byte K/V
//   with head_dim <= 128, the KV cache of real deployments: one block per group of query heads
//   sharing a KV head, K tiles through shared memory with coalesced loads, splits from the SM
//   count.
#include <algorithm>
#include <cfloat>
#include <cstring>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/base/error.h"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kernels.h"

KVPR_CUDA_NAMESPACE_BEGIN

namespace {

constexpr int kWarps = 4;        // warps per block
constexpr int kSplitKeys = 256;  // keys per split of the decode kernel (at least)

struct Partial {
  float m, l;
};

// How scores are made and which keys a query sees (AttentionParams): s = scale · q·k, soft-capped
// to cap · tanh(s / cap) when cap > 0; the query at position i attends keys from first(i) on;
// head h's sink logit sinks[h] (null: none) joins the softmax as a column with no value.
struct AttnMath {
  float scale, cap;
  int64_t window;
  const float* sinks;
  __device__ __forceinline__ float score(float dot) const {
    const float s = dot * scale;
    return cap > 0.f ? cap * tanhf(s / cap) : s;
  }
  __device__ __forceinline__ int64_t first(int64_t i) const { return window > 0 && i + 1 > window ? i + 1 - window : 0; }
  // An online softmax's start for head h: empty, or the sink's column (m = S_h, l = e^0).
  __device__ __forceinline__ void start(int h, float& m, float& l) const {
    m = sinks ? sinks[h] : -FLT_MAX;
    l = sinks ? 1.f : 0.f;
  }
};

// How a lane reads its key: element by element (any head_dim, any alignment), with 16-byte
// loads (head_dim % 8 == 0, rows 16-byte aligned), or with 16-byte loads and head_dim known
// at compile time (head_dim == 32 * CH: 32, 64, 128, 256), so the loops unroll completely.
enum LoadMode : int { kScalar = 0, kVector = 1, kVectorExact = 2 };

// Where a sequence's key t and its value live: row t of the contiguous K/V, or through its block
// table (paged KV); keys [0, head) of a two-segment sequence are rows of its head K/V instead
// (KV streamed or recomputed into a per-step buffer, the rest read in place from resident blocks).
// k and v point at this thread's KV head's columns; rows are `stride` elements apart.
template <typename T>
struct KvRows {
  const T* k;
  const T* v;
  const T* hk;  // the head segment (null: none)
  const T* hv;
  const int32_t* table;  // null: contiguous
  int64_t bt, head, stride;
  int shift;  // log2(bt) when bt is a power of two (16, the default: a shift, not a division), else -1
  __device__ __forceinline__ KvRows(const AttnDesc& d, const AttnDesc* descs, int64_t n_seqs, int64_t col, int64_t stride_)
      : k(static_cast<const T*>(d.k) + col),
        v(static_cast<const T*>(d.v) + col),
        hk(d.head > 0 ? static_cast<const T*>(d.head_k) + col : nullptr),
        hv(d.head > 0 ? static_cast<const T*>(d.head_v) + col : nullptr),
        table(d.table_off >= 0 ? attn_tables(descs, n_seqs) + d.table_off : nullptr),
        bt(d.block_tokens),
        head(d.head),
        stride(stride_),
        shift(-1) {
    if (bt > 0 && (bt & (bt - 1)) == 0)
      for (shift = 0; (int64_t{1} << shift) < bt;) ++shift;
  }
  // Key t's row in k and v (t >= head).
  __device__ __forceinline__ int64_t row(int64_t t) const {
    if (!table) return t;
    if (shift >= 0) return (static_cast<int64_t>(table[t >> shift]) << shift) | (t & (bt - 1));
    return static_cast<int64_t>(table[t / bt]) * bt + t % bt;
  }
  __device__ __forceinline__ const T* key(int64_t t) const { return t < head ? hk + t * stride : k + row(t) * stride; }
  __device__ __forceinline__ const T* value(int64_t t) const { return t < head ? hv + t * stride : v + row(t) * stride; }
};

// Processes keys t = first, first+stride, ... < end (one per lane per iteration) for one
// head, updating this warp's (m, l, acc). q is in shared memory (fp32, head_dim).
template <typename T, int CH, int LOAD>
__device__ __forceinline__ void warp_attend(const KvRows<T>& kv, const float* __restrict__ q, int hd_runtime,
                                            int64_t first, int64_t end, int64_t stride, const AttnMath& am, float& m,
                                            float& l, float (&acc)[CH]) {
  const int hd = LOAD == kVectorExact ? CH * 32 : hd_runtime;
  const int lane = threadIdx.x & 31;
  for (int64_t base = first; base < end; base += stride) {
    const int64_t t = base + lane;
    float s = -FLT_MAX;
    if (t < end) {
      const T* kr = kv.key(t);
      float d = 0.f;
      if constexpr (LOAD != kScalar) {
#pragma unroll 4
        for (int i = 0; i < hd; i += 8) {
          float kf[8];
          load8(kr + i, kf);
#pragma unroll
          for (int j = 0; j < 8; ++j) d += q[i + j] * kf[j];
        }
      } else {
#pragma unroll 8
        for (int i = 0; i < hd; ++i) d += q[i] * to_f32(kr[i]);
      }
      s = am.score(d);
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float p = t < end ? __expf(s - m_new) : 0.f;
    const float correction = __expf(m - m_new);
    l = l * correction + warp_sum(p);
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[c] *= correction;
    // V rows of this chunk, read coalesced: lane owns dimensions [lane*CH, lane*CH + CH).
    auto accumulate = [&](int kk) {
      const float pk = __shfl_sync(0xffffffffu, p, kk);
      const T* vr = kv.value(base + kk) + lane * CH;
#pragma unroll
      for (int c = 0; c < CH; ++c)
        if (lane * CH + c < hd) acc[c] += pk * to_f32(vr[c]);
    };
    const int64_t left = end - base;
    if (left >= 32) {
#pragma unroll 8
      for (int kk = 0; kk < 32; ++kk) accumulate(kk);  // full chunk: loads overlap
    } else {
      for (int kk = 0; kk < static_cast<int>(left); ++kk) accumulate(kk);
    }
    m = m_new;
  }
}

// Finds the sequence whose query rows contain `row` (descriptors sorted by q_begin).
__device__ __forceinline__ int find_seq(const AttnDesc* d, int n, int64_t row) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (d[mid].q_begin <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <typename T, int CH, int LOAD>
__global__ void attention_rows_kernel(float* out, const float* q, const AttnDesc* descs, int n_seqs, int64_t total_q,
                                      int heads, int kv_heads, int hd, AttnMath am) {
  __shared__ float qs[kWarps][CH * 32];
  const int64_t row_stride = static_cast<int64_t>(heads) * hd;     // q and out rows hold every head
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * hd;   // K/V rows hold every KV head
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y * kWarps + warp;
  if (row >= total_q || h >= heads) return;  // whole warps exit together
  const AttnDesc d = descs[find_seq(descs, n_seqs, row)];
  const int64_t j = row - d.q_begin;
  const int64_t n = d.past + j + 1;
  const float* qr = q + row * row_stride + h * hd;
  for (int i = lane; i < hd; i += 32) qs[warp][i] = qr[i];
  __syncwarp();
  float m, l, acc[CH];
  am.start(h, m, l);
#pragma unroll
  for (int c = 0; c < CH; ++c) acc[c] = 0.f;
  const int64_t kh = h / (heads / kv_heads);  // the KV head this query head reads (GQA)
  const KvRows<T> kv(d, descs, n_seqs, kh * hd, kv_stride);
  warp_attend<T, CH, LOAD>(kv, qs[warp], hd, am.first(n - 1), n, 32, am, m, l, acc);
  float* o = out + row * row_stride + h * hd;
  const float inv = 1.f / l;
#pragma unroll
  for (int c = 0; c < CH; ++c)
    if (lane * CH + c < hd) o[lane * CH + c] = acc[c] * inv;
}

// Grid (tiles, heads), 4 warps. Each 32-key tile of K and V (this head's columns) is loaded
// once into shared memory, as fp32, for the tile's 16 query rows; warp w owns rows
// 4w..4w+3 and keeps their online softmax. Lane j scores key j of the tile (K rows padded by
// one float so the lanes hit distinct banks), then the warp accumulates V rows coalesced.
template <typename T, int CH>
__global__ void attention_tile_kernel(float* out, const float* q, const AttnDesc* descs, int n_seqs,
                                      const AttnTile* tiles, int heads, int kv_heads, int hd, AttnMath am) {
  constexpr int HD = CH * 32, RPW = kAttnTileRows / kWarps, KT = 32;
  __shared__ float qs[kAttnTileRows][HD];
  __shared__ float ks[KT][HD + 1];
  __shared__ float vs[KT][HD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const AttnTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  const AttnDesc d = descs[tile.seq];
  const int64_t row_stride = static_cast<int64_t>(heads) * hd;
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * hd;
  const int64_t kh = h / (heads / kv_heads);
  const int rows = d.q_len - tile.first < kAttnTileRows ? d.q_len - tile.first : kAttnTileRows;
  const int64_t q0 = d.q_begin + tile.first;  // first query row of the tile in q and out
  for (int i = threadIdx.x; i < kAttnTileRows * HD; i += blockDim.x) {
    const int r = i / HD, c = i % HD;
    qs[r][c] = r < rows && c < hd ? q[(q0 + r) * row_stride + h * hd + c] : 0.f;
  }
  const KvRows<T> kv(d, descs, n_seqs, kh * hd, kv_stride);
  const int64_t n_keys = static_cast<int64_t>(d.past) + tile.first + rows;  // what the last row sees
  float m[RPW], l[RPW], acc[RPW][CH];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    am.start(h, m[rr], l[rr]);
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[rr][c] = 0.f;
  }
  // From the 32-key tile holding the first row's first key (a window's start) to the last key.
  for (int64_t kb = am.first(n_keys - rows) / KT * KT; kb < n_keys; kb += KT) {
    __syncthreads();  // the previous tile is consumed (and the queries are in place)
    for (int i = threadIdx.x; i < KT * hd; i += blockDim.x) {
      const int r = i / hd, c = i % hd;
      const int64_t t = kb + r;
      ks[r][c] = t < n_keys ? to_f32(kv.key(t)[c]) : 0.f;
      vs[r][c] = t < n_keys ? to_f32(kv.value(t)[c]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr;
      const int64_t limit = static_cast<int64_t>(d.past) + tile.first + r + 1;  // keys [lo, limit) for row r
      const int64_t lo = am.first(limit - 1);
      if (r >= rows || kb >= limit || kb + KT <= lo) continue;  // the same for the whole warp
      const int64_t t = kb + lane;
      const bool seen = t < limit && t >= lo;
      float s = -FLT_MAX;
      if (seen) {
        float dot = 0.f;
        for (int i = 0; i < hd; ++i) dot += qs[r][i] * ks[lane][i];
        s = am.score(dot);
      }
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float p = seen ? __expf(s - m_new) : 0.f;
      const float correction = __expf(m[rr] - m_new);
      l[rr] = l[rr] * correction + warp_sum(p);
#pragma unroll
      for (int c = 0; c < CH; ++c) acc[rr][c] *= correction;
      const int64_t left = limit - kb;
      const int nk = left < KT ? static_cast<int>(left) : KT;
      // From the window's first key: the rows below it may hold anything (a staged mode copies
      // none of them), and 0 times an Inf is a NaN.
      for (int kk = lo > kb ? static_cast<int>(lo - kb) : 0; kk < nk; ++kk) {
        const float pk = __shfl_sync(0xffffffffu, p, kk);
#pragma unroll
        for (int c = 0; c < CH; ++c)
          if (lane * CH + c < hd) acc[rr][c] += pk * vs[kk][lane * CH + c];
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = warp * RPW + rr;
    if (r >= rows) continue;
    float* o = out + (q0 + r) * row_stride + h * hd;
    const float inv = 1.f / l[rr];
#pragma unroll
    for (int c = 0; c < CH; ++c)
      if (lane * CH + c < hd) o[lane * CH + c] = acc[rr][c] * inv;
  }
}

// Grid (splits, heads, seqs). Writes this split's partial to work.
template <typename T, int CH, int LOAD>
__global__ void decode_split_kernel(const float* q, const AttnDesc* descs, int heads, int kv_heads, int hd, AttnMath am,
                                    int splits, float* work) {
  constexpr int HD = CH * 32;  // shared arrays sized for the largest head_dim of this CH
  const int64_t row_stride = static_cast<int64_t>(heads) * hd;
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * hd;
  __shared__ float qs[HD];
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][HD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int split = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const AttnDesc d = descs[s];
  const int64_t n = static_cast<int64_t>(d.past) + 1, lo = am.first(n - 1);  // keys [lo, n)
  const int64_t per = (n - lo + splits - 1) / splits;
  const int64_t begin = lo + split * per, end = begin + per < n ? begin + per : n;
  const float* qr = q + d.q_begin * row_stride + h * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
  __syncthreads();
  float m = -FLT_MAX, l = 0.f, acc[CH];
#pragma unroll
  for (int c = 0; c < CH; ++c) acc[c] = 0.f;
  const int64_t kh = h / (heads / kv_heads);
  const KvRows<T> kv(d, descs, gridDim.z, kh * hd, kv_stride);
  warp_attend<T, CH, LOAD>(kv, qs, hd, begin + warp * 32, end, 32 * kWarps, am, m, l, acc);
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < CH; ++c) wacc[warp][lane * CH + c] = acc[c];
  __syncthreads();
  // Merge the warps; thread i owns dimension i.
  float M = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wm[w]);
  float* dst = work + ((static_cast<int64_t>(s) * heads + h) * splits + split) * (hd + 2);
  float L = 0.f;
  for (int w = 0; w < kWarps; ++w) L += wl[w] > 0.f ? wl[w] * __expf(wm[w] - M) : 0.f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) a += wl[w] > 0.f ? wacc[w][i] * __expf(wm[w] - M) : 0.f;
    dst[2 + i] = a;
  }
  if (threadIdx.x == 0) {
    dst[0] = M;
    dst[1] = L;
  }
}

// Decode for 1- and 2-byte K/V and head_dim <= 128 (every fp16/bf16/fp8 cache of a real model):
// grid (splits, head groups, seqs), 4 warps. A block serves GC query heads that read one KV head
// (grouped-query attention: each K/V row is read once for all of them, not once per head) over
// keys [begin, end) of one sequence, a split of at least kGroupSplitKeys keys; the split count
// comes from the SM count (decode_group_splits). Each warp takes 32-key tiles in turn (w, w + 4,
// ...): it copies the tile's K rows into its shared buffer with coalesced loads (consecutive
// lanes read consecutive 16-byte pieces of a row; before, each lane read a row of its own), lane
// j scores key j for each of the GC heads from shared memory (rows padded by 16 bytes: the lanes
// of a quarter-warp hit distinct banks), and the warp accumulates the V rows, read coalesced
// from global memory once for the GC heads. The warps' partials merge in shared memory; with one
// split the block writes the output itself, else its partial for decode_merge_kernel.
constexpr int kGroupSplitKeys = 512;

// decode_group_kernel's steps, each for one warp and one 32-key tile (KT rows, PITCH elements
// apart in the warp's shared buffer `ks`).

// The tile's K rows into shared memory: 16-byte pieces, consecutive lanes on consecutive pieces
// of a row, then the next row (element by element where rows are not 16-byte multiples).
template <typename T, int LOAD, int PITCH>
__device__ __forceinline__ void load_k_tile(T* ks, const KvRows<T>& kv, int64_t t0, int rows, int hd, int lane) {
  constexpr int PAD = 16 / static_cast<int>(sizeof(T));
  if (LOAD != kScalar && (hd * static_cast<int>(sizeof(T))) % 16 == 0) {
    const int per_row = hd * static_cast<int>(sizeof(T)) / 16;
    for (int i = lane; i < rows * per_row; i += 32) {
      const int r = i / per_row, c = i % per_row;
      *reinterpret_cast<uint4*>(ks + r * PITCH + c * PAD) = *reinterpret_cast<const uint4*>(kv.key(t0 + r) + c * PAD);
    }
  } else {
    for (int i = lane; i < rows * hd; i += 32) {
      const int r = i / hd, c = i % hd;
      ks[r * PITCH + c] = kv.key(t0 + r)[c];
    }
  }
}

// Lane j's scores of key j of the tile for each of the GC heads (-FLT_MAX past the tile's rows).
template <typename T, int CH, int GC, int LOAD, int PITCH>
__device__ __forceinline__ void score_tile(const T* ks, const float (*qs)[CH * 32], int rows, int hd, int lane,
                                           const AttnMath& am, float (&sc)[GC]) {
#pragma unroll
  for (int g = 0; g < GC; ++g) sc[g] = -FLT_MAX;
  if (lane >= rows) return;
  const T* kr = ks + lane * PITCH;
  float dot[GC];
#pragma unroll
  for (int g = 0; g < GC; ++g) dot[g] = 0.f;
  if constexpr (LOAD != kScalar) {
    const int dims = LOAD == kVectorExact ? CH * 32 : hd;
#pragma unroll 4
    for (int i = 0; i < dims; i += 8) {
      float kf[8];
      load8(kr + i, kf);
#pragma unroll
      for (int g = 0; g < GC; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) dot[g] += qs[g][i + j] * kf[j];
    }
  } else {
    for (int i = 0; i < hd; ++i) {
      const float kf = to_f32(kr[i]);
#pragma unroll
      for (int g = 0; g < GC; ++g) dot[g] += qs[g][i] * kf;
    }
  }
#pragma unroll
  for (int g = 0; g < GC; ++g) sc[g] = am.score(dot[g]);
}

// The online softmax over the tile's scores, and its V rows accumulated: coalesced, lane owning
// dimensions [lane * CH, lane * CH + CH) for every head.
template <typename T, int CH, int GC>
__device__ __forceinline__ void accumulate_tile(const KvRows<T>& kv, int64_t t0, int rows, int hd, int lane,
                                                const float (&sc)[GC], float (&m)[GC], float (&l)[GC],
                                                float (&acc)[GC][CH]) {
  float p[GC];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    const float m_new = fmaxf(m[g], warp_max(sc[g]));
    p[g] = lane < rows ? __expf(sc[g] - m_new) : 0.f;
    const float correction = __expf(m[g] - m_new);
    l[g] = l[g] * correction + warp_sum(p[g]);
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[g][c] *= correction;
    m[g] = m_new;
  }
  for (int kk = 0; kk < rows; ++kk) {
    const T* vr = kv.value(t0 + kk) + lane * CH;
    float vf[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) vf[c] = lane * CH + c < hd ? to_f32(vr[c]) : 0.f;
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float pk = __shfl_sync(0xffffffffu, p[g], kk);
#pragma unroll
      for (int c = 0; c < CH; ++c) acc[g][c] += pk * vf[c];
    }
  }
}

// The warps' partials (m, l, acc per head) merged through shared memory `part` ([warp][g][HD + 2]):
// with one split the block's output, else its partial for decode_merge_kernel in `work`.
template <int CH, int GC>
__device__ __forceinline__ void merge_warps(float* part, const float (&m)[GC], const float (&l)[GC],
                                            const float (&acc)[GC][CH], int warp, int lane, int hd, int h0,
                                            int64_t q_row, int heads, int split, int splits, int s, float* out,
                                            float* work, const AttnMath& am) {
  constexpr int HD = CH * 32;
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    float* pw = part + (warp * GC + g) * (HD + 2);
    if (lane == 0) {
      pw[0] = m[g];
      pw[1] = l[g];
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) pw[2 + lane * CH + c] = acc[g][c];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < GC * hd; i += blockDim.x) {
    const int g = i / hd, c = i % hd;
    // With one split the block's output, the sink's column included; else a partial, the sink
    // left to decode_merge_kernel.
    float M, L;
    if (splits == 1) {
      am.start(h0 + g, M, L);
    } else {
      M = -FLT_MAX, L = 0.f;
    }
    for (int w = 0; w < kWarps; ++w) {
      const float* pw = part + (w * GC + g) * (HD + 2);
      if (pw[1] > 0.f) M = fmaxf(M, pw[0]);
    }
    if (L > 0.f) L = __expf(am.sinks[h0 + g] - M);
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float* pw = part + (w * GC + g) * (HD + 2);
      if (pw[1] <= 0.f) continue;  // a warp without keys in this split
      const float e = __expf(pw[0] - M);
      L += pw[1] * e;
      a += pw[2 + c] * e;
    }
    const int h = h0 + g;
    if (splits == 1) {
      out[q_row * heads * hd + h * hd + c] = a / L;
    } else {
      float* dst = work + ((static_cast<int64_t>(s) * heads + h) * splits + split) * (hd + 2);
      dst[2 + c] = a;
      if (c == 0) {
        dst[0] = M;
        dst[1] = L;
      }
    }
  }
}

template <typename T, int CH, int GC, int LOAD>
__global__ void decode_group_kernel(float* out, const float* q, const AttnDesc* descs, int heads, int kv_heads, int hd,
                                    AttnMath am, int splits, float* work) {
  static_assert(sizeof(T) <= 2 && CH <= 4, "shared memory sized for 1- and 2-byte K and head_dim <= 128");
  constexpr int HD = CH * 32, KT = 32, PAD = 16 / static_cast<int>(sizeof(T)), PITCH = HD + PAD;
  constexpr int TILE_BYTES = kWarps * KT * PITCH * static_cast<int>(sizeof(T));
  constexpr int MERGE_BYTES = kWarps * GC * (HD + 2) * static_cast<int>(sizeof(float));
  // The K tiles while the warps attend, then (after a barrier) the warps' partials.
  constexpr int SMEM_BYTES = TILE_BYTES > MERGE_BYTES ? TILE_BYTES : MERGE_BYTES;
  __shared__ uint4 smem[(SMEM_BYTES + 15) / 16];  // uint4: 16-byte aligned
  __shared__ float qs[GC][HD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int split = blockIdx.x, group = blockIdx.y, s = blockIdx.z;
  const int h0 = group * GC;                                 // this block's first query head
  const int64_t kh = h0 / (heads / kv_heads);                // the KV head its GC heads read
  const int64_t row_stride = static_cast<int64_t>(heads) * hd;
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * hd;
  const AttnDesc d = descs[s];
  const int64_t n = static_cast<int64_t>(d.past) + 1, lo = am.first(n - 1);  // keys [lo, n)
  const int64_t per = (n - lo + splits - 1) / splits;
  const int64_t begin = lo + split * per, end = begin + per < n ? begin + per : n;
  for (int i = threadIdx.x; i < GC * HD; i += blockDim.x) {
    const int g = i / HD, c = i % HD;
    qs[g][c] = c < hd ? q[d.q_begin * row_stride + (h0 + g) * hd + c] : 0.f;
  }
  __syncthreads();
  const KvRows<T> kv(d, descs, gridDim.z, kh * hd, kv_stride);
  T* ks = reinterpret_cast<T*>(smem) + warp * KT * PITCH;  // this warp's tile
  float m[GC], l[GC], acc[GC][CH];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[g][c] = 0.f;
  }
  for (int64_t t0 = begin + warp * KT; t0 < end; t0 += kWarps * KT) {
    const int rows = end - t0 < KT ? static_cast<int>(end - t0) : KT;
    load_k_tile<T, LOAD, PITCH>(ks, kv, t0, rows, hd, lane);
    __syncwarp();
    float sc[GC];
    score_tile<T, CH, GC, LOAD, PITCH>(ks, qs, rows, hd, lane, am, sc);
    accumulate_tile<T, CH, GC>(kv, t0, rows, hd, lane, sc, m, l, acc);
    __syncwarp();  // the tile is consumed before the next one overwrites it
  }
  __syncthreads();  // every warp is done with its tile: the buffer now holds the partials
  merge_warps<CH, GC>(reinterpret_cast<float*>(smem), m, l, acc, warp, lane, hd, h0, d.q_begin, heads, split, splits, s,
                      out, work, am);
}

// Splits of decode_group_kernel: enough blocks for 8 per SM (the tail of the last wave then
// idles at most an eighth of the machine), each at least kGroupSplitKeys keys, at most 64.
int decode_group_splits(int64_t max_ctx, int64_t blocks_per_split, int sm_count) {
  const int64_t by_keys = (max_ctx + kGroupSplitKeys - 1) / kGroupSplitKeys;
  const int64_t want = (8 * static_cast<int64_t>(sm_count) + blocks_per_split - 1) / blocks_per_split;
  int64_t s = want < by_keys ? want : by_keys;
  return static_cast<int>(s < 1 ? 1 : (s > 64 ? 64 : s));
}

// Grid (heads, seqs), HD threads: out = sum_i acc_i e^(m_i - M) / sum_i l_i e^(m_i - M), the
// sink's column (m = S_h, l = 1, no value) among the partials.
__global__ void decode_merge_kernel(float* out, const AttnDesc* descs, int heads, int hd, int splits,
                                    const float* work, AttnMath am) {
  const int h = blockIdx.x, s = blockIdx.y, i = threadIdx.x;
  const float* base = work + (static_cast<int64_t>(s) * heads + h) * splits * (hd + 2);
  float M, L;
  am.start(h, M, L);
  for (int p = 0; p < splits; ++p)
    if (base[p * (hd + 2) + 1] > 0.f) M = fmaxf(M, base[p * (hd + 2)]);
  if (L > 0.f) L = __expf(am.sinks[h] - M);
  float a = 0.f;
  for (int p = 0; p < splits; ++p) {
    const float* part = base + p * (hd + 2);
    if (part[1] <= 0.f) continue;  // empty split
    const float w = __expf(part[0] - M);
    L += part[1] * w;
    a += part[2 + i] * w;
  }
  out[descs[s].q_begin * heads * hd + h * hd + i] = a / L;
}

int decode_splits(int64_t max_ctx) {
  int64_t s = (max_ctx + kSplitKeys - 1) / kSplitKeys;
  return static_cast<int>(s < 1 ? 1 : (s > 64 ? 64 : s));
}

template <typename T, int CH, int GC, int LOAD>
void launch_group(float* out, const float* q, const AttnDesc* descs, int64_t n_seqs, int64_t max_ctx, int heads,
                  int kv_heads, int hd, AttnMath am, float* work, int sm_count, cudaStream_t stream) {
  const int groups = heads / GC;
  const int splits = decode_group_splits(max_ctx, static_cast<int64_t>(groups) * n_seqs, sm_count);
  dim3 grid(splits, groups, static_cast<unsigned>(n_seqs));
  KVPR_LAUNCH(grid, kWarps * 32, 0, stream, decode_group_kernel<T, CH, GC, LOAD>)(out, q, descs, heads, kv_heads, hd,
                                                                                 am, splits, work);
  CUDA_CHECK_LAUNCH();
  if (splits > 1) {
    KVPR_LAUNCH(dim3(heads, static_cast<unsigned>(n_seqs)), hd, 0, stream, decode_merge_kernel)(out, descs, heads, hd,
                                                                                            splits, work, am);
    CUDA_CHECK_LAUNCH();
  }
}

template <typename T, int CH, int LOAD>
void launch_as(float* out, const float* q, const AttnDesc* descs, int64_t n_seqs, int64_t total_q, int64_t max_ctx,
               bool all_decode, int heads, int kv_heads, int hd, AttnMath am, float* work, const AttnTile* tiles,
               int64_t n_tiles, int sm_count, cudaStream_t stream) {
  if constexpr (sizeof(T) <= 2 && CH <= 4) {
    if (all_decode) {
      // The query heads of one KV head in groups of 4, 2 or 1, whichever divides them.
      const int g = heads / kv_heads;
      if (g % 4 == 0)
        launch_group<T, CH, 4, LOAD>(out, q, descs, n_seqs, max_ctx, heads, kv_heads, hd, am, work, sm_count, stream);
      else if (g % 2 == 0)
        launch_group<T, CH, 2, LOAD>(out, q, descs, n_seqs, max_ctx, heads, kv_heads, hd, am, work, sm_count, stream);
      else
        launch_group<T, CH, 1, LOAD>(out, q, descs, n_seqs, max_ctx, heads, kv_heads, hd, am, work, sm_count, stream);
      return;
    }
  }
  if (all_decode) {
    const int splits = decode_splits(max_ctx);
    dim3 grid(splits, heads, static_cast<unsigned>(n_seqs));
    KVPR_LAUNCH(grid, kWarps * 32, 0, stream, decode_split_kernel<T, CH, LOAD>)(q, descs, heads, kv_heads, hd, am, splits,
                                                                                    work);
    CUDA_CHECK_LAUNCH();
    KVPR_LAUNCH(dim3(heads, static_cast<unsigned>(n_seqs)), hd, 0, stream, decode_merge_kernel)(out, descs, heads, hd, splits,
                                                                                      work, am);
    CUDA_CHECK_LAUNCH();
  } else if (CH <= 4 && tiles && n_tiles > 0) {  // shared memory sized for head_dim <= 128
    if constexpr (CH <= 4) {
      KVPR_LAUNCH(dim3(static_cast<unsigned>(n_tiles), heads), kWarps * 32, 0, stream, attention_tile_kernel<T, CH>)(
          out, q, descs, static_cast<int>(n_seqs), tiles, heads, kv_heads, hd, am);
      CUDA_CHECK_LAUNCH();
    }
  } else {
    dim3 grid(static_cast<unsigned>(total_q), (heads + kWarps - 1) / kWarps);
    KVPR_LAUNCH(grid, kWarps * 32, 0, stream, attention_rows_kernel<T, CH, LOAD>)(out, q, descs, static_cast<int>(n_seqs), total_q,
                                                                    heads, kv_heads, hd, am);
    CUDA_CHECK_LAUNCH();
  }
}

template <typename T, int CH>
void launch(float* out, const float* q, const AttnDesc* descs, int64_t n_seqs, int64_t total_q, int64_t max_ctx,
            bool all_decode, int heads, int kv_heads, int hd, AttnMath am, float* work, bool aligned,
            const AttnTile* tiles, int64_t n_tiles, int sm_count, cudaStream_t stream) {
  if (aligned && hd == CH * 32)
    launch_as<T, CH, kVectorExact>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, hd, am, work, tiles,
                                     n_tiles, sm_count, stream);
  else if (aligned && hd % 8 == 0)
    launch_as<T, CH, kVector>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, hd, am, work, tiles,
                                     n_tiles, sm_count, stream);
  else
    launch_as<T, CH, kScalar>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, hd, am, work, tiles,
                                     n_tiles, sm_count, stream);
}

}  // namespace

int64_t attention_launch_ctx(int64_t max_ctx) {
  int64_t s = 1;
  while (s < decode_splits(max_ctx)) s *= 2;  // 1, 2, 4, ... 64 splits
  return s * kSplitKeys;
}

AttnBatch describe_attention(const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads) {
  AttnBatch b;
  const int64_t hidden = q.dim(-1);
  KVPR_CHECK(heads > 0 && hidden % heads == 0, "attention: hidden ", hidden, " not divisible by ", heads, " heads");
  if (seqs.empty()) return b;
  const int64_t hd = b.head_dim = hidden / heads;
  // K/V rows may hold fewer heads than q (grouped-query attention).
  const int64_t kv_width = seqs.front().k.dim(-1);
  KVPR_CHECK(kv_width % hd == 0 && heads % (kv_width / hd) == 0, "attention: K/V width ", kv_width,
             " is not a whole number of KV heads of ", hd, " dividing ", heads, " heads");
  b.kv_heads = static_cast<int>(kv_width / hd);
  const DType kv = b.kv_dtype = seqs.front().k.dtype();
  auto aligned16 = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; };
  int64_t max_ctx = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSeq& a = seqs[s];
    check_attention_seq(a, s, kv_width, q.dim(0));  // (every key: the device stores keep no ring)
    KVPR_CHECK(a.k.dtype() == kv && (s == 0 || a.q_begin >= seqs[s - 1].q_begin) && a.block_tokens <= INT32_MAX &&
                   b.tables.size() + static_cast<size_t>(a.n_blocks) <= INT32_MAX,
               "attention: sequence ", s, " is out of order or of another dtype");
    const bool two = a.head > 0;
    b.descs.push_back(AttnDesc{a.k.data(), a.v.data(), two ? a.head_k.data() : nullptr, two ? a.head_v.data() : nullptr,
                               a.q_begin, static_cast<int32_t>(a.q_len), static_cast<int32_t>(a.past_len),
                               a.paged() ? static_cast<int32_t>(b.tables.size()) : -1,
                               static_cast<int32_t>(a.block_tokens), static_cast<int32_t>(a.head)});
    if (a.paged()) b.tables.insert(b.tables.end(), a.blocks, a.blocks + a.n_blocks);
    max_ctx = std::max(max_ctx, a.past_len + a.q_len);
    b.max_q = std::max(b.max_q, a.q_len);
    b.total_q = std::max(b.total_q, a.q_begin + a.q_len);
    b.all_decode = b.all_decode && a.q_len == 1;
    b.aligned = b.aligned && aligned16(a.k) && aligned16(a.v) && (!two || (aligned16(a.head_k) && aligned16(a.head_v)));
    b.kv_bytes += 2 * (a.past_len + a.q_len) * kv_width * static_cast<int64_t>(dtype_size(kv));
  }
  // The context class of the launches: they change at 256, 512, 1024, ... tokens, not every step.
  b.max_ctx = attention_launch_ctx(max_ctx);
  return b;
}

std::vector<char> AttnBatch::upload() const {
  const size_t desc_bytes = descs.size() * sizeof(AttnDesc);
  size_t padded = 0;
  if (!tables.empty()) {
    padded = 64;
    while (padded < tables.size()) padded *= 2;
  }
  std::vector<char> buf(desc_bytes + padded * sizeof(int32_t), 0);
  std::memcpy(buf.data(), descs.data(), desc_bytes);
  if (!tables.empty()) std::memcpy(buf.data() + desc_bytes, tables.data(), tables.size() * sizeof(int32_t));
  return buf;
}

int64_t attention_work_floats(int64_t n_seqs, int64_t max_ctx, int heads, int head_dim) {
  return n_seqs * heads * decode_splits(max_ctx) * (head_dim + 2);
}

void attention(float* out, const float* q, const AttnDesc* descs, int64_t n_seqs, int64_t total_q, int64_t max_ctx,
               int64_t /*max_q_len*/, bool all_decode, int heads, int kv_heads, int head_dim, DType kv_dtype,
               float scale, float softcap, int64_t window, const float* sinks, float* work, bool kv_aligned16,
               const AttnTile* tiles, int64_t n_tiles, int sm_count, cudaStream_t stream) {
  if (n_seqs == 0 || total_q == 0) return;
  const AttnMath am{scale, softcap, window, sinks};
  // A sliding layer's decode reads at most its window: split that, not the whole context (the
  // launch classes of attention_launch_ctx, so a graph of the step still replays).
  if (window > 0 && attention_launch_ctx(window) < max_ctx) max_ctx = attention_launch_ctx(window);
  KVPR_CHECK(total_q <= 0x7fffffff && n_seqs <= 65535, "attention batch too large for the grid");
  KVPR_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attention: ", heads, " heads do not share ", kv_heads,
             " KV heads evenly");
  KVPR_STORAGE_DISPATCH(kv_dtype, T, {
    // Each lane owns CH consecutive dimensions of the head.
    if (head_dim <= 32) launch<T, 1>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, head_dim, am, work, kv_aligned16, tiles, n_tiles, sm_count, stream);
    else if (head_dim <= 64) launch<T, 2>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, head_dim, am, work, kv_aligned16, tiles, n_tiles, sm_count, stream);
    else if (head_dim <= 128) launch<T, 4>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, head_dim, am, work, kv_aligned16, tiles, n_tiles, sm_count, stream);
    else if (head_dim <= 256) launch<T, 8>(out, q, descs, n_seqs, total_q, max_ctx, all_decode, heads, kv_heads, head_dim, am, work, kv_aligned16, tiles, n_tiles, sm_count, stream);
    else KVPR_THROW("CUDA attention supports head_dim up to 256, not ", head_dim);
  });
}

KVPR_CUDA_NAMESPACE_END
