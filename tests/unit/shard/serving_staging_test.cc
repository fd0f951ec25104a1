// ServingStaging: the staging buffers and read cache of spilled serving copies and copies made
// on fetch, and their lending to replies.
#include "shard/serving_staging.h"

#include <gtest/gtest.h>

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

// A buffer a reply still holds (one whose send never completes, say) does not stall the next
// read of another chunk: it gets a new buffer, freed again when the reply lets go.
TEST(ServingStagingTest, AHeldBufferDoesNotStallTheNextRead) {
  auto staging = ServingStaging::Create(1, 4);
  ASSERT_THAT(staging.status(), IsOk());
  bool hit = false;
  auto fill = [](uint16_t v) {
    return [v](uint16_t* out) {
      for (int i = 0; i < 4; ++i) out[i] = v;
      return Status::Ok();
    };
  };
  auto held = (*staging)->Get(1, 0, fill(1), &hit);  // one owner outside the cache
  ASSERT_THAT(held.status(), IsOk());
  auto next = (*staging)->Get(2, 0, fill(2), &hit);
  ASSERT_THAT(next.status(), IsOk());
  EXPECT_FALSE(hit);
  EXPECT_NE(held->get(), next->get());
  EXPECT_EQ(held->get()[3], 1);  // untouched by the read of chunk 2
  EXPECT_EQ(next->get()[3], 2);
  EXPECT_EQ((*staging)->bytes(), 2 * 4 * sizeof(uint16_t));
  held->reset();  // the reply is done: one buffer more than kept, so it is freed
  EXPECT_EQ((*staging)->bytes(), 4 * sizeof(uint16_t));
  next->reset();  // the cache keeps chunk 2's
  auto again = (*staging)->Get(2, 0, fill(9), &hit);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_TRUE(hit);
  EXPECT_EQ(again->get()[0], 2);
}

TEST(ServingStagingTest, StopCancelsTheNextRead) {
  auto staging = ServingStaging::Create(1, 4);
  ASSERT_THAT(staging.status(), IsOk());
  (*staging)->Stop();
  bool hit = false;
  auto next = (*staging)->Get(
      1, 0, [](uint16_t*) { return Status::Ok(); }, &hit);
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
  const uint16_t* first_at = nullptr;
  {
    auto first = (*staging)->Get(1, 0, fill, &hit);
    ASSERT_THAT(first.status(), IsOk());
    first_at = first->get();
  }  // only the cache holds it now: evictable
  auto second = (*staging)->Get(2, 0, fill, &hit);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_FALSE(hit);
  EXPECT_EQ(second->get(), first_at);  // the same buffer, no new one
  EXPECT_EQ((*staging)->bytes(), 4 * sizeof(uint16_t));
}

}  // namespace
}  // namespace zps::server
