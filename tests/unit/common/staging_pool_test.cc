#include "zps/common/staging_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

namespace zps {
namespace {

bool Aligned64(const std::byte* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(StagingPool, ReusesAReleasedBufferOfUpToTwiceTheSize) {
  StagingPool pool(size_t{1} << 20);
  const std::byte* first = nullptr;
  {
    auto a = pool.Acquire(1000);
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(Aligned64(a.get()));
    first = a.get();
  }
  {
    auto b = pool.Acquire(600);  // 1000 is within [600, 1200]: the same buffer
    EXPECT_EQ(b.get(), first);
    auto c = pool.Acquire(600);  // the first is taken: a new one
    EXPECT_NE(c.get(), first);
    EXPECT_TRUE(Aligned64(c.get()));
  }
  // Both are back in the pool; 1000 is more than twice 400, so a request of 400 gets the 600.
  auto d = pool.Acquire(400);
  EXPECT_NE(d.get(), first);
  EXPECT_NE(d.get(), nullptr);
}

TEST(StagingPool, ABufferMayOutliveThePool) {
  std::shared_ptr<std::byte[]> held;
  {
    StagingPool pool;
    held = pool.Acquire(4096);
    held[4095] = std::byte{7};
  }
  EXPECT_EQ(held[4095], std::byte{7});
  held.reset();  // freed, not returned to the gone pool (ASan/TSan builds would see otherwise)
}

}  // namespace
}  // namespace zps
