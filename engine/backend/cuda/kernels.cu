// Elementwise and row kernels of the CUDA backend.
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kernels.h"

KVPR_CUDA_NAMESPACE_BEGIN

namespace {

template <typename T>
__global__ void gather_rows_kernel(float* out, const T* table, const int32_t* ids, int64_t rows, int64_t n_ids,
                                   int64_t width, bool accumulate) {
  for (int64_t i = blockIdx.x; i < n_ids; i += gridDim.x) {
    int64_t r = ids[i];
    if (r < 0 || r >= rows) r = 0;  // ids are validated on the host; never read out of bounds
    const T* src = table + r * width;
    float* dst = out + i * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      float v = to_f32(src[j]);
      dst[j] = accumulate ? dst[j] + v : v;
    }
  }
}

__global__ void scatter_add_rows_kernel(float* out, const float* src, const int32_t* ids, const float* scales,
                                        int64_t rows, int64_t n, int64_t width) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = ids[i];
    if (r < 0 || r >= rows) continue;  // ids are validated on the host; never write out of bounds
    const float s = scales[i];
    const float* in = src + i * width;
    float* dst = out + r * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) dst[j] += s * in[j];
  }
}

template <typename T>
__global__ void layer_norm_kernel(float* out, const float* x, const T* gamma, const T* beta, int64_t rows,
                                  int64_t width, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * width;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) s += xr[j];
    const float mean = block_sum(s) / static_cast<float>(width);
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      float c = xr[j] - mean;
      q += c * c;
    }
    const float inv = rsqrtf(block_sum(q) / static_cast<float>(width) + eps);
    float* o = out + r * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
      o[j] = (xr[j] - mean) * inv * to_f32(gamma[j]) + to_f32(beta[j]);
    __syncthreads();  // out may alias x: finish reading the row before the next one
  }
}

template <typename T>
__global__ void rms_norm_kernel(float* out, const float* x, const T* gamma, int64_t rows, int64_t width, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * width;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) q += xr[j] * xr[j];
    const float inv = rsqrtf(block_sum(q) / static_cast<float>(width) + eps);
    float* o = out + r * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) o[j] = xr[j] * inv * to_f32(gamma[j]);
    __syncthreads();  // out may alias x: finish reading the row before the next one
  }
}

// One block per row; each thread turns pairs (i, i + d/2) of the row's heads (d: rope_dims).
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t rows, int64_t t, int64_t width, int head_dim,
                            RopeParams params) {
  const int dims = rope_dims(head_dim, params), half = dims / 2;
  const int64_t pairs = width / head_dim * half;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t p = positions[r % t];
    float* row = x + r * width;
    for (int64_t j = threadIdx.x; j < pairs; j += blockDim.x) {
      const int i = static_cast<int>(j % half);
      float* v = row + (j / half) * head_dim;
      double s, c;
      sincos(static_cast<double>(rope_angle(p, i, dims, params)), &s, &c);
      const float cf = static_cast<float>(c) * params.attention_scale, sf = static_cast<float>(s) * params.attention_scale;
      const float lo = v[i], hi = v[i + half];
      v[i] = lo * cf - hi * sf;
      v[i + half] = hi * cf + lo * sf;
    }
  }
}

__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);
    case 2: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 3: return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case 4: return v / (1.f + expf(-v));
    default: return v;
  }
}

__global__ void gated_mul_kernel(float* out, const float* gate, const float* up, int64_t n, int act) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (act == 5) {  // gpt-oss's clamped SwiGLU
      const float x = fminf(gate[i], 7.f), y = fminf(fmaxf(up[i], -7.f), 7.f);
      out[i] = (y + 1.f) * (x / (1.f + expf(-1.702f * x)));
    } else {
      out[i] = activate(gate[i], act) * up[i];
    }
  }
}

__global__ void scale_kernel(float* out, const float* x, int64_t n, float factor, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cap > 0.f ? cap * tanhf(factor * x[i] / cap) : factor * x[i];
}

template <typename O, typename T>
__global__ void bias_act_kernel(O* out, const T* bias, int64_t batch, int64_t m, int64_t n, int act) {
  const int64_t per = m * n, total = batch * per;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = to_f32(out[i]);
    if (bias) v += to_f32(bias[(i / per) * n + i % n]);
    v = activate(v, act);
    out[i] = from_f32<O>(v);
  }
}

template <typename O, typename T>
__global__ void fill_bias_kernel(O* out, const T* bias, int64_t batch, int64_t m, int64_t n) {
  const int64_t per = m * n, total = batch * per;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<O>(to_f32(bias[(i / per) * n + i % n]));
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename D, typename S>
__global__ void copy_rows_kernel(D* dst, const S* src, const SpanDesc* spans, int64_t n_spans, int64_t total_rows,
                                 int64_t width) {
  for (int64_t r = blockIdx.x; r < total_rows; r += gridDim.x) {
    int64_t lo = 0, hi = n_spans - 1;  // the last span starting at or before row r
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (spans[mid].first <= r) lo = mid;
      else hi = mid - 1;
    }
    const SpanDesc s = spans[lo];
    const S* in = src + (s.src_row + (r - s.first)) * width;
    D* out = dst + (s.dst_row + (r - s.first)) * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) out[c] = from_f32<D>(to_f32(in[c]));
  }
}

template <typename T>
__global__ void fill_random_kernel(T* dst, int64_t n, uint64_t seed, float mean, float stddev) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<T>(mean + stddev * random_normal(seed, static_cast<uint64_t>(i)));
}

}  // namespace

void gather_rows(float* out, const void* table, DType table_dtype, const int32_t* ids, int64_t rows, int64_t n_ids,
                 int64_t width, bool accumulate, cudaStream_t stream) {
  if (n_ids == 0) return;
  KVPR_FLOAT_DISPATCH(table_dtype, T,
                      KVPR_LAUNCH(grid_for(n_ids, 1, 65535), 256, 0, stream, gather_rows_kernel<T>)(
                          out, static_cast<const T*>(table), ids, rows, n_ids, width, accumulate));
  CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(float* out, const float* src, const int32_t* ids, const float* scales, int64_t rows, int64_t n,
                      int64_t width, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_LAUNCH(grid_for(n, 1, 65535), 256, 0, stream, scatter_add_rows_kernel)(out, src, ids, scales, rows, n, width);
  CUDA_CHECK_LAUNCH();
}

void layer_norm(float* out, const float* x, const void* gamma, const void* beta, DType param_dtype, int64_t rows,
                int64_t width, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  KVPR_FLOAT_DISPATCH(param_dtype, T,
                      KVPR_LAUNCH(grid_for(rows, 1, 65535), 256, 0, stream, layer_norm_kernel<T>)(
                          out, x, static_cast<const T*>(gamma), static_cast<const T*>(beta), rows, width, eps));
  CUDA_CHECK_LAUNCH();
}

void rms_norm(float* out, const float* x, const void* gamma, DType gamma_dtype, int64_t rows, int64_t width, float eps,
              cudaStream_t stream) {
  if (rows == 0) return;
  KVPR_FLOAT_DISPATCH(gamma_dtype, T,
                      KVPR_LAUNCH(grid_for(rows, 1, 65535), 256, 0, stream, rms_norm_kernel<T>)(
                          out, x, static_cast<const T*>(gamma), rows, width, eps));
  CUDA_CHECK_LAUNCH();
}

void rope(float* x, const int32_t* positions, int64_t rows, int64_t t, int64_t width, int head_dim,
          RopeParams params, cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  KVPR_LAUNCH(grid_for(rows, 1, 65535), 128, 0, stream, rope_kernel)(x, positions, rows, t, width, head_dim, params);
  CUDA_CHECK_LAUNCH();
}

void gated_mul(float* out, const float* gate, const float* up, int64_t n, int act, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_LAUNCH(grid_for(n, 256), 256, 0, stream, gated_mul_kernel)(out, gate, up, n, act);
  CUDA_CHECK_LAUNCH();
}

void scale(float* out, const float* x, int64_t n, float factor, float cap, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_LAUNCH(grid_for(n, 256), 256, 0, stream, scale_kernel)(out, x, n, factor, cap);
  CUDA_CHECK_LAUNCH();
}

int activation_code(Activation a) {
  switch (a) {
    case Activation::None: return 0;
    case Activation::ReLU: return 1;
    case Activation::GELU: return 2;
    case Activation::GELUTanh: return 3;
    case Activation::SiLU: return 4;
    case Activation::ClampedSwiGLU: return 5;
  }
  return 0;
}

void bias_act(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t batch, int64_t m, int64_t n,
              int act, cudaStream_t stream) {
  if (batch * m * n == 0) return;
  KVPR_FLOAT_DISPATCH(out_dtype, O,
                      KVPR_FLOAT_DISPATCH(bias_dtype, T,
                                          KVPR_LAUNCH(grid_for(batch * m * n, 256), 256, 0, stream,
                                                      bias_act_kernel<O, T>)(static_cast<O*>(out),
                                                                             static_cast<const T*>(bias), batch, m,
                                                                             n, act)));
  CUDA_CHECK_LAUNCH();
}

void fill_bias(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t batch, int64_t m, int64_t n,
               cudaStream_t stream) {
  if (batch * m * n == 0) return;
  KVPR_FLOAT_DISPATCH(out_dtype, O,
                      KVPR_FLOAT_DISPATCH(bias_dtype, T,
                                          KVPR_LAUNCH(grid_for(batch * m * n, 256), 256, 0, stream,
                                                      fill_bias_kernel<O, T>)(static_cast<O*>(out),
                                                                              static_cast<const T*>(bias), batch, m,
                                                                              n)));
  CUDA_CHECK_LAUNCH();
}

void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_LAUNCH(grid_for(n, 256), 256, 0, stream, add_kernel)(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_STORAGE_DISPATCH(dst_dtype, D,
                      KVPR_STORAGE_DISPATCH(src_dtype, S,
                                          KVPR_LAUNCH(grid_for(n, 256), 256, 0, stream, convert_kernel<D, S>)(
                                              static_cast<D*>(dst), static_cast<const S*>(src), n)));
  CUDA_CHECK_LAUNCH();
}

void copy_rows(void* dst, DType dst_dtype, const void* src, DType src_dtype, const SpanDesc* spans, int64_t n_spans,
               int64_t total_rows, int64_t width, cudaStream_t stream) {
  if (total_rows == 0 || width == 0 || n_spans == 0) return;
  KVPR_STORAGE_DISPATCH(dst_dtype, D,
                      KVPR_STORAGE_DISPATCH(src_dtype, S,
                                          KVPR_LAUNCH(grid_for(total_rows, 1, 1u << 20), 128, 0, stream,
                                                      copy_rows_kernel<D, S>)(static_cast<D*>(dst),
                                                                              static_cast<const S*>(src), spans,
                                                                              n_spans, total_rows, width)));
  CUDA_CHECK_LAUNCH();
}

void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float mean, float stddev, cudaStream_t stream) {
  if (n == 0) return;
  KVPR_STORAGE_DISPATCH(dtype, T,
                      KVPR_LAUNCH(grid_for(n, 256), 256, 0, stream, fill_random_kernel<T>)(static_cast<T*>(dst), n, seed, mean,
                                                                                  stddev));
  CUDA_CHECK_LAUNCH();
}

// ---- quantized weights (engine/base/weight.h's layout) ----

// E2M1 code c (4 bits): exponent bits 2..1 (bias 1), mantissa bit 0, sign bit 3.
__device__ __forceinline__ float e2m1_value(unsigned c) {
  const unsigned e = (c >> 1) & 3u, m = c & 1u;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m)
                           : (1.f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1));
  return c & 8u ? -mag : mag;
}

__device__ __forceinline__ float e4m3_value(unsigned byte) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(byte);
  return static_cast<float>(v);
}

// Code k of a row as the value it multiplies before the zero point and scale.
__device__ __forceinline__ float quant_code(const uint8_t* row, int format, int64_t k) {
  if (format == 1) return static_cast<float>((row[k >> 1] >> ((k & 1) * 4)) & 15);
  if (format == 2) return static_cast<float>(row[k]);
  if (format == 4) return e2m1_value((row[k >> 1] >> ((k & 1) * 4)) & 15u);
  return e4m3_value(row[k]);
}

// The zero point of scale cell s.
__device__ __forceinline__ float quant_zero(const QuantDesc& w, int64_t s) {
  if (!w.zeros) return w.middle;
  return w.zeros_i32 ? static_cast<float>(static_cast<const int32_t*>(w.zeros)[s])
                     : static_cast<float>(static_cast<const uint8_t*>(w.zeros)[s]);
}

constexpr int kGemvWarps = 4;

// A warp's sums of its output n for `rows` rows into out (beta · out + sum).
__device__ __forceinline__ void gemv_store(float* out, const float (&acc)[8], int64_t rows, int64_t n, int64_t width,
                                           float beta) {
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    if (m >= rows) break;
    const float v = warp_sum(acc[m]);
    if ((threadIdx.x & 31) == 0) out[m * width + n] = beta != 0.f ? beta * out[m * width + n] + v : v;
  }
}

__global__ void quantized_gemv_kernel(float* out, const float* x, int64_t rows, QuantDesc w, float beta) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (n >= w.n) return;  // (the whole warp: shuffles below stay full-warp)
  const uint8_t* row = w.codes + n * w.row_bytes;
  const int64_t srow = (n / w.block_n) * w.cols;
  // A lane's eight inputs lie in one block of scales when blocks are multiples of eight.
  const bool one_block = w.block_k % 8 == 0;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t k0 = static_cast<int64_t>(lane) * 8; k0 < w.k; k0 += 256) {
    const int64_t k1 = k0 + 8 < w.k ? k0 + 8 : w.k;
    int64_t s = srow + k0 / w.block_k;
    float z = quant_zero(w, s), sc = w.scales[s];
    for (int64_t k = k0; k < k1; ++k) {
      if (!one_block && k != k0) {
        s = srow + k / w.block_k;
        z = quant_zero(w, s), sc = w.scales[s];
      }
      const float v = (quant_code(row, w.format, k) - z) * sc;
#pragma unroll
      for (int m = 0; m < 8; ++m)
        if (m < rows) acc[m] += v * x[m * w.k + k];
    }
  }
  gemv_store(out, acc, rows, n, w.n, beta);
}

// The same with 16-byte loads of the codes: a lane takes a chunk of 16 bytes of a row at a time (32
// int4 or fp4 codes, 16 int8 or fp8 ones) inside one block of scales, and x as float4s; the
// chunk's products summed before its scale (and zero point) apply once. Format F at compile time
// (QuantDesc::format's codes). Needs quantized_gemv_fast's conditions.
template <int F>
__device__ __forceinline__ float chunk_code(const uint4& q, int i) {
  const uint32_t word = i < (F == 1 || F == 4 ? 8 : 4) ? q.x : i < (F == 1 || F == 4 ? 16 : 8) ? q.y
                        : i < (F == 1 || F == 4 ? 24 : 12) ? q.z : q.w;
  if (F == 1) return static_cast<float>((word >> ((i & 7) * 4)) & 15u);
  if (F == 2) return static_cast<float>((word >> ((i & 3) * 8)) & 255u);
  if (F == 4) return e2m1_value((word >> ((i & 7) * 4)) & 15u);
  return e4m3_value((word >> ((i & 3) * 8)) & 255u);
}

template <int F>
__global__ void quantized_gemv_vec_kernel(float* out, const float* x, int64_t rows, QuantDesc w, float beta) {
  constexpr int E = F == 1 || F == 4 ? 32 : 16;  // codes a chunk
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (n >= w.n) return;  // (the whole warp)
  const uint4* row = reinterpret_cast<const uint4*>(w.codes + n * w.row_bytes);
  const int64_t srow = (n / w.block_n) * w.cols, chunks = w.k / E;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t c = lane; c < chunks; c += 32) {
    const uint4 q = row[c];
    const int64_t k0 = c * E, s = srow + k0 / w.block_k;
    const float sc = w.scales[s], z = F == 1 || F == 2 ? quant_zero(w, s) : 0.f;
    float v[E];
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = chunk_code<F>(q, i) - z;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      if (m >= rows) break;
      const float4* xr = reinterpret_cast<const float4*>(x + m * w.k + k0);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < E / 4; ++j) {
        const float4 xv = xr[j];
        sum += v[4 * j] * xv.x + v[4 * j + 1] * xv.y + v[4 * j + 2] * xv.z + v[4 * j + 3] * xv.w;
      }
      acc[m] += sc * sum;
    }
  }
  gemv_store(out, acc, rows, n, w.n, beta);
}

__global__ void dequantize_rows_kernel(float* dst, QuantDesc w, int64_t n0, int64_t count) {
  const int64_t total = count * w.k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = n0 + i / w.k, k = i % w.k, s = (n / w.block_n) * w.cols + k / w.block_k;
    dst[i] = (quant_code(w.codes + n * w.row_bytes, w.format, k) - quant_zero(w, s)) * w.scales[s];
  }
}

__global__ void gather_columns_kernel(float* dst, const float* x, const int32_t* order, int64_t rows, int64_t k) {
  const int64_t total = rows * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = x[(i / k) * k + order[i % k]];
}

bool quantized_gemv_fast(const QuantDesc& w, const float* x) {
  const int64_t e = w.format == 1 || w.format == 4 ? 32 : 16;
  return w.k % e == 0 && w.block_k % e == 0 && w.row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.codes) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void quantized_gemv(float* out, const float* x, int64_t rows, QuantDesc w, float beta, cudaStream_t stream) {
  if (rows == 0 || w.n == 0) return;
  KVPR_CHECK(rows <= 8 && !w.order, "quantized_gemv: ", rows, " rows (at most 8), x ", w.order ? "not " : "",
             "in the codes' order");
  const auto blocks = static_cast<unsigned>((w.n + kGemvWarps - 1) / kGemvWarps);
  if (quantized_gemv_fast(w, x)) {
    switch (w.format) {
      case 1: KVPR_LAUNCH(blocks, 32 * kGemvWarps, 0, stream, quantized_gemv_vec_kernel<1>)(out, x, rows, w, beta); break;
      case 2: KVPR_LAUNCH(blocks, 32 * kGemvWarps, 0, stream, quantized_gemv_vec_kernel<2>)(out, x, rows, w, beta); break;
      case 3: KVPR_LAUNCH(blocks, 32 * kGemvWarps, 0, stream, quantized_gemv_vec_kernel<3>)(out, x, rows, w, beta); break;
      default: KVPR_LAUNCH(blocks, 32 * kGemvWarps, 0, stream, quantized_gemv_vec_kernel<4>)(out, x, rows, w, beta); break;
    }
  } else {
    KVPR_LAUNCH(blocks, 32 * kGemvWarps, 0, stream, quantized_gemv_kernel)(out, x, rows, w, beta);
  }
  CUDA_CHECK_LAUNCH();
}

void dequantize_rows(float* dst, QuantDesc w, int64_t n0, int64_t count, cudaStream_t stream) {
  if (count * w.k == 0) return;
  KVPR_LAUNCH(grid_for(count * w.k, 256), 256, 0, stream, dequantize_rows_kernel)(dst, w, n0, count);
  CUDA_CHECK_LAUNCH();
}

void gather_columns(float* dst, const float* x, const int32_t* order, int64_t rows, int64_t k, cudaStream_t stream) {
  if (rows * k == 0) return;
  KVPR_LAUNCH(grid_for(rows * k, 256), 256, 0, stream, gather_columns_kernel)(dst, x, order, rows, k);
  CUDA_CHECK_LAUNCH();
}

KVPR_CUDA_NAMESPACE_END
