// The CPU's GEMM on quantized weights (weight.h), reading them as stored: out [M, N] = x [M, K] ·
// wᵀ in fp32. A few rows (decode) take one pass over the codes, each dequantized in registers:
// per block of inputs the kernel sums code · x and applies the block's scale and zero point once,
// as scale · (Σ code · x - zero · Σ x). More rows (prefill) dequantize a tile of the weight's rows
// at a time into a small buffer for OpenBLAS's sgemm, never the whole matrix.
#pragma once

#include <vector>

#include "engine/base/weight.h"

namespace kvpr::cpu {

// Buffers the kernel reuses from call to call, and its choice of kernel.
struct QuantizedScratch {
  std::vector<float> x;        // x with its inputs in the codes' order (GPTQ's act order)
  std::vector<float> xsum;     // each row's sum of x over each block of inputs
  std::vector<float> x_pairs;  // x per 32 inputs as the even ones, then the odd ones (int4, fp4: AVX-512)
  std::vector<float> tile;     // a tile of dequantized rows (prefill)
  bool avx512 = true;          // false: the AVX2 decode kernel where the CPU has AVX-512 (tests)
};

// out, x: F32; w: a quantized matrix [N, K]; all in host memory (the CPU backend's).
void quantized_linear(float* out, const float* x, int64_t M, const Weight& w, QuantizedScratch& scratch);

// Whether the decode kernel for AVX-512 is built and this CPU runs it.
bool quantized_avx512_available();

// One quantized matrix [N, K] as plain pointers: what the AVX-512 kernel, compiled for that CPU
// alone, reads (it calls no inline function another file could share).
struct QuantizedView {
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros_u8;   // int4's, or null
  const int32_t* zeros_i32;  // int8's, or null
  WeightFormat format;
  int64_t N, K, row_bytes, block_n, block_k, cols;
};
// out[m * N + n] for outputs n in [n0, n1) and rows m < M <= 8 of x ([M, K]), over inputs
// [0, K rounded down to 32) (the caller adds the rest); blocks of inputs a multiple of 32 wide, or
// one a row. x_pairs: x rearranged as QuantizedScratch::x_pairs says (int4, fp4), else unused.
void quantized_rows_avx512(const QuantizedView& w, const float* x, const float* x_pairs, int64_t M, int64_t n0,
                           int64_t n1, float* out);

}  // namespace kvpr::cpu
