// The CPU's GEMM on quantized weights (weight.h), reading them as stored: out [M, N] = x [M, K] ·
// wᵀ in fp32. A few rows (decode) take one pass over the codes, each dequantized in registers:
// per block of inputs the kernel sums code · x and applies the block's scale and zero point once,
// as scale · (Σ code · x - zero · Σ x). More rows (prefill) dequantize a tile of the weight's rows
// at a time into a small buffer for OpenBLAS's sgemm, never the whole matrix.
#pragma once

#include <vector>

#include "engine/base/weight.h"

namespace kvpr::cpu {

// Buffers the kernel reuses from call to call.
struct QuantizedScratch {
  std::vector<float> x;     // x with its inputs in the codes' order (GPTQ's act order)
  std::vector<float> xsum;  // each row's sum of x over each block of inputs
  std::vector<float> tile;  // a tile of dequantized rows (prefill)
};

// out, x: F32; w: a quantized matrix [N, K]; all in host memory (the CPU backend's).
void quantized_linear(float* out, const float* x, int64_t M, const Weight& w, QuantizedScratch& scratch);

}  // namespace kvpr::cpu
