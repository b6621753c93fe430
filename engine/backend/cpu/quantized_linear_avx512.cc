// The decode kernel of quantized_linear.h with AVX-512 (F, BW, DQ, VL), chosen at run time where
// the CPU has it, and compiled with those flags: so that no code for AVX-512 can stand in for
// another file's copy of an inline function, this file uses none from the project's headers (the
// weight arrives as plain pointers, QuantizedView, and the caller owns threads and buffers).
//
// Per block of inputs (one scale, one zero point) the block's dequantization is folded into the
// codes' conversion, so one accumulator a row runs across the whole row and is summed once:
//   int4  16 codes' values are a table: lane i of T holds (i - zero) · scale; the codes index it
//         (one permute per 16 weights, no int-to-float conversion). fp4 likewise: e2m1(i) · scale. The 32 codes of 16 bytes come
//         out as their low nibbles (even inputs) and high nibbles (odd ones): x is read in that
//         order, rearranged once a call (x_pairs).
//   int8  code as float, then (code · scale - zero · scale) in one FMA.
//   fp8   E4M3 bytes become fp16s of 1/256 their value by two shifts and a mask (fp16 has 2 more
//         exponent bits, bias 15 against 7), widened by the F16C converter; a block's sums are
//         scaled by scale · 256 at its end (up to 4 rows of x; more: each value as it comes).
// Blocks of 32 inputs (MXFP4's) take one flat loop, an iteration's table built in it.
// Each row keeps two accumulators per 32 inputs (four for one or two rows of x), so FMAs do not
// wait on each other.
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), a self-initialized
// variable that -Wmaybe-uninitialized reports wherever they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "engine/backend/cpu/quantized_linear.h"

namespace kvpr::cpu {

namespace {

constexpr int64_t kStep = 32;  // inputs per iteration

// The 32 fp8 codes at p as two vectors of 16 floats (value / 256).
inline void fp8x32(const uint8_t* p, __m512& a, __m512& b) {
  const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  // byte << 8: sign at bit 15, exponent at 14..11, mantissa at 10..8; an arithmetic shift by one
  // puts exponent and mantissa where fp16 has them and copies the sign into bit 14, cleared.
  const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1), _mm512_set1_epi16(-16385));
  a = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// acc[a][m] += the codes' values · x over inputs [k, kv) (whole iterations), for the M rows of x
// (`ldx` apart); load(k, lo, hi) gives the values of inputs k.. k+31 in x's order.
template <int M, int A, typename Load>
inline void accumulate(int64_t& k, int64_t kv, const float* x, int64_t ldx, __m512 (&acc)[A][M], Load load) {
  if constexpr (A == 4)
    for (; k + 2 * kStep <= kv; k += 2 * kStep) {
      __m512 w0, w1, w2, w3;
      load(k, w0, w1);
      load(k + kStep, w2, w3);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + k;
        acc[0][m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xm), acc[0][m]);
        acc[1][m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xm + 16), acc[1][m]);
        acc[2][m] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xm + 32), acc[2][m]);
        acc[3][m] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xm + 48), acc[3][m]);
      }
    }
  for (; k < kv; k += kStep) {
    __m512 w0, w1;
    load(k, w0, w1);
    for (int m = 0; m < M; ++m) {
      const float* xm = x + m * ldx + k;
      acc[0][m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xm), acc[0][m]);
      acc[1][m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xm + 16), acc[1][m]);
    }
  }
}

template <WeightFormat F, int M>
void rows(const QuantizedView& w, const float* x, const float* xp, int64_t ldx, int64_t n0, int64_t n1, float* out,
          int64_t ldo) {
  const int64_t kv = w.K / kStep * kStep;
  constexpr int A = M <= 2 ? 4 : 2;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 e2m1 = _mm512_setr_ps(0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6);
  const __m512i low4 = _mm512_set1_epi32(15);
  const float middle = F == WeightFormat::Int4 ? 8.f : 128.f;
  constexpr bool is_nibbles = F == WeightFormat::Int4 || F == WeightFormat::Fp4;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    __m512 acc[A][M];
    for (int a = 0; a < A; ++a)
      for (int m = 0; m < M; ++m) acc[a][m] = _mm512_setzero_ps();
    const int64_t s_row = (n / w.block_n) * w.cols;
    // int4, fp4: the table of scale cell c's 16 values, and the 32 at input i looked up in it.
    auto table_of = [&](int64_t c) {
      if constexpr (F == WeightFormat::Int4) {
        const float z = w.zeros_u8 ? w.zeros_u8[c] : middle;
        return _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(z)), _mm512_set1_ps(w.scales[c]));
      } else {
        return _mm512_mul_ps(e2m1, _mm512_set1_ps(w.scales[c]));
      }
    };
    auto nibbles = [&](int64_t i, __m512 table, __m512& lo, __m512& hi) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i / 2)));
      lo = _mm512_permutexvar_ps(_mm512_and_si512(v, low4), table);
      hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    };
    if (is_nibbles && w.block_k == kStep) {
      // A block an iteration (MXFP4, groups of 32): one loop, each iteration its own table.
      int64_t k = 0;
      accumulate<M, A>(k, kv, xp, ldx, acc,
                       [&](int64_t i, __m512& lo, __m512& hi) { nibbles(i, table_of(s_row + i / kStep), lo, hi); });
    } else {
      for (int64_t g = 0, k = 0; k < kv; ++g) {
        const int64_t end = k + w.block_k < kv ? k + w.block_k : kv;
        const float s = w.scales[s_row + g];
        if constexpr (is_nibbles) {
          const __m512 table = table_of(s_row + g);
          accumulate<M, A>(k, end, xp, ldx, acc, [&](int64_t i, __m512& lo, __m512& hi) { nibbles(i, table, lo, hi); });
        } else if constexpr (F == WeightFormat::Int8) {
          const auto z = static_cast<float>(w.zeros_i32 ? w.zeros_i32[s_row + g] : middle);
          const __m512 vs = _mm512_set1_ps(s), vzs = _mm512_set1_ps(-z * s);
          accumulate<M, A>(k, end, x, ldx, acc, [&](int64_t i, __m512& lo, __m512& hi) {
            const auto* p = reinterpret_cast<const __m128i*>(row + i);
            lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p))), vs, vzs);
            hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p + 1))), vs, vzs);
          });
        } else if constexpr (M <= 4) {
          // The block's sum of the values (1/256 of E4M3's) times x, scaled once at its end by
          // scale · 256 (exact): a row's one multiply where the scale is per row.
          __m512 blk[A][M];
          for (int a = 0; a < A; ++a)
            for (int m = 0; m < M; ++m) blk[a][m] = _mm512_setzero_ps();
          accumulate<M, A>(k, end, x, ldx, blk, [&](int64_t i, __m512& lo, __m512& hi) { fp8x32(row + i, lo, hi); });
          const __m512 vs = _mm512_set1_ps(s * 256.f);
          for (int a = 0; a < A; ++a)
            for (int m = 0; m < M; ++m) acc[a][m] = _mm512_fmadd_ps(blk[a][m], vs, acc[a][m]);
        } else {  // (more rows: too few registers for a block's sums beside the row's)
          const __m512 vs = _mm512_set1_ps(s * 256.f);
          accumulate<M, A>(k, end, x, ldx, acc, [&](int64_t i, __m512& lo, __m512& hi) {
            fp8x32(row + i, lo, hi);
            lo = _mm512_mul_ps(lo, vs);
            hi = _mm512_mul_ps(hi, vs);
          });
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      __m512 t = acc[0][m];
      for (int a = 1; a < A; ++a) t = _mm512_add_ps(t, acc[a][m]);
      out[m * ldo + n] = _mm512_reduce_add_ps(t);
    }
  }
}

template <WeightFormat F>
void rows_of(const QuantizedView& w, const float* x, const float* xp, int64_t M, int64_t n0, int64_t n1, float* out) {
  switch (M) {
    case 1: rows<F, 1>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 2: rows<F, 2>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 3: rows<F, 3>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 4: rows<F, 4>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 5: rows<F, 5>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 6: rows<F, 6>(w, x, xp, w.K, n0, n1, out, w.N); break;
    case 7: rows<F, 7>(w, x, xp, w.K, n0, n1, out, w.N); break;
    default: rows<F, 8>(w, x, xp, w.K, n0, n1, out, w.N); break;
  }
}

// --- int4 and int8 by integer dot products (AVX-512 VNNI) ---------------------------------------
// x enters as 16-bit integers, one scale per kVnniStep inputs: q = round(x / s), s = max |x| /
// kXMax, each q split as 256 · hi + lo with hi and lo signed bytes, so that VPDPBUSD (unsigned
// byte times signed byte, four products summed into each 32-bit lane) multiplies the codes by
// hi and by lo; 256 · Σ code · hi + Σ code · lo is then exact in 32 bits. A step of 128 inputs
// costs one load of codes (int4: a mask and a shift), four VPDPBUSD a row of x, and one FMA into
// the row's float sums with the block's scale times x's; the zero points' share,
// scale · zero · Σ x, comes once a block from x's sums (of the same integers).

constexpr float kXMax = 127.f * 256.f + 127.f;  // the largest |q|: hi and lo stay within a signed byte

template <int M>
inline void vnni_step(const __m512i c0, const __m512i c1, const int8_t* xq, int64_t x_stride, const float* xscale,
                      int64_t s_stride, __m512 ws, __m512 (&acc)[M]) {
  for (int m = 0; m < M; ++m) {
    const int8_t* p = xq + m * x_stride;
    const __m512i zero = _mm512_setzero_si512();
    __m512i h = _mm512_dpbusd_epi32(zero, c0, _mm512_loadu_si512(p));
    __m512i l = _mm512_dpbusd_epi32(zero, c0, _mm512_loadu_si512(p + 128));
    h = _mm512_dpbusd_epi32(h, c1, _mm512_loadu_si512(p + 64));
    l = _mm512_dpbusd_epi32(l, c1, _mm512_loadu_si512(p + 192));
    const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
    acc[m] = _mm512_fmadd_ps(f, _mm512_mul_ps(ws, _mm512_set1_ps(xscale[m * s_stride])), acc[m]);
  }
}

template <WeightFormat F, int M>
void vnni_rows(const QuantizedView& w, const int8_t* xq, const float* xscale, const float* xsum, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
  const int64_t steps = w.K / kVnniStep, x_stride = steps * kVnniBytes;
  // Scale blocks narrower than a step (32 or 64 inputs, int4): lane i holds inputs 8i..8i+7 of
  // the step, so it takes scale i / (16 / per) of the step's `per`.
  const int64_t per = w.block_k < kVnniStep ? kVnniStep / w.block_k : 0;
  const __m512i lane_block = per == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                                      : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __mmask16 per_mask = per == 4 ? 0xF : 0x3;
  const __m512i low4 = _mm512_set1_epi8(15);
  // The blocks of inputs [0, steps · kVnniStep), whose zero points' share comes from xsum.
  const int64_t blocks = w.block_k >= w.K ? 1 : (steps * kVnniStep + w.block_k - 1) / w.block_k;
  const float middle = F == WeightFormat::Int4 ? 8.f : 128.f;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    const int64_t s_row = (n / w.block_n) * w.cols;
    const float* srow = w.scales + s_row;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t t = 0; t < steps; ++t) {
      __m512i c0, c1;
      if constexpr (F == WeightFormat::Int4) {
        const __m512i v = _mm512_loadu_si512(row + t * (kVnniStep / 2));
        c0 = _mm512_and_si512(v, low4);                         // inputs 2j
        c1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);  // inputs 2j + 1
      } else {
        c0 = _mm512_loadu_si512(row + t * kVnniStep);
        c1 = _mm512_loadu_si512(row + t * kVnniStep + 64);
      }
      const __m512 ws = per ? _mm512_permutexvar_ps(lane_block, _mm512_maskz_loadu_ps(per_mask, srow + t * per))
                            : _mm512_set1_ps(srow[w.block_k >= w.K ? 0 : t * kVnniStep / w.block_k]);
      vnni_step<M>(c0, c1, xq + t * kVnniBytes, x_stride, xscale + t, steps, ws, acc);
    }
    for (int m = 0; m < M; ++m) {
      const float* sums = xsum + m * w.cols;
      float zero_share = 0;
      for (int64_t g = 0; g < blocks; ++g) {
        const float z = w.zeros_u8 ? w.zeros_u8[s_row + g] : w.zeros_i32 ? static_cast<float>(w.zeros_i32[s_row + g]) : middle;
        zero_share += srow[g] * z * sums[g];
      }
      out[m * ldo + n] = _mm512_reduce_add_ps(acc[m]) - zero_share;
    }
  }
}

// --- fp8 by BF16 dot products (AVX-512 BF16, VBMI) -----------------------------------------------
// Every E4M3 value is a BF16 exactly (3 mantissa bits of 7, exponents 2^-9..2^8 all normal), so a
// byte's magnitude indexes a 128-entry table of its BF16's high bytes and another of its low ones
// (VPERMI2B, 7-bit indices), the sign ORed into the high byte; the two interleaved are 64
// weights' BF16s. x enters as two BF16s, hi = bf16(x) and lo = bf16(x - hi), whose sum is within
// 2^-17 of x: VDPBF16PS multiplies the weights by each, the products exact in fp32. A block's
// sums take its scale once at its end.

// The BF16 bits of E4M3 magnitude i (E4M3's 0x7F is NaN: a NaN).
inline uint16_t e4m3_bf16(int i) {
  const int e = i >> 3, m = i & 7;
  const float v = e ? std::ldexp(1.f + m / 8.f, e - 7) : std::ldexp(m / 8.f, -6);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return i == 0x7F ? uint16_t{0x7FC0} : static_cast<uint16_t>(bits >> 16);
}

// The two tables (high bytes, low bytes) as two vectors each, entries 0..63 and 64..127.
struct Bf16Tables {
  __m512i hi0, hi1, lo0, lo1;
};
inline const Bf16Tables& bf16_tables() {
  static const Bf16Tables t = [] {
    alignas(64) uint8_t hi[128], lo[128];
    for (int i = 0; i < 128; ++i) {
      const uint16_t b = e4m3_bf16(i);
      hi[i] = static_cast<uint8_t>(b >> 8);
      lo[i] = static_cast<uint8_t>(b & 0xFF);
    }
    return Bf16Tables{_mm512_load_si512(hi), _mm512_load_si512(hi + 64), _mm512_load_si512(lo), _mm512_load_si512(lo + 64)};
  }();
  return t;
}

template <int M>
void fp8_bf16_rows(const QuantizedView& w, const uint16_t* xb, int64_t n0, int64_t n1, float* out, int64_t ldo) {
  const int64_t chunks = w.K / kBf16Step, x_stride = chunks * kBf16Step * 2;
  const int64_t per_block = w.block_k >= w.K ? chunks : w.block_k / kBf16Step;
  const Bf16Tables t = bf16_tables();  // (a copy in registers)
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  constexpr int A = M <= 2 ? 2 : 1;  // accumulators a row for each of hi and lo
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    const float* srow = w.scales + (n / w.block_n) * w.cols;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t c0 = 0, g = 0; c0 < chunks; c0 += per_block, ++g) {
      const int64_t c1 = c0 + per_block < chunks ? c0 + per_block : chunks;
      __m512 blk[M][2 * A];
      for (int m = 0; m < M; ++m)
        for (int a = 0; a < 2 * A; ++a) blk[m][a] = _mm512_setzero_ps();
      for (int64_t c = c0; c < c1; ++c) {
        const __m512i v = _mm512_loadu_si512(row + c * kBf16Step);
        // (_mm512_permutex2var_epi8 reads index bits 0..6: the sign bit selects nothing)
        const __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, v, t.hi1), v, sign, 0xF8);  // a | (b & c)
        const __m512i l = _mm512_permutex2var_epi8(t.lo0, v, t.lo1);
        const __m512bh wa = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(l, h));  // inputs 16L + 0..7 of each 128-bit lane L
        const __m512bh wb = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(l, h));  // inputs 16L + 8..15
        for (int m = 0; m < M; ++m) {
          const uint16_t* p = xb + m * x_stride + c * kBf16Step * 2;
          auto x = [&](int i) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p + 32 * i)); };
          // hi · w in blk[m][0] (and [1]), lo · w in the last (and [2]).
          blk[m][0] = _mm512_dpbf16_ps(blk[m][0], wa, x(0));
          blk[m][A - 1] = _mm512_dpbf16_ps(blk[m][A - 1], wb, x(1));
          blk[m][A] = _mm512_dpbf16_ps(blk[m][A], wa, x(2));
          blk[m][2 * A - 1] = _mm512_dpbf16_ps(blk[m][2 * A - 1], wb, x(3));
        }
      }
      const __m512 vs = _mm512_set1_ps(srow[g]);
      for (int m = 0; m < M; ++m) {
        __m512 b = blk[m][0];
        for (int a = 1; a < 2 * A; ++a) b = _mm512_add_ps(b, blk[m][a]);
        acc[m] = _mm512_fmadd_ps(b, vs, acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(acc[m]);
  }
}

}  // namespace

void quantize_x_vnni(const float* x, int64_t M, int64_t K, WeightFormat format, int64_t block_k, int64_t cols,
                     int8_t* xq, float* xscale, float* xsum) {
  const int64_t steps = K / kVnniStep;
  const bool nibbles = format == WeightFormat::Int4;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512 sign = _mm512_set1_ps(-0.f);
  const __m512i qmax = _mm512_set1_epi32(static_cast<int32_t>(kXMax)), qmin = _mm512_set1_epi32(-static_cast<int32_t>(kXMax));
  const __m512i half = _mm512_set1_epi32(128), byte = _mm512_set1_epi32(255);
  for (int64_t m = 0; m < M; ++m) {
    float* sums = xsum + m * cols;
    for (int64_t g = 0; g < cols; ++g) sums[g] = 0;
    for (int64_t t = 0; t < steps; ++t) {
      const float* p = x + m * K + t * kVnniStep;
      __m512 v[8];
      __m512 amax = _mm512_setzero_ps();
      for (int i = 0; i < 8; ++i) {
        v[i] = _mm512_loadu_ps(p + 16 * i);
        amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v[i]));
      }
      const float a = _mm512_reduce_max_ps(amax);
      const float s = a / kXMax;
      const __m512 inv = _mm512_set1_ps(a > 0 ? kXMax / a : 0.f);
      xscale[m * steps + t] = s;
      // The codes' order: int4's inputs 2j (the low nibbles) first, then 2j + 1.
      __m512 u[8];
      for (int j = 0; j < 4; ++j) {
        u[j] = nibbles ? _mm512_permutex2var_ps(v[2 * j], even, v[2 * j + 1]) : v[j];
        u[4 + j] = nibbles ? _mm512_permutex2var_ps(v[2 * j], odd, v[2 * j + 1]) : v[4 + j];
      }
      int8_t* dst = xq + (m * steps + t) * kVnniBytes;
      int32_t part[8];
      for (int i = 0; i < 8; ++i) {
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(u[i], inv));
        q = _mm512_min_epi32(_mm512_max_epi32(q, qmin), qmax);
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q, half), byte), half);
        const __m512i hi = _mm512_srai_epi32(_mm512_sub_epi32(q, lo), 8);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * i), _mm512_cvtepi32_epi8(hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + kVnniStep + 16 * i), _mm512_cvtepi32_epi8(lo));
        part[i] = _mm512_reduce_add_epi32(q);
      }
      // Each 32 inputs' sum into its block's (blocks are 32 wide or more, whole 32s).
      for (int j = 0; j < 4; ++j) {
        const int32_t chunk = nibbles ? part[j] + part[4 + j] : part[2 * j] + part[2 * j + 1];
        const int64_t k = t * kVnniStep + 32 * j;
        sums[block_k >= K ? 0 : k / block_k] += s * static_cast<float>(chunk);
      }
    }
  }
}

void quantized_rows_vnni(const QuantizedView& w, const int8_t* xq, const float* xscale, const float* xsum, int64_t M,
                         int64_t n0, int64_t n1, float* out) {
  auto run = [&]<int R>(int) {
    if (w.format == WeightFormat::Int4)
      vnni_rows<WeightFormat::Int4, R>(w, xq, xscale, xsum, n0, n1, out, w.N);
    else
      vnni_rows<WeightFormat::Int8, R>(w, xq, xscale, xsum, n0, n1, out, w.N);
  };
  switch (M) {
    case 1: run.template operator()<1>(0); break;
    case 2: run.template operator()<2>(0); break;
    case 3: run.template operator()<3>(0); break;
    case 4: run.template operator()<4>(0); break;
    case 5: run.template operator()<5>(0); break;
    case 6: run.template operator()<6>(0); break;
    case 7: run.template operator()<7>(0); break;
    default: run.template operator()<8>(0); break;
  }
}

void bf16_x(const float* x, int64_t M, int64_t K, uint16_t* xb) {
  const int64_t chunks = K / kBf16Step;
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = x + m * K + c * kBf16Step;
      const __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16), v2 = _mm512_loadu_ps(p + 32),
                   v3 = _mm512_loadu_ps(p + 48);
      // The weights' order: inputs 16L + 0..7 of each 16 (L = 0..3), then 16L + 8..15.
      const __m512 u[4] = {_mm512_permutex2var_ps(v0, first, v1), _mm512_permutex2var_ps(v2, first, v3),
                           _mm512_permutex2var_ps(v0, second, v1), _mm512_permutex2var_ps(v2, second, v3)};
      uint16_t* d = xb + (m * chunks + c) * kBf16Step * 2;
      for (int i = 0; i < 4; ++i) {
        const __m256bh hi = _mm512_cvtneps_pbh(u[i]);
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(hi)), 16));
        const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(u[i], back));
        // hi: x of chunk halves 0, 1 (the unpacklo's weights, then the unpackhi's) at 0, 32; lo at 64, 96.
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 16 * (i % 2) + 32 * (i / 2)), reinterpret_cast<__m256i>(hi));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 64 + 16 * (i % 2) + 32 * (i / 2)), reinterpret_cast<__m256i>(lo));
      }
    }
}

void quantized_rows_fp8_bf16(const QuantizedView& w, const uint16_t* xb, int64_t M, int64_t n0, int64_t n1, float* out) {
  switch (M) {
    case 1: fp8_bf16_rows<1>(w, xb, n0, n1, out, w.N); break;
    case 2: fp8_bf16_rows<2>(w, xb, n0, n1, out, w.N); break;
    case 3: fp8_bf16_rows<3>(w, xb, n0, n1, out, w.N); break;
    case 4: fp8_bf16_rows<4>(w, xb, n0, n1, out, w.N); break;
    case 5: fp8_bf16_rows<5>(w, xb, n0, n1, out, w.N); break;
    case 6: fp8_bf16_rows<6>(w, xb, n0, n1, out, w.N); break;
    case 7: fp8_bf16_rows<7>(w, xb, n0, n1, out, w.N); break;
    default: fp8_bf16_rows<8>(w, xb, n0, n1, out, w.N); break;
  }
}

void quantized_rows_avx512(const QuantizedView& w, const float* x, const float* x_pairs, int64_t M, int64_t n0,
                           int64_t n1, float* out) {
  switch (w.format) {
    case WeightFormat::Int4: rows_of<WeightFormat::Int4>(w, x, x_pairs, M, n0, n1, out); break;
    case WeightFormat::Int8: rows_of<WeightFormat::Int8>(w, x, x_pairs, M, n0, n1, out); break;
    case WeightFormat::Fp8: rows_of<WeightFormat::Fp8>(w, x, x_pairs, M, n0, n1, out); break;
    case WeightFormat::Fp4: rows_of<WeightFormat::Fp4>(w, x, x_pairs, M, n0, n1, out); break;
    case WeightFormat::Dense: break;
  }
}

}  // namespace kvpr::cpu
