// ServingDirectory: what a worker may read one-sided from a shard's serving region
// (worker/src/serving_directory.h, docs/protocol.md "One-sided fetch of a published version").
#include "serving_directory.h"

#include <gtest/gtest.h>

#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::worker {
namespace {

const std::vector<std::byte> kKey(16, std::byte{0x5a});
constexpr uint64_t kSession0 = 111, kSession1 = 222;

TEST(ServingDirectory, UnknownChunkAsksTheShard) {
  ServingDirectory d({kSession0, kSession1}, true);
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 0).has_value());
}

TEST(ServingDirectory, LearnedRangeIsReadAtItsAddressUpToItsVersion) {
  ServingDirectory d({kSession0, kSession1}, true);
  // The reply for elements [8, ...) of chunk 3 said: at 0x10010 (bf16), version 4.
  d.Learn(0, 3, 8, 2, 4, 0x10010, kKey);
  auto hit = d.Lookup(0, 3, 0, 2, 4);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->address, 0x10000u);  // the chunk's element 0
  EXPECT_EQ(hit->version, 4);
  EXPECT_EQ(hit->rkey, kKey);
  hit = d.Lookup(0, 3, 100, 2, 2);  // an older min_version is served the version there
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->address, 0x10000u + 200);
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 5).has_value());  // not known to be published
  EXPECT_FALSE(d.Lookup(1, 3, 0, 2, 4).has_value());  // another shard
}

TEST(ServingDirectory, NoticeRaisesTheVersionOfLearnedChunksOnly) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  ASSERT_THAT(d.Notice(0, kSession0, 5), IsOk());
  auto hit = d.Lookup(0, 3, 0, 2, 5);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->version, 5);
  EXPECT_FALSE(d.Lookup(0, 4, 0, 2, 5).has_value());  // never learned: no address
}

TEST(ServingDirectory, TwoBanksAlternateWithTheVersion) {
  ServingDirectory d({kSession0, kSession1}, true);
  // Version 4 of chunk 3 is in bank 0 at 0x10000; bank 1 is 0x8000 further.
  d.Learn(0, 3, 8, 2, 4, 0x10010, kKey, 0x8000);
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 4)->address, 0x10000u);
  ASSERT_THAT(d.Notice(0, kSession0, 5), IsOk());  // version 5 is in the other bank
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 5)->address, 0x18000u);
  EXPECT_EQ(d.Lookup(0, 3, 4, 2, 5)->address, 0x18008u);
  ASSERT_THAT(d.Notice(0, kSession0, 6), IsOk());  // and version 6 back in the first
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 6)->address, 0x10000u);
  // A reply from bank 1 (version 7) says the other bank is before it.
  d.Learn(0, 3, 0, 2, 7, 0x18000, kKey, -0x8000);
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 7)->address, 0x18000u);
  ASSERT_THAT(d.Notice(0, kSession0, 8), IsOk());
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 8)->address, 0x10000u);
  // A late reply of an older version (6, bank 0) after the notice of 8: still bank 0 at 8.
  d.Learn(0, 3, 0, 2, 6, 0x10000, kKey, 0x8000);
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 8)->version, 8);
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 8)->address, 0x10000u);
}

TEST(ServingDirectory, StaleNoticeIsRefusedAndChangesNothing) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 1, 0x10000, kKey);
  ASSERT_THAT(d.Notice(0, kSession0, 6), IsOk());
  Status s = d.Notice(0, kSession0, 5);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(d.Lookup(0, 3, 0, 2, 0)->version, 6);
}

TEST(ServingDirectory, NoticeWithAnotherSessionsTokenIsRefused) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 1, 0x10000, kKey);
  Status s = d.Notice(0, kSession1, 9);  // shard 1's token on shard 0's notice
  EXPECT_EQ(s.code(), Code::kUnauthenticated) << s.ToString();
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 9).has_value());
  EXPECT_EQ(d.Notice(5, kSession0, 9).code(), Code::kOutOfRange);
}

TEST(ServingDirectory, PushForTheChunkEndsDirectReadsUntilTheNextVersion) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  d.Learn(0, 7, 0, 2, 4, 0x20000, kKey);
  d.Pushed(3, 4);  // the update of step 4 may now rewrite chunk 3's copy
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 4).has_value());
  EXPECT_TRUE(d.Lookup(0, 7, 0, 2, 4).has_value());  // server-sum: only that chunk
  ASSERT_THAT(d.Notice(0, kSession0, 5), IsOk());    // step 4 published as version 5
  EXPECT_TRUE(d.Lookup(0, 3, 0, 2, 5).has_value());
  d.Pushed(3, -1);  // initial values change nothing known
  EXPECT_TRUE(d.Lookup(0, 3, 0, 2, 5).has_value());
}

TEST(ServingDirectory, PreReducedPushEndsDirectReadsOfEveryChunk) {
  ServingDirectory d({kSession0, kSession1}, false);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  d.Learn(1, 7, 0, 2, 4, 0x20000, kKey);
  d.Pushed(3, 4);
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 4).has_value());
  EXPECT_FALSE(d.Lookup(1, 7, 0, 2, 4).has_value());
}

TEST(ServingDirectory, ForgetNoticeEndsTheSessionsDirectReads) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  ASSERT_THAT(d.Notice(0, kSession0, msg::ServingNoticeHeader::kNoticeForget), IsOk());
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 0).has_value());
  d.Learn(0, 3, 0, 2, 5, 0x10000, kKey);  // a late reply of the fenced session
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 0).has_value());
  EXPECT_EQ(d.Notice(0, kSession0, 6).code(), Code::kFailedPrecondition);
}

TEST(ServingDirectory, NewRkeyForgetsTheShardsOtherAddresses) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  const std::vector<std::byte> other(16, std::byte{0x33});
  d.Learn(0, 7, 0, 2, 4, 0x90000, other);  // the region was re-registered
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 4).has_value());
  auto hit = d.Lookup(0, 7, 0, 2, 4);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->rkey, other);
}

TEST(ServingDirectory, ForgetAfterAnErrorDropsTheShardsAddresses) {
  ServingDirectory d({kSession0, kSession1}, true);
  d.Learn(0, 3, 0, 2, 4, 0x10000, kKey);
  d.Learn(1, 3, 0, 2, 4, 0x10000, kKey);
  d.Forget(0);
  EXPECT_FALSE(d.Lookup(0, 3, 0, 2, 4).has_value());
  EXPECT_TRUE(d.Lookup(1, 3, 0, 2, 4).has_value());
}

}  // namespace
}  // namespace zps::worker
