// StreamCopy must write exactly memcpy's bytes, and nothing outside the destination, at every
// alignment of source and destination and at sizes around the vector widths. Registered once per ISA (ZPS_ISA), so the AVX-512, AVX2 and scalar paths all run.
#include "zps/common/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "zps/common/cpu.h"

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
    ASSERT_EQ(d[i], s[src_offset + i]) << "byte " << i << " of " << size << " (src +"
                                       << src_offset << ", dst +" << dst_offset << ")";
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
  const size_t sizes[] = {0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 1000,
                          4096 + 17, (256 << 10) + 5};
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

}  // namespace
}  // namespace zps
