// Element types of stored tensors and scalar conversions between them. Compute is fp32;
// fp16 and bf16 are storage formats (weights, KV cache); fp8 (E4M3, the OCP/NVIDIA
// "e4m3fn" format: no infinities, largest finite 448) is a KV-cache format only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvpr {

// (I8: quantized checkpoints' int8 codes and zero points, read at load.)
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, F8E4M3, I8 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::I8: return 1;
    case DType::F8E4M3: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::F8E4M3: return "F8_E4M3";
  }
  return "?";
}

// The formats compute reads and writes: weights, activations.
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
// Those, and the formats that only store values (the KV cache's fp8): what conversions,
// row copies and attention's K/V take.
inline bool is_storage_float(DType t) { return is_float(t) || t == DType::F8E4M3; }

// Parses "F32"/"float32"/"fp32", "F16"/"float16"/"fp16"/"half", "BF16"/"bfloat16",
// "fp8"/"fp8_e4m3"/"F8_E4M3"/"float8_e4m3fn".
inline bool parse_dtype(std::string_view s, DType* out) {
  if (s == "F32" || s == "f32" || s == "float32" || s == "fp32" || s == "float") *out = DType::F32;
  else if (s == "F16" || s == "f16" || s == "float16" || s == "fp16" || s == "half") *out = DType::F16;
  else if (s == "BF16" || s == "bf16" || s == "bfloat16") *out = DType::BF16;
  else if (s == "F8_E4M3" || s == "fp8" || s == "fp8_e4m3" || s == "f8_e4m3" || s == "float8_e4m3fn") *out = DType::F8E4M3;
  else return false;
  return true;
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // f16 subnormal or zero: value = m16 * 2^-24
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14..24
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;  // round to nearest even
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = absu + 0xc8000fffu + ((absu >> 13) & 1u);  // rebias exponent and round to even
  return static_cast<uint16_t>(sign | (r >> 13));
}

// fp8 E4M3 (e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m * 2^-9); S.1111.111 is NaN and there is no infinity.
inline float e4m3_to_f32(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  float mag;
  if (e == 0xfu && m == 7u) {
    uint32_t nan = 0x7fc00000u;
    std::memcpy(&mag, &nan, 4);
  } else if (e == 0) {
    mag = static_cast<float>(m) * (1.f / 512.f);
  } else {
    uint32_t u = ((e + 127u - 7u) << 23) | (m << 20);
    std::memcpy(&mag, &u, 4);
  }
  return (b & 0x80u) ? -mag : mag;
}

// Round to nearest even; magnitudes beyond 448 (infinities too) saturate to +-448 as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does; NaN stays NaN.
inline uint8_t f32_to_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (absu >= 0x43e80000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 464: beyond 448's rounding range
  if (absu < 0x3c800000u) {  // below 2^-6: subnormal, in units of 2^-9 (rounds up to 2^-6 at most)
    float a;
    std::memcpy(&a, &absu, 4);
    const float q = a * 512.f;  // exact: a power-of-two scaling
    uint32_t r = static_cast<uint32_t>(q);
    const float rem = q - static_cast<float>(r);
    if (rem > 0.5f || (rem == 0.5f && (r & 1u))) ++r;
    return static_cast<uint8_t>(sign | r);  // r == 8 is 2^-6, the smallest normal: same bits
  }
  // Normal: keep 3 mantissa bits, rounding the 20 dropped ones to nearest even (a carry moves
  // into the exponent, as it should).
  uint32_t r = absu + 0x7ffffu + ((absu >> 20) & 1u);
  r >>= 20;                             // exponent (8 bits) and 3 mantissa bits
  const uint32_t e = (r >> 3) - 127u + 7u;
  const uint32_t bits = (e << 3) | (r & 7u);
  if (bits > 0x7eu) return static_cast<uint8_t>(sign | 0x7eu);  // 464 > x > 448 rounds to 480: saturate
  return static_cast<uint8_t>(sign | bits);
}

// Reads element i of a float array of type t as fp32.
inline float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F8E4M3: return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    default: return 0.f;
  }
}

inline void store_from_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F8E4M3: static_cast<uint8_t*>(p)[i] = f32_to_e4m3(v); break;
    default: break;
  }
}

}  // namespace kvpr
