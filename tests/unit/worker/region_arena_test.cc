// RegionArena: push staging blocks inside one UCX-allocated region (worker/src/region_arena.h).
#include "region_arena.h"

#include <gtest/gtest.h>

#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::worker {
namespace {

class RegionArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ctx = ucx::Context::Create({.transports = "shm"});
    ASSERT_THAT(ctx, IsOk());
    ctx_ = std::move(*ctx);
    auto region = ctx_->Allocate(kSize);
    ASSERT_THAT(region, IsOk());
    arena_ = std::make_unique<RegionArena>(std::move(*region));
  }
  void TearDown() override { arena_.reset(); }

  static constexpr size_t kSize = 64 * 1024;
  std::unique_ptr<ucx::Context> ctx_;  // outlives the arena's region
  std::unique_ptr<RegionArena> arena_;
};

TEST_F(RegionArenaTest, BlocksLieInTheRegionAlignedAndDisjoint) {
  auto a = arena_->Acquire(100);
  auto b = arena_->Acquire(1000);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(arena_->region().Contains(a.get(), 100));
  EXPECT_TRUE(arena_->region().Contains(b.get(), 1000));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u);
  EXPECT_GE(b.get(), a.get() + 100);
}

TEST_F(RegionArenaTest, FullArenaReturnsNullAndFreedBlocksMerge) {
  std::vector<std::shared_ptr<std::byte[]>> quarters;
  for (int i = 0; i < 4; ++i) {
    quarters.push_back(arena_->Acquire(kSize / 4));
    ASSERT_NE(quarters.back(), nullptr) << i;
  }
  EXPECT_EQ(arena_->Acquire(64), nullptr);  // full: the caller falls back to heap staging
  // Free the middle two: a block of half the region fits only once they merged.
  quarters[1].reset();
  quarters[2].reset();
  auto half = arena_->Acquire(kSize / 2);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half.get(), arena_->region().memory().data() + kSize / 4);
  half.reset();
  quarters.clear();
  EXPECT_NE(arena_->Acquire(kSize), nullptr);  // everything merged back into one block
  EXPECT_EQ(arena_->Acquire(kSize + 64), nullptr);
}

TEST_F(RegionArenaTest, BlockMayOutliveTheArenaObject) {
  auto block = arena_->Acquire(256);
  ASSERT_NE(block, nullptr);
  arena_.reset();  // the region stays alive through the block
  block.get()[0] = std::byte{1};
  block.reset();  // released after the arena: frees the region
}

}  // namespace
}  // namespace zps::worker
