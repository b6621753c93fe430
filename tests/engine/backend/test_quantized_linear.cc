// The CPU's GEMM on quantized weights (engine/backend/cpu/quantized_linear.h) against the dense
// GEMM on the same weights dequantized (engine/base/weight.h: exactly (code - zero) · scale):
// every format (int4 with and without zero points, int8 with I32 zeros, fp8 with partial blocks,
// fp4 in MXFP4's blocks),
// an input order, widths that leave a tail of the vector loop, every decode kernel (AVX-512 VNNI's
// for int4 and int8, AVX-512 BF16's for fp8, AVX-512's, AVX2's) where the CPU has them, a few rows (decode: one pass,
// dequantized in registers) and many (prefill: a tile at a time); linear_batched on a stack and
// linear_accumulate; the layout's slicing; round to nearest within half a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/base/weight.h"

using namespace kvpr;

namespace {

// A random quantized [N, K] of `format` with blocks bn x bk, zero points when `zeros` (U8 for
// int4, I32 for int8), and a random input order when `ordered`.
Weight random_weight(WeightFormat format, int64_t N, int64_t K, int64_t bn, int64_t bk, bool zeros, bool ordered,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  Weight w;
  w.format = format;
  w.shape = {N, K};
  w.block_n = bn, w.block_k = bk;
  const int64_t row_bytes = weight_format_is_nibbles(format) ? (K + 1) / 2 : K;
  w.codes = Tensor::host(DType::U8, {N, row_bytes});
  for (int64_t i = 0; i < w.codes.numel(); ++i) {
    auto b = static_cast<uint8_t>(rng());
    if (format == WeightFormat::Fp8 && (b & 0x7F) == 0x7F) b &= 0xFE;  // no NaN
    w.codes.data_as<uint8_t>()[i] = b;
  }
  w.scales = Tensor::host(DType::F32, {w.scale_rows(), w.scale_cols()});
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (int64_t i = 0; i < w.scales.numel(); ++i) w.scales.data_as<float>()[i] = scale(rng);
  if (zeros) {
    const bool int4 = format == WeightFormat::Int4;
    w.zeros = Tensor::host(int4 ? DType::U8 : DType::I32, w.scales.shape());
    for (int64_t i = 0; i < w.zeros.numel(); ++i) {
      if (int4)
        w.zeros.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng() % 17);
      else
        w.zeros.data_as<int32_t>()[i] = static_cast<int32_t>(rng() % 257);
    }
  }
  if (ordered) {
    w.order = Tensor::host(DType::I32, {K});
    std::vector<int32_t> o(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) o[static_cast<size_t>(k)] = static_cast<int32_t>(k);
    std::shuffle(o.begin(), o.end(), rng);
    std::copy(o.begin(), o.end(), w.order.data_as<int32_t>());
  }
  return w;
}

Tensor random_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  Tensor x = Tensor::host(DType::F32, {M, K});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = d(rng);
  return x;
}

// max |a - b| / max |b|
double rel_err(const Tensor& a, const Tensor& b) {
  double e = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    e = std::max(e, static_cast<double>(std::fabs(a.data_as<float>()[i] - b.data_as<float>()[i])));
    m = std::max(m, static_cast<double>(std::fabs(b.data_as<float>()[i])));
  }
  return e / std::max(m, 1e-30);
}

struct Layout {
  WeightFormat format;
  int64_t N, K, bn, bk;
  bool zeros, ordered;
};
const Layout kLayouts[] = {
    {WeightFormat::Int4, 40, 256, 1, 128, false, false},  // GPTQ g128 symmetric
    {WeightFormat::Int4, 24, 96, 1, 32, true, true},      // asymmetric, act order
    {WeightFormat::Int4, 9, 75, 1, 75, true, false},      // per channel, an odd width (tails)
    {WeightFormat::Int4, 16, 100, 1, 20, false, false},   // groups that are no multiple of 16
    {WeightFormat::Int8, 33, 200, 1, 200, true, false},   // per channel, I32 zeros
    {WeightFormat::Int8, 16, 64, 16, 64, false, false},   // one scale for the tensor
    {WeightFormat::Int8, 12, 208, 1, 64, true, false},    // the last group 16 wide
    {WeightFormat::Int4, 10, 136, 1, 64, true, true},     // the last group 8 wide, act order
    {WeightFormat::Fp8, 50, 160, 32, 32, false, false},   // blocks, the last ones partial
    {WeightFormat::Fp8, 20, 48, 1, 48, false, true},      // per channel, ordered
    {WeightFormat::Fp8, 16, 256, 1, 128, false, false},   // groups of 128 (AVX-512: block sums)
    {WeightFormat::Fp8, 7, 200, 1, 200, false, false},    // per channel, a tail of 8 past 192
    {WeightFormat::Fp4, 24, 96, 1, 32, false, false},     // MXFP4's blocks of 32
    {WeightFormat::Fp4, 9, 75, 1, 32, false, true},       // a tail of 11, ordered
    {WeightFormat::Fp4, 16, 256, 1, 128, false, false},   // groups of 128
    {WeightFormat::Fp4, 9, 75, 1, 75, false, false},      // one scale a row, an odd width
    // (VNNI, steps of 128 inputs:)
    {WeightFormat::Int4, 12, 320, 1, 32, true, false},    // four scales a step, a tail of 64
    {WeightFormat::Int4, 11, 300, 1, 300, false, true},   // one scale a row, a tail of 44, ordered
    {WeightFormat::Int8, 8, 384, 1, 128, true, false},    // groups of 128, I32 zeros
    {WeightFormat::Int8, 32, 256, 16, 256, false, false}, // a scale a row block of 16, no zeros (128)
    {WeightFormat::Int4, 6, 512, 2, 256, true, false},    // blocks of 2 x 256: two steps a block
    // (BF16, fp8 in steps of 64:)
    {WeightFormat::Fp8, 130, 320, 128, 128, false, false},  // DeepSeek's 128 x 128 blocks, partial ones
};

// The VNNI kernel's x is 16-bit integers with one scale per 128 inputs, at most max |x| / 32639:
// each product is off by at most |w| times half of that. The bound of out[m][n] over all inputs.
double x_rounding_bound(const Tensor& dense, const Tensor& x, int64_t m, int64_t n) {
  const int64_t K = dense.dim(1);
  double amax = 0, wsum = 0;
  for (int64_t k = 0; k < K; ++k) {
    amax = std::max(amax, static_cast<double>(std::fabs(x.data_as<float>()[m * K + k])));
    wsum += std::fabs(dense.data_as<float>()[n * K + k]);
  }
  return amax / 32639 / 2 * wsum;
}

}  // namespace

TEST(QuantizedLinear, MatchesTheDenseGemmOnTheDequantizedWeights) {
  CpuBackend be;
  // Where the CPU has AVX-512 (and VNNI) the backend's kernel is that one's: the others are run
  // too.
  RecordProperty("avx512", cpu::quantized_avx512_available() ? "yes" : "no");
  RecordProperty("vnni", cpu::quantized_vnni_available() ? "yes" : "no");
  RecordProperty("bf16", cpu::quantized_bf16_available() ? "yes" : "no");
  cpu::QuantizedScratch avx2, avx512;
  avx2.avx512 = false;
  avx512.dots = false;
  uint32_t seed = 1;
  for (const Layout& l : kLayouts) {
    const Weight w = random_weight(l.format, l.N, l.K, l.bn, l.bk, l.zeros, l.ordered, seed++);
    const Tensor dense = dequantize(w);
    for (int64_t M : {1, 2, 3, 8, 9, 40}) {  // one pass in registers (<= 8), then tiles for sgemm
      const Tensor x = random_x(M, l.K, seed++);
      Tensor got = Tensor::host(DType::F32, {M, l.N}), want = Tensor::host(DType::F32, {M, l.N});
      Tensor got_avx2 = Tensor::host(DType::F32, {M, l.N}), got_avx512 = Tensor::host(DType::F32, {M, l.N});
      be.linear(got, x, w, Tensor(), Activation::None);
      be.linear(want, x, dense, Tensor(), Activation::None);
      cpu::quantized_linear(got_avx2.data_as<float>(), x.data_as<float>(), M, w, avx2);
      cpu::quantized_linear(got_avx512.data_as<float>(), x.data_as<float>(), M, w, avx512);
      EXPECT_LT(rel_err(got_avx512, want), 2e-5) << w.describe() << " M " << M;
      EXPECT_LT(rel_err(got_avx2, want), 2e-5) << w.describe() << " M " << M << " (AVX2)";
      // The backend's: the float kernels' bound, and x's rounding where it took the VNNI kernel.
      double out_max = 0;
      for (int64_t i = 0; i < want.numel(); ++i) out_max = std::max(out_max, static_cast<double>(std::fabs(want.data_as<float>()[i])));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < l.N; ++n) {
          // (fp8's BF16 kernel: x as two BF16s, within 2^-17 of it, inside the float kernels' bound)
          // (any M: without OpenBLAS more than 8 rows take the decode kernels too)
          const bool integer_x = l.format == WeightFormat::Int4 || l.format == WeightFormat::Int8;
          const double bound = 2e-5 * out_max + (integer_x ? x_rounding_bound(dense, x, m, n) : 0.0);
          ASSERT_LE(std::fabs(got.data_as<float>()[m * l.N + n] - want.data_as<float>()[m * l.N + n]), bound)
              << w.describe() << " M " << M << " m " << m << " n " << n;
        }
    }
  }
}

// x of integers within 16 bits, each step of 128 inputs holding ±32639: the VNNI kernel's scale is
// 1, its x exact, and the integer sums exact, so it matches the float kernels to their rounding.
TEST(QuantizedLinear, VnniIsExactOnSixteenBitIntegers) {
  if (!cpu::quantized_vnni_available()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  cpu::QuantizedScratch vnni, avx512;
  avx512.dots = false;
  uint32_t seed = 40;
  for (const Layout& l : kLayouts) {
    if (l.format != WeightFormat::Int4 && l.format != WeightFormat::Int8) continue;
    if (l.K < cpu::kVnniStep) continue;
    const Weight w = random_weight(l.format, l.N, l.K, l.bn, l.bk, l.zeros, false, seed++);
    const Tensor dense = dequantize(w);
    const int64_t M = 3;
    std::mt19937 rng(seed++);
    std::uniform_int_distribution<int> v(-32639, 32639);
    Tensor x = Tensor::host(DType::F32, {M, l.K});
    float* xp = x.data_as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) xp[i] = static_cast<float>(v(rng));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < l.K; k += cpu::kVnniStep) xp[m * l.K + k + m] = m % 2 ? -32639.f : 32639.f;
    Tensor got = Tensor::host(DType::F32, {M, l.N}), want = Tensor::host(DType::F32, {M, l.N});
    cpu::quantized_linear(got.data_as<float>(), xp, M, w, vnni);
    cpu::quantized_linear(want.data_as<float>(), xp, M, w, avx512);
    EXPECT_LT(rel_err(got, want), 2e-6) << w.describe();
  }
}

// A NaN in x is a NaN in every output, as the float kernels give it (the VNNI kernel's integers
// could not hold one: its step's scale becomes NaN).
TEST(QuantizedLinear, ANanInXIsANanOut) {
  CpuBackend be;
  for (WeightFormat f : {WeightFormat::Int4, WeightFormat::Int8, WeightFormat::Fp8}) {
    const Weight w = random_weight(f, 16, 256, 1, 128, f != WeightFormat::Fp8, false, 50);
    Tensor x = random_x(2, 256, 51);
    x.data_as<float>()[256 + 130] = std::nanf("");  // row 1, the second step
    Tensor out = Tensor::host(DType::F32, {2, 16});
    be.linear(out, x, w, Tensor(), Activation::None);
    for (int64_t n = 0; n < 16; ++n) {
      EXPECT_FALSE(std::isnan(out.data_as<float>()[n])) << weight_format_name(f) << " " << n;
      EXPECT_TRUE(std::isnan(out.data_as<float>()[16 + n])) << weight_format_name(f) << " " << n;
    }
  }
}

TEST(QuantizedLinear, BatchedOnAStackAndAccumulated) {
  CpuBackend be;
  const Weight a = random_weight(WeightFormat::Int4, 32, 64, 1, 32, true, false, 7);
  Weight b = random_weight(WeightFormat::Int4, 32, 64, 1, 32, true, false, 8);
  // A stack [2, 32, 64] as Model::stack makes it, part by part.
  Weight s = a;
  s.shape = {2, 32, 64};
  auto join = [](const Tensor& p, const Tensor& q) {
    Shape sh = p.shape();
    sh.insert(sh.begin(), 2);
    Tensor t = Tensor::host(p.dtype(), sh);
    std::memcpy(t.data(), p.data(), p.nbytes());
    std::memcpy(static_cast<char*>(t.data()) + p.nbytes(), q.data(), q.nbytes());
    return t;
  };
  s.codes = join(a.codes, b.codes);
  s.scales = join(a.scales, b.scales);
  s.zeros = join(a.zeros, b.zeros);
  const Tensor x = random_x(3, 64, 9);
  Tensor out = Tensor::host(DType::F32, {2, 3, 32});
  be.linear_batched(out, x, s, Tensor(), Activation::None);
  for (int i = 0; i < 2; ++i) {
    Tensor want = Tensor::host(DType::F32, {3, 32});
    be.linear(want, x, dequantize(i == 0 ? a : b), Tensor(), Activation::None);
    EXPECT_LT(rel_err(out.rows(i, 1).reshape({3, 32}), want), 2e-5) << i;
    // item() of the stack is the matrix.
    Tensor got = Tensor::host(DType::F32, {3, 32});
    be.linear(got, x, s.item(i), Tensor(), Activation::None);
    EXPECT_LT(rel_err(got, want), 2e-5) << i;
  }
  // Into the residual: out += x · wᵀ.
  Tensor acc = random_x(3, 32, 10), base = Tensor::host(DType::F32, {3, 32}), prod = Tensor::host(DType::F32, {3, 32});
  std::memcpy(base.data(), acc.data(), acc.nbytes());
  be.linear_accumulate(acc, x, b, Tensor());
  be.linear(prod, x, dequantize(b), Tensor(), Activation::None);
  for (int64_t i = 0; i < prod.numel(); ++i)
    EXPECT_NEAR(acc.data_as<float>()[i], base.data_as<float>()[i] + prod.data_as<float>()[i], 1e-4) << i;
}

TEST(QuantizedLinear, RowsAndReshapeFollowTheBlocks) {
  const Weight w = random_weight(WeightFormat::Fp8, 64, 48, 16, 16, false, false, 11);
  const Tensor all = dequantize(w);
  // Rows 16..48 of the matrix are the same weights.
  const Tensor part = dequantize(w.rows(16, 32));
  for (int64_t i = 0; i < part.numel(); ++i) ASSERT_EQ(part.data_as<float>()[i], all.data_as<float>()[16 * 48 + i]);
  // [64, 48] as a stack [2, 32, 48]: item 1 is rows 32..64.
  const Tensor item = dequantize(w.reshape({2, 32, 48}).item(1));
  for (int64_t i = 0; i < item.numel(); ++i) ASSERT_EQ(item.data_as<float>()[i], all.data_as<float>()[32 * 48 + i]);
  // A cut through a block of outputs is refused.
  EXPECT_THROW(w.rows(8, 16), Error);
  EXPECT_THROW(w.reshape({4, 16, 48}).reshape({8, 8, 48}), Error);
  // A dense weight is a tensor, and a quantized one is not.
  EXPECT_THROW(w.dense("test"), Error);
}

TEST(QuantizedLinear, RoundToNearestIsWithinHalfAStep) {
  const Tensor x = random_x(12, 200, 12);
  for (WeightFormat f : {WeightFormat::Int4, WeightFormat::Int8, WeightFormat::Fp8, WeightFormat::Fp4}) {
    const Weight w = quantize_rtn(x, f, 64);
    EXPECT_EQ(w.scales.dim(1), 4);  // ceil(200 / 64)
    const Tensor back = dequantize(w);
    for (int64_t n = 0; n < 12; ++n)
      for (int64_t k = 0; k < 200; ++k) {
        const float v = x.data_as<float>()[n * 200 + k], s = w.scales.data_as<float>()[n * 4 + k / 64];
        // int: half a step of the scale; fp8: half an ulp of E4M3 (3 mantissa bits), 1/16 relative;
        // fp4: half the gap between E2M1's neighbours (0.5 up to 2, 1 up to 4, 2 up to 6).
        const float a = std::fabs(v) / s;
        const float bound = f == WeightFormat::Fp8   ? std::fabs(v) / 16 + s * 0.002f
                            : f == WeightFormat::Fp4 ? s * (a <= 2 ? 0.25f : a <= 4 ? 0.5f : 1.f) + 1e-6f
                                                     : s / 2 + 1e-6f;
        ASSERT_LE(std::fabs(back.data_as<float>()[n * 200 + k] - v), bound) << weight_format_name(f) << " " << n << " " << k;
      }
    if (f == WeightFormat::Fp4)  // MX scales: powers of two (E8M0)
      for (int64_t i = 0; i < w.scales.numel(); ++i) {
        const float s = w.scales.data_as<float>()[i];
        EXPECT_EQ(s, std::exp2(std::round(std::log2(s)))) << i;
      }
  }
}
