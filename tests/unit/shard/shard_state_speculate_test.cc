// Speculative updates (UpdateMode::kSpeculative) against sync ShardStates fed the same pushes
// and orders: every outcome (published, clipped -> redone, skipped -> dropped) must leave the
// same bits (chunk CRCs of master, m, v and serving copy); the redo must start from the
// pre-update state; spares count against a memory budget; and copy-on-write snapshots keep the
// bytes of their version while later steps run. The job has a frozen parameter: an
// out-of-place update (a spare, or fresh buffers beside a snapshot) must carry its state over.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "shard/snapshot_manager.h"
#include "shard_steps.h"
#include "state_crcs.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

// 1 shard, 8 chunks of 1024 elements (odd parameter sizes: padding, parameters across chunks).
Layout SmallLayout() {
  auto l =
      Layout::Build({{"a", {1500}}, {"b", {3, 300}}, {"c", {1777}}, {"d", {10}}, {"e", {3000}}},
                    {.chunk_elems = 1024, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

constexpr uint32_t kFrozenParam = 3;  // "d": served, never pushed, never updated

ShardJob Job(UpdateMode mode) {
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  job.accumulation_steps = 2;  // 4 contributors, summed in contributor order
  job.param_groups = {{1e-2f, 0.1f}, {5e-3f, 0.0f}};
  job.param_group = {0, 1, 0, 1, 0};
  job.frozen = {0, 0, 0, 1, 0};
  job.lr_schedule.kind = LrScheduleKind::kWarmupLR;
  job.lr_schedule.warmup_min_lr = 1e-3;
  job.lr_schedule.warmup_max_lr = 1e-2;
  job.lr_schedule.warmup_num_steps = 5;
  job.update_mode = mode;
  return job;
}

using zps::testing::SpillDir;

// Which chunks PushAll pushes: all; all but the layout's last chunk; that chunk only.
enum class Chunks { kAll, kAllButLast, kLastOnly };

// Pushes the same values to every state (initial values, or the gradients of every contributor).
void PushAll(const Layout& layout, std::vector<ShardState*> states, int64_t step, uint32_t seed,
             float scale = 1e-2f, Chunks which = Chunks::kAll) {
  const uint32_t last = layout.num_chunks() - 1;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, step == kInitStep ? 0.5f : scale);
  const uint32_t contributors = step == kInitStep ? 1 : 4;
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    if (p == kFrozenParam && step != kInitStep) continue;
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      if ((which == Chunks::kAllButLast && piece.chunk == last) ||
          (which == Chunks::kLastOnly && piece.chunk != last)) {
        continue;
      }
      for (uint32_t r = 0; r < contributors; ++r) {
        std::vector<float> v(piece.length);
        for (auto& x : v) x = dist(rng);
        for (ShardState* s : states) {
          ASSERT_THAT(testing::Push(*s,
                                    {step, piece.chunk, piece.chunk_offset, piece.length,
                                     step == kInitStep ? 0 : r, DType::kF32},
                                    v.data()),
                      IsOk());
        }
      }
    }
  }
}

using testing::Commit;
using testing::WaitSpeculated;

// The same bits after `step`.
void ExpectSame(const ShardState& a, const ShardState& b, int64_t step) {
  testing::ExpectSameState(a, b, "after step " + std::to_string(step));
}

constexpr double kDivisor = 4.0;  // world 2 x accumulation 2

CommitOrder Assumed(int64_t step, int64_t applied) {
  return {step, false, StepCommit::UnclippedScale(1.0, kDivisor), applied + 1};
}

// Every test runs in each state dtype: the moments packed as fp32, bf16 or int8 (runs of
// parameter groups and frozen parameters start at multiples of the int8 block).
class ShardStateDTypeTest : public ::testing::TestWithParam<StateDType> {
 protected:
  OptimizerConfig Opt() const {
    OptimizerConfig o;
    o.state_dtype = GetParam();
    return o;
  }
};
using ShardStateSpeculate = ShardStateDTypeTest;
using ShardStateSnapshot = ShardStateDTypeTest;

TEST_P(ShardStateSpeculate, EveryOutcomeEqualsSync) {
  const Layout layout = SmallLayout();
  OptimizerConfig opt = Opt();  // AdamW, bias correction: the optimizer step counter matters
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), opt, nullptr);
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), opt, nullptr);
  ASSERT_TRUE(sync.ok() && spec.ok()) << spec.status().ToString();
  const uint32_t n = static_cast<uint32_t>((*spec)->chunk_ids().size());
  EXPECT_EQ((*spec)->speculation_stats().spares, n);
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 1);
  (*spec)->ArmSpeculation(Assumed(0, 0));
  // Per step: the decided order. Unclipped steps decide the assumed scale; step 1 and 4 clip
  // (another scale); step 2 is skipped (the optimizer step does not advance).
  int64_t applied = 0;
  for (int64_t step = 0; step < 6; ++step) {
    PushAll(layout, {sync->get(), spec->get()}, step, 100 + static_cast<uint32_t>(step));
    WaitSpeculated(**spec, n);
    CommitOrder order = Assumed(step, applied);
    if (step == 1 || step == 4) order.grad_scale *= 0.37f;
    if (step == 2) order.skip = true;
    if (!order.skip) ++applied;
    Commit(**sync, order, std::nullopt);
    Commit(**spec, order, Assumed(step + 1, applied));
    ExpectSame(**sync, **spec, step);
  }
  const SpeculationStats st = (*spec)->speculation_stats();
  EXPECT_EQ(st.published, 3u * n);
  EXPECT_EQ(st.redone, 2u * n);
  EXPECT_EQ(st.dropped, 1u * n);
  EXPECT_EQ(st.sync, 0u);
  EXPECT_EQ(st.in_flight, 0u);
}

// With an optimizer pool of several threads the speculation runs on a pool of its own as wide:
// still the bits of a sync shard without any pool (the work split does not depend on threads).
TEST_P(ShardStateSpeculate, SpeculationOnAPoolEqualsSync) {
  const Layout layout = SmallLayout();
  OptimizerConfig opt = Opt();
  auto pool = ThreadPool::Create({.name = "test-opt", .threads = 3});
  ASSERT_THAT(pool, IsOk());
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), opt, nullptr);
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), opt, pool->get());
  ASSERT_TRUE(sync.ok() && spec.ok()) << spec.status().ToString();
  const uint32_t n = static_cast<uint32_t>((*spec)->chunk_ids().size());
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 11);
  (*spec)->ArmSpeculation(Assumed(0, 0));
  int64_t applied = 0;
  for (int64_t step = 0; step < 4; ++step) {
    PushAll(layout, {sync->get(), spec->get()}, step, 500 + static_cast<uint32_t>(step));
    WaitSpeculated(**spec, n);
    CommitOrder order = Assumed(step, applied);
    if (step == 2) order.grad_scale *= 0.5f;  // clipped: redone (on the shard's pool)
    ++applied;
    Commit(**sync, order, std::nullopt);
    Commit(**spec, order, Assumed(step + 1, applied));
    ExpectSame(**sync, **spec, step);
  }
  EXPECT_EQ((*spec)->speculation_stats().published, 3u * n);
}

// The commit comes while the speculation thread is still updating the chunk that completed the
// step (held there by the test hook): ReduceStep takes its report without waiting for the
// update, the commit's pass over the other chunks runs beside it (RAM state), and the chunk is
// handled last. Every outcome still equals sync, step by step.
TEST_P(ShardStateSpeculate, CommitBesideASpeculationInProgressEqualsSync) {
  const Layout layout = SmallLayout();
  OptimizerConfig opt = Opt();
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), opt, nullptr);
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), opt, nullptr);
  ASSERT_TRUE(sync.ok() && spec.ok()) << spec.status().ToString();
  std::atomic<int> held{0};
  (*spec)->SetTestHook([&](std::string_view point, int64_t) {
    if (point != "speculating" || held.load() == 0) return;
    std::this_thread::sleep_for(50ms);  // the commit starts meanwhile
  });
  const uint32_t n = static_cast<uint32_t>((*spec)->chunk_ids().size());
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 1);
  (*spec)->ArmSpeculation(Assumed(0, 0));
  int64_t applied = 0;
  const int64_t steps = 6;
  for (int64_t step = 0; step < steps; ++step) {
    // Every chunk but the last is pushed and speculated; the last one's push then completes
    // the step while the thread is idle, so it takes that chunk.
    const uint32_t seed = 300 + static_cast<uint32_t>(step);
    PushAll(layout, {sync->get(), spec->get()}, step, seed, 1e-2f, Chunks::kAllButLast);
    WaitSpeculated(**spec, n - 1);
    held = 1;
    PushAll(layout, {sync->get(), spec->get()}, step, seed + 1000, 1e-2f, Chunks::kLastOnly);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while ((*spec)->speculation_stats().busy == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    CommitOrder order = Assumed(step, applied);
    if (step % 3 == 1) order.grad_scale *= 0.5f;  // clipped: the busy chunk is redone too
    if (step == 4) order.skip = true;
    if (!order.skip) ++applied;
    Commit(**spec, order, Assumed(step + 1, applied));
    held = 0;
    Commit(**sync, order, std::nullopt);
    ExpectSame(**sync, **spec, step);
  }
  const SpeculationStats st = (*spec)->speculation_stats();
  EXPECT_EQ(st.beside, static_cast<uint64_t>(steps));              // the last chunk of every step
  EXPECT_EQ(st.published + st.redone + st.sync, (steps - 1) * n);  // the applied steps
  EXPECT_EQ(st.in_flight, 0u);
}

// The redo of a clipped step must start from the pre-update master, m and v: a redo that read
// the speculated (already updated) state would apply the step twice, which this catches by
// comparing with a sync state that applied it once.
TEST_P(ShardStateSpeculate, RedoStartsFromThePreUpdateState) {
  const Layout layout = SmallLayout();
  OptimizerConfig opt = Opt();
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), opt, nullptr);
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), opt, nullptr);
  ASSERT_THAT(sync, IsOk());
  ASSERT_THAT(spec, IsOk());
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 3);
  const auto before = (*spec)->MasterOf(0);
  ASSERT_THAT(before, IsOk());
  (*spec)->ArmSpeculation(Assumed(0, 0));
  PushAll(layout, {sync->get(), spec->get()}, 0, 4, 1.0f);  // large: this step clips
  WaitSpeculated(**spec, static_cast<uint32_t>((*spec)->chunk_ids().size()));
  // Speculated, not published: the live state (and what MasterOf reads) is still version 0.
  auto during = (*spec)->MasterOf(0);
  ASSERT_THAT(during, IsOk());
  EXPECT_EQ(*during, *before);
  CommitOrder clipped = Assumed(0, 0);
  clipped.grad_scale *= 0.01f;
  Commit(**sync, clipped, std::nullopt);
  Commit(**spec, clipped, Assumed(1, 1));
  ExpectSame(**sync, **spec, 0);
  auto after = (*spec)->MasterOf(0);
  ASSERT_THAT(after, IsOk());
  EXPECT_NE(*after, *before);
  EXPECT_EQ((*spec)->speculation_stats().redone, (*spec)->chunk_ids().size());
}

// Not armed for the step (or no spare): the chunks are updated at the commit, as in sync mode.
TEST_P(ShardStateSpeculate, UnarmedStepsAreUpdatedAtTheCommit) {
  const Layout layout = SmallLayout();
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), Opt(), nullptr);
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), Opt(), nullptr);
  ASSERT_THAT(sync, IsOk());
  ASSERT_THAT(spec, IsOk());
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 5);
  PushAll(layout, {sync->get(), spec->get()}, 0, 6);
  Commit(**sync, Assumed(0, 0), std::nullopt);
  Commit(**spec, Assumed(0, 0), std::nullopt);
  ExpectSame(**sync, **spec, 0);
  EXPECT_EQ((*spec)->speculation_stats().sync, (*spec)->chunk_ids().size());
}

// With a memory budget the spares are taken out of it (a quarter): here room for one set, so
// one chunk a step is speculated and the others fall back to the commit; still the same bits.
TEST_P(ShardStateSpeculate, SparesCountAgainstTheMemoryBudget) {
  const Layout layout = SmallLayout();
  OptimizerConfig opt = Opt();
  auto sync = ShardState::Create(layout, 0, Job(UpdateMode::kSync), opt, nullptr);
  ASSERT_THAT(sync, IsOk());
  ChunkStoreOptions so;
  // A state record of 1024 elements is 12 KiB, a spare set 12 KiB + 2 KiB: a quarter of 96 KiB
  // holds one set; the other 82 KiB hold the pipeline's 5 buffers and one resident chunk, the
  // other chunks spill.
  so.memory_budget = 96 << 10;
  so.spill_dir = SpillDir();
  so.file_prefix = "shard-spec-test-" + std::to_string(::getpid());
  so.serving_records = false;
  auto spec = ShardState::Create(layout, 0, Job(UpdateMode::kSpeculative), opt, nullptr, so);
  ASSERT_THAT(spec, IsOk());
  const SpeculationStats st0 = (*spec)->speculation_stats();
  EXPECT_EQ(st0.spares, 1u);
  EXPECT_LT((*spec)->storage_stats().store.state_resident, (*spec)->chunk_ids().size());
  PushAll(layout, {sync->get(), spec->get()}, kInitStep, 7);
  (*spec)->ArmSpeculation(Assumed(0, 0));
  int64_t applied = 0;
  for (int64_t step = 0; step < 4; ++step) {
    PushAll(layout, {sync->get(), spec->get()}, step, 300 + static_cast<uint32_t>(step));
    WaitSpeculated(**spec, 1);
    CommitOrder order = Assumed(step, applied);
    if (step == 2) order.grad_scale *= 0.5f;
    ++applied;
    Commit(**sync, order, std::nullopt);
    Commit(**spec, order, Assumed(step + 1, applied));
    ExpectSame(**sync, **spec, step);
  }
  const SpeculationStats st = (*spec)->speculation_stats();
  EXPECT_EQ(st.published, 3u);
  EXPECT_EQ(st.redone, 1u);
  EXPECT_EQ(st.sync, 4u * ((*spec)->chunk_ids().size() - 1));
}

// A snapshot keeps the bytes of its version while steps change the state, in both update
// modes: a step before the visit hands every chunk's pre-update state to the snapshot
// (copy-on-write, out of place); a step during the visit finds every chunk copied by the visit
// already and updates in place.
TEST_P(ShardStateSnapshot, KeepsItsVersionWhileLaterStepsRun) {
  const Layout layout = SmallLayout();
  for (UpdateMode mode : {UpdateMode::kSync, UpdateMode::kSpeculative}) {
    for (const bool step_before_visit : {true, false}) {
      SCOPED_TRACE(std::string(mode == UpdateMode::kSync ? "sync" : "speculative") +
                   (step_before_visit ? ", a step before the visit" : ", a step during it"));
      auto s = ShardState::Create(layout, 0, Job(mode), Opt(), nullptr);
      ASSERT_THAT(s, IsOk());
      PushAll(layout, {s->get()}, kInitStep, 9);
      (*s)->ArmSpeculation(Assumed(0, 0));
      PushAll(layout, {s->get()}, 0, 10);
      Commit(**s, Assumed(0, 0), Assumed(1, 1));
      std::vector<std::vector<float>> at1;
      for (uint32_t c : (*s)->chunk_ids()) at1.push_back(*(*s)->MasterOf(c));
      auto snap = (*s)->BeginSnapshot();
      ASSERT_THAT(snap, IsOk());
      EXPECT_EQ((*s)->BeginSnapshot().status().code(), Code::kFailedPrecondition);  // one at a time
      auto step = [&] {
        PushAll(layout, {s->get()}, 1, 11);
        Commit(**s, Assumed(1, 1), Assumed(2, 2));
      };
      if (step_before_visit) step();
      size_t visited = 0;
      Status v =
          (*snap)->Visit([&](uint32_t chunk, int64_t version, std::span<const float> master,
                             std::span<const std::byte>, std::span<const std::byte>) -> Status {
            EXPECT_EQ(version, 1);
            EXPECT_TRUE(std::equal(master.begin(), master.end(), at1[visited].begin()))
                << "chunk " << chunk;
            if (visited++ == 0 && !step_before_visit) step();
            return Status::Ok();
          });
      ASSERT_THAT(v, IsOk());
      EXPECT_EQ(visited, at1.size());
      EXPECT_EQ((*snap)->copied_on_write(), step_before_visit ? at1.size() : 0u);
      EXPECT_NE(*(*s)->MasterOf(0), at1[0]);  // the live state moved on
      snap->reset();
      EXPECT_THAT((*s)->BeginSnapshot(), IsOk());  // the first one is closed
    }
  }
}

// A step after the visit copied a chunk updates it in place: the same bits as a shard that
// never checkpointed.
TEST_P(ShardStateSnapshot, StepsBesideTheWriteEndBitIdenticalToNoCheckpoint) {
  const Layout layout = SmallLayout();
  for (UpdateMode mode : {UpdateMode::kSync, UpdateMode::kSpeculative}) {
    auto plain = ShardState::Create(layout, 0, Job(mode), Opt(), nullptr);
    auto ckpt = ShardState::Create(layout, 0, Job(mode), Opt(), nullptr);
    ASSERT_THAT(plain, IsOk());
    ASSERT_THAT(ckpt, IsOk());
    auto step = [&](ShardState& st, int64_t k) {
      PushAll(layout, {&st}, k, 20 + static_cast<uint32_t>(k));
      Commit(st, Assumed(k, k), Assumed(k + 1, k + 1));
    };
    for (ShardState* st : {plain->get(), ckpt->get()}) {
      PushAll(layout, {st}, kInitStep, 9);
      st->ArmSpeculation(Assumed(0, 0));
      step(*st, 0);
      step(*st, 1);
    }
    auto snap = (*ckpt)->BeginSnapshot();
    ASSERT_THAT(snap, IsOk());
    size_t n = 0;
    Status v =
        (*snap)->Visit([&](uint32_t, int64_t, std::span<const float>, std::span<const std::byte>,
                           std::span<const std::byte>) -> Status {
          if (n++ == 0) {  // steps 2 and 3 run while the "write" goes on
            step(**ckpt, 2);
            step(**ckpt, 3);
          }
          return Status::Ok();
        });
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ((*snap)->copied_on_write(), 0u);
    step(**plain, 2);
    step(**plain, 3);
    EXPECT_EQ((*plain)->StateCrc(), (*ckpt)->StateCrc());
  }
}

// Steps before the visit hand every chunk's pre-update state to the snapshot and update out of
// place into other buffers: still the same bits as a shard that never checkpointed (the frozen
// parameter's state included, which the update does not write). In speculative mode every chunk
// is speculated before the commit, so the publish gives the live buffers to the snapshot and the
// spare's become live; the next step speculates into a spare allocated again (it wrote through
// a null pointer while a moved-from AlignedBuffer kept its size).
TEST_P(ShardStateSnapshot, StepsBeforeTheVisitEndBitIdenticalToNoCheckpoint) {
  const Layout layout = SmallLayout();
  for (UpdateMode mode : {UpdateMode::kSync, UpdateMode::kSpeculative}) {
    SCOPED_TRACE(mode == UpdateMode::kSync ? "sync" : "speculative");
    auto plain = ShardState::Create(layout, 0, Job(mode), Opt(), nullptr);
    auto ckpt = ShardState::Create(layout, 0, Job(mode), Opt(), nullptr);
    ASSERT_THAT(plain, IsOk());
    ASSERT_THAT(ckpt, IsOk());
    const uint32_t n = static_cast<uint32_t>((*ckpt)->chunk_ids().size());
    auto step = [&](ShardState& st, int64_t k) {
      PushAll(layout, {&st}, k, 40 + static_cast<uint32_t>(k));
      if (mode == UpdateMode::kSpeculative) WaitSpeculated(st, n);
      Commit(st, Assumed(k, k), Assumed(k + 1, k + 1));
    };
    for (ShardState* st : {plain->get(), ckpt->get()}) {
      PushAll(layout, {st}, kInitStep, 9);
      st->ArmSpeculation(Assumed(0, 0));
      step(*st, 0);
    }
    auto snap = (*ckpt)->BeginSnapshot();
    ASSERT_THAT(snap, IsOk());
    for (int64_t k = 1; k <= 3; ++k) {
      step(**ckpt, k);
      step(**plain, k);
      ExpectSame(**plain, **ckpt, k);
    }
    Status v =
        (*snap)->Visit([&](uint32_t, int64_t, std::span<const float>, std::span<const std::byte>,
                           std::span<const std::byte>) -> Status { return Status::Ok(); });
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ((*snap)->copied_on_write(), (*ckpt)->chunk_ids().size());
    snap->reset();
    step(**ckpt, 4);
    step(**plain, 4);
    ExpectSame(**plain, **ckpt, 4);
  }
}

std::string DTypeName(const ::testing::TestParamInfo<StateDType>& p) {
  return std::string(StateDTypeName(p.param));
}
INSTANTIATE_TEST_SUITE_P(StateDType, ShardStateSpeculate,
                         ::testing::Values(StateDType::kF32, StateDType::kBF16, StateDType::kInt8),
                         DTypeName);
INSTANTIATE_TEST_SUITE_P(StateDType, ShardStateSnapshot,
                         ::testing::Values(StateDType::kF32, StateDType::kBF16, StateDType::kInt8),
                         DTypeName);

}  // namespace
}  // namespace zps::server
