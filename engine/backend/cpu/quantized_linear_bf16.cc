// The decode kernel of quantized_linear.h for fp8 by BF16 dot products (AVX-512 BF16 and VBMI),
// chosen at run time where the CPU has them, compiled with their flags alone; like
// quantized_linear_avx512.cc it uses no inline function of the project's headers or the
// standard library's.
//
// Every E4M3 value is a BF16 exactly (3 mantissa bits of 7, exponents 2^-9..2^8 all normal), so a
// byte's magnitude indexes a 128-entry table of its BF16's high bytes and another of its low ones
// (VPERMI2B, 7-bit indices), the sign ORed into the high byte; the two interleaved are 64
// weights' BF16s. x enters as two BF16s, hi = bf16(x) and lo = bf16(x - hi), whose sum is within
// 2^-17 of x: VDPBF16PS multiplies the weights by each, the products exact in fp32. A block's
// sums take its scale once at its end.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (as quantized_linear_avx512.cc says)
#endif
#include <immintrin.h>

#include "engine/backend/cpu/quantized_linear.h"

namespace kvpr::cpu {

namespace {

// The BF16 bits of E4M3 magnitude i (E4M3's 0x7F is NaN: a NaN).
inline uint16_t e4m3_bf16(int i) {
  if (i == 0x7F) return 0x7FC0;
  const uint32_t e = static_cast<uint32_t>(i) >> 3, m = static_cast<uint32_t>(i) & 7;
  if (e == 0) {  // subnormal: m · 2^-9, a BF16 2^-9 · m exactly (m < 8: at most 3 significant bits)
    if (m == 0) return 0;
    uint32_t shift = 0;  // m = 1.f · 2^k: k = 2, 1 or 0
    while ((m << shift) < 4) ++shift;
    const uint32_t k = 2 - shift, frac = (m << shift) & 3;  // the bits below m's leading one
    return static_cast<uint16_t>(((k - 9 + 127) << 7) | (frac << (7 - 2)));
  }
  return static_cast<uint16_t>(((e - 7 + 127) << 7) | (m << 4));  // 2^(e-7) · (1 + m/8)
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

}  // namespace kvpr::cpu
