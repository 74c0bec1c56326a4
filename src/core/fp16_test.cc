#include "core/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"

namespace shoal {
namespace {

bool IsNanBits(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu); }

TEST(Fp16Test, EveryBitPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (IsNanBits(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(IsNanBits(FloatToFp16(f))) << h;
      continue;
    }
    ASSERT_EQ(FloatToFp16(f), h) << "bits " << h << " value " << f;
  }
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(Fp16ToFloat(0xFC00)) && Fp16ToFloat(0xFC00) < 0);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(0.1f), 0x2E66);
}

TEST(Fp16Test, RoundsToNearestTiesToEven) {
  const float ulp = std::ldexp(1.0f, -10);             // FP16's spacing at 1
  EXPECT_EQ(FloatToFp16(1.0f + ulp / 2), 0x3C00);      // tie, even below
  EXPECT_EQ(FloatToFp16(1.0f + 3 * ulp / 2), 0x3C02);  // tie, even above
  EXPECT_EQ(FloatToFp16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3C01);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);  // tie with 65536: infinity
  EXPECT_EQ(FloatToFp16(-1e9f), 0xFC00);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  // Subnormals: 2^-25 is the tie between 0 and the smallest subnormal.
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 subnormal ulps, tie to 2
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToFp16(std::ldexp(1023.5f, -24)), 0x0400);  // up into the normals
  EXPECT_TRUE(IsNanBits(FloatToFp16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Fp16Test, ArrayFormsGiveTheScalarBits) {
  std::vector<uint16_t> halves(0x10000 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(halves.size());
  Fp16ToFloat(halves.data(), floats.data(), halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = Fp16ToFloat(halves[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(floats[i])) << i;
    } else {
      ASSERT_EQ(floats[i], want) << i;
    }
  }
  // Floats between representable FP16 values, ties included, over the whole range.
  std::vector<float> in;
  uint32_t state = 2463534242u;
  for (int i = 0; i < 200000; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    // Exponents from 2^-30 (below FP16's subnormals) to 2^17 (beyond its range).
    const uint32_t exp = 97u + (state >> 24) % 48u;
    const uint32_t bits = (state & 0x807FFFFFu) | (exp << 23);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    in.push_back(f);
  }
  in.push_back(std::ldexp(1.0f, -25));
  in.push_back(65520.0f);
  std::vector<uint16_t> out(in.size());
  FloatToFp16(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) continue;
    ASSERT_EQ(out[i], FloatToFp16(in[i])) << "value " << in[i];
  }
}

// bf16 keeps a float's top 16 bits, rounding the rest to nearest, ties to even.
TEST(Bf16Test, RoundsToNearestEvenAndRoundTripsWhatItHolds) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa, 1.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above a half rounds up.
  EXPECT_EQ(FloatToBf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  for (const uint16_t h : {0x0000, 0x3f80, 0x4049, 0xc2f7, 0x7f7f}) {
    EXPECT_EQ(FloatToBf16(Bf16ToFloat(h)), h);
  }
}

// A NaN whose payload lies only in the low bits would round into infinity; it stays NaN.
TEST(Bf16Test, NaNStaysNaN) {
  uint32_t bits = 0x7fffffffu;  // all-ones mantissa: rounding would carry into the exponent
  float nan;
  std::memcpy(&nan, &bits, 4);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  bits = 0x7f800001u;  // the smallest payload: rounding would drop it, giving infinity
  std::memcpy(&nan, &bits, 4);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(INFINITY))));
}

}  // namespace
}  // namespace shoal
