// ShardState with a memory budget (master, m, v in a ChunkStore, mostly spilled) must end every
// step with exactly the state of the RAM-only ShardState, and checkpoint visits / restores must
// go through the store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "zps/server/shard_state.h"

namespace zps::server {
namespace {

std::string SpillDir() {
  const char* d = std::getenv("ZPS_TEST_SPILL_DIR");
  std::string dir = d != nullptr ? d : ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// 1 shard, 14 chunks of 4096 elements; parameters of odd sizes so chunks have padding.
Layout BigLayout() {
  auto l = Layout::Build({{"a", {5000}}, {"b", {3, 1000}}, {"c", {7777}}, {"d", {10}},
                          {"e", {40000}}},
                         {.chunk_elems = 4096, .align_elems = 64, .num_shards = 1});
  EXPECT_TRUE(l.ok());
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
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  ChunkStoreOptions so;
  so.memory_budget = kBudget;
  so.spill_dir = SpillDir();
  so.file_prefix = "shard-spill-test-" + std::to_string(::getpid());
  auto s = ShardState::Create(layout, 0, job, opt, nullptr, so);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
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
    ASSERT_TRUE(pieces.ok());
    for (const Piece& piece : *pieces) {
      for (uint32_t r = 0; r < ranks; ++r) {
        std::vector<float> v(piece.length);
        for (auto& x : v) x = dist(rng);
        for (ShardState* s : {&a, &b}) {
          auto t = s->BeginPush({step, piece.chunk, piece.chunk_offset, piece.length, r,
                                 DType::kF32});
          ASSERT_TRUE(t.ok()) << t.status().ToString();
          std::memcpy(t->destination().data(), v.data(), t->destination().size());
          ASSERT_TRUE(s->FinishPush(std::move(*t), Status::Ok()).ok());
        }
      }
    }
  }
}

void Step(ShardState& s, int64_t step, bool skip) {
  ASSERT_TRUE(s.WaitForGradients(step, std::chrono::milliseconds(1000)).ok());
  auto rep = s.ReduceStep(step);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(s.ApplyCommit({step, skip, 0.5f, step + 1}).ok());
}

void ExpectSame(const ShardState& a, const ShardState& b) {
  for (uint32_t c : a.chunk_ids()) {
    auto x = a.ChunkCrc(c);
    auto y = b.ChunkCrc(c);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(*x, *y) << "chunk " << c;
    auto ma = a.MasterOf(c);
    auto mb = b.MasterOf(c);
    ASSERT_TRUE(ma.ok() && mb.ok());
    EXPECT_EQ(*ma, *mb) << "chunk " << c;
  }
  EXPECT_EQ(a.StateCrc(), b.StateCrc());
}

TEST(ShardStateSpill, StepsMatchRamBitForBit) {
  const Layout layout = BigLayout();
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    OptimizerConfig opt;
    opt.kind = kind;
    opt.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
    Pair p = MakePair(layout, opt);
    ASSERT_TRUE(p.ram && p.spill);
    const ShardStorageStats st0 = p.spill->storage_stats();
    ASSERT_TRUE(st0.spilled);
    EXPECT_EQ(st0.store.chunks, 14u);
    // Adam: one 48 KiB record resident; SGD with momentum: 32 KiB records, four resident.
    EXPECT_EQ(st0.store.state_resident, kind == OptimizerKind::kSgd ? 4u : 1u);
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
        return [&out](const Status& s, int64_t, std::span<const std::byte> d) {
          ASSERT_TRUE(s.ok());
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

TEST(ShardStateSpill, CheckpointVisitAndRestoreGoThroughTheStore) {
  const Layout layout = BigLayout();
  Pair p = MakePair(layout, OptimizerConfig{});
  ASSERT_TRUE(p.ram && p.spill);
  PushAll(layout, *p.ram, *p.spill, kInitStep, 7);
  for (int64_t step = 0; step < 2; ++step) {
    PushAll(layout, *p.ram, *p.spill, step, 200 + static_cast<uint32_t>(step));
    Step(*p.ram, step, false);
    Step(*p.spill, step, false);
  }
  // "Checkpoint" both: the visits must see the same tensors.
  struct Saved {
    std::vector<float> master, m, v;
  };
  std::map<uint32_t, Saved> from_ram, from_spill;
  auto saver = [](std::map<uint32_t, Saved>& out) {
    return [&out](uint32_t c, int64_t version, std::span<const float> master,
                  std::span<const float> m, std::span<const float> v) -> Status {
      EXPECT_EQ(version, 2);
      out[c] = {{master.begin(), master.end()}, {m.begin(), m.end()}, {v.begin(), v.end()}};
      return Status::Ok();
    };
  };
  ASSERT_TRUE(p.ram->VisitChunkState(saver(from_ram)).ok());
  ASSERT_TRUE(p.spill->VisitChunkState(saver(from_spill)).ok());
  ASSERT_EQ(from_ram.size(), from_spill.size());
  for (const auto& [c, s] : from_ram) {
    EXPECT_EQ(s.master, from_spill[c].master) << c;
    EXPECT_EQ(s.m, from_spill[c].m) << c;
    EXPECT_EQ(s.v, from_spill[c].v) << c;
  }
  const uint32_t crc = p.ram->StateCrc();
  // Roll the spilled shard back to "nothing", then restore the saved state into it.
  ASSERT_TRUE(p.spill->ResetTo(-1, {}, Unavailable("test")).ok());
  EXPECT_EQ(p.spill->version(), -1);
  EXPECT_NE(p.spill->StateCrc(), crc);
  auto load = [&](uint32_t c, std::span<float> master, std::span<float> m,
                  std::span<float> v) -> Status {
    const Saved& s = from_spill.at(c);
    std::memcpy(master.data(), s.master.data(), master.size_bytes());
    std::memcpy(m.data(), s.m.data(), m.size_bytes());
    std::memcpy(v.data(), s.v.data(), v.size_bytes());
    return Status::Ok();
  };
  ASSERT_TRUE(p.spill->ResetTo(2, load, Unavailable("test")).ok());
  EXPECT_EQ(p.spill->version(), 2);
  ExpectSame(*p.ram, *p.spill);
  // And training continues identically.
  PushAll(layout, *p.ram, *p.spill, 2, 300);
  Step(*p.ram, 2, false);
  Step(*p.spill, 2, false);
  ExpectSame(*p.ram, *p.spill);
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
