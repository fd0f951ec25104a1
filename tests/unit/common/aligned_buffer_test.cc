// AlignedBuffer: alignment, zeroing, and a moved-from buffer that is empty.
#include "zps/common/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

TEST(AlignedBuffer, AllocatesZeroedAndAligned) {
  auto small = AlignedBuffer<float>::Allocate(100);
  ASSERT_THAT(small, IsOk());
  EXPECT_EQ(small->size(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small->data()) % 64, 0u);
  for (float x : small->span()) EXPECT_EQ(x, 0.0f);
  auto huge = AlignedBuffer<uint16_t>::Allocate(AlignedBuffer<uint16_t>::kHugePageMin / 2);
  ASSERT_THAT(huge, IsOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(huge->data()) % (2u << 20), 0u);
}

// The speculative publish hands a chunk's spare buffers to the live state (and the live ones to
// a snapshot) by moving them, then tells "given away" from "still here" by the spare's size: a
// moved-from buffer that kept its size made the next speculation write through a null pointer.
TEST(AlignedBuffer, AMovedFromBufferIsEmpty) {
  auto a = AlignedBuffer<float>::Allocate(256);
  ASSERT_THAT(a, IsOk());
  float* data = a->data();
  AlignedBuffer<float> b(std::move(*a));
  EXPECT_EQ(b.size(), 256u);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a->size(), 0u);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_TRUE(a->span().empty());
  AlignedBuffer<float> c;
  c = std::move(b);
  EXPECT_EQ(c.size(), 256u);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.data(), nullptr);
  c = AlignedBuffer<float>();  // the old block is freed, c is empty
  EXPECT_EQ(c.size(), 0u);
}

}  // namespace
}  // namespace zps
