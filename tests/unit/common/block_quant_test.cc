// The block codec (zps/common/block_quant.h) on the ISA this process runs (ZPS_ISA: the test is
// registered once per ISA), against an independent scalar model of the format written here, and
// against golden CRCs, so every ISA is pinned to the same bits on any x86-64 machine.
//
// Regenerating the goldens (only when the format changes on purpose; say why in the commit):
//   ZPS_BLOCK_QUANT_GOLDEN=print build/bin/test_common --gtest_filter='BlockQuant.Golden*'
// prints the table and fails on purpose, so that mode can never pass in CI.
#include "zps/common/block_quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "zps/common/cpu.h"
#include "zps/common/crc32c.h"
#include "zps/common/dtype.h"
#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

struct Rng {  // splitmix64; floats by exact integer-to-float steps
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // A value in (-1, 1) times 2^e for a block-varying exponent: magnitudes spread as weights do.
  float Float(int e) {
    const auto m = static_cast<int32_t>(Next() >> 40) - (1 << 23);  // [-2^23, 2^23)
    return std::ldexp(static_cast<float>(m), e - 23);
  }
};

std::vector<float> Inputs(size_t n, uint64_t seed, uint32_t block) {
  Rng r{seed};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = r.Float(-static_cast<int>((i / block) % 9));
  return x;
}

Isa Active() {
  auto isa = ActiveIsa();
  return isa.ok() ? *isa : Isa::kScalar;
}

void SkipIfIsaMissing() {
  if (!ActiveIsa().ok()) GTEST_SKIP() << "this CPU lacks the ISA ZPS_ISA asks for";
}

// ---- the format as block_quant.h states it, written without the library's code --------------

std::vector<std::byte> ModelQuantize(QuantFormat f, const std::vector<float>& x) {
  std::vector<std::byte> out;
  const float qmax = f.bits == 8 ? 127.0f : 7.0f;
  for (size_t e = 0; e < x.size(); e += f.block) {
    const size_t len = std::min<size_t>(f.block, x.size() - e);
    float absmax = 0;
    bool bad = false;
    for (size_t i = 0; i < len; ++i) {
      if (!std::isfinite(x[e + i])) bad = true;
      absmax = std::max(absmax, std::fabs(x[e + i]));
    }
    std::vector<int> codes(len, 0);
    float scale = 0;
    if (bad) {
      scale = std::numeric_limits<float>::quiet_NaN();
    } else if (absmax >= std::ldexp(1.0f, -120)) {
      scale = absmax / qmax;
      const float inv = qmax / absmax;
      for (size_t i = 0; i < len; ++i) {
        float y = x[e + i] * inv;
        y = std::nearbyint(y);
        codes[i] = static_cast<int>(std::min(std::max(y, -qmax), qmax));
      }
    }
    const auto* sb = reinterpret_cast<const std::byte*>(&scale);
    out.insert(out.end(), sb, sb + 4);
    if (f.bits == 8) {
      for (int c : codes) out.push_back(static_cast<std::byte>(static_cast<int8_t>(c)));
    } else {
      for (size_t i = 0; i < len; i += 2) {
        const int lo = codes[i], hi = i + 1 < len ? codes[i + 1] : 0;
        out.push_back(static_cast<std::byte>((lo & 0xf) | ((hi & 0xf) << 4)));
      }
    }
  }
  return out;
}

std::vector<float> ModelDequantize(QuantFormat f, const std::vector<std::byte>& q, size_t n) {
  std::vector<float> out(n);
  size_t off = 0;
  for (size_t e = 0; e < n; e += f.block) {
    const size_t len = std::min<size_t>(f.block, n - e);
    float scale;
    std::memcpy(&scale, q.data() + off, 4);
    const auto* c = reinterpret_cast<const uint8_t*>(q.data() + off + 4);
    for (size_t i = 0; i < len; ++i) {
      int code;
      if (f.bits == 8) {
        code = static_cast<int8_t>(c[i]);
      } else {
        const int nib = (i & 1) ? c[i / 2] >> 4 : c[i / 2] & 0xf;
        code = nib >= 8 ? nib - 16 : nib;
      }
      out[e + i] = static_cast<float>(code) * scale;
    }
    off += 4 + (f.bits == 8 ? len : (len + 1) / 2);
  }
  return out;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

const QuantFormat kFormats[] = {{8, 64}, {8, 2048}, {4, 64}, {4, 2048}, {8, 192}, {4, 192}};
const size_t kSizes[] = {1, 2, 31, 63, 64, 65, 127, 200, 2047, 2048, 2049, 4099, 6144 + 37};

TEST(BlockQuant, FormatValidation) {
  EXPECT_THAT(ValidateQuantFormat({8, 2048}), IsOk());
  EXPECT_THAT(ValidateQuantFormat({4, 64}), IsOk());
  EXPECT_THAT(ValidateQuantFormat({2, 64}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ValidateQuantFormat({8, 100}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ValidateQuantFormat({8, 0}), StatusIs(Code::kInvalidArgument));
}

TEST(BlockQuant, BlockDTypesHaveStableCodesAndNames) {
  EXPECT_EQ(static_cast<int>(DType::kI8Block), 3);
  EXPECT_EQ(static_cast<int>(DType::kI4Block), 4);
  EXPECT_EQ(*ParseDType("int8-block"), DType::kI8Block);
  EXPECT_EQ(*ParseDType("int4-block"), DType::kI4Block);
  EXPECT_EQ(DTypeName(DType::kI4Block), "int4-block");
  EXPECT_EQ(*DTypeFromByte(3), DType::kI8Block);
  EXPECT_THAT(DTypeFromByte(5), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(DTypeSize(DType::kI8Block), 0u);  // sizes come from QuantizedBytes
  EXPECT_EQ(DTypeQuantBits(DType::kI4Block), 4);
  EXPECT_TRUE(IsBlockQuantized(DType::kI8Block));
  EXPECT_FALSE(IsBlockQuantized(DType::kBF16));
}

TEST(BlockQuant, Sizes) {
  EXPECT_EQ(QuantizedBytes({8, 64}, 64), 68u);
  EXPECT_EQ(QuantizedBytes({8, 64}, 65), 68u + 5u);
  EXPECT_EQ(QuantizedBytes({4, 64}, 64), 36u);
  EXPECT_EQ(QuantizedBytes({4, 64}, 129), 72u + 5u);  // a 1-element last block: scale + 1 byte
  EXPECT_EQ(QuantizedBytes({4, 64}, 130), 72u + 5u);
  EXPECT_EQ(QuantizedBytes({8, 2048}, 0), 0u);
  EXPECT_EQ(QuantizedBlockStride({8, 2048}), 2052u);
  EXPECT_EQ(QuantizedBlockStride({4, 2048}), 1028u);
}

TEST(BlockQuant, MatchesModelBitForBit) {
  SkipIfIsaMissing();
  for (QuantFormat f : kFormats) {
    for (size_t n : kSizes) {
      SCOPED_TRACE("bits " + std::to_string(f.bits) + " block " + std::to_string(f.block) + " n " +
                   std::to_string(n));
      const auto x = Inputs(n, 7 + n, f.block);
      std::vector<std::byte> q(QuantizedBytes(f, n));
      QuantizeBlocks(f, x, q);
      const auto want = ModelQuantize(f, x);
      ASSERT_EQ(q.size(), want.size());
      ASSERT_EQ(0, std::memcmp(q.data(), want.data(), q.size()));
      const auto want_deq = ModelDequantize(f, want, n);
      std::vector<float> deq(n);
      DequantizeBlocks(f, q, deq);
      std::vector<uint16_t> bf(n), h(n);
      DequantizeBlocksToBf16(f, q, bf);
      DequantizeBlocksToF16(f, q, h);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameBits(deq[i], want_deq[i])) << i;
        ASSERT_EQ(bf[i], FloatToBf16(want_deq[i])) << i;
        ASSERT_EQ(h[i], FloatToHalf(want_deq[i])) << i;
      }
    }
  }
}

TEST(BlockQuant, RoundTripWithinHalfAStep) {
  SkipIfIsaMissing();
  for (QuantFormat f : kFormats) {
    const size_t n = 3 * f.block + 17;
    const auto x = Inputs(n, 99, f.block);
    std::vector<std::byte> q(QuantizedBytes(f, n));
    QuantizeBlocks(f, x, q);
    std::vector<float> deq(n);
    DequantizeBlocks(f, q, deq);
    const float qmax = f.bits == 8 ? 127.0f : 7.0f;
    for (size_t e = 0; e < n; e += f.block) {
      const size_t len = std::min<size_t>(f.block, n - e);
      float absmax = 0;
      for (size_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(x[e + i]));
      const float bound = absmax / qmax * 0.5f * (1 + 1e-5f);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_LE(std::fabs(deq[e + i] - x[e + i]), bound)
            << "bits " << int(f.bits) << " " << e + i;
      }
    }
  }
}

TEST(BlockQuant, Int4PackingIsLowNibbleFirstTwosComplement) {
  SkipIfIsaMissing();
  QuantFormat f{4, 64};
  std::vector<float> x(67, 0.0f);
  x[0] = 7.0f;    // code 7  -> 0x7
  x[1] = -7.0f;   // code -7 -> 0x9
  x[2] = 1.0f;    // code 1
  x[3] = -2.0f;   // code -2 -> 0xe
  x[64] = -3.0f;  // the short last block: absmax 3, code -7
  x[66] = 1.5f;   // 1.5 * 7 / 3 = 3.5 -> round half to even: 4
  std::vector<std::byte> q(QuantizedBytes(f, x.size()));
  ASSERT_EQ(q.size(), 36u + 4u + 2u);
  QuantizeBlocks(f, x, q);
  float scale;
  std::memcpy(&scale, q.data(), 4);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(static_cast<uint8_t>(q[4]), 0x97);
  EXPECT_EQ(static_cast<uint8_t>(q[5]), 0xe1);
  EXPECT_EQ(static_cast<uint8_t>(q[6]), 0x00);
  std::memcpy(&scale, q.data() + 36, 4);
  EXPECT_EQ(scale, 3.0f / 7.0f);
  EXPECT_EQ(static_cast<uint8_t>(q[40]), 0x09);  // element 64: -7, element 65: 0
  EXPECT_EQ(static_cast<uint8_t>(q[41]), 0x04);  // element 66: 4, then a zero pad nibble
}

TEST(BlockQuant, NonFiniteBlockDequantizesToNaNAndOthersStayFinite) {
  SkipIfIsaMissing();
  for (QuantFormat f : {QuantFormat{8, 64}, QuantFormat{4, 64}}) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      auto x = Inputs(3 * 64, 5, 64);
      x[64 + 33] = bad;
      std::vector<std::byte> q(QuantizedBytes(f, x.size()));
      QuantizeBlocks(f, x, q);
      std::vector<float> deq(x.size());
      DequantizeBlocks(f, q, deq);
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(std::isnan(deq[i]), i >= 64 && i < 128) << i;
      }
      std::vector<float> acc(x.size(), 1.0f);
      DequantizeAddBlocks(f, q, acc);
      EXPECT_TRUE(std::isnan(acc[64]));
      EXPECT_TRUE(std::isfinite(acc[0]));
      // Error feedback: the block's residual is reset, the others carry on.
      std::vector<float> r(x.size(), 0.25f);
      QuantizeWithResidual(f, x, r, q);
      for (size_t i = 64; i < 128; ++i) EXPECT_EQ(r[i], 0.0f) << i;
      for (size_t i = 0; i < 64; ++i) EXPECT_TRUE(std::isfinite(r[i]));
    }
  }
}

TEST(BlockQuant, ZeroAndTinyBlocksAreZeros) {
  SkipIfIsaMissing();
  QuantFormat f{8, 64};
  std::vector<float> x(128, 0.0f);
  x[70] = 1e-38f;  // below 2^-120: the block is stored as zeros
  x[71] = -0.0f;
  std::vector<std::byte> q(QuantizedBytes(f, x.size()));
  QuantizeBlocks(f, x, q);
  std::vector<float> deq(x.size(), 5.0f);
  DequantizeBlocks(f, q, deq);
  for (float v : deq) EXPECT_EQ(v, 0.0f);
}

TEST(BlockQuant, RangeMatchesTheWholeDequantization) {
  SkipIfIsaMissing();
  for (QuantFormat f : kFormats) {
    const size_t n = 4 * f.block + 45;
    const auto x = Inputs(n, 3, f.block);
    std::vector<std::byte> q(QuantizedBytes(f, n));
    QuantizeBlocks(f, x, q);
    std::vector<float> all(n);
    DequantizeBlocks(f, q, all);
    Rng r{11};
    for (int t = 0; t < 40; ++t) {
      size_t begin = r.Next() % n, end = r.Next() % n + 1;
      if (begin >= end) std::swap(begin, end);
      if (begin == end) ++end;
      if (end > n) continue;
      const QuantRange cov = QuantizedCovering(f, n, begin, end);
      ASSERT_LE(cov.offset + cov.bytes, q.size());
      std::span<const std::byte> blocks(q.data() + cov.offset, cov.bytes);
      std::vector<float> part(end - begin);
      DequantizeRange(f, blocks, cov.skip, part.size(), DequantTarget::kF32, part.data());
      std::vector<uint16_t> bf(end - begin), h(end - begin);
      DequantizeRange(f, blocks, cov.skip, bf.size(), DequantTarget::kBF16, bf.data());
      DequantizeRange(f, blocks, cov.skip, h.size(), DequantTarget::kF16, h.data());
      for (size_t i = begin; i < end; ++i) {
        ASSERT_TRUE(SameBits(part[i - begin], all[i])) << begin << ".." << end << " at " << i;
        ASSERT_EQ(bf[i - begin], FloatToBf16(all[i]));
        ASSERT_EQ(h[i - begin], FloatToHalf(all[i]));
      }
    }
  }
}

TEST(BlockQuant, DequantizeAddIsOneAddPerElement) {
  SkipIfIsaMissing();
  for (QuantFormat f : kFormats) {
    const size_t n = 2 * f.block + 9;
    const auto x = Inputs(n, 21, f.block);
    auto acc = Inputs(n, 22, f.block);
    const auto acc0 = acc;
    std::vector<std::byte> q(QuantizedBytes(f, n));
    QuantizeBlocks(f, x, q);
    std::vector<float> deq(n);
    DequantizeBlocks(f, q, deq);
    DequantizeAddBlocks(f, q, acc);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameBits(acc[i], acc0[i] + deq[i])) << i;
  }
}

TEST(BlockQuant, ErrorFeedbackLosesNothingOverTime) {
  SkipIfIsaMissing();
  for (QuantFormat f : {QuantFormat{8, 256}, QuantFormat{4, 256}}) {
    const size_t n = 1000;
    std::vector<float> r(n, 0.0f);
    std::vector<double> sent(n, 0.0), truth(n, 0.0);
    std::vector<std::byte> q(QuantizedBytes(f, n));
    std::vector<float> deq(n);
    for (int step = 0; step < 50; ++step) {
      const auto g = Inputs(n, 1000 + step, 256);
      std::vector<float> t(n);
      for (size_t i = 0; i < n; ++i) t[i] = g[i] + r[i];
      QuantizeWithResidual(f, g, r, q);
      DequantizeBlocks(f, q, deq);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameBits(r[i], t[i] - deq[i])) << i;  // r = (g + r) - deq(q), exactly
        sent[i] += deq[i];
        truth[i] += g[i];
      }
    }
    // What was sent differs from the true sum by the last residual only (up to fp32 rounding of
    // the running sums), not by 50 steps of rounding errors.
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sent[i] + r[i], truth[i], 1e-4) << "bits " << int(f.bits) << " " << i;
    }
  }
}

// ---- golden CRCs ------------------------------------------------------------------------------

struct Golden {
  uint8_t bits;
  uint32_t block;
  uint32_t quantized;  // QuantizeBlocks' bytes
  uint32_t f32;        // DequantizeBlocks
  uint32_t bf16;       // DequantizeBlocksToBf16
  uint32_t added;      // DequantizeAddBlocks onto a second input
  uint32_t residual;   // three steps of QuantizeWithResidual: the last bytes and the residual
};

// clang-format off
constexpr Golden kGolden[] = {
  {8, 64, 0x61b9f74eu, 0x8a0363bau, 0xfc549ccdu, 0x7a99dab1u, 0xf00bcc26u},
  {8, 2048, 0x38bc670fu, 0x29fe8c98u, 0x8c602887u, 0x31b98aa0u, 0x079274a8u},
  {4, 64, 0x595a20f3u, 0xacabf076u, 0xff12116eu, 0xb65dead1u, 0x3a06bbfau},
  {4, 2048, 0x76ff891du, 0xf866c2cau, 0xf04d84c8u, 0xc15e3017u, 0x1681c045u},
};
// clang-format on

template <typename T>
uint32_t Crc(const std::vector<T>& v) {
  return Crc32c(v.data(), v.size() * sizeof(T));
}

TEST(BlockQuant, GoldenCrcs) {
  SkipIfIsaMissing();
  const bool print = std::getenv("ZPS_BLOCK_QUANT_GOLDEN") != nullptr;
  const size_t n = 3 * 2048 + 4099;  // whole vectors, tails, short last blocks
  for (const Golden& g : kGolden) {
    const QuantFormat f{g.bits, g.block};
    const auto x = Inputs(n, 42, f.block);
    std::vector<std::byte> q(QuantizedBytes(f, n));
    QuantizeBlocks(f, x, q);
    std::vector<float> deq(n);
    DequantizeBlocks(f, q, deq);
    std::vector<uint16_t> bf(n);
    DequantizeBlocksToBf16(f, q, bf);
    auto acc = Inputs(n, 43, f.block);
    DequantizeAddBlocks(f, q, acc);
    std::vector<float> r(n, 0.0f);
    std::vector<std::byte> qr(q.size());
    for (int step = 0; step < 3; ++step) QuantizeWithResidual(f, Inputs(n, 50 + step, 64), r, qr);
    const uint32_t res = Crc32cExtend(Crc(qr), std::as_bytes(std::span(r)));
    const Golden got{g.bits, g.block, Crc(q), Crc(deq), Crc(bf), Crc(acc), res};
    if (print) {
      std::printf("  {%d, %u, 0x%08xu, 0x%08xu, 0x%08xu, 0x%08xu, 0x%08xu},\n", g.bits, g.block,
                  got.quantized, got.f32, got.bf16, got.added, got.residual);
      continue;
    }
    SCOPED_TRACE(std::string(IsaName(Active())) + " bits " + std::to_string(g.bits) + " block " +
                 std::to_string(g.block));
    EXPECT_EQ(got.quantized, g.quantized);
    EXPECT_EQ(got.f32, g.f32);
    EXPECT_EQ(got.bf16, g.bf16);
    EXPECT_EQ(got.added, g.added);
    EXPECT_EQ(got.residual, g.residual);
  }
  if (print) FAIL() << "ZPS_BLOCK_QUANT_GOLDEN=print prints the table and fails on purpose";
}

}  // namespace
}  // namespace zps
