// StreamCopy must write exactly memcpy's bytes, and nothing outside the destination, at every
// alignment of source and destination and at sizes around the vector widths. Registered once per
// ISA (ZPS_ISA), so the AVX-512, AVX2 and scalar paths all run.
#include "zps/common/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zps/common/cpu.h"
#include "zps/common/dtype.h"

namespace zps {
namespace {

constexpr size_t kGuard = 128;  // bytes checked on each side of the destination
constexpr std::byte kFill{0xa5};

void CheckCopy(size_t size, size_t src_offset, size_t dst_offset, size_t stream_from,
               std::mt19937& rng) {
  std::vector<std::byte> src(size + 128);
  for (auto& b : src) b = static_cast<std::byte>(rng());
  std::vector<std::byte> dst(size + 64 + 2 * kGuard, kFill);
  // Both bases rounded up to 64 bytes, so that the offsets are the exact misalignments.
  auto aligned = [](std::byte* p) {
    return p + ((64 - (reinterpret_cast<uintptr_t>(p) & 63)) & 63);
  };
  std::byte* const s = aligned(src.data());
  std::byte* const d0 = aligned(dst.data() + kGuard - 64);
  std::byte* const d = d0 + dst_offset;
  ASSERT_LE(static_cast<size_t>(s - src.data()) + src_offset + size, src.size());
  ASSERT_LE(d + size + kGuard, dst.data() + dst.size());
  StreamCopy({d, size}, {s + src_offset, size}, stream_from);
  for (size_t i = 0; i < size; ++i) {
    ASSERT_EQ(d[i], s[src_offset + i]) << "byte " << i << " of " << size << " (src +" << src_offset
                                       << ", dst +" << dst_offset << ")";
  }
  for (std::byte* p = dst.data(); p < d; ++p) ASSERT_EQ(*p, kFill) << "wrote before dst";
  for (std::byte* p = d + size; p < dst.data() + dst.size(); ++p) {
    ASSERT_EQ(*p, kFill) << "wrote past dst, size " << size;
  }
}

TEST(StreamCopy, EqualsMemcpyAtEveryAlignment) {
  auto isa = ActiveIsa();
  if (!isa.ok()) GTEST_SKIP() << isa.status().ToString();
  std::mt19937 rng(7);
  // Streaming from the first byte: sizes around the 32- and 64-byte stores and the unrolled
  // 128- and 256-byte loops, so that head, bulk and tail each take every length.
  const size_t sizes[] = {0,   1,   31,  32,  33,  63,  64,   65,        127,
                          128, 129, 255, 256, 257, 511, 1000, 4096 + 17, (256 << 10) + 5};
  for (size_t size : sizes) {
    for (size_t dst_offset : {0, 1, 8, 31, 32, 33, 63}) {
      for (size_t src_offset : {0, 3, 32}) {
        CheckCopy(size, src_offset, dst_offset, /*stream_from=*/0, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(StreamCopy, BelowTheThresholdIsMemcpyAndTheThresholdIsBounded) {
  auto isa = ActiveIsa();
  if (!isa.ok()) GTEST_SKIP() << isa.status().ToString();
  std::mt19937 rng(11);
  CheckCopy(1000, 3, 5, /*stream_from=*/1 << 20, rng);
  const size_t t = StreamCopyThreshold();
  EXPECT_GE(t, size_t{1} << 20);
  EXPECT_LE(t, size_t{64} << 20);
  EXPECT_EQ(t, StreamCopyThreshold());
}

TEST(StreamCopy, TheDefaultThresholdCopiesLargeBuffers) {
  auto isa = ActiveIsa();
  if (!isa.ok()) GTEST_SKIP() << isa.status().ToString();
  std::mt19937 rng(13);
  const size_t size = StreamCopyThreshold() + 100;
  std::vector<std::byte> src(size), dst(size + 64, kFill);
  for (auto& b : src) b = static_cast<std::byte>(rng());
  StreamCopy({dst.data() + 1, size}, src);
  EXPECT_EQ(dst[0], kFill);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 1));
  EXPECT_EQ(dst[size + 1], kFill);
}

// The streamed 16-bit conversions equal the cached ones (dtype.h) bit for bit, NaN payloads,
// infinities and rounding ties included, at every 16-bit alignment of the output and at sizes
// around the 8- and 16-lane loops, and write nothing around the output.
TEST(StreamCopy, ConversionsEqualTheCachedOnesAtEveryAlignment) {
  auto isa = ActiveIsa();
  if (!isa.ok()) GTEST_SKIP() << isa.status().ToString();
  std::mt19937 rng(17);
  std::vector<float> in(4096 + 64);
  for (auto& f : in) f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            65504.0f,
                            65520.0f,
                            1.0f + 1.0f / 2048,
                            1e-8f};
  for (size_t i = 0; i < std::size(specials); ++i) in[i * 7] = specials[i];
  constexpr uint16_t kMark = 0xa5a5;
  for (bool bf16 : {false, true}) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4096 + 3}) {
      for (size_t offset = 0; offset < 17; ++offset) {
        std::span<const float> src(in.data() + (offset % 3), n);
        std::vector<uint16_t> want(n);
        if (bf16)
          ConvertF32ToBF16(src, want);
        else
          ConvertF32ToF16(src, want);
        std::vector<uint16_t> out(n + 64, kMark);
        // 64-byte aligned base, then `offset` elements in: every alignment a store can meet.
        uint16_t* base = out.data();
        while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
        std::span<uint16_t> dst(base + offset, n);
        ASSERT_LE(base + offset + n, out.data() + out.size());
        if (bf16)
          StreamConvertF32ToBF16(src, dst, /*stream_from=*/0);
        else
          StreamConvertF32ToF16(src, dst, /*stream_from=*/0);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[i], want[i]) << (bf16 ? "bf16" : "fp16") << " element " << i << " of " << n
                                     << ", output offset " << offset;
        }
        for (uint16_t* p = out.data(); p < dst.data(); ++p) ASSERT_EQ(*p, kMark);
        for (uint16_t* p = dst.data() + n; p < out.data() + out.size(); ++p) {
          ASSERT_EQ(*p, kMark);
        }
      }
    }
  }
}

}  // namespace
}  // namespace zps
