// The one device boundary. Model code and the runtime are written against this interface;
// each backend (cpu/, cuda/) implements memory, streams, events, copies and the ops.
//
// Streams follow docs/design.md §3: every backend has a compute stream and two copy streams
// (host-to-device and device-to-host). Work on one stream runs in order; work on different
// streams is ordered only by events. Ops run on the compute stream.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/host_memory.h"
#include "engine/base/tensor.h"
#include "engine/base/weight.h"
#include "engine/base/trace.h"

namespace kvpr {

enum class Stream : int { Compute = 0, H2D = 1, D2H = 2 };

// GELU is erf's (transformers' "gelu"); GELUTanh its tanh approximation ("gelu_new",
// "gelu_pytorch_tanh": GPT-2, OPT's configs that ask for it, Gemma's GeGLU); SiLU is x·sigmoid(x).
// ClampedSwiGLU is gpt-oss's gate (Backend::gated_mul only): with g = min(gate, 7) and
// u = clamp(up, -7, 7), act(gate) · up is (u + 1) · g · sigmoid(1.702 g).
enum class Activation { None, ReLU, GELU, GELUTanh, SiLU, ClampedSwiGLU };
const char* activation_name(Activation a);  // "none", "relu", "gelu", "gelu_tanh", "silu", "clamped_swiglu"

// A point in a stream's work. Backends define what is inside.
class Event {
 public:
  struct Impl {
    virtual ~Impl() = default;
  };
  Event() = default;
  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<Impl> impl_;
};

// One sequence of an attention call. Its queries are rows [q_begin, q_begin+q_len) of q and
// out; it attends causally to keys and values 0 .. past_len + j for its j-th query. k and v are
// [rows, kv width] in device memory (any float dtype) and already hold the current chunk's keys
// and values. Without a block table key t is row t; with one (paged KV), key t is row
// blocks[t / block_tokens] * block_tokens + t % block_tokens of k and v, the whole block store,
// read in place. `blocks` (n_blocks entries) is host memory the caller keeps until the call
// returns. (No std::span: the CUDA sources that include this are C++17.)
// Two segments (KV partly resident, docs/kv-modes.md "Auto"): keys [0, head) are rows 0.. of
// head_k and head_v instead, the rest as above (a block table's entries below head are unread).
struct AttentionSeq {
  AttentionSeq() = default;
  AttentionSeq(int64_t q_begin_, int64_t q_len_, int64_t past_len_, Tensor k_, Tensor v_, const int32_t* blocks_ = nullptr,
               int64_t n_blocks_ = 0, int64_t block_tokens_ = 0)
      : q_begin(q_begin_), q_len(q_len_), past_len(past_len_), k(std::move(k_)), v(std::move(v_)), blocks(blocks_),
        n_blocks(n_blocks_), block_tokens(block_tokens_) {}
  int64_t q_begin = 0;
  int64_t q_len = 0;
  int64_t past_len = 0;
  Tensor k;
  Tensor v;
  const int32_t* blocks = nullptr;
  int64_t n_blocks = 0;
  int64_t block_tokens = 0;
  Tensor head_k;
  Tensor head_v;
  int64_t head = 0;
  bool paged() const { return blocks != nullptr; }
  // The sequence with keys [0, n) in rows of hk and hv.
  AttentionSeq with_head(Tensor hk, Tensor hv, int64_t n) const {
    AttentionSeq a = *this;
    a.head_k = std::move(hk);
    a.head_v = std::move(hv);
    a.head = n;
    return a;
  }
  // Key t's row in k and v (t >= head), or in head_k and head_v (t < head).
  int64_t row(int64_t t) const {
    if (t < head) return t;
    return paged() ? int64_t{blocks[t / block_tokens]} * block_tokens + t % block_tokens : t;
  }
};
// How a layer's attention turns scores into weights. A query at position i attends keys
// i - window < t <= i (window 0: every key t <= i; transformers' sliding window, Mistral's and
// Gemma's); its score of key t is s = scale · q·k, capped to softcap · tanh(s / softcap) when
// softcap > 0 (Gemma 2's attn_logit_softcapping), then softmax over the keys it attends and,
// with sinks (F32 [heads] in the backend's memory: gpt-oss's per-head sink logits), one more
// column per query head h of logit sinks[h] and no value: the weights of the keys then sum to
// less than 1. A plain scale converts to it: a full causal layer.
struct AttentionParams {
  AttentionParams(float scale_ = 1.f) : scale(scale_) {}  // NOLINT: implicit, the common case
  AttentionParams(float scale_, int64_t window_, float softcap_) : scale(scale_), softcap(softcap_), window(window_) {}
  float scale = 1.f;
  float softcap = 0.f;
  int64_t window = 0;
  Tensor sinks;
  // The first key query position `i` attends.
  int64_t first_key(int64_t i) const { return window > 0 && i + 1 > window ? i + 1 - window : 0; }
};

// Throws unless the window and cap are not negative and sinks, when defined, are F32 [heads].
void check_attention_params(const AttentionParams& p, int heads);

// Throws unless the sequence's keys from `first_key` on (those its queries' windows read: blocks
// below may have gone back to the pool, kNone in its table) all lie in k and v (through its
// block table where it has one) and k and v have `kv_width` columns and one dtype. Shared by the
// backends' attention.
void check_attention_seq(const AttentionSeq& a, size_t index, int64_t kv_width, int64_t q_rows, int64_t first_key = 0);

// Rows [src_row, src_row + count) of a copy_rows source go to [dst_row, dst_row + count).
struct RowSpan {
  int64_t src_row = 0;
  int64_t dst_row = 0;
  int64_t count = 0;
};
// Throws unless dst and src are 2-D float tensors of one width and every span lies inside
// both. Shared by the backends' copy_rows.
void check_row_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans);
// Throws unless linear_batched's x is a stored float dtype and out F32 or w's (non-fp8) dtype
// (a quantized w: F32, F16 or BF16).
void check_linear_batched_dtypes(const Tensor& out, const Tensor& x, const Weight& w);
// The same as check_row_spans, and one dtype (Backend::copy_spans).
void check_copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans);

// The sizes of out [M, N] = x [M, K] · w [N, K]ᵀ (+ bias [N]); throws (naming `what`) unless the
// tensors fit and the activations are F32. Shared by the backends' linear and linear_accumulate.
struct LinearShape {
  int64_t M, N, K;
};
LinearShape check_linear(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias, const char* what);

// Rotary embedding frequencies, as Hugging Face's rope types "default", "linear" and "llama3"
// compute them. Element pair i of a head (of head_dim / 2) turns by position · inv_freq(i),
// inv_freq(i) = theta^(-2i/head_dim) · freq_scale, then, with llama3_factor > 0 (Llama-3.1,
// 3.2): a frequency whose wavelength 2π/f exceeds original_max_position / low_freq_factor is
// divided by llama3_factor, one below original_max_position / high_freq_factor is kept, and
// the band between blends the two by (original_max_position / wavelength - low) / (high - low).
// With yarn_factor > 0 (YaRN: Qwen2.5's and Qwen3's long contexts), pairs below yarn_low keep
// their frequency, pairs from yarn_high on are divided by yarn_factor, and between the two the
// weight of the divided one ramps linearly, (i - yarn_low) / (yarn_high - yarn_low); cos and sin
// are then multiplied by attention_scale (YaRN's attention factor), which scales Q·K by its square.
// With rotary_dim > 0 (partial rotary: Phi's partial_rotary_factor) only the first rotary_dim
// elements of each head turn, pairs (i, i + rotary_dim/2) with frequencies over rotary_dim (the
// exponent's denominator), and the rest pass unchanged.
// With longrope_pairs > 0 (Phi-3/3.5/4-mini's "longrope"), pair i's frequency is divided by its
// own factor: longrope[0][i] (the short factors) for a sequence within the original context,
// longrope[1][i] (the long ones) for a sequence past it. A sequence's regime travels in its
// positions (kRopeLong): the generator decides it per sequence (ForwardChunk::long_rope).
inline constexpr int kLongropeMaxPairs = 64;
// Set in a position: turn by the long factors. Positions stay far below it.
inline constexpr int32_t kRopeLong = int32_t{1} << 30;
struct RopeParams {
  float theta = 10000.f;
  float freq_scale = 1.f;  // "linear": 1 / factor
  float llama3_factor = 0.f;  // 0: no llama3 scaling
  float low_freq_factor = 1.f, high_freq_factor = 4.f, original_max_position = 8192.f;
  float yarn_factor = 0.f;  // 0: no YaRN
  float yarn_low = 0.f, yarn_high = 0.f;
  float attention_scale = 1.f;
  int rotary_dim = 0;  // 0: the whole head
  int longrope_pairs = 0;  // 0: no longrope; else rope_dims / 2
  float longrope[2][kLongropeMaxPairs] = {};  // short, long
};

// Throws unless rope's tensors fit (see Backend::rope); returns T, the rows positions covers.
int64_t check_rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params);
// Throws unless scatter_add_rows's tensors fit.
void check_scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales);
// Throws unless rms_norm's, gated_mul's and scale's tensors fit.
void check_rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma);
void check_gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act);
void check_scale(const Tensor& out, const Tensor& x, float cap);
// Throws unless argmax_lse's tensors fit (see Backend::argmax_lse); returns the row count.
int64_t check_argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid);

// Where pinned host memory comes from. The default is the backend's own (cudaHostAlloc, or
// aligned_alloc on the CPU); a worker bound to a NUMA node installs one that allocates on
// its node (numa/), which the CUDA backend then registers with cudaHostRegister.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;  // zeroed, page aligned; throws kvpr::Error
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual std::string describe() const = 0;
};

// What Backend::end_graph_step did with a step's work.
enum class GraphOutcome {
  None,         // no graph step was open, or the backend has no graphs (the CPU)
  Eager,        // issued op by op: the first step with this work
  Captured,     // the second step with this work: captured into a CUDA graph and launched
  Replayed,     // an earlier step's graph launched: one call instead of one per op
  Interrupted,  // a call a graph cannot hold came mid-step: the step ran op by op
};
const char* graph_outcome_name(GraphOutcome o);
struct GraphStep {
  GraphOutcome outcome = GraphOutcome::None;
  int64_t ops = 0;            // ops and copies the step recorded
  std::string capture_error;  // why capturing failed (the step then ran op by op)
};
struct GraphCounters {
  int64_t eager = 0, captured = 0, replayed = 0, interrupted = 0, capture_failed = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // True when device memory is ordinary host memory (the CPU backend).
  virtual bool device_is_host() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, Shape shape) = 0;         // device memory, zeroed
  virtual Tensor alloc_pinned(DType dtype, Shape shape) = 0;  // page-locked host memory
  virtual size_t device_bytes_in_use() const = 0;
  // Device memory free for new allocations now (the CPU backend: host_bytes_available()).
  virtual size_t device_bytes_free() const = 0;

  // ---- copies and ordering ----
  // Copies src into dst (same dtype and element count; any memory kinds) in order on `s`.
  // `what` names the copy in traces ("X[0:l]", "KV[l:s']").
  virtual void copy(const Tensor& dst, const Tensor& src, Stream s, const char* what = "copy") = 0;
  // Every span's rows of src into its rows of dst in order on `s`, as copies (dst and src 2-D
  // of one dtype and width; spans do not overlap in dst): a layer's X[0:l], K[l:s'] or V[l:s']
  // of a whole GPU batch, or its new rows, in one call rather than one per sequence. The CUDA
  // backend issues each run of equal spans at a constant pitch (a uniform batch in consecutive
  // slots) as one 2-D copy and the spans left over as one batched copy; by default, one copy()
  // per span.
  virtual void copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans, Stream s,
                          const char* what = "copy");
  virtual Event record(Stream s) = 0;
  virtual void wait(Stream s, const Event& e) = 0;  // work on s after this waits for e
  virtual void synchronize(const Event& e) = 0;     // the host waits for e
  virtual void synchronize() = 0;                   // the host waits for every stream
  // Milliseconds between two completed events (synchronize on `end` first).
  virtual double elapsed_ms(const Event& start, const Event& end) = 0;

  // Tracing: when set, every copy and op is recorded on its stream's track. The label is
  // prefixed to op names (e.g. "L3") so a trace reads by layer.
  void set_tracer(Tracer* t) { tracer_ = t; }
  Tracer* tracer() const { return tracer_; }
  void set_trace_label(std::string label) { trace_label_ = std::move(label); }
  const std::string& trace_label() const { return trace_label_; }
  // Pinned host allocations (alloc_pinned) made after this come from `a`.
  void set_host_allocator(std::shared_ptr<HostAllocator> a) { host_allocator_ = std::move(a); }

  // ---- decode-step graphs ----
  // Work issued on the compute stream between begin_graph_step() and end_graph_step() is
  // recorded, not launched; end_graph_step() issues it. The first time a step's work is seen
  // it is issued op by op; the second time in a row it is captured into a CUDA graph; every
  // later step with the same work replays that graph: one launch instead of hundreds. "The
  // same work" is the same ops on the same buffers with the same sizes and launch shapes;
  // values that come through uploaded parameters (token ids, positions, context lengths, the
  // rows new K/V go to) and the contents of pinned inputs may differ. The launch shapes of
  // decode attention change only when the longest context passes 256, 512, 1024, ... tokens,
  // so a decode step is replayed between those points. A call a graph cannot hold (another
  // stream, an event, a host wait, a copy into pageable memory) interrupts the recording: what
  // was recorded is issued op by op, then the call runs, and the rest of the step runs as
  // usual. Memory released while a step is recorded is freed after the step is issued.
  // Backends without graphs (the CPU) run the work as it comes. With a tracer attached a
  // recorded step is traced as one span.
  virtual void begin_graph_step() {}
  virtual GraphStep end_graph_step() { return {}; }
  virtual GraphCounters graph_counters() const { return {}; }

  // ---- ops (compute stream). Activations are F32; weights any float dtype. ----
  // out[i, :] = table[ids[i], :] (ids I32 in device memory).
  virtual void gather_rows(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // out[i, :] += table[ids[i], :].
  virtual void add_gathered_rows(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // out[ids[i], :] += scales[i] * src[i, :] (src F32 [M, W], ids I32 and scales F32 [M] in device
  // memory, ids distinct: a mixture of experts adds each expert's rows back, weighted).
  virtual void scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales) = 0;
  // out = layer_norm(x) * gamma + beta over the last dim; out may alias x.
  virtual void layer_norm(const Tensor& out, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, float eps) = 0;
  // out = x / sqrt(mean(x²) + eps) * gamma over the last dim (RMSNorm, Llama); out may alias x.
  virtual void rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma, float eps) = 0;
  // Rotary position embedding (Llama, Hugging Face's rotate_half layout), in place. x is
  // [..., T, width] F32 with width a multiple of head_dim; every row r of the last two dims is
  // rotated by position positions[r % T] (I32 [T], device memory): in each head, element i and
  // i + d/2 turn by the angle rope_angle(p, i, d, params), d = rope_dims(head_dim, params) (the
  // head, or its rotary part), computed in fp32 as Hugging Face does. Q and K stacked as
  // [2, T, hidden] turn in one call.
  virtual void rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params) = 0;
  // out = act(gate) * up elementwise: a gated MLP's gate (SiLU: SwiGLU, Llama's; GELUTanh:
  // GeGLU, Gemma's); out may alias gate or up.
  virtual void gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act) = 0;
  // out = factor · x, or with cap > 0, cap · tanh(factor · x / cap) (soft-capping: Gemma 2's
  // final logits), elementwise in fp32; out may alias x. Gemma's embedding scale is factor.
  virtual void scale(const Tensor& out, const Tensor& x, float factor, float cap) = 0;
  // Whether linear, linear_accumulate and linear_batched take quantized weights (weight.h),
  // reading them as stored; a backend that does not is given them dequantized at load.
  virtual bool reads_quantized_weights() const { return false; }
  // out[M, N] = act(x[M, K] · w[N, K]ᵀ + bias[N]); bias may be undefined.
  virtual void linear(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias,
                      Activation act) = 0;
  // out[M, N] += x[M, K] · w[N, K]ᵀ + bias[N] (bias may be undefined): a projection added into
  // the residual stream in place. On a GPU the GEMM accumulates into out (beta = 1) and one
  // kernel adds the bias: no temporary and no separate add launch.
  virtual void linear_accumulate(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias) = 0;
  // out[b] = act(x · w[b]ᵀ + bias[b]) for every b: x [M, K] shared, w [B, N, K], bias [B, N]
  // (or undefined), out [B, M, N]. One strided-batched GEMM on a GPU: a layer's Q, K and V
  // projections (or K and V when recomputing) in one call, the input converted once. x may be
  // in any stored float dtype (KVPR's X as the KV store holds it: no conversion when it has the
  // weights' dtype), out in F32 or the weights' dtype (recomputed K/V written as the store
  // keeps them: no fp32 round trip).
  virtual void linear_batched(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias,
                              Activation act) = 0;
  // out = a + b elementwise; out may alias a or b.
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // dst = src converted to dst's dtype (same element count).
  virtual void convert(const Tensor& dst, const Tensor& src) = 0;
  // Every span's rows of src, converted to dst's dtype, into its rows of dst, as one op:
  // the new K/V rows of a whole batch go into their sequences' caches in one launch, not
  // two per sequence. dst and src are 2-D of one width; spans must not overlap in dst.
  virtual void copy_rows(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) = 0;
  // Fills a float tensor with normal(mean, stddev) values from a counter-based generator:
  // element i depends only on (seed, i), so every backend produces the same values.
  virtual void fill_random(const Tensor& t, uint64_t seed, float mean, float stddev) = 0;
  // Greedy choice and log-sum-exp of each row of logits [R, V] (F32) over ids [0, valid):
  // ids[r] (I32 [R]) is the first id of the row's largest logit; stats[r] (F32 [R, 2]) holds
  // that logit and the row's log-sum-exp, so its log-probability is stats[r,0] - stats[r,1].
  // Greedy decoding needs only these 12 bytes per row on the host, not the logits.
  virtual void argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) = 0;
  // Multi-head causal attention. q, out: [T, heads*head_dim] F32; softmax(q·kᵀ·scale)·v over
  // the keys `params` admits (a window, a soft-cap: AttentionParams). The sequences' K and V rows
  // hold kv_heads*head_dim values, kv_heads dividing heads: query head h attends with KV head
  // h / (heads / kv_heads) (grouped-query attention; MHA when equal).
  virtual void attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs,
                         int heads, const AttentionParams& params) = 0;

 protected:
  Tracer* tracer_ = nullptr;
  std::string trace_label_;
  std::shared_ptr<HostAllocator> host_allocator_;
};

// Opens a graph step when `on`; ends it at end(), or when an exception leaves the scope (what
// was recorded is then issued, as it would have been without a graph step).
class GraphStepScope {
 public:
  GraphStepScope(Backend& be, bool on) : be_(on ? &be : nullptr) {
    if (be_) be_->begin_graph_step();
  }
  ~GraphStepScope() {
    try {
      if (be_) be_->end_graph_step();
    } catch (...) {  // already unwinding from the step's own error
    }
  }
  GraphStep end() {
    GraphStep r;
    if (be_) r = be_->end_graph_step();
    be_ = nullptr;
    return r;
  }
  GraphStepScope(const GraphStepScope&) = delete;
  GraphStepScope& operator=(const GraphStepScope&) = delete;

 private:
  Backend* be_;
};

const char* stream_name(Stream s);  // "compute", "h2d", "d2h"

// The counter-based normal generator of fill_random, shared by the backends.
#if defined(__CUDACC__)
#define KVPR_HD __host__ __device__
#else
#define KVPR_HD
#endif
KVPR_HD inline uint64_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + (i + 1) * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
KVPR_HD inline float random_normal(uint64_t seed, uint64_t i) {
  uint64_t b = random_bits(seed, i);
  // Box-Muller on two 24-bit uniforms in (0, 1].
  float u1 = (static_cast<float>(b >> 40) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = static_cast<float>((b >> 16) & 0xffffff) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

// The elements of a head of head_dim that turn (RopeParams::rotary_dim).
KVPR_HD inline int rope_dims(int head_dim, const RopeParams& r) { return r.rotary_dim > 0 ? r.rotary_dim : head_dim; }

// The frequency of element pair i (RopeParams), of a rotation over head_dim elements (rope_dims').
KVPR_HD inline float rope_inv_freq(int i, int head_dim, const RopeParams& r, bool long_factors = false) {
  double f = static_cast<double>(r.freq_scale) /
             pow(static_cast<double>(r.theta), 2.0 * i / static_cast<double>(head_dim));
  if (r.llama3_factor > 0.f) {
    const double wavelen = 6.283185307179586 / f;
    const double old_len = r.original_max_position;
    if (wavelen > old_len / r.low_freq_factor) {
      f /= r.llama3_factor;
    } else if (!(wavelen < old_len / r.high_freq_factor)) {
      const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1.0 - smooth) * f / r.llama3_factor + smooth * f;
    }
  }
  if (r.yarn_factor > 0.f) {
    const double lo = r.yarn_low, hi = r.yarn_high == r.yarn_low ? r.yarn_high + 0.001 : r.yarn_high;
    const double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0);
    f = f / r.yarn_factor * ramp + f * (1.0 - ramp);
  }
  if (r.longrope_pairs > 0) f /= r.longrope[long_factors ? 1 : 0][i];
  return static_cast<float>(f);
}

// The angle by which rope turns element pair i at `position` (kRopeLong: by the long factors):
// the frequency rounded to fp32, times the position in fp32, as Hugging Face's rotary embedding
// computes it. Shared by the backends.
KVPR_HD inline float rope_angle(int32_t position, int i, int head_dim, const RopeParams& r) {
  const bool long_factors = (position & kRopeLong) != 0;
  return static_cast<float>(position & ~kRopeLong) * rope_inv_freq(i, head_dim, r, long_factors);
}

// Creates a backend by name: "cpu", "cuda" (device 0 or `device`), or "auto" (cuda when
// a device is present, else cpu). Throws when the requested backend is unavailable.
std::unique_ptr<Backend> create_backend(const std::string& name, int device = 0);

// Whether this build includes the CUDA backend and a device is visible.
bool cuda_available();
// Number of visible CUDA devices (0 without the CUDA backend, a driver or a device).
int visible_cuda_devices();
// PCI bus id ("0000:17:00.0") of each visible CUDA device, in CUDA's order.
std::vector<std::string> cuda_pci_bus_ids();

}  // namespace kvpr
