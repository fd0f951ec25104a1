// 16-bit gradient slots: a job with grad_dtype fp16 or bf16 keeps its pushes as they landed
// (no conversion when a transfer completes); the reduction widens and sums several slots in
// contributor order, and reads one slot directly. Every result must equal, bit for bit, an fp32
// job fed the widened values (widening is exact): the reports, master, m, v and serving copy,
// in sync and speculative mode, with groups, a frozen parameter and an overflowing step. The
// rollback fence and ForgetRank must keep stale 16-bit transfers out of the live slots.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "grad_slot_fixture.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

using namespace testing;  // grad_slot_fixture.h
using Case = GradSlotCase;

// Chunks of 1024 elements: a and e span chunks.
Layout Grad16Layout() { return GradSlotLayout(1500, 2100, 1024); }

// Two parameter groups on top of the fixture's job.
ShardJob Job(const Case& c, DType grad) {
  ShardJob job = GradSlotJob(c, grad);
  job.param_groups = {{1e-2f, 0.1f}, {5e-3f, 0.0f}};
  job.param_group = {0, 1, 0, 1, 0};
  return job;
}

std::vector<uint16_t> To16(DType d, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  if (d == DType::kF16)
    ConvertF32ToF16(x, h);
  else
    ConvertF32ToBF16(x, h);
  return h;
}

std::vector<float> Widen(DType d, const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  if (d == DType::kF16)
    ConvertF16ToF32(h, x);
  else
    ConvertBF16ToF32(h, x);
  return x;
}

class ShardStateGrad16 : public ::testing::TestWithParam<Case> {};

TEST_P(ShardStateGrad16, EqualsAnFp32JobFedTheWidenedValues) {
  const Case c = GetParam();
  const Layout layout = Grad16Layout();
  OptimizerConfig opt;  // AdamW with bias correction
  auto half = ShardState::Create(layout, 0, Job(c, c.dtype), opt, nullptr);
  auto full = ShardState::Create(layout, 0, Job(c, DType::kF32), opt, nullptr);
  ASSERT_TRUE(half.ok() && full.ok()) << half.status().ToString() << full.status().ToString();
  ShardState& h = **half;
  ShardState& f = **full;
  std::mt19937 rng(7);
  ASSERT_THAT(PushInitialValues(layout, rng, {&h, &f}), IsOk());
  const double divisor = static_cast<double>(c.world) * c.accum;
  int64_t applied = 0;
  auto order_for = [&](int64_t step, bool skip) {
    return CommitOrder{step, skip, StepCommit::UnclippedScale(1.0, divisor), applied + 1};
  };
  h.ArmSpeculation(order_for(0, false));
  f.ArmSpeculation(order_for(0, false));
  for (int64_t step = 0; step < 5; ++step) {
    // Step 3 overflows: one contributor's element is +Inf (an fp16 overflow).
    const bool overflow = step == 3;
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    for (const auto& [p, piece] : TrainedPieces(layout)) {
      for (uint32_t slot = GradSlots(c); slot-- > 0;) {  // the last contributor first
        std::vector<float> x(piece.length);
        for (auto& v : x) v = dist(rng);
        if (overflow && slot == 0 && p == 4) x[piece.length / 2] = 1e30f;
        const std::vector<uint16_t> g16 = To16(c.dtype, x);
        const std::vector<float> g32 = Widen(c.dtype, g16);
        // Server-sum: contributor `slot`; pre-reduced: rank 0, micro-batch `slot`.
        const uint32_t rank = slot;
        ASSERT_THAT(Push(h, {step, piece.chunk, piece.chunk_offset, piece.length, rank, c.dtype},
                         g16.data()),
                    IsOk());
        ASSERT_THAT(
            Push(f, {step, piece.chunk, piece.chunk_offset, piece.length, rank, DType::kF32},
                 g32.data()),
            IsOk());
      }
    }
    for (ShardState* s : {&h, &f}) ASSERT_THAT(s->WaitForGradients(step, 2000ms), IsOk());
    auto rh = h.ReduceStep(step);
    auto rf = f.ReduceStep(step);
    ASSERT_TRUE(rh.ok() && rf.ok()) << rh.status().ToString() << rf.status().ToString();
    ASSERT_EQ(rh->size(), rf->size());
    bool non_finite = false;
    for (size_t i = 0; i < rh->size(); ++i) {
      EXPECT_EQ((*rh)[i].first, (*rf)[i].first);
      EXPECT_EQ((*rh)[i].second.non_finite, (*rf)[i].second.non_finite) << "step " << step;
      if (!(*rf)[i].second.non_finite) {
        // Bit-identical, not near: the same values summed in the same order.
        EXPECT_EQ((*rh)[i].second.sum_squares, (*rf)[i].second.sum_squares)
            << "chunk " << (*rh)[i].first << " step " << step;
      }
      non_finite |= (*rf)[i].second.non_finite;
    }
    EXPECT_EQ(non_finite, overflow && c.dtype == DType::kF16)  // 1e30 is finite in bf16
        << "step " << step;
    const CommitOrder order = order_for(step, non_finite);
    if (!non_finite) ++applied;
    ASSERT_THAT(h.ApplyCommit(order, order_for(step + 1, false)), IsOk());
    ASSERT_THAT(f.ApplyCommit(order, order_for(step + 1, false)), IsOk());
    ExpectSameState(h, f, "after step " + std::to_string(step));
  }
  EXPECT_EQ(applied, c.dtype == DType::kF16 ? 4 : 5);
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, ShardStateGrad16,
    ::testing::Values(Case{DType::kF16, ReductionMode::kServerSum, 1, 1, UpdateMode::kSync},
                      Case{DType::kBF16, ReductionMode::kServerSum, 1, 1, UpdateMode::kSync},
                      Case{DType::kF16, ReductionMode::kServerSum, 3, 1, UpdateMode::kSync},
                      Case{DType::kBF16, ReductionMode::kServerSum, 2, 2, UpdateMode::kSync},
                      Case{DType::kF16, ReductionMode::kPreReduced, 2, 1, UpdateMode::kSync},
                      Case{DType::kBF16, ReductionMode::kPreReduced, 1, 3, UpdateMode::kSync},
                      Case{DType::kF16, ReductionMode::kServerSum, 1, 1, UpdateMode::kSpeculative},
                      Case{DType::kBF16, ReductionMode::kServerSum, 3, 1,
                           UpdateMode::kSpeculative}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.Name(); });

// Shard-0 chunks 0 and 2 of a 2-shard layout (as shard_state_test.cc's).
class ShardStateGrad16Fence : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = Layout::Build({{"p0", {200}}, {"p1", {5, 10}}},
                           {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
    ASSERT_THAT(l, IsOk());
    layout_ = *l;
    ShardJob job{ReductionMode::kServerSum, 2, DType::kF16, DType::kBF16};
    auto s = ShardState::Create(layout_, 0, job, OptimizerConfig{}, nullptr);
    ASSERT_THAT(s, IsOk());
    shard_ = std::move(*s);
    Init();
  }
  void Init() {
    std::vector<float> v(128, 1.0f);
    ASSERT_THAT(Push(*shard_, {kInitStep, 0, 0, 128, 0, DType::kF32}, v.data()), IsOk());
    ASSERT_THAT(Push(*shard_, {kInitStep, 2, 0, 50, 0, DType::kF32}, v.data()), IsOk());
  }
  static std::vector<uint16_t> Half(float x, size_t n) {
    return To16(DType::kF16, std::vector<float>(n, x));
  }
  Layout layout_;
  std::unique_ptr<ShardState> shard_;
};

// A 16-bit transfer still landing after a rollback writes into a slot buffer no one reads, and
// FinishPush refuses it: the new gradients are what the reduction sees.
TEST_F(ShardStateGrad16Fence, RollbackFencesA16BitTransferStillLanding) {
  const uint64_t old_gen = shard_->epoch();
  auto in_flight = shard_->BeginPush({0, 0, 0, 128, 0, DType::kF16, old_gen});
  ASSERT_THAT(in_flight, IsOk());
  ASSERT_THAT(shard_->ResetTo(-1, {}, Unavailable("rolling back")), IsOk());
  Init();
  const uint64_t gen = shard_->epoch();
  const auto g = Half(0.25f, 128);
  for (uint32_t rank : {0u, 1u}) {
    ASSERT_THAT(Push(*shard_, {0, 0, 0, 128, rank, DType::kF16, gen}, g.data()), IsOk());
    ASSERT_THAT(Push(*shard_, {0, 2, 0, 50, rank, DType::kF16, gen}, g.data()), IsOk());
  }
  std::memset(in_flight->destination().data(), 0x7b, in_flight->destination().size());
  EXPECT_EQ(shard_->FinishPush(std::move(*in_flight), Status::Ok()).code(), Code::kUnavailable);
  ASSERT_THAT(shard_->WaitForGradients(0, 100ms), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].second.sum_squares, 128 * 0.5 * 0.5);  // 0.25 + 0.25, exact
  EXPECT_EQ((*reports)[1].second.sum_squares, 50 * 0.5 * 0.5);
  EXPECT_FALSE((*reports)[0].second.non_finite);
}

// A restarted rank's 16-bit slot is cleared by ForgetRank (what landed is dropped, what is still
// landing is refused), and its pushes of the step again make exactly the sum without the crash.
TEST_F(ShardStateGrad16Fence, ForgetRankClearsA16BitSlot) {
  const auto g0 = Half(0.5f, 128), g1 = Half(0.25f, 128), garbage = Half(6e4f, 128);
  ASSERT_THAT(Push(*shard_, {0, 0, 0, 128, 0, DType::kF16}, g0.data()), IsOk());
  ASSERT_THAT(Push(*shard_, {0, 2, 0, 50, 0, DType::kF16}, g0.data()), IsOk());
  ASSERT_THAT(Push(*shard_, {0, 0, 0, 64, 1, DType::kF16}, garbage.data()), IsOk());
  auto in_flight = shard_->BeginPush({0, 2, 0, 50, 1, DType::kF16});
  ASSERT_THAT(in_flight, IsOk());
  auto dropped = shard_->ForgetRank(1);
  ASSERT_THAT(dropped, IsOk());
  EXPECT_EQ(*dropped, 64u);
  // Only [64, 128) is pushed again by rank 1 in chunk 0 at first: what it pushed before must not
  // be there any more (the slot was cleared), so the step is not complete yet.
  ASSERT_THAT(Push(*shard_, {0, 0, 64, 64, 1, DType::kF16}, g1.data()), IsOk());
  ASSERT_THAT(Push(*shard_, {0, 2, 0, 50, 1, DType::kF16}, g1.data()), IsOk());
  EXPECT_EQ(shard_->WaitForGradients(0, 1ms).code(), Code::kDeadlineExceeded);
  ASSERT_THAT(Push(*shard_, {0, 0, 0, 64, 1, DType::kF16}, g1.data()), IsOk());
  std::memcpy(in_flight->destination().data(), garbage.data(), in_flight->destination().size());
  EXPECT_EQ(shard_->FinishPush(std::move(*in_flight), Status::Ok()).code(), Code::kUnavailable);
  ASSERT_THAT(shard_->WaitForGradients(0, 100ms), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].second.sum_squares, 128 * 0.75 * 0.75);
  EXPECT_EQ((*reports)[1].second.sum_squares, 50 * 0.75 * 0.75);
}

}  // namespace
}  // namespace zps::server
