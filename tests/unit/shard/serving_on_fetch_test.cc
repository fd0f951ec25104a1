// Serving copies made on fetch (ServingCopies::kOnFetch): a shard that keeps none answers every
// fetch with the bytes a shard that keeps them serves, at every version, for every serving dtype;
// its CRCs are the same; its state bytes count no serving copy; a chunk's copy is converted once
// per version and then taken from the cache; a restore's new masters are what later fetches
// get; and the configurations it cannot serve are refused at Create.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "shard_steps.h"
#include "zps/server/shard_state.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kChunk = 4096;
constexpr uint32_t kChunks = 6;

// 1 shard, 6 chunks of 4096 elements.
Layout SixChunks() {
  auto l = Layout::Build({{"a", {kChunks * kChunk}}}, {.chunk_elems = kChunk, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

ShardJob Job(DType serving) {
  ShardJob job;
  job.world_size = 1;
  job.serving_dtype = serving;
  return job;
}

OptimizerConfig Adam(StateDType state) {
  OptimizerConfig o;
  o.state_dtype = state;
  return o;
}

std::unique_ptr<ShardState> Make(const Layout& layout, DType serving, ServingCopies copies,
                                 StateDType state = StateDType::kInt8) {
  auto s =
      ShardState::Create(layout, 0, Job(serving), Adam(state), nullptr, std::nullopt, {}, copies);
  EXPECT_THAT(s, IsOk()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Deterministic values of chunk c at `seed`: initial values or gradients.
std::vector<float> Values(uint32_t c, int seed) {
  std::vector<float> v(kChunk);
  for (uint64_t i = 0; i < kChunk; ++i) {
    v[i] = 0.01f * static_cast<float>(
                       static_cast<int64_t>((i * 7919 + c * 104729 + seed * 31) % 2001) - 1000);
  }
  return v;
}

void PushAll(ShardState& s, int64_t step, int seed) {
  for (uint32_t c = 0; c < kChunks; ++c) {
    const std::vector<float> v = Values(c, seed);
    ASSERT_THAT(testing::Push(s, {step, c, 0, kChunk, 0, DType::kF32}, v.data()), IsOk());
  }
}

// The bytes a fetch of `req` gets (and whether they came with an owner).
std::vector<std::byte> FetchBytes(ShardState& s, const FetchRequest& req, bool* owned = nullptr) {
  testing::FetchResult a;
  s.Fetch(req, a.Callback(/*keep_owner=*/true));
  EXPECT_TRUE(a.Wait());
  EXPECT_THAT(a.status, IsOk());
  EXPECT_EQ(a.version, req.min_version);
  if (owned != nullptr) *owned = a.owner != nullptr;
  return a.data;
}

class ServingOnFetchTest : public ::testing::TestWithParam<DType> {};

TEST_P(ServingOnFetchTest, ServesTheBytesAStoredCopyHoldsAtEveryVersion) {
  const Layout layout = SixChunks();
  auto stored = Make(layout, GetParam(), ServingCopies::kStored);
  auto made = Make(layout, GetParam(), ServingCopies::kOnFetch);
  ASSERT_TRUE(stored && made);
  PushAll(*stored, kInitStep, 0);
  PushAll(*made, kInitStep, 0);
  // Whole chunks, and a range inside one (a quantized copy serves its covering blocks).
  const FetchRequest whole{2, 0, kChunk, 0}, part{4, 100, 1000, 0};
  for (int64_t step = 0; step < 3; ++step) {
    for (FetchRequest r : {whole, part}) {
      r.min_version = step;
      bool owned = false;
      const std::vector<std::byte> want = FetchBytes(*stored, r);
      EXPECT_EQ(FetchBytes(*made, r, &owned), want) << "version " << step;
      EXPECT_TRUE(owned);  // a copy of the range from a staging buffer, with its owner
    }
    EXPECT_EQ(made->StateCrc(), stored->StateCrc()) << "version " << step;
    for (uint32_t c = 0; c < kChunks; ++c) {
      EXPECT_EQ(*made->ChunkCrc(c), *stored->ChunkCrc(c)) << "chunk " << c;
    }
    for (ShardState* s : {stored.get(), made.get()}) {
      PushAll(*s, step, static_cast<int>(step) + 1);
      testing::Commit(*s, {.step = step, .optimizer_step = step + 1}, std::nullopt);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ServingDTypes, ServingOnFetchTest,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32, DType::kI8Block),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           std::string name(DTypeName(p.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(ServingOnFetchStatsTest, KeepsNoServingBytesAndConvertsAChunkOncePerVersion) {
  const Layout layout = SixChunks();
  auto stored = Make(layout, DType::kBF16, ServingCopies::kStored);
  auto made = Make(layout, DType::kBF16, ServingCopies::kOnFetch);
  ASSERT_TRUE(stored && made);
  EXPECT_EQ(made->state_bytes().serving, 0u);
  EXPECT_EQ(stored->state_bytes().serving, kChunks * kChunk * 2);
  EXPECT_EQ(made->state_bytes().master, stored->state_bytes().master);
  const ShardStorageStats st0 = made->storage_stats();
  EXPECT_TRUE(st0.serving_on_fetch);
  EXPECT_FALSE(st0.spilled);
  EXPECT_EQ(st0.serving_staging_bytes, kServingStagingBuffers * kChunk * 2);
  EXPECT_FALSE(stored->storage_stats().serving_on_fetch);

  PushAll(*made, kInitStep, 0);
  FetchBytes(*made, {1, 0, 8, 0});
  FetchBytes(*made, {1, 8, 8, 0});  // the same chunk and version: the cache
  FetchBytes(*made, {3, 0, 8, 0});
  ShardStorageStats st = made->storage_stats();
  EXPECT_EQ(st.made_fetches, 3u);
  EXPECT_EQ(st.made_fetch_conversions, 2u);
  EXPECT_EQ(st.spilled_fetches, 0u);
  PushAll(*made, 0, 1);
  testing::Commit(*made, {.step = 0, .optimizer_step = 1}, std::nullopt);
  FetchBytes(*made, {1, 0, 8, 1});  // a new version: converted again
  st = made->storage_stats();
  EXPECT_EQ(st.made_fetches, 4u);
  EXPECT_EQ(st.made_fetch_conversions, 3u);
}

// Fetches racing the update passes: every answer is one whole version, the bytes a stored copy
// held at the version it names (a pass waits for a conversion in progress, and a conversion for
// the pass).
TEST(ServingOnFetchStatsTest, FetchesDuringUpdatesGetWholeVersions) {
  constexpr int64_t kSteps = 12;
  const Layout layout = SixChunks();
  auto stored = Make(layout, DType::kBF16, ServingCopies::kStored);
  auto made = Make(layout, DType::kBF16, ServingCopies::kOnFetch);
  ASSERT_TRUE(stored && made);
  std::vector<std::vector<std::byte>> want;  // chunk 3's copy at each version
  const FetchRequest whole{3, 0, kChunk, 0};
  PushAll(*stored, kInitStep, 0);
  for (int64_t step = 0; step <= kSteps; ++step) {
    want.push_back(FetchBytes(*stored, {whole.chunk, 0, kChunk, step}));
    if (step == kSteps) break;
    PushAll(*stored, step, static_cast<int>(step) + 1);
    testing::Commit(*stored, {.step = step, .optimizer_step = step + 1}, std::nullopt);
  }
  PushAll(*made, kInitStep, 0);
  // The fetcher asks for whatever version is published until it gets the last one, so it fetches
  // at least once whatever the threads' timing.
  std::vector<std::pair<int64_t, std::vector<std::byte>>> got;
  std::thread fetcher([&] {
    for (;;) {
      testing::FetchResult a;
      made->Fetch(whole, a.Callback());
      if (!a.Wait() || !a.status.ok()) break;
      got.emplace_back(a.version, std::move(a.data));
      if (got.back().first == kSteps) break;
    }
  });
  for (int64_t step = 0; step < kSteps; ++step) {
    PushAll(*made, step, static_cast<int>(step) + 1);
    testing::Commit(*made, {.step = step, .optimizer_step = step + 1}, std::nullopt);
  }
  fetcher.join();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().first, kSteps);
  for (const auto& [version, bytes] : got) {
    ASSERT_TRUE(version >= 0 && version <= kSteps) << version;
    EXPECT_EQ(bytes, want[static_cast<size_t>(version)]) << "version " << version;
  }
  EXPECT_EQ(FetchBytes(*made, {whole.chunk, 0, kChunk, kSteps}), want.back());
}

TEST(ServingOnFetchStatsTest, AFetchAfterARestoreGetsTheRestoredMasters) {
  const Layout layout = SixChunks();
  auto made = Make(layout, DType::kF32, ServingCopies::kOnFetch);
  ASSERT_TRUE(made);
  PushAll(*made, kInitStep, 0);
  PushAll(*made, 0, 1);
  testing::Commit(*made, {.step = 0, .optimizer_step = 1}, std::nullopt);
  FetchBytes(*made, {0, 0, kChunk, 1});  // version 1, converted and cached
  // Restore version 1 with other masters: what a fetch of version 1 gets changes with them.
  const auto load = [](uint32_t chunk, std::span<float> master, std::span<std::byte> m,
                       std::span<std::byte> v) {
    for (size_t i = 0; i < master.size(); ++i) master[i] = 3.0f + static_cast<float>(chunk);
    std::fill(m.begin(), m.end(), std::byte{0});
    std::fill(v.begin(), v.end(), std::byte{0});
    return Status::Ok();
  };
  ASSERT_THAT(made->ResetTo(1, load, Unavailable("rolled back")), IsOk());
  const std::vector<std::byte> got = FetchBytes(*made, {0, 0, 4, 1});
  std::vector<float> want(4, 3.0f);
  ASSERT_EQ(got.size(), want.size() * sizeof(float));  // fp32 copies: the masters' bits
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
}

TEST(ServingOnFetchStatsTest, RefusesSpilledStateAndSpeculation) {
  const Layout layout = SixChunks();
  ChunkStoreOptions so;
  so.memory_budget = UINT64_MAX;
  so.spill_dir = zps::testing::SpillDir();
  so.file_prefix = "serving-on-fetch-test-" + std::to_string(::getpid());
  auto spilled = ShardState::Create(layout, 0, Job(DType::kBF16), Adam(StateDType::kF32), nullptr,
                                    so, {}, ServingCopies::kOnFetch);
  EXPECT_THAT(spilled, StatusIs(Code::kFailedPrecondition));
  ShardJob spec = Job(DType::kBF16);
  spec.update_mode = UpdateMode::kSpeculative;
  auto speculative = ShardState::Create(layout, 0, spec, Adam(StateDType::kF32), nullptr,
                                        std::nullopt, {}, ServingCopies::kOnFetch);
  EXPECT_THAT(speculative, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(ShardState::Create(layout, 0, spec, Adam(StateDType::kF32), nullptr),
              IsOk());  // stored copies serve it
}

}  // namespace
}  // namespace zps::server
