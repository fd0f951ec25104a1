// The serving tier (server/src/shard/serving_tier.h) through ShardState: a spilled serving copy
// is answered from the reader thread with an owner, read from NVMe once per version and then
// from the cache; replies that hold their staging buffers do not stall later fetches; a fetch
// queued before the initial values is answered at their publish; and a rollback fails the
// fetches that wait.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "shard_steps.h"
#include "zps/server/shard_state.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kChunk = 4096;
constexpr uint64_t kRecord = kChunk * 2;  // bf16

// 1 shard, 16 chunks of 4096 elements.
Layout SixteenChunks() {
  auto l = Layout::Build({{"a", {16 * kChunk}}}, {.chunk_elems = kChunk, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

using zps::testing::SpillDir;

// A few serving copies fit in RAM beside the staging buffers; the rest spill.
std::unique_ptr<ShardState> Make(const Layout& layout) {
  ChunkStoreOptions so;
  so.memory_budget = UINT64_MAX;
  so.serving_records = true;
  so.serving_memory_budget = (kServingStagingBuffers + 5 + 2) * kRecord;
  so.spill_dir = SpillDir();
  so.file_prefix = "serving-tier-test-" + std::to_string(::getpid());
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  auto s = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, so);
  EXPECT_THAT(s, IsOk()) << s.status().ToString();
  return std::move(*s);
}

void PushInit(ShardState& s, const Layout& layout) {
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    std::vector<float> v(kChunk, 1.0f + static_cast<float>(c));
    ASSERT_THAT(testing::Push(s, {kInitStep, c, 0, kChunk, 0, DType::kF32}, v.data()), IsOk());
  }
}

// The chunk whose serving copy spilled: the last ones (the first fit the budget).
constexpr uint32_t kSpilled = 15;

TEST(ServingTierTest, SpilledCopiesComeFromTheReaderThenTheCache) {
  const Layout layout = SixteenChunks();
  auto s = Make(layout);
  const ShardStorageStats st0 = s->storage_stats();
  ASSERT_TRUE(st0.serving_in_store);
  EXPECT_EQ(st0.serving_staging_bytes, kServingStagingBuffers * kRecord);
  EXPECT_LT(st0.store.serving_resident, st0.store.chunks);
  PushInit(*s, layout);
  testing::FetchResult first, second;
  s->Fetch({kSpilled, 10, 4, 0}, first.Callback(/*keep_owner=*/true));
  ASSERT_TRUE(first.Wait());
  ASSERT_THAT(first.status, IsOk());
  EXPECT_EQ(first.version, 0);
  EXPECT_NE(first.owner, nullptr);  // the range in a staging buffer, with its owner
  ASSERT_EQ(first.data.size(), 4u * 2);
  EXPECT_EQ(first.Word(0), 0x4180);  // bf16 16.0: chunk 15's initial value
  s->Fetch({kSpilled, 0, 8, 0}, second.Callback());
  ASSERT_TRUE(second.Wait());
  ASSERT_THAT(second.status, IsOk());
  const ShardStorageStats st = s->storage_stats();
  EXPECT_EQ(st.spilled_fetches, 2u);
  EXPECT_EQ(st.spilled_fetch_reads, 1u);  // the second from the cache
}

// Replies that hold their staging buffers (sends that never complete: a worker that vanished)
// do not stall later fetches of spilled copies: the reader takes new buffers, freed again once
// the replies let go.
TEST(ServingTierTest, RepliesHoldingTheirBuffersDoNotStallLaterFetches) {
  const Layout layout = SixteenChunks();
  auto s = Make(layout);
  constexpr uint32_t kHeld = kServingStagingBuffers + 2;
  const ShardStorageStats st0 = s->storage_stats();
  ASSERT_GE(st0.store.chunks - st0.store.serving_resident, kHeld);
  PushInit(*s, layout);
  std::vector<std::unique_ptr<testing::FetchResult>> replies;
  for (uint32_t i = 0; i < kHeld; ++i) {
    const uint32_t chunk = kSpilled - i;
    auto& r = replies.emplace_back(std::make_unique<testing::FetchResult>());
    s->Fetch({chunk, 0, kChunk, 0}, r->Callback(/*keep_owner=*/true));
    ASSERT_TRUE(r->Wait()) << "chunk " << chunk;
    ASSERT_THAT(r->status, IsOk());
    ASSERT_NE(r->owner, nullptr);
    // bf16 of the initial value 1 + chunk (exact)
    EXPECT_EQ(r->Word(0), std::bit_cast<uint32_t>(1.0f + static_cast<float>(chunk)) >> 16);
  }
  EXPECT_EQ(s->storage_stats().serving_staging_bytes, kHeld * kRecord);
  replies.clear();  // the sends are done: the buffers beyond the kept ones are freed
  EXPECT_EQ(s->storage_stats().serving_staging_bytes, kServingStagingBuffers * kRecord);
  testing::FetchResult after;
  s->Fetch({kSpilled, 0, kChunk, 0}, after.Callback());
  ASSERT_TRUE(after.Wait());
  EXPECT_THAT(after.status, IsOk());
}

// A reply for a quarter of a chunk or less holds a copy of its range, not a staging buffer.
TEST(ServingTierTest, SmallRangeRepliesHoldNoStagingBuffer) {
  const Layout layout = SixteenChunks();
  auto s = Make(layout);
  constexpr uint32_t kHeld = kServingStagingBuffers + 2;
  PushInit(*s, layout);
  std::vector<std::unique_ptr<testing::FetchResult>> replies;
  for (uint32_t i = 0; i < kHeld; ++i) {
    const uint32_t chunk = kSpilled - i;
    auto& r = replies.emplace_back(std::make_unique<testing::FetchResult>());
    s->Fetch({chunk, kChunk / 2, kChunk / 4, 0}, r->Callback(/*keep_owner=*/true));
    ASSERT_TRUE(r->Wait()) << "chunk " << chunk;
    ASSERT_THAT(r->status, IsOk());
    ASSERT_NE(r->owner, nullptr);
    ASSERT_EQ(r->data.size(), kChunk / 4 * 2);
    EXPECT_EQ(r->Word(0), std::bit_cast<uint32_t>(1.0f + static_cast<float>(chunk)) >> 16);
  }
  EXPECT_EQ(s->storage_stats().serving_staging_bytes, kServingStagingBuffers * kRecord);
}

TEST(ServingTierTest, AFetchWaitingForTheInitialValuesIsAnsweredAtTheirPublish) {
  const Layout layout = SixteenChunks();
  auto s = Make(layout);
  testing::FetchResult parked;
  s->Fetch({kSpilled, 0, 4, 0}, parked.Callback());
  PushInit(*s, layout);
  ASSERT_TRUE(parked.Wait());
  ASSERT_THAT(parked.status, IsOk());
  EXPECT_EQ(parked.Word(3), 0x4180);
}

TEST(ServingTierTest, ARollbackFailsWaitingFetches) {
  const Layout layout = SixteenChunks();
  auto s = Make(layout);
  PushInit(*s, layout);
  testing::FetchResult waiting;
  s->Fetch({kSpilled, 0, 4, 1}, waiting.Callback());  // version 1: not published yet
  ASSERT_THAT(s->ResetTo(-1, {}, Unavailable("rolled back")), IsOk());
  ASSERT_TRUE(waiting.Wait());
  EXPECT_THAT(waiting.status, StatusIs(Code::kUnavailable));
}

}  // namespace
}  // namespace zps::server
