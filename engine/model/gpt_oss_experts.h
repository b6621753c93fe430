// gpt-oss's experts as the Llama family's per-expert matrices.
//
// A gpt-oss checkpoint stores each layer's experts fused: gate and up interleaved in one
// matrix (output column 2j is gate j, 2j + 1 is up j) and down in another, each with a bias,
//   - as OpenAI ships them, in MXFP4: `mlp.experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16] with
//     `_scales` U8 [E, 2I, H/32] (E8M0) and `_bias` [E, 2I]; `down_proj_blocks` [E, H, I/32, 16],
//     `_scales` [E, H, I/32], `_bias` [E, H]. Row r's block g holds 32 values of the input
//     dimension, two per byte, the low nibble first: value = FP4_E2M1[nibble] · 2^(scale - 127);
//   - or dequantized as transformers saves GptOssExperts' parameters: `mlp.experts.gate_up_proj`
//     [E, H, 2I] and `down_proj` [E, I, H] (x · W: input dimension first), with their biases.
// The model asks for `mlp.experts.<e>.{gate_proj,up_proj,down_proj}.{weight,bias}` ([out, in],
// as Qwen-MoE's experts are named); these are derived here, on the host, expert by expert
// (MXFP4 dequantized exactly into BF16: every E2M1 value times a power of two is a BF16 value
// within its exponent range), or, where the model computes on quantized matrices, kept in MXFP4
// as weight.h's fp4 layout: the same bytes, the E8M0 scales as F32 powers of two.
#pragma once

#include <optional>
#include <string>

#include "engine/base/tensor.h"
#include "engine/base/weight.h"
#include "engine/model/checkpoint.h"

namespace kvpr {

// The dtype of the derived weight `key` (a checkpoint key, prefix included), or nullopt when
// `key` is not an expert weight this checkpoint can derive.
std::optional<DType> gpt_oss_expert_dtype(const CheckpointDir& ckpt, const std::string& key);
// The derived weight `key`, in host memory; undefined when gpt_oss_expert_dtype says nullopt.
// Throws naming the tensor when the packed ones have shapes that do not fit each other.
Tensor gpt_oss_expert_weight(const CheckpointDir& ckpt, const std::string& key);

// Bytes a weight of expert matrix `key` takes kept in MXFP4 (fp4 codes and an F32 scale per 32),
// or 0 when the checkpoint does not store it in MXFP4.
double gpt_oss_expert_fp4_bytes(const CheckpointDir& ckpt, const std::string& key);
// That matrix in weight.h's fp4 layout: codes U8 [rows, in/2], scales F32 [rows, in/32] (blocks
// of 1 x 32), in host memory; undefined when gpt_oss_expert_fp4_bytes says 0.
Weight gpt_oss_expert_fp4(const CheckpointDir& ckpt, const std::string& key);

}  // namespace kvpr
