// ShardState with a memory budget (master, m, v in a ChunkStore, mostly spilled) must end every
// step with exactly the state of the RAM-only ShardState, and checkpoint visits / restores must
// go through the store. With a serving budget too (ShardStateServingSpill), the 16-bit serving
// copies spill as well and fetches of them are read back from NVMe: still bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include "shard_steps.h"
#include "state_crcs.h"
#include "zps/server/nvme.h"
#include "zps/server/shard_state.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using zps::testing::SpillDir;

// 1 shard, 14 chunks of 4096 elements; parameters of odd sizes so chunks have padding.
Layout BigLayout() {
  auto l =
      Layout::Build({{"a", {5000}}, {"b", {3, 1000}}, {"c", {7777}}, {"d", {10}}, {"e", {40000}}},
                    {.chunk_elems = 4096, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

struct Pair {
  std::unique_ptr<ShardState> ram, spill;
};

// The budget holds the pipeline's 5 buffers of one 48 KiB record plus one resident chunk.
constexpr uint64_t kBudget = 6 * 3 * 16384;

Pair MakePair(const Layout& layout, const OptimizerConfig& opt) {
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  Pair p;
  auto r = ShardState::Create(layout, 0, job, opt, nullptr);
  EXPECT_THAT(r, IsOk());
  ChunkStoreOptions so;
  so.memory_budget = kBudget;
  so.spill_dir = SpillDir();
  so.file_prefix = "shard-spill-test-" + std::to_string(::getpid());
  so.serving_records = false;  // serving copies in the shard's RAM block (no --serving-budget)
  auto s = ShardState::Create(layout, 0, job, opt, nullptr, so);
  EXPECT_THAT(s, IsOk());
  p.ram = std::move(*r);
  p.spill = std::move(*s);
  return p;
}

// Pushes the same values (initial when step == kInitStep, else gradients of both ranks) to both.
void PushAll(const Layout& layout, ShardState& a, ShardState& b, int64_t step, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, step == kInitStep ? 0.5f : 1e-2f);
  const uint32_t ranks = step == kInitStep ? 1 : 2;
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      for (uint32_t r = 0; r < ranks; ++r) {
        std::vector<float> v(piece.length);
        for (auto& x : v) x = dist(rng);
        for (ShardState* s : {&a, &b}) {
          ASSERT_THAT(testing::Push(
                          *s, {step, piece.chunk, piece.chunk_offset, piece.length, r, DType::kF32},
                          v.data()),
                      IsOk());
        }
      }
    }
  }
}

void Step(ShardState& s, int64_t step, bool skip) {
  ASSERT_THAT(s.WaitForGradients(step, std::chrono::milliseconds(1000)), IsOk());
  auto rep = s.ReduceStep(step);
  ASSERT_THAT(rep, IsOk());
  ASSERT_THAT(s.ApplyCommit({step, skip, 0.5f, step + 1}), IsOk());
}

void ExpectSame(const ShardState& a, const ShardState& b) {
  testing::ExpectSameState(a, b, "");
  for (uint32_t c : a.chunk_ids()) {
    auto ma = a.MasterOf(c);
    auto mb = b.MasterOf(c);
    ASSERT_THAT(ma, IsOk());
    ASSERT_THAT(mb, IsOk());
    EXPECT_EQ(*ma, *mb) << "chunk " << c;
  }
}

// In each state dtype (the moments packed as fp32, bf16 or int8).
class ShardStateSpillDType : public ::testing::TestWithParam<StateDType> {};

TEST_P(ShardStateSpillDType, StepsMatchRamBitForBit) {
  const Layout layout = BigLayout();
  const bool fp32 = GetParam() == StateDType::kF32;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    OptimizerConfig opt;
    opt.kind = kind;
    opt.state_dtype = GetParam();
    opt.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
    Pair p = MakePair(layout, opt);
    ASSERT_TRUE(p.ram && p.spill);
    const ShardStorageStats st0 = p.spill->storage_stats();
    ASSERT_TRUE(st0.spilled);
    EXPECT_EQ(st0.store.chunks, 14u);
    // fp32 Adam: one 48 KiB record resident; SGD with momentum: 32 KiB records, four resident.
    if (fp32) {
      EXPECT_EQ(st0.store.state_resident, kind == OptimizerKind::kSgd ? 4u : 1u);
    }
    EXPECT_LT(st0.store.state_resident, 14u);
    EXPECT_FALSE(p.ram->storage_stats().spilled);

    PushAll(layout, *p.ram, *p.spill, kInitStep, 1);
    ASSERT_EQ(p.spill->version(), 0);
    ExpectSame(*p.ram, *p.spill);
    for (int64_t step = 0; step < 4; ++step) {
      PushAll(layout, *p.ram, *p.spill, step, 100 + static_cast<uint32_t>(step));
      Step(*p.ram, step, step == 2);
      Step(*p.spill, step, step == 2);
      ASSERT_EQ(p.spill->version(), step + 1);
      ExpectSame(*p.ram, *p.spill);
    }
    // The serving copies fetched are the same too.
    for (uint32_t c : p.ram->chunk_ids()) {
      std::vector<std::byte> a, b;
      auto grab = [](std::vector<std::byte>& out) {
        return [&out](const Status& s, int64_t, std::span<const std::byte> d,
                      std::shared_ptr<const void>) {
          ASSERT_THAT(s, IsOk());
          out.assign(d.begin(), d.end());
        };
      };
      p.ram->Fetch({c, 0, 10, 4}, grab(a));
      p.spill->Fetch({c, 0, 10, 4}, grab(b));
      EXPECT_EQ(a, b);
    }
    const ShardStorageStats st = p.spill->storage_stats();
    EXPECT_GT(st.store.bytes_read, 0u);
    EXPECT_GT(st.store.bytes_written, 0u);
    EXPECT_EQ(st.io_errors, 0u);
  }
}

TEST_P(ShardStateSpillDType, CheckpointVisitAndRestoreGoThroughTheStore) {
  const Layout layout = BigLayout();
  OptimizerConfig opt;
  opt.state_dtype = GetParam();
  Pair p = MakePair(layout, opt);
  ASSERT_TRUE(p.ram && p.spill);
  PushAll(layout, *p.ram, *p.spill, kInitStep, 7);
  for (int64_t step = 0; step < 2; ++step) {
    PushAll(layout, *p.ram, *p.spill, step, 200 + static_cast<uint32_t>(step));
    Step(*p.ram, step, false);
    Step(*p.spill, step, false);
  }
  // "Checkpoint" both: the visits must see the same tensors.
  struct Saved {
    std::vector<float> master;
    std::vector<std::byte> m, v;
  };
  std::map<uint32_t, Saved> from_ram, from_spill;
  auto saver = [](std::map<uint32_t, Saved>& out) {
    return [&out](uint32_t c, int64_t version, std::span<const float> master,
                  std::span<const std::byte> m, std::span<const std::byte> v) -> Status {
      EXPECT_EQ(version, 2);
      out[c] = {{master.begin(), master.end()}, {m.begin(), m.end()}, {v.begin(), v.end()}};
      return Status::Ok();
    };
  };
  ASSERT_THAT(p.ram->VisitChunkState(saver(from_ram)), IsOk());
  ASSERT_THAT(p.spill->VisitChunkState(saver(from_spill)), IsOk());
  ASSERT_EQ(from_ram.size(), from_spill.size());
  for (const auto& [c, s] : from_ram) {
    EXPECT_EQ(s.master, from_spill[c].master) << c;
    EXPECT_EQ(s.m, from_spill[c].m) << c;
    EXPECT_EQ(s.v, from_spill[c].v) << c;
  }
  const uint32_t crc = p.ram->StateCrc();
  // Roll the spilled shard back to "nothing", then restore the saved state into it.
  ASSERT_THAT(p.spill->ResetTo(-1, {}, Unavailable("test")), IsOk());
  EXPECT_EQ(p.spill->version(), -1);
  EXPECT_NE(p.spill->StateCrc(), crc);
  auto load = [&](uint32_t c, std::span<float> master, std::span<std::byte> m,
                  std::span<std::byte> v) -> Status {
    const Saved& s = from_spill.at(c);
    std::memcpy(master.data(), s.master.data(), master.size_bytes());
    std::memcpy(m.data(), s.m.data(), m.size_bytes());
    std::memcpy(v.data(), s.v.data(), v.size_bytes());
    return Status::Ok();
  };
  ASSERT_THAT(p.spill->ResetTo(2, load, Unavailable("test")), IsOk());
  EXPECT_EQ(p.spill->version(), 2);
  ExpectSame(*p.ram, *p.spill);
  // And training continues identically.
  PushAll(layout, *p.ram, *p.spill, 2, 300);
  Step(*p.ram, 2, false);
  Step(*p.spill, 2, false);
  ExpectSame(*p.ram, *p.spill);
}

// ---- serving copies spilled too (--serving-budget) ---------------------------------------------

// Compact moments shrink the state records, so the same budget keeps more chunks in RAM and the
// spill file holds fewer bytes (each moment starts at a 4 KiB boundary of its record).
TEST(ShardStateSpill, CompactStateShrinksTheSpilledBytes) {
  const Layout layout = BigLayout();
  uint64_t fp32_bytes = 0;
  for (StateDType d : {StateDType::kF32, StateDType::kBF16, StateDType::kInt8}) {
    OptimizerConfig opt;
    opt.state_dtype = d;
    Pair p = MakePair(layout, opt);
    ASSERT_TRUE(p.spill);
    const ChunkStoreStats st = p.spill->storage_stats().store;
    uint64_t records = 0, elems = 0, moments = 0;
    for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
      const uint64_t n = layout.chunk_size(c);
      records += AlignUp(n * 4) + 2 * AlignUp(MomentBytes(d, n));
      moments += 2 * MomentBytes(d, n);
      elems += n;
    }
    EXPECT_EQ(st.state_ram_bytes + st.state_file_bytes, records) << StateDTypeName(d);
    if (d == StateDType::kF32) {
      fp32_bytes = records;
    } else {
      EXPECT_LT(records, fp32_bytes) << StateDTypeName(d);
    }
    const ShardStateBytes b = p.spill->state_bytes();
    EXPECT_EQ(b.master, elems * 4);
    EXPECT_EQ(b.m + b.v + b.scales, moments);
    EXPECT_EQ(b.m, elems * (d == StateDType::kF32 ? 4 : (d == StateDType::kBF16 ? 2 : 1)));
    EXPECT_EQ(b.serving, elems * 2);
  }
}

INSTANTIATE_TEST_SUITE_P(StateDType, ShardStateSpillDType,
                         ::testing::Values(StateDType::kF32, StateDType::kBF16, StateDType::kInt8),
                         [](const auto& p) { return std::string(StateDTypeName(p.param)); });

// 14 serving records of 8 KiB: the serving budget holds the 4 fetch staging buffers, the spill
// pipeline's 5 buffers and 2 resident copies; the other 12 live in the serving spill file.
constexpr uint64_t kServingRecord = 4096 * 2;
constexpr uint64_t kServingBudget = (kServingStagingBuffers + 5 + 2) * kServingRecord;

std::unique_ptr<ShardState> MakeServingSpilled(const Layout& layout, const OptimizerConfig& opt,
                                               uint64_t state_budget,
                                               const ServingAllocator& alloc = {},
                                               DType serving = DType::kBF16) {
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, serving};
  ChunkStoreOptions so;
  so.memory_budget = state_budget;
  so.serving_records = true;
  so.serving_memory_budget = kServingBudget * (DTypeSize(serving) / 2);
  so.spill_dir = SpillDir();
  so.file_prefix = "shard-serving-test-" + std::to_string(::getpid());
  auto s = ShardState::Create(layout, 0, job, opt, nullptr, so, alloc);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? std::move(*s) : nullptr;
}

// Fetches [offset, offset + length) of every chunk from both at min_version and compares.
void ExpectSameFetches(ShardState& ram, ShardState& spill, int64_t min_version, uint64_t offset,
                       uint64_t length) {
  for (uint32_t c : ram.chunk_ids()) {
    const uint64_t size = ram.layout().chunk_size(c);
    ASSERT_LT(offset, size);
    const uint64_t n = std::min(length, size - offset);
    testing::FetchResult a, b;
    ram.Fetch({c, offset, n, min_version}, a.Callback());
    spill.Fetch({c, offset, n, min_version}, b.Callback());
    ASSERT_TRUE(a.Wait() && b.Wait()) << "chunk " << c;
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << b.status.ToString();
    EXPECT_EQ(a.version, b.version) << "chunk " << c;
    EXPECT_EQ(a.data, b.data) << "chunk " << c;
  }
}

TEST(ShardStateServingSpill, StateAndServingSpilledMatchRamBitForBit) {
  const Layout layout = BigLayout();
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    OptimizerConfig opt;
    opt.kind = kind;
    opt.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
    ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
    auto ram = ShardState::Create(layout, 0, job, opt, nullptr);
    ASSERT_THAT(ram, IsOk());
    auto spill = MakeServingSpilled(layout, opt, kBudget);
    ASSERT_TRUE(spill);
    const ShardStorageStats st0 = spill->storage_stats();
    ASSERT_TRUE(st0.spilled && st0.serving_in_store);
    EXPECT_EQ(st0.store.serving_resident, 2u);
    EXPECT_EQ(st0.serving_staging_bytes, kServingStagingBuffers * kServingRecord);
    EXPECT_GT(st0.store.serving_file_bytes, 0u);

    // Fetches parked before the initial values (answered at the publish, from the reader).
    testing::FetchResult parked;
    const uint32_t last = layout.num_chunks() - 1;  // spilled
    spill->Fetch({last, 0, 16, 0}, parked.Callback());
    PushAll(layout, **ram, *spill, kInitStep, 1);
    ASSERT_TRUE(parked.Wait());
    EXPECT_THAT(parked.status, IsOk());
    EXPECT_EQ(parked.version, 0);
    ExpectSame(**ram, *spill);
    ExpectSameFetches(**ram, *spill, 0, 0, 4096);
    for (int64_t step = 0; step < 4; ++step) {
      // One waiting fetch per chunk for the version this step publishes.
      std::vector<std::unique_ptr<testing::FetchResult>> waiting;
      for (uint32_t c : spill->chunk_ids()) {
        waiting.push_back(std::make_unique<testing::FetchResult>());
        spill->Fetch({c, 100, 200, step + 1}, waiting.back()->Callback());
      }
      PushAll(layout, **ram, *spill, step, 100 + static_cast<uint32_t>(step));
      Step(**ram, step, step == 2);
      Step(*spill, step, step == 2);
      for (auto& w : waiting) {
        ASSERT_TRUE(w->Wait());
        ASSERT_THAT(w->status, IsOk());
        EXPECT_EQ(w->version, step + 1);
      }
      ExpectSame(**ram, *spill);
      ExpectSameFetches(**ram, *spill, step + 1, 0, 4096);
      ExpectSameFetches(**ram, *spill, step + 1, 2000, 96);
    }
    const ShardStorageStats st = spill->storage_stats();
    EXPECT_GT(st.store.serving_bytes_read, 0u);
    EXPECT_GT(st.store.serving_bytes_written, 0u);
    EXPECT_GT(st.spilled_fetches, 0u);
    EXPECT_GT(st.spilled_fetch_reads, 0u);
    EXPECT_LE(st.spilled_fetch_reads, st.spilled_fetches);
    EXPECT_EQ(st.io_errors, 0u);
  }
}

// fp32 serving copies (two words an element) spill and are read back like 16-bit ones.
TEST(ShardStateServingSpill, Fp32ServingCopiesSpillAndMatchRamBitForBit) {
  const Layout layout = BigLayout();
  OptimizerConfig opt;
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kF32};
  auto ram = ShardState::Create(layout, 0, job, opt, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto spill = MakeServingSpilled(layout, opt, kBudget, {}, DType::kF32);
  ASSERT_TRUE(spill);
  const ShardStorageStats st0 = spill->storage_stats();
  ASSERT_TRUE(st0.serving_in_store);
  EXPECT_EQ(st0.store.serving_resident, 2u);
  EXPECT_EQ(st0.serving_staging_bytes, kServingStagingBuffers * kServingRecord * 2);
  PushAll(layout, **ram, *spill, kInitStep, 1);
  ExpectSame(**ram, *spill);
  ExpectSameFetches(**ram, *spill, 0, 0, 4096);
  for (int64_t step = 0; step < 3; ++step) {
    PushAll(layout, **ram, *spill, step, 200 + static_cast<uint32_t>(step));
    Step(**ram, step, false);
    Step(*spill, step, false);
    ExpectSame(**ram, *spill);
    ExpectSameFetches(**ram, *spill, step + 1, 0, 4096);
    ExpectSameFetches(**ram, *spill, step + 1, 2000, 96);
  }
  // The fetched copy of a spilled chunk is the master's bits.
  const uint32_t last = layout.num_chunks() - 1;
  testing::FetchResult f;
  spill->Fetch({last, 0, layout.chunk_size(last), 3}, f.Callback());
  ASSERT_TRUE(f.Wait() && f.status.ok()) << f.status.ToString();
  auto master = spill->MasterOf(last);
  ASSERT_THAT(master, IsOk());
  ASSERT_EQ(f.data.size(), master->size() * 4);
  EXPECT_EQ(0, std::memcmp(f.data.data(), master->data(), f.data.size()));
  EXPECT_GT(spill->storage_stats().spilled_fetches, 0u);
}

TEST(ShardStateServingSpill, ServingAloneSpillsWithTheStateInRam) {
  const Layout layout = BigLayout();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto spill = MakeServingSpilled(layout, OptimizerConfig{}, UINT64_MAX);  // no --memory-budget
  ASSERT_TRUE(spill);
  const ShardStorageStats st0 = spill->storage_stats();
  EXPECT_EQ(st0.store.state_resident, 14u);
  EXPECT_EQ(st0.store.state_file_bytes, 0u);
  EXPECT_EQ(st0.store.serving_resident, 2u);
  // Only the serving tier spills, so only its pipeline buffers exist.
  EXPECT_EQ(st0.store.buffer_bytes, st0.store.serving_buffer_bytes);
  PushAll(layout, **ram, *spill, kInitStep, 3);
  for (int64_t step = 0; step < 3; ++step) {
    PushAll(layout, **ram, *spill, step, 400 + static_cast<uint32_t>(step));
    Step(**ram, step, false);
    Step(*spill, step, false);
    ExpectSame(**ram, *spill);
    ExpectSameFetches(**ram, *spill, step + 1, 0, 4096);
  }
}

TEST(ShardStateServingSpill, ResidentCopiesAreInTheAllocatorsRegionSpilledOnesComeWithAnOwner) {
  const Layout layout = BigLayout();
  std::vector<std::unique_ptr<std::byte[]>> keep;
  std::span<std::byte> region;
  ServingAllocator alloc = [&](size_t bytes) -> Result<std::span<std::byte>> {
    keep.push_back(std::make_unique<std::byte[]>(bytes + 64));
    auto base = reinterpret_cast<uintptr_t>(keep.back().get());
    region = {reinterpret_cast<std::byte*>((base + 63) / 64 * 64), bytes};
    return region;
  };
  auto spill = MakeServingSpilled(layout, OptimizerConfig{}, kBudget, alloc);
  ASSERT_TRUE(spill);
  ASSERT_EQ(region.size(), 2 * kServingRecord);  // the 2 resident copies only
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  PushAll(layout, **ram, *spill, kInitStep, 5);
  auto in_region = [&](const std::byte* p) {
    return p >= region.data() && p < region.data() + region.size();
  };
  for (uint32_t c : spill->chunk_ids()) {
    testing::FetchResult r;
    spill->Fetch({c, 8, 8, 0}, r.Callback(true));
    ASSERT_TRUE(r.Wait());
    ASSERT_THAT(r.status, IsOk());
    const bool resident = c < 2;  // placement in id order
    EXPECT_EQ(in_region(r.where), resident) << "chunk " << c;
    EXPECT_EQ(r.owner == nullptr, resident) << "chunk " << c;
  }
}

TEST(ShardStateServingSpill, FetchesWaitForAFreeStagingBuffer) {
  const Layout layout = BigLayout();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto spill = MakeServingSpilled(layout, OptimizerConfig{}, kBudget);
  ASSERT_TRUE(spill);
  PushAll(layout, **ram, *spill, kInitStep, 9);
  // Hold the owners of fetches of 4 different spilled chunks: every staging buffer is taken.
  std::vector<std::unique_ptr<testing::FetchResult>> held;
  for (uint32_t c = 2; c < 2 + kServingStagingBuffers; ++c) {
    held.push_back(std::make_unique<testing::FetchResult>());
    spill->Fetch({c, 0, 4096, 0}, held.back()->Callback(true));
    ASSERT_TRUE(held.back()->Wait());
    ASSERT_THAT(held.back()->status, IsOk());
  }
  // A fifth chunk (not cached). The held owners hold copies of their ranges, never a staging
  // buffer (the serving tier's reader, ServingTier::Loop, replies with a copy), so this read does
  // not wait for one to be released; whether it is answered yet is up to the serving reader thread,
  // so that is not asserted (it was, and failed when the reader answered first).
  testing::FetchResult fifth;
  spill->Fetch({10, 0, 4096, 0}, fifth.Callback());
  // Queued behind it: a chunk whose copy is held.
  testing::FetchResult cached;
  spill->Fetch({3, 0, 4096, 0}, cached.Callback());
  held[0]->owner.reset();
  ASSERT_TRUE(fifth.Wait());
  ASSERT_THAT(fifth.status, IsOk());
  ASSERT_TRUE(cached.Wait());
  testing::FetchResult want;
  (*ram)->Fetch({10, 0, 4096, 0}, want.Callback());
  ASSERT_TRUE(want.Wait());
  EXPECT_EQ(fifth.data, want.data);
  testing::FetchResult want3;
  (*ram)->Fetch({3, 0, 4096, 0}, want3.Callback());
  ASSERT_TRUE(want3.Wait());
  EXPECT_EQ(cached.data, want3.data);
  // The buffer a held owner covers stays intact while later fetches reuse the other buffers.
  testing::FetchResult want2;
  (*ram)->Fetch({3, 0, 4096, 0}, want2.Callback());
  ASSERT_TRUE(want2.Wait());
  const std::vector<std::byte> still(held[1]->where, held[1]->where + 4096 * 2);
  EXPECT_EQ(still, want2.data);
}

TEST(ShardStateServingSpill, CheckpointRestoreRewritesSpilledServingCopies) {
  const Layout layout = BigLayout();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto spill = MakeServingSpilled(layout, OptimizerConfig{}, kBudget);
  ASSERT_TRUE(spill);
  PushAll(layout, **ram, *spill, kInitStep, 11);
  for (int64_t step = 0; step < 2; ++step) {
    PushAll(layout, **ram, *spill, step, 500 + static_cast<uint32_t>(step));
    Step(**ram, step, false);
    Step(*spill, step, false);
  }
  struct Saved {
    std::vector<float> master;
    std::vector<std::byte> m, v;
  };
  std::map<uint32_t, Saved> saved;
  ASSERT_TRUE(
      spill
          ->VisitChunkState([&](uint32_t c, int64_t, std::span<const float> master,
                                std::span<const std::byte> m, std::span<const std::byte> v) {
            saved[c] = {{master.begin(), master.end()}, {m.begin(), m.end()}, {v.begin(), v.end()}};
            return Status::Ok();
          })
          .ok());
  // A fetch parked for a version the rollback discards is failed with the reason.
  testing::FetchResult parked;
  spill->Fetch({12, 0, 8, 3}, parked.Callback());
  ASSERT_THAT(spill->ResetTo(-1, {}, Unavailable("rolled back")), IsOk());
  ASSERT_TRUE(parked.Wait());
  EXPECT_EQ(parked.status.code(), Code::kUnavailable);
  EXPECT_NE(spill->StateCrc(), (*ram)->StateCrc());
  auto load = [&](uint32_t c, std::span<float> master, std::span<std::byte> m,
                  std::span<std::byte> v) -> Status {
    const Saved& s = saved.at(c);
    std::memcpy(master.data(), s.master.data(), master.size_bytes());
    std::memcpy(m.data(), s.m.data(), m.size_bytes());
    std::memcpy(v.data(), s.v.data(), v.size_bytes());
    return Status::Ok();
  };
  ASSERT_THAT(spill->ResetTo(2, load, Unavailable("restore")), IsOk());
  ExpectSame(**ram, *spill);
  ExpectSameFetches(**ram, *spill, 2, 0, 4096);
  PushAll(layout, **ram, *spill, 2, 600);
  Step(**ram, 2, false);
  Step(*spill, 2, false);
  ExpectSame(**ram, *spill);
  ExpectSameFetches(**ram, *spill, 3, 0, 4096);
}

// Fails every read completion with EIO while armed (the fetch path of spilled serving copies).
class FailReadsEngine final : public IoEngine {
 public:
  FailReadsEngine(std::unique_ptr<IoEngine> inner, std::shared_ptr<std::atomic<bool>> armed)
      : inner_(std::move(inner)), armed_(std::move(armed)) {}
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight(); }
  Status Push(const IoRequest& req) override {
    if (req.op == IoRequest::Op::kRead) reads_.insert(req.tag);
    return inner_->Push(req);
  }
  Status Flush() override { return inner_->Flush(); }
  Result<IoCompletion> Wait() override {
    ZPS_ASSIGN_OR_RETURN(IoCompletion c, inner_->Wait());
    auto it = reads_.find(c.tag);
    if (it != reads_.end()) {
      reads_.erase(it);
      if (armed_->load()) c.res = -EIO;
    }
    return c;
  }

 private:
  std::unique_ptr<IoEngine> inner_;
  std::shared_ptr<std::atomic<bool>> armed_;
  std::multiset<uint64_t> reads_;
};

// Store options whose reads fail while `armed` is set.
ChunkStoreOptions FailingReads(const std::string& prefix,
                               const std::shared_ptr<std::atomic<bool>>& armed) {
  ChunkStoreOptions so;
  so.spill_dir = SpillDir();
  so.file_prefix = prefix + "-" + std::to_string(::getpid());
  so.wrap_engine = [armed](std::unique_ptr<IoEngine> e) -> std::unique_ptr<IoEngine> {
    return std::make_unique<FailReadsEngine>(std::move(e), armed);
  };
  return so;
}

TEST(ShardStateServingSpill, AFailedReadFailsThatFetchOnly) {
  const Layout layout = BigLayout();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto armed = std::make_shared<std::atomic<bool>>(false);
  ChunkStoreOptions so = FailingReads("shard-serving-fault", armed);
  so.memory_budget = UINT64_MAX;  // only serving copies spill: every read is a fetch's
  so.serving_records = true;
  so.serving_memory_budget = kServingBudget;
  auto spill = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, so);
  ASSERT_THAT(spill, IsOk());
  PushAll(layout, **ram, **spill, kInitStep, 13);
  armed->store(true);
  testing::FetchResult bad;
  (*spill)->Fetch({5, 0, 64, 0}, bad.Callback());
  ASSERT_TRUE(bad.Wait());
  EXPECT_EQ(bad.status.code(), Code::kIoError) << bad.status.ToString();
  EXPECT_EQ((*spill)->storage_stats().io_errors, 1u);
  armed->store(false);
  // Nothing was lost: the next fetch reads the copy, and the step goes on bit for bit.
  ExpectSameFetches(**ram, **spill, 0, 0, 4096);
  PushAll(layout, **ram, **spill, 0, 700);
  Step(**ram, 0, false);
  Step(**spill, 0, false);
  ExpectSame(**ram, **spill);
  ExpectSameFetches(**ram, **spill, 1, 0, 4096);
}

// Copies made on fetch from spilled masters: a failed read of a master fails that fetch only
// (IoError, counted); the next fetch converts it, and training goes on bit for bit.
TEST(ShardStateServingSpill, AFailedMasterReadFailsThatMadeFetchOnly) {
  const Layout layout = BigLayout();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto ram = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(ram, IsOk());
  auto armed = std::make_shared<std::atomic<bool>>(false);
  ChunkStoreOptions so = FailingReads("shard-made-fault", armed);
  so.memory_budget = kBudget;  // 1 of 14 states resident: the last chunk's master is spilled
  auto made = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, so, {},
                                 ServingCopies::kOnFetch);
  ASSERT_THAT(made, IsOk());
  ASSERT_EQ((*made)->storage_stats().store.state_resident, 1u);
  PushAll(layout, **ram, **made, kInitStep, 13);
  armed->store(true);
  testing::FetchResult bad;
  (*made)->Fetch({13, 0, 64, 0}, bad.Callback());
  ASSERT_TRUE(bad.Wait());
  EXPECT_EQ(bad.status.code(), Code::kIoError) << bad.status.ToString();
  EXPECT_EQ((*made)->storage_stats().io_errors, 1u);
  armed->store(false);
  ExpectSameFetches(**ram, **made, 0, 0, 4096);
  PushAll(layout, **ram, **made, 0, 700);
  Step(**ram, 0, false);
  Step(**made, 0, false);
  ExpectSame(**ram, **made);
  ExpectSameFetches(**ram, **made, 1, 0, 4096);
}

TEST(ShardStateServingSpill, ServingBudgetTooSmallForTheStagingBuffersIsAClearError) {
  ChunkStoreOptions so;
  so.memory_budget = UINT64_MAX;
  so.serving_records = true;
  so.serving_memory_budget = 3 * kServingRecord;
  so.spill_dir = SpillDir();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  auto s = ShardState::Create(BigLayout(), 0, job, OptimizerConfig{}, nullptr, so);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kResourceExhausted) << s.status().ToString();
  EXPECT_NE(s.status().message().find("staging"), std::string::npos);
}

TEST(ShardStateSpill, BudgetTooSmallForTheBuffersIsAClearError) {
  ChunkStoreOptions so;
  so.memory_budget = 4096;
  so.spill_dir = SpillDir();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  auto s = ShardState::Create(BigLayout(), 0, job, OptimizerConfig{}, nullptr, so);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kResourceExhausted) << s.status().ToString();
}

}  // namespace
}  // namespace zps::server
