// BufferPool: the buffers snapshots hand back for the next out-of-place update.
#include "shard/buffer_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

TEST(BufferPoolTest, GivenBuffersAreTakenAgainBySize) {
  BufferPool pool;
  auto empty = pool.Take(0);
  ASSERT_THAT(empty.status(), IsOk());
  EXPECT_EQ(empty->size(), 0u);
  auto a = pool.Take(100);  // nothing pooled: a new one
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ(a->size(), 100u);
  const float* where = a->data();
  pool.Give(std::move(*a));
  pool.Give(AlignedBuffer<float>());  // dropped
  EXPECT_EQ(pool.pooled(), 1u);
  auto other = pool.Take(50);  // another size: not the pooled one
  ASSERT_THAT(other.status(), IsOk());
  EXPECT_NE(other->data(), where);
  auto again = pool.Take(100);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->data(), where);
  EXPECT_EQ(pool.pooled(), 0u);
}

TEST(BufferPoolTest, TakeLikeShapesAsTheLiveState) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.momentum = 0.9f;
  sgd.state_dtype = StateDType::kInt8;
  auto live = ChunkBuffers::Allocate(ChunkLayout::For(sgd, DType::kBF16), 8);
  ASSERT_THAT(live.status(), IsOk());
  BufferPool pool;
  auto fresh = pool.TakeLike(*live);
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_EQ(fresh->master.size(), 8u);
  EXPECT_EQ(fresh->m.size(), MomentBytes(StateDType::kInt8, 8));  // packed
  EXPECT_EQ(fresh->v.size(), 0u);
  EXPECT_EQ(fresh->dtype, StateDType::kInt8);
  pool.Give(std::move(*fresh));
  EXPECT_EQ(pool.pooled(), 2u);  // master and m; no v
}

TEST(BufferPoolTest, ReserveFillsThePoolInTheBackground) {
  BufferPool pool;
  pool.Reserve({16, 32}, {66}, "test");  // two masters, one packed moment
  pool.Reserve({64}, {}, "test");        // only the first call does anything
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (pool.pooled() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(pool.pooled(), 3u);
  auto b = pool.Take(32);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(pool.pooled(), 2u);
  auto m = pool.TakeBytes(66);
  ASSERT_THAT(m.status(), IsOk());
  EXPECT_EQ(pool.pooled(), 1u);
}

TEST(BufferPoolTest, DestroyedWhileReserving) {
  // The destructor stops the reserving thread between buffers and joins it.
  BufferPool pool;
  pool.Reserve(std::vector<size_t>(1000, 1 << 16), {}, "test");
}

}  // namespace
}  // namespace zps::server
