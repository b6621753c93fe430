// Vector helpers for the CPU kernels: load 8 floats from F32/F16/BF16 storage, dot products
// and axpy in fp32. AVX2+FMA+F16C when the build enables them (KVPR_CPU_AVX2), scalar otherwise.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/base/dtype.h"
#include "engine/base/error.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVPR_VEC_AVX2 1
#endif

namespace kvpr::cpu {

// Element type tags for templated kernels.
struct F32Tag { using T = float; };
struct F16Tag { using T = uint16_t; };
struct BF16Tag { using T = uint16_t; };
struct F8Tag { using T = uint8_t; };  // fp8 E4M3 (KV cache)

// Every fp8 E4M3 byte's value: widening is a table lookup (a gather with AVX2).
inline const float* e4m3_table() {
  static const auto table = [] {
    struct Table {
      float v[256];
    } t{};
    for (int b = 0; b < 256; ++b) t.v[b] = e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  return table.v;
}

template <typename Tag>
inline float load1(const typename Tag::T* p) {
  if constexpr (std::is_same_v<Tag, F32Tag>) return *p;
  else if constexpr (std::is_same_v<Tag, F16Tag>) return f16_to_f32(*p);
  else if constexpr (std::is_same_v<Tag, F8Tag>) return e4m3_table()[*p];
  else return bf16_to_f32(*p);
}

#ifdef KVPR_VEC_AVX2
template <typename Tag>
inline __m256 load8(const typename Tag::T* p) {
  if constexpr (std::is_same_v<Tag, F32Tag>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<Tag, F16Tag>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (std::is_same_v<Tag, F8Tag>) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_i32gather_ps(e4m3_table(), idx, 4);
  } else {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}
#endif

// Calls fn with the storage tag of a float dtype.
template <typename Fn>
inline void dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: fn(F32Tag{}); return;
    case DType::F16: fn(F16Tag{}); return;
    case DType::BF16: fn(BF16Tag{}); return;
    case DType::F8E4M3: fn(F8Tag{}); return;
    default: KVPR_THROW("expected a float tensor, got ", dtype_name(t));
  }
}

// sum_i a[i] * b[i], a in fp32, b in Tag's storage.
template <typename Tag>
inline float dot(const float* a, const typename Tag::T* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#ifdef KVPR_VEC_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8<Tag>(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8<Tag>(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8<Tag>(b + i), acc0);
  s = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += a[i] * load1<Tag>(b + i);
  return s;
}

// y[i] += alpha * x[i], x in Tag's storage.
template <typename Tag>
inline void axpy(float* y, float alpha, const typename Tag::T* x, int64_t n) {
  int64_t i = 0;
#ifdef KVPR_VEC_AVX2
  __m256 va = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8<Tag>(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += alpha * load1<Tag>(x + i);
}

// dst[i] = float(src[i]).
template <typename Tag>
inline void to_f32(float* dst, const typename Tag::T* src, int64_t n) {
  int64_t i = 0;
#ifdef KVPR_VEC_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<Tag>(src + i));
#endif
  for (; i < n; ++i) dst[i] = load1<Tag>(src + i);
}

// out[m * ldo + n] = dot(x[m, :], w[n, :]) for 4 weight rows n0..n0+3 (fp32) and rows m0..m1
// of x: a 4x2 register tile so each loaded vector feeds several FMAs.
inline void dot_4xm(const float* x, int64_t m0, int64_t m1, const float* w0, const float* w1, const float* w2,
                    const float* w3, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
#ifdef KVPR_VEC_AVX2
  for (; m + 2 <= m1; m += 2) {
    const float* xa = x + m * K;
    const float* xb = xa + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
      __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
      __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
      a0 = _mm256_fmadd_ps(va, v0, a0);
      a1 = _mm256_fmadd_ps(va, v1, a1);
      a2 = _mm256_fmadd_ps(va, v2, a2);
      a3 = _mm256_fmadd_ps(va, v3, a3);
      b0 = _mm256_fmadd_ps(vb, v0, b0);
      b1 = _mm256_fmadd_ps(vb, v1, b1);
      b2 = _mm256_fmadd_ps(vb, v2, b2);
      b3 = _mm256_fmadd_ps(vb, v3, b3);
    }
    float ra[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
    float rb[4] = {hsum(b0), hsum(b1), hsum(b2), hsum(b3)};
    for (; k < K; ++k) {
      ra[0] += xa[k] * w0[k], ra[1] += xa[k] * w1[k], ra[2] += xa[k] * w2[k], ra[3] += xa[k] * w3[k];
      rb[0] += xb[k] * w0[k], rb[1] += xb[k] * w1[k], rb[2] += xb[k] * w2[k], rb[3] += xb[k] * w3[k];
    }
    for (int j = 0; j < 4; ++j) {
      out[m * ldo + n0 + j] = ra[j];
      out[(m + 1) * ldo + n0 + j] = rb[j];
    }
  }
#endif
  for (; m < m1; ++m) {
    const float* xr = x + m * K;
    out[m * ldo + n0 + 0] = dot<F32Tag>(xr, w0, K);
    out[m * ldo + n0 + 1] = dot<F32Tag>(xr, w1, K);
    out[m * ldo + n0 + 2] = dot<F32Tag>(xr, w2, K);
    out[m * ldo + n0 + 3] = dot<F32Tag>(xr, w3, K);
  }
}

}  // namespace kvpr::cpu
