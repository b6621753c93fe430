#include "engine/backend/cpu/quantized_linear.h"

#include <algorithm>
#include <cstring>

#include "engine/backend/cpu/vec.h"
#include "engine/base/error.h"
#include "engine/base/thread_pool.h"

#ifdef KVPR_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace kvpr::cpu {

namespace {

// fp8 codes enter the sums as e4m3 / 256 (the E4M3 bits placed in an fp16, whose exponent bias
// is 8 more), and the block's scale is multiplied by 256: both exact, powers of two.
constexpr float kFp8Unit = 256.f;

// Rows of x the decode kernel keeps in registers at once.
constexpr int kMaxRows = 8;

// Σ_k code(k) · x[m][k] over inputs [k0, k1) of one row of codes, for the M rows of x (`ldx`
// apart), into dot[m]; codes in the kernel's units (int4, int8: the code; fp8: e4m3 / 256).
template <WeightFormat F, int M>
void block_dot(const uint8_t* row, int64_t k0, int64_t k1, const float* x, int64_t ldx, float* dot) {
  int64_t k = k0;
#ifdef KVPR_VEC_AVX2
  if (!weight_format_is_nibbles(F) || k0 % 2 == 0) {
    // Two accumulators a row (inputs k..k+7 and k+8..k+15): the FMAs of one iteration do not
    // wait for each other.
    __m256 acc[M], acc2[M];
    for (int m = 0; m < M; ++m) acc[m] = acc2[m] = _mm256_setzero_ps();
    // int4: a 32-bit word of 8 codes broadcast to every lane, lane i shifted by 4i (input 2j is
    // the low nibble of byte j: lane i is input i), no shuffle.
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), low4 = _mm256_set1_epi32(15);
    // fp4: the magnitude's 3 bits index E2M1's 8 values (vpermps reads an index's low 3 bits),
    // and bit 3, moved to bit 31, is the sign.
    const __m256 e2m1 = _mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
    const __m256i sign = _mm256_set1_epi32(8);
    for (; k + 16 <= k1; k += 16) {
      __m256 w0, w1;
      if constexpr (weight_format_is_nibbles(F)) {
        int32_t a, b;
        std::memcpy(&a, row + k / 2, 4);
        std::memcpy(&b, row + k / 2 + 4, 4);
        const __m256i c0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(a), shifts), low4);
        const __m256i c1 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b), shifts), low4);
        if constexpr (F == WeightFormat::Int4) {
          w0 = _mm256_cvtepi32_ps(c0);
          w1 = _mm256_cvtepi32_ps(c1);
        } else {
          w0 = _mm256_xor_ps(_mm256_permutevar8x32_ps(e2m1, c0),
                             _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c0, sign), 28)));
          w1 = _mm256_xor_ps(_mm256_permutevar8x32_ps(e2m1, c1),
                             _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c1, sign), 28)));
        }
      } else if constexpr (F == WeightFormat::Int8) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
        w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
        w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
      } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
        auto half = [](__m128i bytes) {  // 8 E4M3 bytes as fp16s of 1/256 their value
          const __m128i v = _mm_cvtepu8_epi16(bytes);
          const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7F)), 7),
                                         _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8));
          return _mm256_cvtph_ps(h);
        };
        w0 = half(b);
        w1 = half(_mm_srli_si128(b, 8));
      }
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + k;
        acc[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xm), acc[m]);
        acc2[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xm + 8), acc2[m]);
      }
    }
    for (int m = 0; m < M; ++m) dot[m] = hsum(_mm256_add_ps(acc[m], acc2[m]));
  } else {
    for (int m = 0; m < M; ++m) dot[m] = 0;
  }
#else
  for (int m = 0; m < M; ++m) dot[m] = 0;
#endif
  for (; k < k1; ++k) {
    float q = weight_code(row, F, k);
    if constexpr (F == WeightFormat::Fp8) q /= kFp8Unit;
    for (int m = 0; m < M; ++m) dot[m] += q * x[m * ldx + k];
  }
}

// out[m][n] for M rows of x (x, xsum, out `ldx`, `cols`, `ldo` apart) and every output n.
template <WeightFormat F, int M>
void decode_rows(float* out, int64_t ldo, const float* x, int64_t ldx, const float* xsum, const Weight& w) {
  const int64_t N = w.dim(0), K = w.dim(1), bk = w.block_k, bn = w.block_n, cols = w.scale_cols();
  const int64_t row_bytes = w.codes.dim(-1);
  const auto* codes = w.codes.data_as<uint8_t>();
  const float* scales = w.scales.data_as<float>();
  ThreadPool::global().parallel_for(N, 8, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float acc[M] = {}, dot[M];
      const int64_t s_row = (n / bn) * cols;
      for (int64_t g = 0; g < cols; ++g) {
        const int64_t k0 = g * bk, k1 = std::min(K, k0 + bk);
        block_dot<F, M>(codes + n * row_bytes, k0, k1, x, ldx, dot);
        if constexpr (F == WeightFormat::Fp8 || F == WeightFormat::Fp4) {
          const float s = scales[s_row + g] * (F == WeightFormat::Fp8 ? kFp8Unit : 1.f);
          for (int m = 0; m < M; ++m) acc[m] += s * dot[m];
        } else {
          const float s = scales[s_row + g];
          const auto z = static_cast<float>(weight_zero(w, s_row + g));
          for (int m = 0; m < M; ++m) acc[m] += s * (dot[m] - z * xsum[m * cols + g]);
        }
      }
      for (int m = 0; m < M; ++m) out[m * ldo + n] = acc[m];
    }
  });
}

template <WeightFormat F>
void decode(float* out, int64_t ldo, const float* x, int64_t M, int64_t ldx, const float* xsum, int64_t cols,
            const Weight& w) {
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
    const float* xm = x + m0 * ldx;
    const float* sm = xsum + m0 * cols;
    float* om = out + m0 * ldo;
    switch (std::min<int64_t>(kMaxRows, M - m0)) {
      case 1: decode_rows<F, 1>(om, ldo, xm, ldx, sm, w); break;
      case 2: decode_rows<F, 2>(om, ldo, xm, ldx, sm, w); break;
      case 3: decode_rows<F, 3>(om, ldo, xm, ldx, sm, w); break;
      case 4: decode_rows<F, 4>(om, ldo, xm, ldx, sm, w); break;
      case 5: decode_rows<F, 5>(om, ldo, xm, ldx, sm, w); break;
      case 6: decode_rows<F, 6>(om, ldo, xm, ldx, sm, w); break;
      case 7: decode_rows<F, 7>(om, ldo, xm, ldx, sm, w); break;
      default: decode_rows<F, 8>(om, ldo, xm, ldx, sm, w); break;
    }
  }
}

#ifdef KVPR_CPU_AVX512
// Inputs the AVX-512 kernel takes a loop iteration at a time.
constexpr int64_t kAvx512Step = 32;

// Whether the VNNI kernel takes w: int4 or int8 whose blocks of inputs fit its steps, and at
// least one whole step.
bool vnni_fits(const Weight& w) {
  const int64_t bk = w.block_k, K = w.dim(1);
  if (K < kVnniStep || !(w.format == WeightFormat::Int4 || w.format == WeightFormat::Int8)) return false;
  return bk % kVnniStep == 0 || bk >= K || (w.format == WeightFormat::Int4 && (bk == 32 || bk == 64));
}

// Whether the BF16 kernel takes w: fp8 whose blocks of inputs are whole steps, and at least one.
bool bf16_fits(const Weight& w) {
  const int64_t bk = w.block_k, K = w.dim(1);
  return w.format == WeightFormat::Fp8 && K >= kBf16Step && (bk % kBf16Step == 0 || bk >= K);
}

// The decode with an AVX-512 kernel (VNNI's for int4 and int8, BF16's for fp8, where they fit):
// rows of x in groups of 8 over the pool's threads, and the inputs past the kernel's last whole
// step added here.
void decode_avx512(float* out, const float* x, int64_t M, const Weight& w, QuantizedScratch& scratch) {
  const int64_t N = w.dim(0), K = w.dim(1);
  const QuantizedView view{w.codes.data_as<uint8_t>(),
                           w.scales.data_as<float>(),
                           w.zeros.defined() && w.zeros.dtype() == DType::U8 ? w.zeros.data_as<uint8_t>() : nullptr,
                           w.zeros.defined() && w.zeros.dtype() == DType::I32 ? w.zeros.data_as<int32_t>() : nullptr,
                           w.format,
                           N,
                           K,
                           w.codes.dim(-1),
                           w.block_n,
                           w.block_k,
                           w.scale_cols()};
  const int64_t cols = view.cols;
  const bool vnni = scratch.dots && quantized_vnni_available() && vnni_fits(w);
  const bool bf16 = scratch.dots && quantized_bf16_available() && bf16_fits(w);
  const int64_t step = vnni ? kVnniStep : bf16 ? kBf16Step : kAvx512Step, kv = K / step * step;
  const int64_t steps = K / kVnniStep;  // (the VNNI kernel's)
  const float* pairs = nullptr;
  if (bf16) {
    scratch.xb.resize(static_cast<size_t>(M * kv * 2));
    bf16_x(x, M, K, scratch.xb.data());
  } else if (vnni) {
    scratch.xq.resize(static_cast<size_t>(M * steps * kVnniBytes));
    scratch.xscale.resize(static_cast<size_t>(M * steps));
    scratch.xsum.resize(static_cast<size_t>(M * cols));
    quantize_x_vnni(x, M, K, w.format, w.block_k, cols, scratch.xq.data(), scratch.xscale.data(), scratch.xsum.data());
  } else if (weight_format_is_nibbles(w.format)) {
    scratch.x_pairs.resize(static_cast<size_t>(M * K));
    float* d = scratch.x_pairs.data();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < kv; k += kAvx512Step)
        for (int64_t j = 0; j < kAvx512Step / 2; ++j) {
          d[m * K + k + j] = x[m * K + k + 2 * j];
          d[m * K + k + kAvx512Step / 2 + j] = x[m * K + k + 2 * j + 1];
        }
    pairs = d;
  }
  ThreadPool::global().parallel_for(N, 8, [&](int64_t b, int64_t e) {
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
      if (bf16) {
        quantized_rows_fp8_bf16(view, scratch.xb.data() + m0 * kv * 2, rows, b, e, out + m0 * N);
      } else if (vnni) {
        quantized_rows_vnni(view, scratch.xq.data() + m0 * steps * kVnniBytes, scratch.xscale.data() + m0 * steps,
                            scratch.xsum.data() + m0 * cols, rows, b, e, out + m0 * N);
      } else {
        quantized_rows_avx512(view, x + m0 * K, pairs ? pairs + m0 * K : nullptr, rows, b, e, out + m0 * N);
      }
    }
    for (int64_t n = b; n < e && kv < K; ++n) {
      const uint8_t* row = view.codes + n * view.row_bytes;
      const int64_t s_row = (n / w.block_n) * cols;
      for (int64_t k = kv; k < K; ++k) {
        const int64_t s = s_row + k / w.block_k;
        const float v = (weight_code(row, w.format, k) - static_cast<float>(weight_zero(w, s))) * view.scales[s];  // (fp8, fp4: zero 0)
        for (int64_t m = 0; m < M; ++m) out[m * N + n] += v * x[m * K + k];
      }
    }
  });
}
#endif

}  // namespace

bool quantized_avx512_available() {
#ifdef KVPR_CPU_AVX512
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

bool quantized_vnni_available() {
#ifdef KVPR_CPU_AVX512
  static const bool has = quantized_avx512_available() && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

bool quantized_bf16_available() {
#ifdef KVPR_CPU_AVX512
  static const bool has =
      quantized_avx512_available() && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
  return has;
#else
  return false;
#endif
}

void quantized_linear(float* out, const float* x, int64_t M, const Weight& w, QuantizedScratch& scratch) {
  KVPR_CHECK(w.quantized() && w.rank() == 2, "quantized_linear: weight ", w.describe());
  const int64_t N = w.dim(0), K = w.dim(1), cols = w.scale_cols(), bk = w.block_k;
  // x in the codes' input order.
  if (w.order.defined()) {
    scratch.x.resize(static_cast<size_t>(M * K));
    const int32_t* order = w.order.data_as<int32_t>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) scratch.x[static_cast<size_t>(m * K + k)] = x[m * K + order[k]];
    x = scratch.x.data();
  }
#ifdef KVPR_HAVE_OPENBLAS
  if (M > kMaxRows) {
    // Tiles of about 1 Mi weights, dequantized by the pool's threads, each one sgemm.
    ThreadPool& pool = ThreadPool::global();
    const int64_t tile = std::min<int64_t>(N, std::max<int64_t>(16, (int64_t{1} << 20) / K));
    scratch.tile.resize(static_cast<size_t>(tile * K));
    const int64_t row_bytes = w.codes.dim(-1), srows_cols = cols;
    const auto* codes = w.codes.data_as<uint8_t>();
    const float* scales = w.scales.data_as<float>();
    const float* e4m3 = e4m3_table();
    float e2m1[16];
    for (uint8_t c = 0; c < 16; ++c) e2m1[c] = fp4_e2m1_value(c);
    for (int64_t n0 = 0; n0 < N; n0 += tile) {
      const int64_t nt = std::min(tile, N - n0);
      float* t = scratch.tile.data();
      pool.parallel_for(nt, 8, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t n = n0 + i, s_row = (n / w.block_n) * srows_cols;
          const uint8_t* row = codes + n * row_bytes;
          float* ti = t + i * K;
          for (int64_t g = 0; g < cols; ++g) {  // a block at a time: its scale and zero point
            const int64_t k1 = std::min(K, (g + 1) * bk);
            const float s = scales[s_row + g], z = static_cast<float>(weight_zero(w, s_row + g));
            if (w.format == WeightFormat::Int4)
              for (int64_t k = g * bk; k < k1; ++k) ti[k] = (static_cast<float>((row[k / 2] >> (k % 2 * 4)) & 15) - z) * s;
            else if (w.format == WeightFormat::Int8)
              for (int64_t k = g * bk; k < k1; ++k) ti[k] = (static_cast<float>(row[k]) - z) * s;
            else if (w.format == WeightFormat::Fp4)
              for (int64_t k = g * bk; k < k1; ++k) ti[k] = e2m1[(row[k / 2] >> (k % 2 * 4)) & 15] * s;
            else
              for (int64_t k = g * bk; k < k1; ++k) ti[k] = e4m3[row[k]] * s;
          }
        }
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(nt),
                  static_cast<int>(K), 1.f, x, static_cast<int>(K), t, static_cast<int>(K), 0.f, out + n0,
                  static_cast<int>(N));
    }
    return;
  }
#endif
#ifdef KVPR_CPU_AVX512
  // (Zero points as the layout has them: U8 for int4, I32 for int8.)
  const bool zeros_fit = !w.zeros.defined() || w.zeros.dtype() == (w.format == WeightFormat::Int4 ? DType::U8 : DType::I32);
  if (scratch.avx512 && quantized_avx512_available() && (bk % kAvx512Step == 0 || bk >= K) && zeros_fit) {
    decode_avx512(out, x, M, w, scratch);
    return;
  }
#endif
  // Each row's sum of x over each block of inputs: the zero points' share.
  scratch.xsum.assign(static_cast<size_t>(M * cols), 0.f);
  if (w.format == WeightFormat::Int4 || w.format == WeightFormat::Int8)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) scratch.xsum[static_cast<size_t>(m * cols + k / bk)] += x[m * K + k];
  const float* xsum = scratch.xsum.data();
  switch (w.format) {
    case WeightFormat::Int4: decode<WeightFormat::Int4>(out, N, x, M, K, xsum, cols, w); break;
    case WeightFormat::Int8: decode<WeightFormat::Int8>(out, N, x, M, K, xsum, cols, w); break;
    case WeightFormat::Fp8: decode<WeightFormat::Fp8>(out, N, x, M, K, xsum, cols, w); break;
    case WeightFormat::Fp4: decode<WeightFormat::Fp4>(out, N, x, M, K, xsum, cols, w); break;
    case WeightFormat::Dense: break;
  }
}

}  // namespace kvpr::cpu
