// Block-quantized gradient slots (grad_dtype int8 / int4 blocks): each push piece lands encoded
// and Reduce dequantizes the slots into fp32 in contributor order. The result must not depend on
// the order pushes arrive in, and must equal, bit for bit, an fp32 job fed the dequantized values
// (the same values summed in the same order): reports, master, m, v and serving copy, in
// server-sum and pre-reduced mode, with accumulation, a frozen parameter and speculative updates.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>

#include "grad_slot_fixture.h"
#include "zps/common/grad_quant.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

using namespace testing;  // grad_slot_fixture.h
using Case = GradSlotCase;

// Chunks of 4096 elements: pieces shorter than a block and longer than one.
Layout QuantLayout() { return GradSlotLayout(5000, 6100, 4096); }

// One push: where it goes and its bytes in both forms.
struct Pushed {
  PushRequest q, f;
  std::vector<std::byte> encoded;
  std::vector<float> dequantized;
};

class ShardStateQuantizedGrads : public ::testing::TestWithParam<Case> {};

TEST_P(ShardStateQuantizedGrads, OrderIndependentAndEqualToFp32OfTheDequantizedValues) {
  const Case c = GetParam();
  const Layout layout = QuantLayout();
  const QuantFormat fmt = GradQuantFormat(c.dtype);
  OptimizerConfig opt;  // AdamW with bias correction
  auto qa = ShardState::Create(layout, 0, GradSlotJob(c, c.dtype), opt, nullptr);
  auto qb = ShardState::Create(layout, 0, GradSlotJob(c, c.dtype), opt, nullptr);
  auto full = ShardState::Create(layout, 0, GradSlotJob(c, DType::kF32), opt, nullptr);
  ASSERT_TRUE(qa.ok() && qb.ok() && full.ok());
  ShardState& a = **qa;  // pushes arrive in one order
  ShardState& b = **qb;  // and in the reverse one
  ShardState& f = **full;
  std::mt19937 rng(11);
  ASSERT_THAT(PushInitialValues(layout, rng, {&a, &b, &f}), IsOk());
  const double divisor = static_cast<double>(c.world) * c.accum;
  int64_t applied = 0;
  auto order_for = [&](int64_t step) {
    return CommitOrder{step, false, StepCommit::UnclippedScale(1.0, divisor), applied + 1};
  };
  for (ShardState* s : {&a, &b, &f}) s->ArmSpeculation(order_for(0));
  for (int64_t step = 0; step < 4; ++step) {
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    std::vector<Pushed> pushes;
    for (const auto& [p, piece] : TrainedPieces(layout)) {
      for (uint32_t slot = 0; slot < GradSlots(c); ++slot) {
        Pushed u;
        std::vector<float> x(piece.length);
        for (auto& v : x) v = dist(rng) * static_cast<float>(1 + slot);
        u.encoded.resize(PushBytes(c.dtype, piece.length));
        QuantizeBlocks(fmt, x, u.encoded);
        u.dequantized.resize(piece.length);
        DequantizeBlocks(fmt, u.encoded, u.dequantized);
        // Server-sum: contributor `slot`; pre-reduced: rank 0, micro-batch `slot`.
        u.q = {step, piece.chunk, piece.chunk_offset, piece.length, slot, c.dtype};
        u.f = {step, piece.chunk, piece.chunk_offset, piece.length, slot, DType::kF32};
        pushes.push_back(std::move(u));
      }
    }
    for (const Pushed& u : pushes) {
      ASSERT_THAT(Push(a, u.q, u.encoded.data()), IsOk());
      ASSERT_THAT(Push(f, u.f, u.dequantized.data()), IsOk());
    }
    for (auto it = pushes.rbegin(); it != pushes.rend(); ++it) {
      ASSERT_THAT(Push(b, it->q, it->encoded.data()), IsOk());
    }
    for (ShardState* s : {&a, &b, &f}) ASSERT_THAT(s->WaitForGradients(step, 2000ms), IsOk());
    auto ra = a.ReduceStep(step);
    auto rb = b.ReduceStep(step);
    auto rf = f.ReduceStep(step);
    ASSERT_TRUE(ra.ok() && rb.ok() && rf.ok());
    ASSERT_EQ(ra->size(), rf->size());
    ASSERT_EQ(rb->size(), rf->size());
    for (size_t i = 0; i < ra->size(); ++i) {
      EXPECT_EQ((*ra)[i].second.sum_squares, (*rf)[i].second.sum_squares)
          << "chunk " << (*ra)[i].first << " step " << step;
      EXPECT_EQ((*rb)[i].second.sum_squares, (*rf)[i].second.sum_squares)
          << "chunk " << (*rb)[i].first << " step " << step << " (reverse arrival)";
    }
    const CommitOrder order = order_for(step);
    ++applied;
    for (ShardState* s : {&a, &b, &f})
      ASSERT_THAT(s->ApplyCommit(order, order_for(step + 1)), IsOk());
    ExpectSameChunkCrcs(a, f, "after step " + std::to_string(step));
    ExpectSameChunkCrcs(b, f, "after step " + std::to_string(step) + " (reverse arrival)");
    EXPECT_EQ(a.StateCrc(), b.StateCrc()) << "after step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, ShardStateQuantizedGrads,
    ::testing::Values(Case{DType::kI8Block, ReductionMode::kServerSum, 1, 1, UpdateMode::kSync},
                      Case{DType::kI4Block, ReductionMode::kServerSum, 3, 1, UpdateMode::kSync},
                      Case{DType::kI8Block, ReductionMode::kServerSum, 2, 2, UpdateMode::kSync},
                      Case{DType::kI4Block, ReductionMode::kPreReduced, 1, 3, UpdateMode::kSync},
                      Case{DType::kI8Block, ReductionMode::kServerSum, 3, 1,
                           UpdateMode::kSpeculative}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.Name(); });

TEST(ShardStateQuantizedGradsWire, ADestinationOfTheWrongDtypeIsRefused) {
  const Layout layout = QuantLayout();
  Case c{DType::kI8Block, ReductionMode::kServerSum, 1, 1, UpdateMode::kSync};
  auto s = ShardState::Create(layout, 0, GradSlotJob(c, c.dtype), OptimizerConfig{}, nullptr);
  ASSERT_THAT(s, IsOk());
  EXPECT_THAT((*s)->BeginPush({0, 0, 0, 64, 0, DType::kI4Block}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT((*s)->BeginPush({0, 0, 0, 64, 0, DType::kBF16}), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::server
