// Quantized checkpoints as the hub publishes them. config.json's `quantization_config` names
// the method; each quantized Linear module keeps its parts under its own prefix (P = the
// module, e.g. "model.layers.0.self_attn.q_proj"; the weight is out N x in K):
//   - fp8 (DeepSeek-V3, Qwen3-*-FP8): P.weight F8_E4M3 [N, K] and P.weight_scale_inv F32
//     [ceil(N/bn), ceil(K/bk)] (weight_block_size [bn, bk]): w = fp8 · scale_inv of its block;
//   - compressed-tensors float-quantized (RedHatAI's FP8): P.weight F8_E4M3 [N, K] and
//     P.weight_scale, one per tensor ([1]), per output channel ([N, 1]) or per block;
//   - compressed-tensors pack-quantized (W4A16, W8A16): P.weight_packed I32 [N, K·bits/32] (value
//     j of a word at bits [bits·j, bits·j + bits), stored plus 2^(bits-1)), P.weight_scale
//     [N, K/G] (G = group_size; one column per channel), P.weight_shape, and when asymmetric
//     P.weight_zero_point (packed along the rows; I8 before compressed-tensors 0.9.4); with
//     actorder P.weight_g_idx [K];
//   - compressed-tensors int-quantized (W8A8) and naive-quantized: P.weight I8 [N, K] and
//     P.weight_scale as above (the activations' quantization is not applied: weight-only);
//   - gptq (AutoGPTQ, GPTQModel): P.qweight I32 [K·bits/32, N] (packed along the input),
//     P.qzeros I32 [groups, N·bits/32] (along the output), P.scales [groups, N], P.g_idx I32 [K]:
//     w = scale · (q - z), where checkpoint_format "gptq" (v1) stores z - 1;
//   - awq (AutoAWQ's GEMM): P.qweight I32 [K, N/8] and P.qzeros I32 [K/G, N/8], eight 4-bit
//     values a word in AWQ's order (value i of word c is column 8c + kAwqColumn[i]),
//     P.scales [K/G, N]: w = (q - z) · scale;
//   - mxfp4: gpt-oss's experts, which its architecture derives (gpt_oss_experts.h).
// Modules the method leaves as they are (embeddings, norms, lm_head unless GPTQModel's `lm_head`
// quantized it, routers, an `ignore` or `modules_to_not_convert` list) are read as stored: a module
// is quantized exactly when its quantized tensors are there.
//
// Every format is repacked at load into kvpr's own layout (weight.h), which the GEMMs of the Llama
// family and OPT take as it is, on the CPU and on CUDA (ranks that receive their weights over NCCL
// receive that layout: Model::share_layout); a backend that does not read it gets the weights
// dequantized from it at load, exactly, into the model's dtype. What a format does not define is
// refused by name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/base/json.h"
#include "engine/base/tensor.h"
#include "engine/base/weight.h"
#include "engine/model/checkpoint.h"

namespace kvpr {

class QuantizedCheckpoint {
 public:
  QuantizedCheckpoint() = default;
  // `config` is config.json (a wrapper's quantization_config is at its top level too); none:
  // an unquantized checkpoint. Throws naming the field of a method, scheme or combination that
  // is not supported.
  static QuantizedCheckpoint from_config(const json::Value& config, const std::string& source);

  bool quantized() const { return !method_.empty() && method_ != "mxfp4"; }
  const std::string& method() const { return method_; }
  // For the load log and /health: "gptq int4 g128 sym", "fp8 e4m3 blocks 128x128", ...
  const std::string& describe() const { return describe_; }
  // Bits per weight of the quantized matrices as stored (scales and zeros included), or 0.
  double bits_per_weight() const { return bits_per_weight_; }
  // What /health and `kvpr info --json` say: method, scheme, bits a weight as stored, whether the
  // matrices are kept quantized (the GEMMs reading them as stored, in fp32) or dequantized at load
  // into `dequantized_to`, and the dtype they are computed in; null for an unquantized checkpoint.
  json::Value to_json(bool kept, DType dequantized_to) const;
  // The same in words, for the load log and `kvpr info`: "kept quantized: ..." or "dequantized
  // to BF16 at load".
  std::string how_computed(bool kept, DType dequantized_to) const;

  // The model's dtype, which dequantized weights take: config.json's torch_dtype, else the
  // stored embedding's (else BF16). Called once the checkpoint is open.
  void settle_dtype(const CheckpointDir& ckpt);
  // The dtype the weight under checkpoint key `key` (a module's ".weight") dequantizes to when
  // its module is stored quantized (the model's), else nullopt.
  std::optional<DType> dtype(const CheckpointDir& ckpt, const std::string& key) const;
  // That weight in kvpr's quantized layout (weight.h) in host memory, [N, K]; dense F32 when no
  // order of its inputs makes GPTQ's groups contiguous. Throws naming the tensor whose dtype or
  // shape does not fit the others.
  Weight weight(const CheckpointDir& ckpt, const std::string& key) const;
  // The same, dequantized: F32 [N, K] in host memory.
  Tensor dequantize(const CheckpointDir& ckpt, const std::string& key) const;

 private:
  std::string method_;  // "", "fp8", "compressed-tensors", "gptq", "awq", "mxfp4"
  std::string describe_;
  double bits_per_weight_ = 0;
  int bits_ = 0;                // integer formats' bits (4, 8)
  int64_t group_ = 0;           // integer formats' group size (0: one per output channel)
  bool gptq_v1_zeros_ = false;  // gptq v1: zeros stored minus one
  bool symmetric_ = true;
  bool desc_act_ = false;       // gptq: the groups follow g_idx, which must be there
  int64_t block_n_ = 0, block_k_ = 0;  // fp8 blocks of scales (weight_block_size, block_structure)
  // compressed-tensors' integer schemes (config_groups): a module's tensors must fit one.
  struct IntScheme {
    int bits;
    int64_t group;  // 0: one scale a row (channel) or in all (tensor)
    bool symmetric;
  };
  std::vector<IntScheme> int_schemes_;
  std::optional<DType> model_dtype_;  // config.json's torch_dtype
};

// AWQ's order of the eight 4-bit values in a word: value i is column kAwqColumn[i] of its 8.
inline constexpr int kAwqColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};

}  // namespace kvpr
