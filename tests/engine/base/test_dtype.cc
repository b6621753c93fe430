#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/vec.h"
#include "engine/base/dtype.h"
#include "engine/base/json.h"
#include "tests/test_util.h"

using namespace kvpr;

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);                // rounds up to inf
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);    // halfway: to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);    // halfway: to even (up)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);  // halfway to zero: even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.f, -26)), 0x0001);
  EXPECT_EQ(f32_to_f16(-2.f), 0xc000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, BF16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float x;
  uint32_t u = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81
  std::memcpy(&x, &u, 4);
  EXPECT_EQ(f32_to_bf16(x), 0x3f80);
  u = 0x3f818000;
  std::memcpy(&x, &u, 4);
  EXPECT_EQ(f32_to_bf16(x), 0x3f82);
  EXPECT_FLOAT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

// fp8 E4M3 against tests/data/fp8/e4m3.json (tests/scripts/make_fp8_fixtures.py: every value of
// the format as an exact fraction, nearest by exact comparison, ties to even, saturating past
// 448): all 256 bytes decode to their values, and 4539 float32 inputs (every value, its float32
// neighbours, the midpoints between values and theirs, subnormals, +-inf, NaN, random ones)
// encode to the expected byte, the CPU kernels' table widening included.
TEST(DType, F8E4M3MatchesTheReference) {
  const json::Value ref = json::parse(test::read_file(test::data_path("fp8/e4m3.json")));
  const json::Array& decode = ref.find("decode")->as_array();
  ASSERT_EQ(decode.size(), 256u);
  for (size_t b = 0; b < 256; ++b) {
    const float got = e4m3_to_f32(static_cast<uint8_t>(b));
    const std::string& want = decode[b].as_string();
    if (want == "nan") {
      EXPECT_TRUE(std::isnan(got)) << "byte " << b;
    } else {
      EXPECT_EQ(got, std::stof(want)) << "byte " << b;
      EXPECT_EQ(f32_to_e4m3(got), (b == 0x80 && got == 0.f) ? 0x80 : b) << "round trip of byte " << b;
    }
    EXPECT_EQ(std::isnan(got) ? 1.f : got,
              std::isnan(cpu::e4m3_table()[b]) ? 1.f : cpu::e4m3_table()[b]) << "table, byte " << b;
  }
  const json::Array& encode = ref.find("encode")->as_array();
  ASSERT_GT(encode.size(), 4000u);
  int nan_inputs = 0;
  for (const json::Value& c : encode) {
    const uint32_t bits = static_cast<uint32_t>(c.as_array()[0].as_int());
    const int want = static_cast<int>(c.as_array()[1].as_int());
    float x;
    std::memcpy(&x, &bits, 4);
    nan_inputs += std::isnan(x);
    EXPECT_EQ(f32_to_e4m3(x), want) << "float32 0x" << std::hex << bits << " (" << x << ")";
    uint8_t stored = 0;
    store_from_f32(&stored, DType::F8E4M3, 0, x);
    EXPECT_EQ(stored, want);
  }
  EXPECT_GE(nan_inputs, 2);  // quiet and signalling-payload NaNs of both signs
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  DType dt;
  for (const char* name : {"fp8", "fp8_e4m3", "F8_E4M3", "float8_e4m3fn"}) {
    ASSERT_TRUE(parse_dtype(name, &dt)) << name;
    EXPECT_EQ(dt, DType::F8E4M3);
  }
  EXPECT_FALSE(is_float(DType::F8E4M3));  // a storage format: weights and activations never are
  EXPECT_TRUE(is_storage_float(DType::F8E4M3));
}
