// Every CPU op against a plain double-precision loop, on awkward sizes and all weight dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "engine/backend/argmax_lse.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

Tensor random_tensor(Backend& be, DType dt, Shape shape, std::mt19937& rng, float scale = 1.f) {
  Tensor h = Tensor::host(dt, shape);
  std::normal_distribution<float> nd(0.f, scale);
  for (int64_t i = 0; i < h.numel(); ++i) store_from_f32(h.data(), dt, i, nd(rng));
  Tensor d = be.alloc(dt, shape);
  be.copy(d, h, Stream::H2D);
  be.synchronize();
  return d;
}

std::vector<double> as_double(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_as_f32(t.data(), t.dtype(), i);
  return v;
}

double tol_for(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-5; }  // reference uses the stored values

}  // namespace

class CpuOps : public ::testing::TestWithParam<DType> {};

TEST_P(CpuOps, LinearMatchesReferenceForSmallAndLargeM) {
  CpuBackend be;
  std::mt19937 rng(7);
  for (auto [M, K, N] : {std::tuple{1, 37, 19}, {3, 64, 130}, {8, 33, 7}, {9, 100, 45}, {67, 31, 129}}) {
    Tensor x = random_tensor(be, DType::F32, {M, K}, rng);
    Tensor w = random_tensor(be, GetParam(), {N, K}, rng);
    Tensor b = random_tensor(be, GetParam(), {N}, rng);
    for (Activation act : {Activation::None, Activation::ReLU, Activation::GELU}) {
      Tensor out = be.alloc(DType::F32, {M, N});
      be.linear(out, x, w, b, act);
      auto xv = as_double(x), wv = as_double(w), bv = as_double(b);
      std::vector<double> ref(M * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double s = bv[n];
          for (int k = 0; k < K; ++k) s += xv[m * K + k] * wv[n * K + k];
          if (act == Activation::ReLU) s = std::max(0.0, s);
          if (act == Activation::GELU) s = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
          ref[m * N + n] = s;
        }
      EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), tol_for(GetParam())))
          << "M=" << M << " K=" << K << " N=" << N;
    }
  }
}

TEST_P(CpuOps, LinearAccumulateAddsIntoTheResidual) {
  CpuBackend be;
  std::mt19937 rng(17);
  for (auto [M, K, N] : {std::tuple{1, 37, 19}, {9, 100, 45}}) {
    Tensor x = random_tensor(be, DType::F32, {M, K}, rng);
    Tensor w = random_tensor(be, GetParam(), {N, K}, rng);
    Tensor b = random_tensor(be, GetParam(), {N}, rng);
    Tensor out = random_tensor(be, DType::F32, {M, N}, rng);
    auto xv = as_double(x), wv = as_double(w), bv = as_double(b), ov = as_double(out);
    be.linear_accumulate(out, x, w, b);
    std::vector<double> ref(M * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = ov[m * N + n] + bv[n];
        for (int k = 0; k < K; ++k) s += xv[m * K + k] * wv[n * K + k];
        ref[m * N + n] = s;
      }
    EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), tol_for(GetParam()))) << "M=" << M;
  }
}

TEST_P(CpuOps, GatherAndLayerNorm) {
  CpuBackend be;
  std::mt19937 rng(8);
  const int V = 50, D = 45, T = 13;
  Tensor table = random_tensor(be, GetParam(), {V, D}, rng);
  Tensor ids = be.alloc(DType::I32, {T});
  for (int i = 0; i < T; ++i) ids.data_as<int32_t>()[i] = (i * 7) % V;
  Tensor out = be.alloc(DType::F32, {T, D});
  be.gather_rows(out, table, ids);
  be.add_gathered_rows(out, table, ids);
  auto tv = as_double(table);
  std::vector<double> ref(T * D);
  for (int i = 0; i < T; ++i)
    for (int j = 0; j < D; ++j) ref[i * D + j] = 2 * tv[((i * 7) % V) * D + j];
  EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), 1e-6));
  // A mixture of experts adds 5 rows back into rows 9, 0, 3, 12, 6 of out, weighted.
  Tensor src = random_tensor(be, DType::F32, {5, D}, rng), to = be.alloc(DType::I32, {5}), w = be.alloc(DType::F32, {5});
  auto sv = as_double(src);
  for (int i = 0; i < 5; ++i) {
    to.data_as<int32_t>()[i] = (9 + 4 * i) % T;
    w.data_as<float>()[i] = 0.25f * (i + 1);
    for (int j = 0; j < D; ++j) ref[((9 + 4 * i) % T) * D + j] += 0.25 * (i + 1) * sv[i * D + j];
  }
  be.scatter_add_rows(out, src, to, w);
  EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), 1e-6));
  EXPECT_THROW(be.scatter_add_rows(out, src, to, be.alloc(DType::F32, {4})), Error);

  Tensor g = random_tensor(be, GetParam(), {D}, rng), b = random_tensor(be, GetParam(), {D}, rng);
  Tensor ln = be.alloc(DType::F32, {T, D});
  be.layer_norm(ln, out, g, b, 1e-5f);
  auto gv = as_double(g), bv = as_double(b);
  for (int i = 0; i < T; ++i) {
    double mu = 0, var = 0;
    for (int j = 0; j < D; ++j) mu += ref[i * D + j];
    mu /= D;
    for (int j = 0; j < D; ++j) var += (ref[i * D + j] - mu) * (ref[i * D + j] - mu);
    var /= D;
    for (int j = 0; j < D; ++j) ref[i * D + j] = (ref[i * D + j] - mu) / std::sqrt(var + 1e-5) * gv[j] + bv[j];
  }
  EXPECT_TRUE(test::close_rel(ref, ln.data_as<float>(), ref.size(), 1e-5));
}

// Llama's ops against their definitions in Hugging Face's modeling_llama.py, in double:
// LlamaRMSNorm, apply_rotary_pos_emb with rotate_half (cos/sin of position · inv_freq, linear
// scaling dividing inv_freq), and silu(gate_proj) · up_proj.
TEST_P(CpuOps, RmsNormRopeAndSiluMul) {
  CpuBackend be;
  std::mt19937 rng(9);
  const int T = 7, D = 45;
  Tensor x = random_tensor(be, DType::F32, {T, D}, rng, 2.f), g = random_tensor(be, GetParam(), {D}, rng);
  Tensor out = be.alloc(DType::F32, {T, D});
  be.rms_norm(out, x, g, 1e-5f);
  auto xv = as_double(x), gv = as_double(g);
  std::vector<double> ref(T * D);
  for (int i = 0; i < T; ++i) {
    double ms = 0;
    for (int j = 0; j < D; ++j) ms += xv[i * D + j] * xv[i * D + j] / D;
    for (int j = 0; j < D; ++j) ref[i * D + j] = xv[i * D + j] / std::sqrt(ms + 1e-5) * gv[j];
  }
  EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), 1e-6));

  const int hd = 16, heads = 3, W = hd * heads;
  Tensor qk = random_tensor(be, DType::F32, {2, T, W}, rng);
  Tensor pos = be.alloc(DType::I32, {T});
  for (int i = 0; i < T; ++i) pos.data_as<int32_t>()[i] = 3 + 5 * i;
  // Linear scaling (a quarter of the frequency), then llama3 scaling: Hugging Face's
  // _compute_llama3_parameters written out in double, with a head wide enough that its
  // frequencies fall in all three bands (kept, blended, divided).
  // With p.rotary_dim (Phi's partial rotary) only the head's first rd elements turn, with
  // frequencies over rd, as transformers' apply_rotary_pos_emb splits q_rot and q_pass.
  auto check_rope = [&](int d, const RopeParams& p, auto&& inv_freq, double scale = 1.0) {
    const int rw = d * heads, rd = p.rotary_dim > 0 ? p.rotary_dim : d;
    Tensor t = random_tensor(be, DType::F32, {2, T, rw}, rng);
    auto tv = as_double(t);
    be.rope(t, pos, d, p);
    std::vector<double> rr(tv.size());
    for (int r = 0; r < 2 * T; ++r)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < d; ++i) {
          const double* v = &tv[r * rw + h * d];
          if (i >= rd) {
            rr[r * rw + h * d + i] = v[i];  // passes
            continue;
          }
          const int j = i % (rd / 2);
          const double a = (3 + 5 * (r % T)) * inv_freq(j, rd);
          const double rot = i < rd / 2 ? -v[i + rd / 2] : v[i - rd / 2];  // rotate_half
          rr[r * rw + h * d + i] = (v[i] * std::cos(a) + rot * std::sin(a)) * scale;
        }
    EXPECT_TRUE(test::close_rel(rr, t.data_as<float>(), rr.size(), 1e-5)) << "head_dim " << d;
  };
  RopeParams partial;  // Phi-4-mini's: 96 of 128 dimensions turn
  partial.rotary_dim = 96;
  check_rope(128, partial, [](int j, int d) { return 1.0 / std::pow(10000.0, 2.0 * j / d); });
  // Longrope over it: each pair's frequency divided by its short factor (positions without
  // kRopeLong), cos and sin scaled by the attention factor.
  RopeParams lr = partial;
  lr.longrope_pairs = 48;
  lr.attention_scale = 1.25f;
  for (int i = 0; i < 48; ++i) lr.longrope[0][i] = 1.f + 0.25f * i, lr.longrope[1][i] = 100.f;
  check_rope(128, lr, [](int j, int d) { return 1.0 / ((1.0 + 0.25 * j) * std::pow(10000.0, 2.0 * j / d)); }, 1.25);
  // The long factors where the position carries kRopeLong.
  for (int i = 0; i < T; ++i) pos.data_as<int32_t>()[i] |= kRopeLong;
  for (int i = 0; i < 48; ++i) std::swap(lr.longrope[0][i], lr.longrope[1][i]);
  check_rope(128, lr, [](int j, int d) { return 1.0 / ((1.0 + 0.25 * j) * std::pow(10000.0, 2.0 * j / d)); }, 1.25);
  for (int i = 0; i < T; ++i) pos.data_as<int32_t>()[i] &= ~kRopeLong;
  partial.rotary_dim = hd + 2;  // more than the head
  EXPECT_THROW(be.rope(qk, pos, hd, partial), Error);
  RopeParams linear;
  linear.theta = 500000.f;
  linear.freq_scale = 0.25f;
  check_rope(hd, linear, [](int j, int d) { return 0.25 / std::pow(500000.0, 2.0 * j / d); });
  RopeParams l3;
  l3.theta = 500000.f;
  l3.llama3_factor = 8.f;
  l3.low_freq_factor = 1.f;
  l3.high_freq_factor = 4.f;
  l3.original_max_position = 8192.f;
  int bands[3] = {0, 0, 0};
  auto l3_freq = [&](int j, int d) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * j / d), wavelen = 2 * M_PI / f;
    const double low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
    if (wavelen < high_wavelen) return ++bands[0], f;
    if (wavelen > low_wavelen) return ++bands[2], f / 8.0;
    ++bands[1];
    const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
    return (1 - smooth) * f / 8.0 + smooth * f;
  };
  check_rope(128, l3, l3_freq);
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0);
  EXPECT_GT(bands[2], 0);
  // YaRN: pairs below 3 kept, from 9 on divided by 4, a linear ramp between; cos and sin scaled.
  const RopeParams yarn{.theta = 1000000.f, .yarn_factor = 4.f, .yarn_low = 3.f, .yarn_high = 9.f,
                       .attention_scale = 1.1386294f};
  check_rope(32, yarn, [](int j, int d) {
    const double f = 1.0 / std::pow(1000000.0, 2.0 * j / d), ramp = std::clamp((j - 3.0) / 6.0, 0.0, 1.0);
    return f / 4.0 * ramp + f * (1 - ramp);
  }, 1.1386294);
  EXPECT_THROW(be.rope(qk, pos, 10, RopeParams{}), Error);           // 48 is no multiple of 10
  EXPECT_THROW(be.rope(qk, be.alloc(DType::I32, {T + 1}), hd, RopeParams{}), Error);

  Tensor gate = random_tensor(be, DType::F32, {T, D}, rng, 3.f), up = random_tensor(be, DType::F32, {T, D}, rng);
  auto gtv = as_double(gate), uv = as_double(up);
  Tensor geglu = be.alloc(DType::F32, {T, D});
  be.gated_mul(geglu, gate, up, Activation::GELUTanh);  // Gemma's GeGLU: torch's gelu(approximate="tanh")
  for (int i = 0; i < T * D; ++i)
    ref[i] = 0.5 * gtv[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (gtv[i] + 0.044715 * std::pow(gtv[i], 3)))) * uv[i];
  EXPECT_TRUE(test::close_rel(ref, geglu.data_as<float>(), ref.size(), 1e-5));
  be.gated_mul(gate, gate, up, Activation::SiLU);  // in place
  for (int i = 0; i < T * D; ++i) ref[i] = gtv[i] / (1 + std::exp(-gtv[i])) * uv[i];
  EXPECT_TRUE(test::close_rel(ref, gate.data_as<float>(), ref.size(), 1e-6));
  EXPECT_THROW(be.gated_mul(gate, gate, up, Activation::None), Error);

  // Scaled (Gemma's embedding scale) and soft-capped (Gemma 2's final logits, 30 · tanh(x / 30)).
  Tensor xs = random_tensor(be, DType::F32, {T, D}, rng, 40.f), ys = be.alloc(DType::F32, {T, D});
  auto xsv = as_double(xs);
  be.scale(ys, xs, 2.5f, 0.f);
  for (int i = 0; i < T * D; ++i) ref[i] = 2.5 * xsv[i];
  EXPECT_TRUE(test::close_rel(ref, ys.data_as<float>(), ref.size(), 1e-6));
  be.scale(xs, xs, 1.f, 30.f);
  int capped = 0;
  for (int i = 0; i < T * D; ++i) ref[i] = 30 * std::tanh(xsv[i] / 30), capped += std::fabs(xsv[i]) > 30;
  EXPECT_TRUE(test::close_rel(ref, xs.data_as<float>(), ref.size(), 1e-5));
  EXPECT_GT(capped, 0);  // values beyond the cap, squeezed into it
  EXPECT_THROW(be.scale(xs, xs, 1.f, -1.f), Error);
}

TEST_P(CpuOps, AttentionPrefillAndDecodeOverCache) {
  CpuBackend be;
  std::mt19937 rng(9);
  const int heads = 4, hd = 20, hidden = heads * hd;
  // K/V with every head (MHA), two heads shared by pairs of query heads, and one head (GQA).
  for (int kv_heads : {4, 2, 1}) {
    const int kvw = kv_heads * hd, group = heads / kv_heads;
    // Three sequences: a prefill chunk with no past, a chunk continuing a past, one decode row.
    struct S { int q_len, past; };
    std::vector<S> spec = {{5, 0}, {4, 7}, {1, 300}};
    int T = 0;
    for (auto s : spec) T += s.q_len;
    Tensor q = random_tensor(be, DType::F32, {T, hidden}, rng);
    std::vector<AttentionSeq> seqs;
    int off = 0;
    for (auto s : spec) {
      AttentionSeq a;
      a.q_begin = off;
      a.q_len = s.q_len;
      a.past_len = s.past;
      a.k = random_tensor(be, GetParam(), {s.past + s.q_len + 3, kvw}, rng);
      a.v = random_tensor(be, GetParam(), {s.past + s.q_len + 3, kvw}, rng);
      seqs.push_back(a);
      off += s.q_len;
    }
    // Full causal; a window of 6 keys (shorter than every context but the first rows'); a window
    // and Gemma 2's soft-cap of the scores (3, where scores of ~±4 are far from linear); a
    // window and gpt-oss's sink logits, comparable to the scores.
    AttentionParams sunk(0.3f, 6, 0.f);
    sunk.sinks = be.alloc(DType::F32, {heads});
    for (int h = 0; h < heads; ++h) sunk.sinks.data_as<float>()[h] = 1.5f * static_cast<float>(h) - 1.f;
    for (const AttentionParams& params : {AttentionParams(0.3f), AttentionParams(0.3f, 6, 0.f),
                                          AttentionParams(1.5f, 6, 3.f), sunk}) {
    Tensor out = be.alloc(DType::F32, {T, hidden});
    const double scale = params.scale;
    be.attention(out, q, seqs, heads, params);
    auto qv = as_double(q);
    std::vector<double> ref(T * hidden);
    for (const auto& a : seqs) {
      auto kv = as_double(a.k), vv = as_double(a.v);
      for (int j = 0; j < a.q_len; ++j)
        for (int h = 0; h < heads; ++h) {
          const int kh = h / group;  // modeling_llama's repeat_kv: query head h reads KV head h / group
          const int n = static_cast<int>(a.past_len) + j + 1;  // query position n - 1
          // transformers' sliding_window_overlay: key t is seen iff n - 1 - window < t.
          const int first = params.window > 0 ? std::max(0, n - static_cast<int>(params.window)) : 0;
          std::vector<double> sc(n);
          // A sink joins the softmax as one more logit with no value (modeling_gpt_oss).
          const double sink = params.sinks.defined() ? params.sinks.data_as<float>()[h] : -1e300;
          double mx = sink, sum = 0;
          for (int t = first; t < n; ++t) {
            double s = 0;
            for (int e = 0; e < hd; ++e) s += qv[(a.q_begin + j) * hidden + h * hd + e] * kv[t * kvw + kh * hd + e];
            sc[t] = s * scale;
            if (params.softcap > 0) sc[t] = params.softcap * std::tanh(sc[t] / params.softcap);
            mx = std::max(mx, sc[t]);
          }
          for (int t = first; t < n; ++t) sum += sc[t] = std::exp(sc[t] - mx);
          if (params.sinks.defined()) sum += std::exp(sink - mx);
          for (int e = 0; e < hd; ++e) {
            double o = 0;
            for (int t = first; t < n; ++t) o += sc[t] / sum * vv[t * kvw + kh * hd + e];
            ref[(a.q_begin + j) * hidden + h * hd + e] = o;
          }
        }
    }
    EXPECT_TRUE(test::close_rel(ref, out.data_as<float>(), ref.size(), 1e-5))
        << kv_heads << " KV heads, window " << params.window << ", softcap " << params.softcap
        << (params.sinks.defined() ? ", sinks" : "");
    }
  }
  // K/V widths that are not a whole number of KV heads dividing the query heads.
  Tensor q = be.alloc(DType::F32, {1, hidden}), out = be.alloc(DType::F32, {1, hidden});
  for (int bad : {3 * hd, hd + 1}) {
    Tensor k = be.alloc(GetParam(), {4, bad}), v = be.alloc(GetParam(), {4, bad});
    EXPECT_THROW(be.attention(out, q, {AttentionSeq{0, 1, 2, k, v}}, heads, 1.f), Error) << bad;
  }
}

TEST_P(CpuOps, ConvertRoundsToTheStorageType) {
  CpuBackend be;
  std::mt19937 rng(10);
  Tensor src = random_tensor(be, DType::F32, {1000}, rng);
  Tensor dst = be.alloc(GetParam(), {1000});
  be.convert(dst, src);
  for (int i = 0; i < 1000; ++i) {
    float s = src.data_as<float>()[i];
    Tensor one = Tensor::host(GetParam(), {1});
    store_from_f32(one.data(), GetParam(), 0, s);
    EXPECT_EQ(load_as_f32(dst.data(), GetParam(), i), load_as_f32(one.data(), GetParam(), 0));
  }
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, CpuOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(CpuBackend, ShapeErrorsAreReported) {
  CpuBackend be;
  Tensor x = be.alloc(DType::F32, {2, 3});
  Tensor w = be.alloc(DType::F32, {4, 5});
  Tensor out = be.alloc(DType::F32, {2, 4});
  EXPECT_THROW(be.linear(out, x, w, Tensor(), Activation::None), Error);
  EXPECT_THROW(be.copy(be.alloc(DType::F16, {6}), x, Stream::Compute), Error);
  Tensor dst = be.alloc(DType::F16, {4, 3});
  EXPECT_THROW(be.copy_rows(dst, x, {RowSpan{1, 0, 2}}), Error);  // past the source's rows
  EXPECT_THROW(be.copy_rows(dst, x, {RowSpan{0, 3, 2}}), Error);  // past the destination's
  EXPECT_THROW(be.copy_rows(dst, w, {RowSpan{0, 0, 1}}), Error);  // widths differ
}

TEST(CpuBackend, BatchedLinearIsOneLinearPerBatch) {
  CpuBackend be;
  Tensor x = be.alloc(DType::F32, {5, 7}), w = be.alloc(DType::F16, {3, 4, 7}), b = be.alloc(DType::F16, {3, 4});
  be.fill_random(x, 1, 0.f, 1.f);
  be.fill_random(w, 2, 0.f, 0.3f);
  be.fill_random(b, 3, 0.f, 1.f);
  Tensor out = be.alloc(DType::F32, {3, 5, 4});
  be.linear_batched(out, x, w, b, Activation::ReLU);
  for (int64_t i = 0; i < 3; ++i) {
    Tensor one = be.alloc(DType::F32, {5, 4});
    be.linear(one, x, w.rows(i, 1).reshape({4, 7}), b.rows(i, 1).reshape({4}), Activation::ReLU);
    for (int64_t j = 0; j < 20; ++j) EXPECT_EQ(out.data_as<float>()[i * 20 + j], one.data_as<float>()[j]);
  }
}

TEST(CpuBackend, CopyRowsMovesEverySpanAndNothingElse) {
  CpuBackend be;
  Tensor src = be.alloc(DType::F32, {6, 5}), dst = be.alloc(DType::F16, {10, 5});
  for (int i = 0; i < 30; ++i) src.data_as<float>()[i] = static_cast<float>(i);
  be.copy_rows(dst, src, {RowSpan{0, 8, 2}, RowSpan{2, 0, 0}, RowSpan{3, 1, 3}});
  for (int r = 0; r < 10; ++r)
    for (int c = 0; c < 5; ++c) {
      float want = r >= 8 ? static_cast<float>((r - 8) * 5 + c) : (r >= 1 && r < 4) ? static_cast<float>((r + 2) * 5 + c) : 0.f;
      EXPECT_EQ(load_as_f32(dst.data(), DType::F16, r * 5 + c), want) << r << "," << c;
    }
}

// A row split over the pool's threads (fewer rows than threads) gives the whole row's answer: the
// first of equal largest logits, across the parts too, and the log-sum-exp, fewer valid ids than
// the row holds, one valid id; a part of -inf alone (masked ids) or of NaN, where the row's own
// definition holds.
TEST(CpuBackend, ArgmaxLseOfARowSplitOverThreadsIsTheRowsOwn) {
  if (ThreadPool::global().size() < 2) GTEST_SKIP() << "one thread: no row is split";
  CpuBackend be;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 4.f);
  const int64_t V = 1001;
  const float inf = std::numeric_limits<float>::infinity();
  for (int c = 0; c < 6; ++c) {
    std::vector<float> l(static_cast<size_t>(V));
    for (float& v : l) v = d(rng);
    if (c == 1) l[900] = l[10] = 40.f;  // equal largest, far apart: the first wins
    if (c == 2) std::fill(l.begin(), l.begin() + 600, -inf);
    if (c == 3) std::fill(l.begin(), l.begin() + 600, -inf), l[5] = std::nanf("");
    const int32_t valid = c == 4 ? 997 : c == 5 ? 1 : static_cast<int32_t>(V);
    Tensor logits = Tensor::host(DType::F32, {1, V}), ids = Tensor::host(DType::I32, {1}), stats = Tensor::host(DType::F32, {1, 2});
    std::copy(l.begin(), l.end(), logits.data_as<float>());
    be.argmax_lse(ids, stats, logits, valid);
    const RowStats want = row_argmax_lse(l.data(), valid);
    EXPECT_EQ(ids.data_as<int32_t>()[0], want.token) << c;
    EXPECT_EQ(stats.data_as<float>()[0], want.max) << c;
    const float lse = stats.data_as<float>()[1];
    if (std::isnan(want.lse)) {
      EXPECT_TRUE(std::isnan(lse)) << c;
    } else {
      EXPECT_NEAR(lse, want.lse, 1e-5 * std::fabs(want.lse)) << c;
    }
    if (c == 1) {
      EXPECT_EQ(ids.data_as<int32_t>()[0], 10);
    }
  }
}
