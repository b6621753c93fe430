// The CPU's GEMM on quantized weights (weight.h), reading them as stored: out [M, N] = x [M, K] ·
// wᵀ in fp32. A few rows (decode) take one pass over the codes: where the CPU has AVX-512 VNNI
// (int4, int8) or AVX-512 BF16 and VBMI (fp8), as dot products on the codes (x as 16-bit integers
// a step of 128 inputs, or as two BF16s: quantized_linear_vnni.cc, quantized_linear_bf16.cc); else
// dequantized in registers, per block of inputs summing code · x and applying the block's scale
// and zero point once, as scale · (Σ code · x - zero · Σ x). More rows (prefill) dequantize a tile
// of the weight's rows at a time into a small buffer for OpenBLAS's sgemm, never the whole matrix.
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
  std::vector<int8_t> xq;      // x as the VNNI kernel reads it (int4, int8)
  std::vector<float> xscale;   // its scale per kVnniStep inputs
  std::vector<uint16_t> xb;    // x as the BF16 kernel reads it (fp8)
  bool avx512 = true;          // false: the AVX2 decode kernel where the CPU has AVX-512 (tests)
  bool dots = true;            // false: not the dot-product kernels (VNNI's, BF16's) (tests)
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

// Whether the VNNI decode kernel (int4 and int8 by integer dot products) is built and this CPU
// runs it.
bool quantized_vnni_available();

// The VNNI kernel's x: one step of kVnniStep inputs is kVnniBytes bytes, each input's 16-bit
// integer as a high and a low signed byte (the high bytes of the step, then the low ones), in
// the codes' order (int4: the step's inputs 2j, then 2j + 1), with one scale a step.
constexpr int64_t kVnniStep = 128, kVnniBytes = 2 * kVnniStep;
// x [M, K] as that for inputs [0, K rounded down to kVnniStep): xq [M, steps, kVnniBytes],
// xscale [M, steps], and xsum [M, cols]: the sum of each block of block_k inputs of the integers
// times their scales (block_k: 32, 64, a multiple of kVnniStep, or K and more).
void quantize_x_vnni(const float* x, int64_t M, int64_t K, WeightFormat format, int64_t block_k, int64_t cols,
                     int8_t* xq, float* xscale, float* xsum);
// out[m * N + n] for outputs n in [n0, n1) and rows m < M <= 8, over the inputs quantize_x_vnni
// prepared (the caller adds the rest): int4 (U8 zero points or none) with blocks of 32, 64, a
// multiple of kVnniStep or whole rows; int8 (I32 zero points or none) with the latter two.
void quantized_rows_vnni(const QuantizedView& w, const int8_t* xq, const float* xscale, const float* xsum, int64_t M,
                         int64_t n0, int64_t n1, float* out);

// Whether the BF16 decode kernel for fp8 is built and this CPU runs it (AVX-512 BF16 and VBMI).
bool quantized_bf16_available();

// The BF16 kernel's x: each kBf16Step inputs as 2 · kBf16Step BF16s, hi = bf16(x) then lo =
// bf16(x - hi) (their sum within 2^-17 of x), each in the weights' order (of each 16 inputs the
// first 8, then of each 16 the last 8), for inputs [0, K rounded down to kBf16Step): xb [M, K / kBf16Step,
// 2 · kBf16Step].
constexpr int64_t kBf16Step = 64;
void bf16_x(const float* x, int64_t M, int64_t K, uint16_t* xb);
// out[m * N + n] for outputs n in [n0, n1) and rows m < M <= 8 of fp8 codes, over the inputs
// bf16_x prepared (the caller adds the rest); blocks of inputs a multiple of kBf16Step or whole rows.
void quantized_rows_fp8_bf16(const QuantizedView& w, const uint16_t* xb, int64_t M, int64_t n0, int64_t n1, float* out);

}  // namespace kvpr::cpu
