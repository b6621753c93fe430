// Launchers of the CUDA kernels (kernels.cu, attention.cu, sampling.cu). All run on `stream`; float
// inputs of any storage dtype (F32/F16/BF16) are read through load_f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/base/dtype.h"


// The kernels live in kvpr::cuda. Built for the SIMT emulator of the tests they live in an
// inline namespace of their own, so that they never clash with the real ones at link time.
#if defined(KVPR_SIMT_EMULATION)
#define KVPR_CUDA_NAMESPACE_BEGIN namespace kvpr::cuda { inline namespace simt {
#define KVPR_CUDA_NAMESPACE_END } }
#else
#define KVPR_CUDA_NAMESPACE_BEGIN namespace kvpr::cuda {
#define KVPR_CUDA_NAMESPACE_END }
#endif

KVPR_CUDA_NAMESPACE_BEGIN

void gather_rows(float* out, const void* table, DType table_dtype, const int32_t* ids, int64_t rows, int64_t n_ids,
                 int64_t width, bool accumulate, cudaStream_t stream);
// out[ids[i]] += scales[i] * src[i] for i < n, rows of `width` (Backend::scatter_add_rows; ids distinct).
void scatter_add_rows(float* out, const float* src, const int32_t* ids, const float* scales, int64_t rows, int64_t n,
                      int64_t width, cudaStream_t stream);
void layer_norm(float* out, const float* x, const void* gamma, const void* beta, DType param_dtype, int64_t rows,
                int64_t width, float eps, cudaStream_t stream);
void rms_norm(float* out, const float* x, const void* gamma, DType gamma_dtype, int64_t rows, int64_t width, float eps,
              cudaStream_t stream);
// x [rows, width] F32 in place; row r turns by positions[r % t] (Backend::rope).
void rope(float* x, const int32_t* positions, int64_t rows, int64_t t, int64_t width, int head_dim,
          RopeParams params, cudaStream_t stream);
// out = act(gate) * up (Backend::gated_mul; act as bias_act's).
void gated_mul(float* out, const float* gate, const float* up, int64_t n, int act, cudaStream_t stream);
// out = factor * x, or cap * tanh(factor * x / cap) when cap > 0 (Backend::scale).
void scale(float* out, const float* x, int64_t n, float factor, float cap, cudaStream_t stream);
// The activation codes of the kernels: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh), 4 silu,
// 5 gpt-oss's clamped SwiGLU (gated_mul only).
int activation_code(Activation a);
// out[b, m, n] = act(out[b, m, n] + bias[b, n]) (bias may be null; act: activation_code's).
// out in F32, F16 or BF16 (a GEMM's fp16 output rounded once more, after the bias).
void bias_act(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t batch, int64_t m, int64_t n,
              int act, cudaStream_t stream);
// out[b, m, n] = bias[b, n]: a GEMM's C before it accumulates into it (beta = 1), so an fp16
// output is rounded once, from the fp32 sum of product and bias.
void fill_bias(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t batch, int64_t m, int64_t n,
               cudaStream_t stream);
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, cudaStream_t stream);
void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float mean, float stddev, cudaStream_t stream);

// A quantized matrix [n, k] in kvpr's layout (engine/base/weight.h) as the kernels read it, in
// device memory: codes (row_bytes a row), F32 scales of `cols` a row of blocks, zero points (U8,
// or I32 when zeros_i32; null: `middle`) and the input order (null: none).
struct QuantDesc {
  const uint8_t* codes;
  const float* scales;
  const void* zeros;
  const int32_t* order;
  int64_t n, k, row_bytes, block_n, block_k, cols;
  int format;  // 1 int4, 2 int8, 3 fp8 (E4M3), 4 fp4 (E2M1)
  int zeros_i32;
  float middle;
};
// out[m, n] = beta · out[m, n] + Σ_k w[n, k] · x[m, k] for m < rows (at most 8): one warp
// an output row, a lane eight inputs at a time, the codes dequantized in registers (decode).
// x, out: F32 [rows, k], [rows, n].
// x is in the codes' input order (an act order gathered first: gather_columns; w.order null).
// When the codes and x allow it (quantized_gemv_fast: K and the scale blocks whole
// chunks of 16 bytes of codes, the codes and x 16-byte aligned) each lane reads 16 bytes of codes
// at a time and x as float4s, the format a template argument; else one byte at a time.
void quantized_gemv(float* out, const float* x, int64_t rows, QuantDesc w, float beta, cudaStream_t stream);
bool quantized_gemv_fast(const QuantDesc& w, const float* x);
// dst [count, k] F32 = rows [n0, n0 + count) of the weight dequantized, in the codes' input
// order (a prefill tile for cuBLAS).
void dequantize_rows(float* dst, QuantDesc w, int64_t n0, int64_t count, cudaStream_t stream);
// dst[m, j] = x[m, order[j]] for m < rows, j < k (x in the codes' input order).
void gather_columns(float* dst, const float* x, const int32_t* order, int64_t rows, int64_t k, cudaStream_t stream);

// One sequence of an attention call, as the kernels read it from device memory.
struct AttnDesc {
  const void* k;   // K/V rows, row stride kv_width: key t is row t, or through `blocks`
  const void* v;
  // Two segments: keys [0, head) are rows 0.. of head_k/head_v (null when head is 0), the rest
  // as above.
  const void* head_k;
  const void* head_v;
  int64_t q_begin;
  int32_t q_len;
  int32_t past;
  // Paged KV: key t is row table[t / block_tokens] * block_tokens + t % block_tokens, where the
  // tables follow the call's n_seqs descriptors in the same upload (attn_tables) and this
  // sequence's starts at entry table_off; -1: key t is row t.
  int32_t table_off;
  int32_t block_tokens;
  int32_t head;
};
// The block tables of an attention call: after its descriptors, in one upload (so the tables'
// address changes only with the number of sequences, and a CUDA graph of a decode step holds).
#ifdef __CUDACC__
__host__ __device__
#endif
inline const int32_t* attn_tables(const AttnDesc* descs, int64_t n_seqs) {
  return reinterpret_cast<const int32_t*>(descs + n_seqs);
}

// A tile of the prefill kernel: query rows [first, first + kAttnTileRows) of sequence `seq`
// (fewer at the sequence's end), one block per (tile, head).
struct AttnTile {
  int32_t seq;
  int32_t first;
};
constexpr int kAttnTileRows = 16;
// The tiles covering every query row of the sequences, in order.
inline std::vector<AttnTile> attention_tiles(const AttnDesc* descs, int64_t n_seqs) {
  std::vector<AttnTile> t;
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int32_t f = 0; f < descs[s].q_len; f += kAttnTileRows) t.push_back(AttnTile{static_cast<int32_t>(s), f});
  return t;
}

// Attention over `n_seqs` sequences (descriptors in device memory), scored and windowed as
// AttentionParams{scale, window, softcap} says, with per-head sink logits `sinks` (device, F32
// [heads]; null: none). q, out [T, heads*hd] F32;
// K and V rows [kv_heads*hd]: query head h reads KV head h / (heads / kv_heads) (grouped-query
// attention; kv_heads == heads is multi-head attention).
// Decode rows (q_len == 1) use a split-context kernel whose partials live in `work`
// (work_floats floats; attention_work_floats says how many are needed); with 1- or 2-byte K/V
// and head_dim <= 128, the grouped kernel (one block per split and group of query heads that
// share a KV head, splits from `sm_count`, the device's SMs, and at least 512 keys each; K
// tiles through shared memory). kv_aligned16: every
// k and v pointer is 16-byte aligned (then keys are read with 16-byte loads when head_dim % 8 == 0).
// Other batches use the tiled kernel when `tiles` (device memory, attention_tiles) is given
// and head_dim <= 128: a block loads each 32-key tile of K and V once into shared memory for
// 16 query rows; else one warp per (row, head) walks the keys.
// The launches depend on max_ctx only through the decode kernel's split count (one per 256
// keys, at most 64). The backend passes this instead of max_ctx: the split count rounded up to
// a power of two, times 256. A decode step's launches then change when the longest context
// passes 256, 512, 1024, ... tokens, not every token, so a CUDA graph of the step is replayed
// in between and a server sees few distinct steps (batch sizes × 7 context classes).
int64_t attention_launch_ctx(int64_t max_ctx);
// A batch of the backend's attention sequences as the kernels take them: one descriptor each,
// the paged ones' block tables after them (padded to a power of two entries, at least 64: their
// size changes the uploads after them, which a CUDA graph's key holds, so it changes rarely),
// and what the launch depends on. Checks every sequence (kvpr::Error naming the first bad one).
struct AttnBatch {
  std::vector<AttnDesc> descs;
  std::vector<int32_t> tables;
  int64_t head_dim = 0, max_ctx = 0, max_q = 0, total_q = 0, kv_bytes = 0;  // max_ctx: attention_launch_ctx's
  int kv_heads = 0;
  DType kv_dtype = DType::F32;
  bool all_decode = true, aligned = true;
  // The descriptors, then the tables: what goes up in one upload.
  std::vector<char> upload() const;
};
AttnBatch describe_attention(const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads);
int64_t attention_work_floats(int64_t n_seqs, int64_t max_ctx, int heads, int head_dim);
void attention(float* out, const float* q, const AttnDesc* descs, int64_t n_seqs, int64_t total_q, int64_t max_ctx,
               int64_t max_q_len, bool all_decode, int heads, int kv_heads, int head_dim, DType kv_dtype, float scale,
               float softcap, int64_t window, const float* sinks, float* work, bool kv_aligned16, const AttnTile* tiles, int64_t n_tiles, int sm_count,
               cudaStream_t stream);

// One span of copy_rows as the kernel reads it: `first` is the index of the span's first row
// among all rows of the call (spans in order, first ascending).
struct SpanDesc {
  int64_t src_row;
  int64_t dst_row;
  int64_t first;
};
// The descriptors of copy_rows' non-empty spans; `rows` gets their total row count.
template <typename Span>
std::vector<SpanDesc> span_descs(const std::vector<Span>& spans, int64_t* rows) {
  std::vector<SpanDesc> d;
  *rows = 0;
  for (const Span& s : spans) {
    if (s.count == 0) continue;
    d.push_back(SpanDesc{s.src_row, s.dst_row, *rows});
    *rows += s.count;
  }
  return d;
}
// dst row (span.dst_row + j) = src row (span.src_row + j) converted, for the total_rows rows
// of n_spans spans (descriptors in device memory).
void copy_rows(void* dst, DType dst_dtype, const void* src, DType src_dtype, const SpanDesc* spans, int64_t n_spans,
               int64_t total_rows, int64_t width, cudaStream_t stream);

// Per row of logits [rows, vocab]: ids[r] = first id of the largest logit among [0, valid),
// stats[r] = (that logit, log-sum-exp over [0, valid)). One block per row.
void argmax_lse(int32_t* ids, float* stats, const float* logits, int64_t rows, int64_t vocab, int32_t valid,
                cudaStream_t stream);

KVPR_CUDA_NAMESPACE_END
