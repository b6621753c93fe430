// A matrix weight as the GEMMs read it: out N x in K ([N, K]), or a stack of B of them ([B, N, K],
// a layer's Q/K/V or gate/up, multiplied in one batched call). Either dense (a Tensor of a float
// dtype, converted implicitly) or quantized, in kvpr's own layout, into which every checkpoint
// format is repacked at load (quantized_checkpoint.h says how each one maps):
//   codes   U8. int4: [.., N, ceil(K/2)], two inputs a byte (input 2j in the low nibble, 2j+1 in
//           the high one); int8: [.., N, K], unsigned (a signed code plus 128); fp8: [.., N, K],
//           E4M3 bytes; fp4: as int4, E2M1 codes (MXFP4's elements: 0, ±0.5, ±1, ±1.5, ±2, ±3,
//           ±4, ±6; bit 3 the sign).
//   scales  F32 [.., ceil(N/block_n), ceil(K/block_k)]: one per block of block_n outputs by
//           block_k inputs (a group of G inputs: 1 x G; a channel: 1 x K, as is a tensor's one
//           scale, repeated; DeepSeek's fp8 blocks: 128 x 128, the last ones partial).
//   zeros   shaped as the scales: U8 (int4) or I32 (int8); undefined: the middle code (8 for
//           int4, 128 for int8). fp8 and fp4 have none.
//   order   I32 [K], or undefined: input k of the codes is input order[k] of x (GPTQ's act order,
//           whose groups load contiguous this way).
// Weight [n, k] = (code - zero) · scale for the integer formats, e4m3(code) · scale for fp8,
// e2m1(code) · scale for fp4 (MXFP4's E8M0 scales are powers of two, exact in F32).
// The GEMMs read these bytes (and dequantize in registers, or a tile at a time), never a
// dequantized copy of the matrix.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "engine/base/tensor.h"

namespace kvpr {

enum class WeightFormat : uint8_t { Dense, Int4, Int8, Fp8, Fp4 };

const char* weight_format_name(WeightFormat f);  // "dense", "int4", "int8", "fp8", "fp4"
// The format of one of those names; false for another.
bool parse_weight_format(const std::string& name, WeightFormat* out);

struct Weight {
  Tensor codes;  // dense: the matrix itself
  Tensor scales, zeros, order;
  WeightFormat format = WeightFormat::Dense;
  int64_t block_n = 1, block_k = 1;
  Shape shape;  // [.., N, K]

  Weight() = default;
  Weight(const Tensor& dense) : codes(dense), shape(dense.shape()) {}  // NOLINT: a dense weight is a tensor

  // Its tensors, defined or not: codes, scales, zeros, order (what is copied, streamed, digested).
  std::array<Tensor*, 4> parts() { return {&codes, &scales, &zeros, &order}; }
  std::array<const Tensor*, 4> parts() const { return {&codes, &scales, &zeros, &order}; }

  bool defined() const { return codes.defined(); }
  bool quantized() const { return format != WeightFormat::Dense; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int64_t numel() const { return shape_numel(shape); }
  // Bytes of every part (codes, scales, zeros, order).
  size_t nbytes() const;
  // The dense tensor; throws naming `what` when the weight is quantized.
  const Tensor& dense(const char* what) const;
  std::string describe() const;  // "BF16[4, 8]", "int4 1x128[4, 8]"

  // Matrices [begin, begin + count) of a stack [B, N, K] (rank kept); rows of a matrix [N, K],
  // which must start and end on whole blocks of outputs.
  Weight rows(int64_t begin, int64_t count) const;
  // Matrix b of a stack [B, N, K], as [N, K].
  Weight item(int64_t b) const;
  // [N, K] seen as a stack [B, N/B, K] (whole blocks of outputs in each), or a stack as another
  // stack or matrix of the same rows.
  Weight reshape(const Shape& to) const;
  // The scale grid's columns (ceil(K / block_k)) and rows of one matrix (ceil(N / block_n)).
  int64_t scale_cols() const;
  int64_t scale_rows() const;
};

// A dense matrix quantized as `format` round to nearest, symmetric, one scale per row and group of
// `group` inputs (0: per row), fp8 and fp4 included (fp4: MX's power-of-two scales): for random
// models (kvpr-bench weights) and tests.
// `dense` is in host memory; so is the result.
Weight quantize_rtn(const Tensor& dense, WeightFormat format, int64_t group);

// The weight in F32 in host memory (its parts must be in host or pinned memory): each element
// exactly (code - zero) · scale.
Tensor dequantize(const Weight& w);

// FP4 E2M1's 16 values, by code (bit 3 the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
float fp4_e2m1_value(uint8_t code);
// Whether a format's codes are 4 bits, two a byte (int4, fp4).
constexpr bool weight_format_is_nibbles(WeightFormat f) { return f == WeightFormat::Int4 || f == WeightFormat::Fp4; }

// The stored value of element k (< K) of a row of codes, as the kernels multiply it before the
// scale: int4 / int8 codes as integers, fp8 as its E4M3 value, fp4 as its E2M1 value.
float weight_code(const uint8_t* row, WeightFormat format, int64_t k);
// The code a missing zero point stands for: the middle of the integer range (8, 128; fp8, fp4: 0).
int32_t weight_middle_code(WeightFormat f);
// The zero point of cell s of the scales' grid (row-major over every matrix of a stack).
int32_t weight_zero(const Weight& w, int64_t s);

}  // namespace kvpr
