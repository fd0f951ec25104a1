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

#include "zps/common/grad_quant.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

// 1 shard, chunks of 4096 elements: parameters across chunks (pieces shorter than a block and
// longer than one), padding, a frozen one (c).
Layout QuantLayout() {
  auto l = Layout::Build({{"a", {5000}}, {"b", {3, 300}}, {"c", {700}}, {"d", {10}}, {"e", {6100}}},
                         {.chunk_elems = 4096, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

struct Case {
  DType dtype;
  ReductionMode mode;
  uint32_t world;
  uint32_t accum;
  UpdateMode update;
  std::string Name() const {
    return std::string(dtype == DType::kI8Block ? "int8" : "int4") + "_" +
           (mode == ReductionMode::kServerSum ? "sum" : "prereduced") + "_w" +
           std::to_string(world) + "_k" + std::to_string(accum) + "_" +
           (update == UpdateMode::kSync ? "sync" : "speculative");
  }
};

ShardJob Job(const Case& c, DType grad) {
  ShardJob job{c.mode, c.world, grad, DType::kBF16};
  job.accumulation_steps = c.accum;
  job.frozen = {0, 0, 1, 0, 0};
  job.update_mode = c.update;
  return job;
}

uint32_t Slots(const Case& c) {
  return (c.mode == ReductionMode::kServerSum ? c.world : 1) * c.accum;
}

Status Push(ShardState& s, const PushRequest& r, const void* data) {
  ZPS_ASSIGN_OR_RETURN(PushTicket t, s.BeginPush(r));
  if (t.destination().size() != PushBytes(r.dtype, r.length)) {
    return Internal("destination of " + std::to_string(t.destination().size()) + " bytes");
  }
  std::memcpy(t.destination().data(), data, t.destination().size());
  return s.FinishPush(std::move(t), Status::Ok());
}

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
  auto qa = ShardState::Create(layout, 0, Job(c, c.dtype), opt, nullptr);
  auto qb = ShardState::Create(layout, 0, Job(c, c.dtype), opt, nullptr);
  auto full = ShardState::Create(layout, 0, Job(c, DType::kF32), opt, nullptr);
  ASSERT_TRUE(qa.ok() && qb.ok() && full.ok());
  ShardState& a = **qa;  // pushes arrive in one order
  ShardState& b = **qb;  // and in the reverse one
  ShardState& f = **full;
  std::mt19937 rng(11);
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      std::vector<float> v(piece.length);
      std::normal_distribution<float> dist(0.0f, 0.5f);
      for (auto& x : v) x = dist(rng);
      for (ShardState* s : {&a, &b, &f}) {
        ASSERT_THAT(
            Push(*s, {kInitStep, piece.chunk, piece.chunk_offset, piece.length, 0, DType::kF32},
                 v.data()),
            IsOk());
      }
    }
  }
  const double divisor = static_cast<double>(c.world) * c.accum;
  int64_t applied = 0;
  auto order_for = [&](int64_t step) {
    return CommitOrder{step, false, StepCommit::UnclippedScale(1.0, divisor), applied + 1};
  };
  for (ShardState* s : {&a, &b, &f}) s->ArmSpeculation(order_for(0));
  for (int64_t step = 0; step < 4; ++step) {
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    std::vector<Pushed> pushes;
    for (uint32_t p = 0; p < layout.num_params(); ++p) {
      if (p == 2) continue;  // frozen: never pushed
      auto pieces = layout.Pieces(p);
      ASSERT_THAT(pieces, IsOk());
      for (const Piece& piece : *pieces) {
        for (uint32_t slot = 0; slot < Slots(c); ++slot) {
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
    for (uint32_t id : a.chunk_ids()) {
      auto ca = a.ChunkCrc(id);
      auto cb = b.ChunkCrc(id);
      auto cf = f.ChunkCrc(id);
      ASSERT_TRUE(ca.ok() && cb.ok() && cf.ok());
      EXPECT_EQ(*ca, *cf) << "chunk " << id << " after step " << step;
      EXPECT_EQ(*cb, *cf) << "chunk " << id << " after step " << step << " (reverse arrival)";
    }
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
  auto s = ShardState::Create(layout, 0, Job(c, c.dtype), OptimizerConfig{}, nullptr);
  ASSERT_THAT(s, IsOk());
  EXPECT_THAT((*s)->BeginPush({0, 0, 0, 64, 0, DType::kI4Block}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT((*s)->BeginPush({0, 0, 0, 64, 0, DType::kBF16}), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::server
