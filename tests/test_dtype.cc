#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/dtype.h"

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
