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

}  // namespace

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
