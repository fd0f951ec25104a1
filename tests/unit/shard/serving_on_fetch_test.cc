// Serving copies made on fetch (ServingCopies::kOnFetch): a shard that keeps none answers every
// fetch with the bytes a shard that keeps them serves, at every version, for every serving dtype;
// its CRCs are the same; its state bytes count no serving copy; a chunk's copy is converted once
// per version and then taken from the cache; a restore's new masters are what later fetches
// get; all of it with the state in RAM and with masters spilled to NVMe (read back alone, not
// their moments), and with speculative updates, whose every outcome serves what sync updates of
// stored copies serve.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "shard_steps.h"
#include "zps/server/shard_server.h"
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

ShardJob Job(DType serving, UpdateMode update = UpdateMode::kSync) {
  ShardJob job;
  job.world_size = 1;
  job.serving_dtype = serving;
  job.update_mode = update;
  return job;
}

OptimizerConfig Adam(StateDType state) {
  OptimizerConfig o;
  o.state_dtype = state;
  return o;
}

// Where the state lives: RAM buffers, or a store whose budget holds the pipeline's 3 buffers
// (one chunk read ahead, one written behind) and 2 of the 6 chunks' int8 state records (16 KiB
// of master, 2 x 8 KiB of moments), so that 4 masters are read back from the spill file.
enum class Storage { kRam, kSpilled };
constexpr uint64_t kInt8Record = 16384 + 2 * 8192;

std::optional<ChunkStoreOptions> Spill(Storage storage) {
  if (storage == Storage::kRam) return std::nullopt;
  ChunkStoreOptions so;
  so.memory_budget = 5 * kInt8Record;
  so.read_ahead = 1;
  so.write_behind = 1;
  so.serving_records = true;  // asked for, and not made: there are no copies to keep
  so.spill_dir = zps::testing::SpillDir();
  so.file_prefix = "serving-on-fetch-test-" + std::to_string(::getpid());
  return so;
}

std::unique_ptr<ShardState> Make(const Layout& layout, DType serving, ServingCopies copies,
                                 Storage storage = Storage::kRam,
                                 StateDType state = StateDType::kInt8,
                                 UpdateMode update = UpdateMode::kSync) {
  auto s = ShardState::Create(layout, 0, Job(serving, update), Adam(state), nullptr, Spill(storage),
                              {}, copies);
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

class ServingOnFetchTest : public ::testing::TestWithParam<std::tuple<DType, Storage>> {};

// Stored copies with the state in RAM are the reference for a shard that makes them on fetch,
// from RAM or from a store.
TEST_P(ServingOnFetchTest, ServesTheBytesAStoredCopyHoldsAtEveryVersion) {
  const auto [serving, storage] = GetParam();
  const Layout layout = SixChunks();
  auto stored = Make(layout, serving, ServingCopies::kStored);
  auto made = Make(layout, serving, ServingCopies::kOnFetch, storage);
  ASSERT_TRUE(stored && made);
  const ShardStorageStats st = made->storage_stats();
  EXPECT_FALSE(st.serving_in_store);
  if (storage == Storage::kSpilled) {
    ASSERT_TRUE(st.spilled);
    EXPECT_EQ(st.store.state_resident, 2u);
    EXPECT_EQ(st.store.serving_file_bytes, 0u);
  }
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
      EXPECT_TRUE(owned);  // the range in a staging buffer, with its owner
    }
    EXPECT_EQ(made->StateCrc(), stored->StateCrc()) << "version " << step;
    for (uint32_t c = 0; c < kChunks; ++c) {
      EXPECT_EQ(*made->ChunkCrc(c), *stored->ChunkCrc(c)) << "chunk " << c;
      // Every chunk, resident or spilled, whole.
      const FetchRequest r{c, 0, kChunk, step};
      EXPECT_EQ(FetchBytes(*made, r), FetchBytes(*stored, r)) << "chunk " << c;
    }
    for (ShardState* s : {stored.get(), made.get()}) {
      PushAll(*s, step, static_cast<int>(step) + 1);
      testing::Commit(*s, {.step = step, .optimizer_step = step + 1}, std::nullopt);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ServingDTypes, ServingOnFetchTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16,
                                                              DType::kF32, DType::kI8Block),
                                            ::testing::Values(Storage::kRam, Storage::kSpilled)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, Storage>>& p) {
                           std::string name(DTypeName(std::get<0>(p.param)));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name +
                                  (std::get<1>(p.param) == Storage::kRam ? "_ram" : "_spilled");
                         });

class ServingOnFetchStorageTest : public ::testing::TestWithParam<Storage> {};

TEST_P(ServingOnFetchStorageTest, KeepsNoServingBytesAndConvertsAChunkOncePerVersion) {
  const Layout layout = SixChunks();
  auto stored = Make(layout, DType::kBF16, ServingCopies::kStored);
  auto made = Make(layout, DType::kBF16, ServingCopies::kOnFetch, GetParam());
  ASSERT_TRUE(stored && made);
  EXPECT_EQ(made->state_bytes().serving, 0u);
  EXPECT_EQ(stored->state_bytes().serving, kChunks * kChunk * 2);
  EXPECT_EQ(made->state_bytes().master, stored->state_bytes().master);
  const ShardStorageStats st0 = made->storage_stats();
  EXPECT_TRUE(st0.serving_on_fetch);
  EXPECT_EQ(st0.spilled, GetParam() == Storage::kSpilled);
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
  if (GetParam() == Storage::kRam) return;
  // A conversion of a spilled chunk reads its master (16 KiB), not its moments.
  const uint64_t read = st.store.bytes_read;
  for (uint32_t c = 0; c < kChunks; ++c) FetchBytes(*made, {c, 0, 8, 1});
  st = made->storage_stats();
  EXPECT_EQ(st.store.bytes_read - read, (kChunks - st.store.state_resident) * kChunk * 4);
  EXPECT_EQ(st.store.serving_bytes_read, 0u);
}

// Fetches racing the update passes: every answer is one whole version, the bytes a stored copy
// held at the version it names (a pass waits for a conversion in progress, and a conversion for
// the pass).
TEST_P(ServingOnFetchStorageTest, FetchesDuringUpdatesGetWholeVersions) {
  constexpr int64_t kSteps = 12;
  const Layout layout = SixChunks();
  auto stored = Make(layout, DType::kBF16, ServingCopies::kStored);
  auto made = Make(layout, DType::kBF16, ServingCopies::kOnFetch, GetParam());
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

TEST_P(ServingOnFetchStorageTest, AFetchAfterARestoreGetsTheRestoredMasters) {
  const Layout layout = SixChunks();
  auto made = Make(layout, DType::kF32, ServingCopies::kOnFetch, GetParam());
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

// Speculative updates: every outcome of a speculated chunk (published as assumed, redone after a
// clip, dropped by a skip) leaves a shard that makes its copies on fetch serving, chunk by chunk
// and version by version, what a sync shard's stored copies hold, with the same CRCs; while a
// fetcher converts the live masters beside the speculation and the commits. Spilled, the spares
// are set aside from the budget (one chunk speculated per step here) and hold no serving copy.
TEST_P(ServingOnFetchStorageTest, SpeculativeUpdatesServeWhatSyncStoredCopiesHold) {
  constexpr int64_t kSteps = 6;
  const Layout layout = SixChunks();
  auto stored = Make(layout, DType::kBF16, ServingCopies::kStored);
  auto made = Make(layout, DType::kBF16, ServingCopies::kOnFetch, GetParam(), StateDType::kInt8,
                   UpdateMode::kSpeculative);
  ASSERT_TRUE(stored && made);
  // A spare set is a master and two moments: no serving copy, and no second serving bank.
  const uint64_t set_bytes = kChunk * 4 + 2 * MomentBytes(StateDType::kInt8, kChunk);
  const SpeculationStats spares = made->speculation_stats();
  EXPECT_EQ(spares.spares, GetParam() == Storage::kRam ? kChunks : 1u);
  EXPECT_EQ(spares.spare_bytes, spares.spares * set_bytes);
  // The decided order of each step: step 1 clips (another scale than the assumed one), step 3
  // is skipped (the optimizer step stays), the others are as assumed.
  const auto assumed = [](int64_t step, int64_t applied) {
    return CommitOrder{.step = step, .optimizer_step = applied + 1};
  };
  std::vector<CommitOrder> orders;
  for (int64_t step = 0, applied = 0; step < kSteps; ++step) {
    CommitOrder o = assumed(step, applied);
    if (step == 1) o.grad_scale = 0.37f;
    if (step == 3) o.skip = true;
    if (!o.skip) ++applied;
    orders.push_back(o);
  }
  // The sync shard's copies and CRCs at every version.
  std::vector<std::vector<std::vector<std::byte>>> want(kSteps + 1);
  std::vector<std::vector<uint32_t>> want_crc(kSteps + 1);
  PushAll(*stored, kInitStep, 0);
  for (int64_t v = 0; v <= kSteps; ++v) {
    for (uint32_t c = 0; c < kChunks; ++c) {
      want[v].push_back(FetchBytes(*stored, {c, 0, kChunk, v}));
      want_crc[v].push_back(*stored->ChunkCrc(c));
    }
    if (v == kSteps) break;
    PushAll(*stored, v, static_cast<int>(v) + 1);
    testing::Commit(*stored, orders[v], std::nullopt);
  }
  PushAll(*made, kInitStep, 0);
  made->ArmSpeculation(assumed(0, 0));
  constexpr uint32_t kRaced = 3;
  std::vector<std::pair<int64_t, std::vector<std::byte>>> got;
  std::thread fetcher([&] {
    for (;;) {
      testing::FetchResult a;
      made->Fetch({kRaced, 0, kChunk, 0}, a.Callback());
      if (!a.Wait() || !a.status.ok()) break;
      got.emplace_back(a.version, std::move(a.data));
      if (got.back().first == kSteps) break;
    }
  });
  for (int64_t step = 0; step < kSteps; ++step) {
    PushAll(*made, step, static_cast<int>(step) + 1);
    testing::WaitSpeculated(*made, spares.spares);
    const int64_t applied = orders[step].optimizer_step - (orders[step].skip ? 1 : 0);
    testing::Commit(*made, orders[step], assumed(step + 1, applied));
    for (uint32_t c = 0; c < kChunks; ++c) {
      EXPECT_EQ(FetchBytes(*made, {c, 0, kChunk, step + 1}), want[step + 1][c])
          << "chunk " << c << ", version " << step + 1;
      EXPECT_EQ(*made->ChunkCrc(c), want_crc[step + 1][c]) << "chunk " << c;
    }
  }
  fetcher.join();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().first, kSteps);
  for (const auto& [version, bytes] : got) {
    ASSERT_TRUE(version >= 0 && version <= kSteps) << version;
    EXPECT_EQ(bytes, want[static_cast<size_t>(version)][kRaced]) << "version " << version;
  }
  const SpeculationStats st = made->speculation_stats();
  EXPECT_GT(st.published, 0u);
  EXPECT_GT(st.redone, 0u);
  EXPECT_GT(st.dropped, 0u);
  EXPECT_EQ(made->state_bytes().serving, 0u);
}

INSTANTIATE_TEST_SUITE_P(Storage, ServingOnFetchStorageTest,
                         ::testing::Values(Storage::kRam, Storage::kSpilled),
                         [](const ::testing::TestParamInfo<Storage>& p) {
                           return std::string(p.param == Storage::kRam ? "Ram" : "Spilled");
                         });

// zps-server's options: on-fetch takes a memory budget, and refuses a serving budget (nothing to
// hold) with an error that names both flags.
TEST(ServingOnFetchRefusalTest, ServerOptionsTakeAMemoryBudgetAndRefuseAServingBudget) {
  auto options = [](uint64_t memory_budget, uint64_t serving_budget) {
    ShardServerOptions o;
    o.token = "t";
    o.data_dir = "/nonexistent";  // Finalize checks the flags only
    o.serving_copies = "on-fetch";
    o.memory_budget = memory_budget;
    o.serving_budget = serving_budget;
    return o;
  };
  EXPECT_THAT(options(0, 0).Finalize(), IsOk());
  EXPECT_THAT(options(1 << 30, 0).Finalize(), IsOk());
  const Status refused = options(1 << 30, 1 << 20).Finalize();
  EXPECT_THAT(refused, StatusIs(Code::kInvalidArgument));
  EXPECT_NE(refused.message().find("--serving-copies on-fetch"), std::string::npos);
  EXPECT_NE(refused.message().find("--serving-budget"), std::string::npos);
  ShardServerOptions bad = options(0, 0);
  bad.serving_copies = "never";
  EXPECT_THAT(bad.Finalize(), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::server
