// The decode kernel of quantized_linear.h for int4 and int8 by integer dot products (AVX-512
// VNNI), chosen at run time where the CPU has it, compiled with its flags alone; like
// quantized_linear_avx512.cc it uses no inline function of the project's headers (so that no code
// for VNNI can stand in for another file's copy).
//
// x enters as 16-bit integers, one scale per kVnniStep inputs: q = round(x / s), s = max |x| /
// kXMax, each q split as 256 · hi + lo with hi and lo signed bytes, so that VPDPBUSD (unsigned
// byte times signed byte, four products summed into each 32-bit lane) multiplies the codes by
// hi and by lo; 256 · Σ code · hi + Σ code · lo is then exact in 32 bits. A step of 128 inputs
// costs one load of codes (int4: a mask and a shift), four VPDPBUSD a row of x, and one FMA into
// the row's float sums with the block's scale times x's; the zero points' share,
// scale · zero · Σ x, comes once a row from x's block sums (of the same integers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (as quantized_linear_avx512.cc says)
#endif
#include <immintrin.h>

#include "engine/backend/cpu/quantized_linear.h"

namespace kvpr::cpu {

namespace {

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
  // Steps a block of whole steps holds (one block a row, or blocks within a step: never reached).
  const int64_t steps_a_block = per || w.block_k >= w.K ? steps + 1 : w.block_k / kVnniStep;
  const float middle = F == WeightFormat::Int4 ? 8.f : 128.f;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    const int64_t s_row = (n / w.block_n) * w.cols;
    const float* srow = w.scales + s_row;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t t = 0, g = 0, in_block = 0; t < steps; ++t) {
      __m512i c0, c1;
      if constexpr (F == WeightFormat::Int4) {
        const __m512i v = _mm512_loadu_si512(row + t * (kVnniStep / 2));
        c0 = _mm512_and_si512(v, low4);                         // inputs 2j
        c1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);  // inputs 2j + 1
      } else {
        c0 = _mm512_loadu_si512(row + t * kVnniStep);
        c1 = _mm512_loadu_si512(row + t * kVnniStep + 64);
      }
      if (in_block == steps_a_block) ++g, in_block = 0;  // (blocks of whole steps: their scale)
      ++in_block;
      const __m512 ws = per ? _mm512_permutexvar_ps(lane_block, _mm512_maskz_loadu_ps(per_mask, srow + t * per))
                            : _mm512_set1_ps(srow[g]);
      vnni_step<M>(c0, c1, xq + t * kVnniBytes, x_stride, xscale + t, steps, ws, acc);
    }
    // Σ over blocks of scale · zero · (the block's sum of x), 16 blocks at a time.
    __m512 share[M];
    for (int m = 0; m < M; ++m) share[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < blocks; g += 16) {
      const __mmask16 k = blocks - g >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (blocks - g)) - 1);
      const __m512 z =
          w.zeros_u8    ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, w.zeros_u8 + s_row + g)))
          : w.zeros_i32 ? _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, w.zeros_i32 + s_row + g))
                        : _mm512_set1_ps(middle);
      const __m512 sz = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + g), z);
      for (int m = 0; m < M; ++m) share[m] = _mm512_fmadd_ps(sz, _mm512_maskz_loadu_ps(k, xsum + m * w.cols + g), share[m]);
    }
    for (int m = 0; m < M; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[m], share[m]));
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
      __mmask16 nan = 0;
      for (int i = 0; i < 8; ++i) {
        v[i] = _mm512_loadu_ps(p + 16 * i);
        amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v[i]));
        nan |= _mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q);
      }
      const float a = _mm512_reduce_max_ps(amax);
      // (a NaN in x: the step's scale is NaN, so the outputs are, as the float kernels' would be)
      const float s = nan ? __builtin_nanf("") : a / kXMax;
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

}  // namespace kvpr::cpu
