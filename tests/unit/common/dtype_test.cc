// Conversion tests. Reference: the exact rounding done in double precision, which is independent
// of the bit tricks used in dtype.h.
#include "zps/common/dtype.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "zps/common/cpu.h"

namespace zps {
namespace {

// Round-to-nearest-even of a finite double to fp16, computed arithmetically.
uint16_t RefHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(f));
  if (std::isinf(f) || a >= 65520.0) return sign | 0x7c00;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  int exp = std::max(e - 1, -14);
  double ulp = std::ldexp(1.0, exp - 10);
  double q = std::nearbyint(a / ulp);  // default rounding mode: ties to even
  double r = q * ulp;
  if (r == 0) return sign;
  int re;
  std::frexp(r, &re);
  int rexp = re - 1;
  if (rexp < -14)
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r / std::ldexp(1.0, -24)));
  uint16_t mant = static_cast<uint16_t>(std::ldexp(r, -rexp) * 1024.0 - 1024.0);
  return static_cast<uint16_t>(sign | ((rexp + 15) << 10) | mant);
}

uint16_t RefBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  double a = static_cast<double>(f);
  if (std::isinf(f) || a == 0) return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
  int e;
  std::frexp(std::fabs(a), &e);
  int exp = std::max(e - 1, -126);
  double ulp = std::ldexp(1.0, exp - 7);
  double r = std::nearbyint(a / ulp) * ulp;
  if (std::fabs(r) > static_cast<double>(std::numeric_limits<float>::max())) {
    return std::signbit(f) ? 0xff80 : 0x7f80;
  }
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(r)) >> 16);
}

std::vector<float> Samples() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          70000.0f,
                          6.1035156e-05f,
                          5.9604645e-08f,
                          2.9802322e-08f,
                          2.9802326e-08f,
                          1e-10f,
                          3.1415926f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          1.00048828125f /* fp16 tie */,
                          1.00146484375f,
                          1.00390625f /* bf16 tie */};
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float f = std::bit_cast<float>(bits);
    if (!std::isnan(f)) v.push_back(f);
  }
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) v.push_back(small(rng));
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 100000; ++i) v.push_back(tiny(rng));
  return v;
}

TEST(DType, ScalarHalfMatchesReference) {
  for (float f : Samples()) {
    ASSERT_EQ(FloatToHalf(f), RefHalf(f)) << f << " bits " << std::bit_cast<uint32_t>(f);
  }
}

TEST(DType, ScalarBf16MatchesReference) {
  for (float f : Samples()) {
    ASSERT_EQ(FloatToBf16(f), RefBf16(f)) << f;
  }
}

TEST(DType, HalfRoundTripIsExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(DType, NanStaysNan) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  float snan = std::numeric_limits<float>::signaling_NaN();
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(nan))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(snan))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(snan))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(-nan))));
}

// The bulk (vectorised) paths must equal the scalar ones bit for bit, NaN payloads included.
TEST(DType, BulkConversionsMatchScalarOnThisIsa) {
  auto isa = ActiveIsa();
  if (!isa.ok()) GTEST_SKIP() << isa.status().ToString();
  std::vector<float> in = Samples();
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i)
    in.push_back(std::bit_cast<float>(static_cast<uint32_t>(0x7f800001u + (rng() & 0x7fffffu))));
  in.push_back(std::bit_cast<float>(0xff812345u));
  std::vector<uint16_t> h(in.size()), b(in.size());
  ConvertF32ToF16(in, h);
  ConvertF32ToBF16(in, b);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(h[i], FloatToHalf(in[i])) << i << " isa " << IsaName(*isa);
    ASSERT_EQ(b[i], FloatToBf16(in[i])) << i;
  }
  std::vector<float> back(in.size());
  ConvertF16ToF32(h, back);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(HalfToFloat(h[i]))) << i;
  }
  ConvertBF16ToF32(b, back);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(Bf16ToFloat(b[i]))) << i;
  }
}

TEST(DType, ParseAndValidate) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_FALSE(DTypeFromByte(9).ok());
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
}

}  // namespace
}  // namespace zps
