#include "engine/model/gpt_oss_experts.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/base/dtype.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {

// `key` = <base>mlp.experts.<e>.<part>.<weight|bias>, split.
struct ExpertKey {
  std::string base;  // "<prefix>layers.N.mlp.experts."
  int64_t expert = -1;
  std::string part;  // gate_proj, up_proj, down_proj
  bool bias = false;
};

std::optional<ExpertKey> parse(const std::string& key) {
  static const std::string kExperts = "mlp.experts.";
  const size_t at = key.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  ExpertKey k;
  k.base = key.substr(0, at + kExperts.size());
  const std::string rest = key.substr(k.base.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos) return std::nullopt;
  for (size_t i = 0; i < dot; ++i)
    if (rest[i] < '0' || rest[i] > '9') return std::nullopt;
  k.expert = std::atoll(rest.substr(0, dot).c_str());
  const std::string tail = rest.substr(dot + 1);
  for (const char* part : {"gate_proj", "up_proj", "down_proj"}) {
    if (tail == std::string(part) + ".weight" || tail == std::string(part) + ".bias") {
      k.part = part;
      k.bias = tail.back() == 's';
      return k;
    }
  }
  return std::nullopt;
}

// The fused tensor a part comes from: gate_up_proj or down_proj.
std::string fused_name(const ExpertKey& k) { return k.part == "down_proj" ? "down_proj" : "gate_up_proj"; }

// Rows of the fused [out] dimension this part takes: gate the even ones, up the odd, down all.
struct RowPick {
  int64_t first, step;
};
RowPick pick(const ExpertKey& k) {
  if (k.part == "gate_proj") return {0, 2};
  if (k.part == "up_proj") return {1, 2};
  return {0, 1};
}

const TensorRecord* find(const CheckpointDir& ckpt, const std::string& name) { return ckpt.find(name); }

float element(const TensorRecord& r, int64_t i) { return load_as_f32(r.data, r.dtype, static_cast<size_t>(i)); }

Tensor bias_of(const ExpertKey& k, const TensorRecord& b) {
  KVPR_CHECK(b.shape.size() == 2 && k.expert < b.shape[0], b.file, ": tensor '", b.name, "' has shape ",
             shape_str(b.shape), ", which has no expert ", k.expert);
  const RowPick p = pick(k);
  const int64_t n = b.shape[1] / p.step;
  Tensor out = Tensor::host(b.dtype, {n});
  for (int64_t j = 0; j < n; ++j)
    store_from_f32(out.data(), out.dtype(), static_cast<size_t>(j), element(b, k.expert * b.shape[1] + p.first + j * p.step));
  return out;
}

void check_mxfp4(const ExpertKey& k, const TensorRecord& blocks, const TensorRecord& scales) {
  const Shape& bs = blocks.shape;
  KVPR_CHECK(blocks.dtype == DType::U8 && scales.dtype == DType::U8 && bs.size() == 4 && bs[3] == 16 &&
                 scales.shape == Shape({bs[0], bs[1], bs[2]}) && k.expert < bs[0],
             blocks.file, ": MXFP4 tensors '", blocks.name, "' ", shape_str(bs), " and '", scales.name, "' ",
             shape_str(scales.shape), " are not U8 [E, rows, in/32, 16] and [E, rows, in/32] with expert ", k.expert);
}

// MXFP4 blocks [E, R, G, 16] and scales [E, R, G]: the picked rows of expert e, [rows, 32 G] in BF16.
Tensor dequantize(const ExpertKey& k, const TensorRecord& blocks, const TensorRecord& scales) {
  check_mxfp4(k, blocks, scales);
  const Shape& bs = blocks.shape;
  const RowPick p = pick(k);
  const int64_t R = bs[1], G = bs[2], rows = R / p.step, in = 32 * G;
  const auto* b = static_cast<const uint8_t*>(blocks.data);
  const auto* s = static_cast<const uint8_t*>(scales.data);
  Tensor out = Tensor::host(DType::BF16, {rows, in});
  auto* o = out.data_as<uint16_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = k.expert * R + p.first + r * p.step;
    for (int64_t g = 0; g < G; ++g) {
      const float unit = std::ldexp(1.f, static_cast<int>(s[src * G + g]) - 127);
      const uint8_t* bytes = b + (src * G + g) * 16;
      uint16_t* dst = o + r * in + 32 * g;
      for (int j = 0; j < 16; ++j) {
        dst[2 * j] = f32_to_bf16(fp4_e2m1_value(bytes[j] & 0x0F) * unit);
        dst[2 * j + 1] = f32_to_bf16(fp4_e2m1_value(bytes[j] >> 4) * unit);
      }
    }
  }
  return out;
}

// The same rows kept in MXFP4: each row's 16 G bytes as they are, its scales as F32.
Weight fp4(const ExpertKey& k, const TensorRecord& blocks, const TensorRecord& scales) {
  check_mxfp4(k, blocks, scales);
  const Shape& bs = blocks.shape;
  const RowPick p = pick(k);
  const int64_t R = bs[1], G = bs[2], rows = R / p.step;
  const auto* b = static_cast<const uint8_t*>(blocks.data);
  const auto* s = static_cast<const uint8_t*>(scales.data);
  Weight w;
  w.format = WeightFormat::Fp4;
  w.shape = {rows, 32 * G};
  w.block_n = 1, w.block_k = 32;
  w.codes = Tensor::host(DType::U8, {rows, 16 * G});
  w.scales = Tensor::host(DType::F32, {rows, G});
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = k.expert * R + p.first + r * p.step;
    std::memcpy(w.codes.data_as<uint8_t>() + r * 16 * G, b + src * G * 16, static_cast<size_t>(16 * G));
    for (int64_t g = 0; g < G; ++g)
      w.scales.data_as<float>()[r * G + g] = std::ldexp(1.f, static_cast<int>(s[src * G + g]) - 127);
  }
  return w;
}

// transformers' parameter [E, in, out] (x · W): the picked output columns of expert e, [rows, in].
Tensor transpose(const ExpertKey& k, const TensorRecord& w) {
  KVPR_CHECK(w.shape.size() == 3 && k.expert < w.shape[0], w.file, ": tensor '", w.name, "' has shape ",
             shape_str(w.shape), ", not [E, in, out] with expert ", k.expert);
  const RowPick p = pick(k);
  const int64_t in = w.shape[1], cols = w.shape[2], rows = cols / p.step;
  Tensor out = Tensor::host(w.dtype, {rows, in});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < in; ++i)
      store_from_f32(out.data(), out.dtype(), static_cast<size_t>(r * in + i),
                     element(w, (k.expert * in + i) * cols + p.first + r * p.step));
  return out;
}

}  // namespace

std::optional<DType> gpt_oss_expert_dtype(const CheckpointDir& ckpt, const std::string& key) {
  const std::optional<ExpertKey> k = parse(key);
  if (!k) return std::nullopt;
  const std::string fused = k->base + fused_name(*k);
  if (k->bias) {
    const TensorRecord* b = find(ckpt, fused + "_bias");
    return b ? std::optional<DType>(b->dtype) : std::nullopt;
  }
  if (find(ckpt, fused + "_blocks") && find(ckpt, fused + "_scales")) return DType::BF16;
  if (const TensorRecord* w = find(ckpt, fused)) return w->dtype;
  return std::nullopt;
}

Tensor gpt_oss_expert_weight(const CheckpointDir& ckpt, const std::string& key) {
  const std::optional<ExpertKey> k = parse(key);
  if (!k) return Tensor();
  const std::string fused = k->base + fused_name(*k);
  if (k->bias) {
    const TensorRecord* b = find(ckpt, fused + "_bias");
    return b ? bias_of(*k, *b) : Tensor();
  }
  const TensorRecord* blocks = find(ckpt, fused + "_blocks");
  const TensorRecord* scales = find(ckpt, fused + "_scales");
  if (blocks && scales) return dequantize(*k, *blocks, *scales);
  if (const TensorRecord* w = find(ckpt, fused)) return transpose(*k, *w);
  return Tensor();
}

double gpt_oss_expert_fp4_bytes(const CheckpointDir& ckpt, const std::string& key) {
  const std::optional<ExpertKey> k = parse(key);
  if (!k || k->bias) return 0;
  const std::string fused = k->base + fused_name(*k);
  return find(ckpt, fused + "_blocks") && find(ckpt, fused + "_scales") ? 0.5 + 4.0 / 32 : 0;
}

Weight gpt_oss_expert_fp4(const CheckpointDir& ckpt, const std::string& key) {
  if (gpt_oss_expert_fp4_bytes(ckpt, key) == 0) return Weight();
  const ExpertKey k = *parse(key);
  const std::string fused = k.base + fused_name(k);
  return fp4(k, *find(ckpt, fused + "_blocks"), *find(ckpt, fused + "_scales"));
}

}  // namespace kvpr
