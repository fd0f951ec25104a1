// The update policy (server/src/shard/update_policy.h) through ShardState: the sync policy
// ignores arming and reports nothing; the speculative one counts each chunk's outcome at the
// commit (published, redone, dropped, sync), forgets its armed order on a rollback, and leaves
// the same bits as the sync one in every case.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "shard_steps.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

// 1 shard, 4 chunks of 256 elements.
Layout FourChunks() {
  auto l = Layout::Build({{"a", {700}}, {"b", {300}}},
                         {.chunk_elems = 256, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

std::unique_ptr<ShardState> Make(const Layout& layout, UpdateMode mode) {
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  job.update_mode = mode;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdamW;
  auto s = ShardState::Create(layout, 0, job, opt, nullptr);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

void PushAll(const Layout& layout, const std::vector<ShardState*>& states, int64_t step,
             uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      std::vector<float> v(piece.length);
      for (auto& x : v) x = dist(rng);
      for (ShardState* s : states) {
        ASSERT_THAT(
            testing::Push(*s, {step, piece.chunk, piece.chunk_offset, piece.length, 0, DType::kF32},
                          v.data()),
            IsOk());
      }
    }
  }
}

using testing::Commit;
using testing::WaitSpeculated;

TEST(UpdatePolicyTest, SyncIgnoresArmingAndReportsNothing) {
  const Layout layout = FourChunks();
  auto s = Make(layout, UpdateMode::kSync);
  PushAll(layout, {s.get()}, kInitStep, 1);
  s->ArmSpeculation({0, false, 1.0f, 1});
  PushAll(layout, {s.get()}, 0, 2);
  Commit(*s, {0, false, 1.0f, 1}, CommitOrder{1, false, 1.0f, 2});
  const SpeculationStats st = s->speculation_stats();
  EXPECT_EQ(st.published + st.redone + st.dropped + st.sync, 0u);
  EXPECT_EQ(st.spares, 0u);
  EXPECT_EQ(s->serving_bank_bytes(), 0u);
}

TEST(UpdatePolicyTest, SpeculativeCountsEachOutcomeAndMatchesSync) {
  const Layout layout = FourChunks();
  auto sync = Make(layout, UpdateMode::kSync);
  auto spec = Make(layout, UpdateMode::kSpeculative);
  const uint32_t n = static_cast<uint32_t>(spec->chunk_ids().size());
  EXPECT_EQ(spec->speculation_stats().spares, n);  // RAM state: one spare per chunk
  EXPECT_GT(spec->serving_bank_bytes(), 0u);       // and two serving banks
  PushAll(layout, {sync.get(), spec.get()}, kInitStep, 1);
  spec->ArmSpeculation({0, false, 1.0f, 1});
  // Step 0 as assumed: published. Step 1 clipped: redone. Step 2 skipped: dropped.
  const CommitOrder orders[] = {{0, false, 1.0f, 1}, {1, false, 0.5f, 2}, {2, true, 1.0f, 2}};
  for (const CommitOrder& order : orders) {
    PushAll(layout, {sync.get(), spec.get()}, order.step, 10 + static_cast<uint32_t>(order.step));
    WaitSpeculated(*spec, n);
    const CommitOrder assumed{order.step + 1, false, 1.0f, order.optimizer_step + 1};
    Commit(*sync, order, std::nullopt);
    Commit(*spec, order, assumed);
    EXPECT_EQ(sync->StateCrc(), spec->StateCrc()) << "after step " << order.step;
  }
  const SpeculationStats st = spec->speculation_stats();
  EXPECT_EQ(st.published, n);
  EXPECT_EQ(st.redone, n);
  EXPECT_EQ(st.dropped, n);
  EXPECT_EQ(st.sync, 0u);
  EXPECT_EQ(st.in_flight, 0u);
}

TEST(UpdatePolicyTest, ARollbackForgetsTheArmedOrder) {
  const Layout layout = FourChunks();
  auto spec = Make(layout, UpdateMode::kSpeculative);
  PushAll(layout, {spec.get()}, kInitStep, 1);
  spec->ArmSpeculation({0, false, 1.0f, 1});
  ASSERT_THAT(spec->ResetTo(-1, {}, Cancelled("rollback")), IsOk());
  PushAll(layout, {spec.get()}, kInitStep, 1);
  PushAll(layout, {spec.get()}, 0, 2);
  // Nothing armed: every chunk is reduced, none speculated; the commit updates them all.
  Commit(*spec, {0, false, 1.0f, 1}, std::nullopt);
  const SpeculationStats st = spec->speculation_stats();
  EXPECT_EQ(st.published, 0u);
  EXPECT_EQ(st.sync, spec->chunk_ids().size());
}

}  // namespace
}  // namespace zps::server
