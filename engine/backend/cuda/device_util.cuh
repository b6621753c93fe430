// Device-side helpers shared by the CUDA kernels: loads and stores of F32/F16/BF16 (and the
// KV cache's fp8 E4M3) as fp32, dtype dispatch, and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "engine/base/dtype.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/base/error.h"

KVPR_CUDA_NAMESPACE_BEGIN

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// Round to nearest even, saturating to +-448 (engine/base/dtype.h's f32_to_e4m3 is the same).
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_f32<__nv_fp8_e4m3>(float v) { return __nv_fp8_e4m3(v); }

// Eight consecutive elements at a 16-byte-aligned address, as fp32: one 16-byte load for
// fp16/bf16, two for fp32.
__device__ __forceinline__ void load8(const float* p, float (&o)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
__device__ __forceinline__ float bits_as_f32(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(w);
#else
  float f;
  memcpy(&f, &w, sizeof f);
  return f;
#endif
}
__device__ __forceinline__ float half_bits_as_f32(uint32_t bits16) {
  __half_raw r;
  r.x = static_cast<unsigned short>(bits16);
  return __half2float(__half(r));
}
__device__ __forceinline__ void load8(const __half* p, float (&o)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) o[2 * i] = half_bits_as_f32(w[i] & 0xffffu), o[2 * i + 1] = half_bits_as_f32(w[i] >> 16);
}
// bf16 is the high half of an fp32: widening is a shift.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&o)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) o[2 * i] = bits_as_f32(w[i] << 16), o[2 * i + 1] = bits_as_f32(w[i] & 0xffff0000u);
}

// fp8: one 8-byte load (8-byte alignment, which 16-byte-aligned rows of a head_dim % 8 == 0 give).
__device__ __forceinline__ void load8(const __nv_fp8_e4m3* p, float (&o)[8]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const uint32_t w[2] = {u.x, u.y};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    __nv_fp8_e4m3 x;
    x.__x = static_cast<__nv_fp8_storage_t>((w[i >> 2] >> (8 * (i & 3))) & 0xffu);
    o[i] = static_cast<float>(x);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `part` may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? part[lane] : 0.f;
  return warp_sum(v);
}

inline unsigned grid_for(int64_t n, int threads, unsigned cap = 65535u * 8) {
  int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g > cap ? cap : g);
}

KVPR_CUDA_NAMESPACE_END

// KVPR_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...) launches a kernel. Under
// the SIMT emulator of the tests (engine/backend/emulated/simt_emu.h, host compiler, no GPU) the same
// launch runs the kernel's threads on the CPU.
#if defined(KVPR_SIMT_EMULATION)
#define KVPR_LAUNCH(grid, block, smem, stream, ...) ::kvpr_emu::launch(grid, block, smem, stream, __VA_ARGS__)
#else
#define KVPR_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

// Runs BODY with `T` the device type of a float DType.
#define KVPR_FLOAT_DISPATCH(dtype, T, ...)                                               \
  switch (dtype) {                                                                        \
    case ::kvpr::DType::F32: { using T = float; __VA_ARGS__; break; }                     \
    case ::kvpr::DType::F16: { using T = __half; __VA_ARGS__; break; }                    \
    case ::kvpr::DType::BF16: { using T = __nv_bfloat16; __VA_ARGS__; break; }            \
    default: KVPR_THROW("CUDA kernel needs a float dtype, got ", ::kvpr::dtype_name(dtype)); \
  }

// The same, for values that are only stored: the float dtypes and the KV cache's fp8 E4M3
// (conversions, row copies, attention's K/V).
#define KVPR_STORAGE_DISPATCH(dtype, T, ...)                                             \
  switch (dtype) {                                                                        \
    case ::kvpr::DType::F32: { using T = float; __VA_ARGS__; break; }                     \
    case ::kvpr::DType::F16: { using T = __half; __VA_ARGS__; break; }                    \
    case ::kvpr::DType::BF16: { using T = __nv_bfloat16; __VA_ARGS__; break; }            \
    case ::kvpr::DType::F8E4M3: { using T = __nv_fp8_e4m3; __VA_ARGS__; break; }          \
    default: KVPR_THROW("CUDA kernel needs a float dtype, got ", ::kvpr::dtype_name(dtype)); \
  }
