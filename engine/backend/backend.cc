#include "engine/backend/backend.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>

#include "engine/backend/argmax_lse.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"

#ifdef KVPR_HAVE_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace kvpr {

const char* graph_outcome_name(GraphOutcome o) {
  switch (o) {
    case GraphOutcome::None: return "none";
    case GraphOutcome::Eager: return "eager";
    case GraphOutcome::Captured: return "captured";
    case GraphOutcome::Replayed: return "replayed";
    case GraphOutcome::Interrupted: return "interrupted";
  }
  return "?";
}

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::Compute: return "compute";
    case Stream::H2D: return "h2d";
    case Stream::D2H: return "d2h";
  }
  return "?";
}

void check_row_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) {
  KVPR_CHECK(dst.rank() == 2 && src.rank() == 2 && dst.dim(1) == src.dim(1) &&
                 is_storage_float(dst.dtype()) && is_storage_float(src.dtype()),
             "copy_rows: dst ", dst.describe(), " and src ", src.describe(), " must be 2-D float of one width");
  for (const RowSpan& s : spans)
    KVPR_CHECK(s.count >= 0 && s.src_row >= 0 && s.dst_row >= 0 && s.src_row + s.count <= src.dim(0) &&
                   s.dst_row + s.count <= dst.dim(0),
               "copy_rows: span of ", s.count, " rows from ", s.src_row, " to ", s.dst_row, " outside src ",
               src.describe(), " or dst ", dst.describe());
}

void check_attention_seq(const AttentionSeq& a, size_t index, int64_t kv_width, int64_t q_rows, int64_t first_key) {
  const int64_t n = a.past_len + a.q_len;
  KVPR_CHECK(a.k.rank() == 2 && a.v.rank() == 2 && a.k.dim(1) == kv_width && a.v.dim(1) == kv_width &&
                 a.k.dtype() == a.v.dtype() && a.k.dim(0) == a.v.dim(0) && a.past_len >= 0 && a.q_len >= 0 &&
                 a.q_begin >= 0 && a.q_begin + a.q_len <= q_rows,
             "attention: sequence ", index, " has k ", a.k.describe(), " v ", a.v.describe(), " for past ", a.past_len,
             " + ", a.q_len, " queries");
  KVPR_CHECK(a.head >= 0 && a.head <= n, "attention: sequence ", index, " has a head of ", a.head, " of ", n, " keys");
  if (a.head > 0)
    KVPR_CHECK(a.head_k.rank() == 2 && a.head_v.rank() == 2 && a.head_k.dim(1) == kv_width &&
                   a.head_v.dim(1) == kv_width && a.head_k.dtype() == a.k.dtype() && a.head_v.dtype() == a.k.dtype() &&
                   a.head_k.dim(0) >= a.head && a.head_v.dim(0) >= a.head,
               "attention: sequence ", index, " has head k ", a.head_k.describe(), " v ", a.head_v.describe(), " for ",
               a.head, " keys");
  if (!a.paged()) {
    KVPR_CHECK(a.k.dim(0) >= n, "attention: sequence ", index, " has ", a.k.dim(0), " K/V rows for ", n, " keys");
    return;
  }
  const int64_t bt = a.block_tokens;
  KVPR_CHECK(bt > 0 && a.n_blocks * bt >= n, "attention: sequence ", index, " has ", a.n_blocks, " blocks of ", bt,
             " tokens for ", n, " keys");
  for (int64_t i = std::max(a.head, first_key) / bt; i * bt < n; ++i) {
    const int64_t b = a.blocks[i];
    KVPR_CHECK(b >= 0 && (b + 1) * bt <= a.k.dim(0), "attention: sequence ", index, "'s block ", b,
               " lies outside the ", a.k.dim(0), " K/V rows");
  }
}

void Backend::copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans, Stream s,
                         const char* what) {
  check_copy_spans(dst, src, spans);
  for (const RowSpan& r : spans)
    if (r.count > 0) copy(dst.rows(r.dst_row, r.count), src.rows(r.src_row, r.count), s, what);
}

void check_copy_spans(const Tensor& dst, const Tensor& src, const std::vector<RowSpan>& spans) {
  check_row_spans(dst, src, spans);
  KVPR_CHECK(dst.dtype() == src.dtype(), "copy_spans: dst ", dst.describe(), " and src ", src.describe(),
             " differ in dtype");
}

void check_linear_batched_dtypes(const Tensor& out, const Tensor& x, const Weight& w) {
  const bool out_ok = out.dtype() == DType::F32 ||
                      (w.quantized() ? out.dtype() == DType::F16 || out.dtype() == DType::BF16
                                     : out.dtype() == w.codes.dtype() && w.codes.dtype() != DType::F8E4M3);
  KVPR_CHECK(is_storage_float(x.dtype()) && out_ok, "linear_batched: input ", x.describe(), " and output ",
             out.describe(), " for weights ", w.describe());
}

LinearShape check_linear(const Tensor& out, const Tensor& x, const Weight& w, const Tensor& bias, const char* what) {
  KVPR_CHECK(out.dtype() == DType::F32 && x.dtype() == DType::F32 && x.rank() >= 1 && x.dim(-1) > 0, what,
             ": output ", out.describe(), " and input ", x.describe(), " must be F32");
  const int64_t K = x.dim(-1), M = x.numel() / K, N = w.rank() == 2 ? w.dim(0) : 0;
  KVPR_CHECK(w.rank() == 2 && w.dim(1) == K && out.numel() == M * N && (!bias.defined() || bias.numel() == N), what,
             ": shapes x ", x.describe(), " w ", w.describe(), " out ", out.describe());
  return LinearShape{M, N, K};
}

int64_t check_rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& params) {
  KVPR_CHECK(params.rotary_dim >= 0 && params.rotary_dim % 2 == 0 && params.rotary_dim <= head_dim,
             "rope: rotary_dim ", params.rotary_dim, " must be even and at most head_dim ", head_dim);
  KVPR_CHECK(params.longrope_pairs == 0 || params.longrope_pairs == rope_dims(head_dim, params) / 2,
             "rope: ", params.longrope_pairs, " longrope factors for ", rope_dims(head_dim, params) / 2, " pairs");
  KVPR_CHECK(x.dtype() == DType::F32 && x.rank() >= 2 && head_dim > 0 && head_dim % 2 == 0 &&
                 x.dim(-1) % head_dim == 0 && positions.dtype() == DType::I32 && positions.rank() == 1 &&
                 positions.dim(0) == x.dim(-2),
             "rope: x ", x.describe(), " (F32 [..., T, heads*head_dim]) and positions ", positions.describe(),
             " (I32 [T]) do not fit head_dim ", head_dim);
  return positions.dim(0);
}

void check_rms_norm(const Tensor& out, const Tensor& x, const Tensor& gamma) {
  KVPR_CHECK(out.dtype() == DType::F32 && x.dtype() == DType::F32 && x.rank() >= 1 && out.numel() == x.numel() &&
                 gamma.numel() == x.dim(-1) && is_float(gamma.dtype()),
             "rms_norm: shapes out ", out.describe(), " x ", x.describe(), " gamma ", gamma.describe());
}

void check_scatter_add_rows(const Tensor& out, const Tensor& src, const Tensor& ids, const Tensor& scales) {
  KVPR_CHECK(out.dtype() == DType::F32 && src.dtype() == DType::F32 && ids.dtype() == DType::I32 &&
                 scales.dtype() == DType::F32 && out.rank() == 2 && src.rank() == 2 && src.dim(1) == out.dim(1) &&
                 ids.numel() == src.dim(0) && scales.numel() == src.dim(0),
             "scatter_add_rows: shapes out ", out.describe(), " src ", src.describe(), " ids ", ids.describe(),
             " scales ", scales.describe());
}

void check_gated_mul(const Tensor& out, const Tensor& gate, const Tensor& up, Activation act) {
  KVPR_CHECK(out.dtype() == DType::F32 && gate.dtype() == DType::F32 && up.dtype() == DType::F32 &&
                 out.numel() == gate.numel() && gate.numel() == up.numel(),
             "gated_mul: shapes out ", out.describe(), " gate ", gate.describe(), " up ", up.describe());
  KVPR_CHECK(act != Activation::None, "gated_mul: a gate needs an activation");
}

void check_scale(const Tensor& out, const Tensor& x, float cap) {
  KVPR_CHECK(out.dtype() == DType::F32 && x.dtype() == DType::F32 && out.numel() == x.numel(),
             "scale: shapes out ", out.describe(), " x ", x.describe());
  KVPR_CHECK(cap >= 0 && std::isfinite(cap), "scale: cap ", cap, " must be finite and not negative");
}

void check_attention_params(const AttentionParams& p, int heads) {
  KVPR_CHECK(p.window >= 0 && p.softcap >= 0, "attention: window ", p.window, " and softcap ", p.softcap,
             " must not be negative");
  KVPR_CHECK(!p.sinks.defined() || (p.sinks.dtype() == DType::F32 && p.sinks.numel() == heads),
             "attention: sinks ", p.sinks.defined() ? p.sinks.describe() : "", " must be F32 [", heads, "]");
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::None: return "none";
    case Activation::ReLU: return "relu";
    case Activation::GELU: return "gelu";
    case Activation::GELUTanh: return "gelu_tanh";
    case Activation::SiLU: return "silu";
    case Activation::ClampedSwiGLU: return "clamped_swiglu";
  }
  return "?";
}

int64_t check_argmax_lse(const Tensor& ids, const Tensor& stats, const Tensor& logits, int32_t valid) {
  KVPR_CHECK(logits.dtype() == DType::F32 && stats.dtype() == DType::F32 && logits.rank() >= 1 && logits.dim(-1) > 0,
             "argmax_lse: logits ", logits.describe(), " and stats ", stats.describe(), " must be F32");
  const int64_t V = logits.dim(-1), R = logits.numel() / V;
  KVPR_CHECK(ids.dtype() == DType::I32 && ids.numel() == R && stats.numel() == 2 * R && valid > 0 && valid <= V,
             "argmax_lse: shapes ids ", ids.describe(), " stats ", stats.describe(), " logits ", logits.describe(),
             " valid ", valid);
  return R;
}

bool cuda_available() {
#ifdef KVPR_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

int visible_cuda_devices() {
#ifdef KVPR_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

std::vector<std::string> cuda_pci_bus_ids() {
  std::vector<std::string> ids;
#ifdef KVPR_HAVE_CUDA
  for (int d = 0; d < cuda_device_count(); ++d) ids.push_back(cuda_pci_bus_id(d));
#endif
  return ids;
}

std::unique_ptr<Backend> create_backend(const std::string& name, int device) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda" || name == "auto") {
#ifdef KVPR_HAVE_CUDA
    if (cuda_device_count() > 0) return make_cuda_backend(device);
#endif
    (void)device;
    if (name == "auto") return std::make_unique<CpuBackend>();
#ifdef KVPR_HAVE_CUDA
    KVPR_THROW("backend 'cuda' requested but no CUDA device is visible");
#else
    KVPR_THROW("backend 'cuda' requested but this build has no CUDA backend (configure with KVPR_CUDA=ON)");
#endif
  }
  KVPR_THROW("unknown backend '", name, "' (expected auto, cpu or cuda)");
}

RowStats row_argmax_lse(const float* logits, int32_t valid) {
  KVPR_CHECK(valid > 0, "no valid token ids to sample from");
  float mx = -std::numeric_limits<float>::infinity();
  int32_t arg = 0;
  for (int32_t i = 0; i < valid; ++i)
    if (logits[i] > mx) mx = logits[i], arg = i;
  double sum = 0;
  for (int32_t i = 0; i < valid; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return {arg, mx, mx + std::log(sum)};
}

}  // namespace kvpr
