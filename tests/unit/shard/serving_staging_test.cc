// ServingStaging: the staging buffers and read cache of spilled serving copies.
#include "shard/serving_staging.h"

#include <gtest/gtest.h>

#include <thread>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

TEST(ServingStagingTest, CachesTheLatestCopyPerGeneration) {
  auto staging = ServingStaging::Create(2, 4);
  ASSERT_THAT(staging.status(), IsOk());
  EXPECT_EQ((*staging)->bytes(), 2 * 4 * sizeof(uint16_t));
  int reads = 0;
  auto read = [&](uint16_t* out) {
    ++reads;
    for (int i = 0; i < 4; ++i) out[i] = static_cast<uint16_t>(reads * 10 + i);
    return Status::Ok();
  };
  bool hit = true;
  auto a = (*staging)->Get(7, 2, read, &hit);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_FALSE(hit);
  EXPECT_EQ((*a).get()[1], 11);
  auto b = (*staging)->Get(7, 2, read, &hit);  // the same chunk and generation: the cache
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_TRUE(hit);
  EXPECT_EQ(reads, 1);
  auto c = (*staging)->Get(7, 4, read, &hit);  // a new generation: read again
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_FALSE(hit);
  EXPECT_EQ((*c).get()[0], 20);
}

TEST(ServingStagingTest, AReadErrorIsReturnedAndNotCached) {
  auto staging = ServingStaging::Create(1, 4);
  ASSERT_THAT(staging.status(), IsOk());
  bool hit = false;
  auto bad = (*staging)->Get(
      1, 0, [](uint16_t*) { return IoError("disk"); }, &hit);
  EXPECT_THAT(bad.status(), StatusIs(Code::kIoError));
  auto good = (*staging)->Get(
      1, 0,
      [](uint16_t* out) {
        out[0] = 5;
        return Status::Ok();
      },
      &hit);
  ASSERT_THAT(good.status(), IsOk());
  EXPECT_FALSE(hit);
}

TEST(ServingStagingTest, WaitsForAHeldBufferAndStopCancels) {
  auto staging = ServingStaging::Create(1, 4);
  ASSERT_THAT(staging.status(), IsOk());
  bool hit = false;
  auto fill = [](uint16_t* out) {
    out[0] = 1;
    return Status::Ok();
  };
  auto held = (*staging)->Get(1, 0, fill, &hit);  // one owner outside the cache
  ASSERT_THAT(held.status(), IsOk());
  // Another chunk needs the only buffer: the cache entry goes, then the read waits for `held`.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (*staging)->Stop();
  });
  auto next = (*staging)->Get(2, 0, fill, &hit);
  stopper.join();
  EXPECT_THAT(next.status(), StatusIs(Code::kCancelled));
}

TEST(ServingStagingTest, AReleasedBufferServesTheNextRead) {
  auto staging = ServingStaging::Create(1, 4);
  ASSERT_THAT(staging.status(), IsOk());
  bool hit = false;
  auto fill = [](uint16_t* out) {
    out[0] = 3;
    return Status::Ok();
  };
  {
    auto first = (*staging)->Get(1, 0, fill, &hit);
    ASSERT_THAT(first.status(), IsOk());
  }  // only the cache holds it now: evictable
  auto second = (*staging)->Get(2, 0, fill, &hit);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_FALSE(hit);
}

}  // namespace
}  // namespace zps::server
