#include "kernels/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(DoubleToHalf(1.0).bits, 0x3c00);
  EXPECT_EQ(DoubleToHalf(-2.0).bits, 0xc000);
  EXPECT_EQ(DoubleToHalf(65504.0).bits, 0x7bff);  // largest finite
  EXPECT_EQ(DoubleToHalf(65520.0).bits, 0x7c00);  // ties up to inf
  EXPECT_EQ(DoubleToHalf(65519.99).bits, 0x7bff);
  EXPECT_EQ(DoubleToHalf(std::ldexp(1.0, -24)).bits, 0x0001);  // subnormal
  EXPECT_EQ(DoubleToHalf(std::ldexp(1.0, -25)).bits, 0x0000);  // tie to even
  EXPECT_EQ(DoubleToHalf(std::ldexp(3.0, -25)).bits, 0x0002);
  EXPECT_EQ(DoubleToHalf(std::ldexp(1.0, -14)).bits, 0x0400);  // min normal
  EXPECT_EQ(DoubleToHalf(-0.0).bits, 0x8000);
  EXPECT_EQ(DoubleToHalf(HUGE_VAL).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToDouble(DoubleToHalf(std::nan("")))));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(DoubleToHalf(1.0 + std::ldexp(1.0, -11)).bits, 0x3c00);
  EXPECT_EQ(DoubleToHalf(1.0 + 3 * std::ldexp(1.0, -11)).bits, 0x3c02);
  // Just above the tie rounds up: no double rounding through float.
  EXPECT_EQ(DoubleToHalf(1.0 + std::ldexp(1.0, -11) + 1e-12).bits, 0x3c01);
}

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const Half h{static_cast<uint16_t>(b)};
    const double v = HalfToDouble(h);
    if (std::isnan(v)) continue;
    EXPECT_EQ(DoubleToHalf(v).bits, b) << std::hex << b;
  }
}

TEST(BFloat16Test, KnownValuesAndRoundTrip) {
  EXPECT_EQ(DoubleToBFloat16(1.0).bits, 0x3f80);
  EXPECT_EQ(DoubleToBFloat16(-1.5).bits, 0xbfc0);
  EXPECT_EQ(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8)).bits, 0x3f80);  // tie
  EXPECT_EQ(DoubleToBFloat16(1.0 + 3 * std::ldexp(1.0, -8)).bits, 0x3f82);
  EXPECT_EQ(DoubleToBFloat16(3.5e38).bits, 0x7f80);  // overflow to inf
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const BFloat16 h{static_cast<uint16_t>(b)};
    const double v = BFloat16ToDouble(h);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(BitsToFloat(b << 16)));
      continue;
    }
    EXPECT_EQ(v, static_cast<double>(BitsToFloat(b << 16)));
    EXPECT_EQ(DoubleToBFloat16(v).bits, b) << std::hex << b;
  }
}

// Rounding a double picks the nearer neighbour (ties aside).
TEST(HalfTest, RoundsToNearest) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> dist(-70000.0, 70000.0);
  for (int i = 0; i < 20000; ++i) {
    const double v = dist(rng) * std::ldexp(1.0, -(i % 30));
    const double h = HalfToDouble(DoubleToHalf(v));
    const double b = BFloat16ToDouble(DoubleToBFloat16(v));
    if (std::fabs(v) < 65504.0) {
      // The next half away from h in v's direction is no nearer.
      const Half hb = DoubleToHalf(v);
      const double up = HalfToDouble(Half{static_cast<uint16_t>(hb.bits + 1)});
      const double down =
          (hb.bits & 0x7fff) == 0
              ? -up
              : HalfToDouble(Half{static_cast<uint16_t>(hb.bits - 1)});
      EXPECT_LE(std::fabs(v - h), std::fabs(v - up) + 1e-300) << v;
      EXPECT_LE(std::fabs(v - h), std::fabs(v - down) + 1e-300) << v;
    }
    EXPECT_LE(std::fabs(v - b), std::fabs(v) * std::ldexp(1.0, -8)) << v;
  }
}

}  // namespace
}  // namespace syncnorm
