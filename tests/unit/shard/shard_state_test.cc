#include "zps/server/shard_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "shard_steps.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

// Two parameters over chunks of 128 elements, 2 shards: p0 has 200 elements (chunks 0,1),
// p1 starts at 256 (aligned) with 50 elements (chunk 2). Shard 0 owns chunks 0 and 2.
Layout TestLayout() {
  auto l = Layout::Build({{"p0", {200}}, {"p1", {5, 10}}},
                         {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
  EXPECT_THAT(l, IsOk());
  return *l;
}

class ShardStateTest : public ::testing::Test {
 protected:
  void Make(ReductionMode mode, uint32_t world, DType grad = DType::kF32) {
    ShardJob job{mode, world, grad, DType::kBF16};
    auto s = ShardState::Create(layout_, 0, job, OptimizerConfig{}, nullptr);
    ASSERT_THAT(s, IsOk());
    shard_ = std::move(*s);
  }
  Status Push(const PushRequest& r, const void* data) { return testing::Push(*shard_, r, data); }
  // Initialises the shard-0 chunks: chunk 0 = p0[0..128), chunk 2 = p1.
  void Init() {
    std::vector<float> v(128);
    std::iota(v.begin(), v.end(), 1.0f);
    ASSERT_THAT(Push({kInitStep, 0, 0, 128, 0, DType::kF32}, v.data()), IsOk());
    ASSERT_THAT(Push({kInitStep, 2, 0, 50, 0, DType::kF32}, v.data()), IsOk());
    ASSERT_EQ(shard_->version(), 0);
  }
  Layout layout_ = TestLayout();
  std::unique_ptr<ShardState> shard_;
};

TEST_F(ShardStateTest, InitPublishesVersionZeroAndServesBf16) {
  Make(ReductionMode::kServerSum, 2);
  EXPECT_EQ(shard_->version(), -1);
  Init();
  std::vector<uint16_t> got;
  int64_t version = -5;
  shard_->Fetch({0, 10, 4, 0}, [&](const Status& s, int64_t v, std::span<const std::byte> d,
                                   std::shared_ptr<const void>) {
    ASSERT_THAT(s, IsOk());
    version = v;
    got.resize(d.size() / 2);
    std::memcpy(got.data(), d.data(), d.size());
  });
  EXPECT_EQ(version, 0);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], FloatToBf16(11.0f));
}

// Rank 0 pushes the initial values again when it joins again at step 0 (its step 0 failed
// without a rollback). The copy of an initialised chunk must be received and dropped: the
// state, the step's gradients already pushed, and their coverage stay as they were. Before a
// chunk is complete an overlap is still refused (a new session's hello drops the old one's
// initial pushes first: ForgetRank), and once a chunk is updated, initial values are refused
// with Unavailable: the rank re-joins and learns the step the job is at.
TEST_F(ShardStateTest, InitialValuesPushedAgainAreDropped) {
  Make(ReductionMode::kServerSum, 2);
  std::vector<float> v(128), other(128, -7.0f), g(128, 0.25f);
  std::iota(v.begin(), v.end(), 1.0f);
  ASSERT_THAT(Push({kInitStep, 0, 0, 64, 0, DType::kF32}, v.data()), IsOk());
  EXPECT_EQ(Push({kInitStep, 0, 0, 64, 0, DType::kF32}, other.data()).code(), Code::kAlreadyExists);
  EXPECT_EQ(shard_->version(), -1);
  ASSERT_THAT(Push({kInitStep, 0, 64, 64, 0, DType::kF32}, v.data() + 64), IsOk());
  ASSERT_THAT(Push({kInitStep, 2, 0, 50, 0, DType::kF32}, v.data()), IsOk());
  ASSERT_EQ(shard_->version(), 0);
  auto master = shard_->MasterOf(0);
  ASSERT_THAT(master, IsOk());
  EXPECT_EQ(0, std::memcmp(master->data(), v.data(), 128 * 4));
  // Rank 0 pushed its gradient of step 0 for chunk 0 (slot 0, where initial values land too).
  ASSERT_THAT(Push({0, 0, 0, 128, 0, DType::kF32}, g.data()), IsOk());
  const uint32_t crc = shard_->StateCrc();
  const uint32_t grads = shard_->GradientCrc();
  // It joins again at step 0: every initial value again, with other bits to see them dropped.
  ASSERT_THAT(Push({kInitStep, 0, 0, 128, 0, DType::kF32}, other.data()), IsOk());
  ASSERT_THAT(Push({kInitStep, 2, 0, 50, 0, DType::kF32}, other.data()), IsOk());
  EXPECT_EQ(shard_->StateCrc(), crc);
  EXPECT_EQ(shard_->GradientCrc(), grads);
  // Its gradient of chunk 0 is still the one pushed: pushed again it overlaps.
  EXPECT_EQ(Push({0, 0, 0, 128, 0, DType::kF32}, g.data()).code(), Code::kAlreadyExists);
  ASSERT_THAT(Push({0, 2, 0, 50, 0, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 0, 0, 128, 1, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 50, 1, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  ASSERT_THAT(shard_->ReduceStep(0), IsOk());
  ASSERT_THAT(shard_->ApplyCommit({0, false, 0.5f, 1}), IsOk());
  ASSERT_EQ(shard_->version(), 1);
  // Rank 0 told to start at step 0 while step 0 was being decided: it re-joins (Unavailable).
  EXPECT_EQ(Push({kInitStep, 0, 0, 128, 0, DType::kF32}, v.data()).code(), Code::kUnavailable);
  EXPECT_EQ(shard_->version(), 1);
}

// The serving copies live in the memory the ServingAllocator gave (the server passes a UCX
// region so that workers can Get them), and a failing allocator fails Create.
TEST(ShardStateServingAllocator, ServesFromTheGivenMemory) {
  std::vector<std::byte> block;
  size_t asked = 0;
  auto alloc = [&](size_t bytes) -> Result<std::span<std::byte>> {
    asked = bytes;
    block.resize(bytes + 64);
    auto* p = block.data();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return std::span<std::byte>(p, bytes);
  };
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  auto s =
      ShardState::Create(TestLayout(), 0, job, OptimizerConfig{}, nullptr, std::nullopt, alloc);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(asked, 256u + 128u);  // chunk 0: 128 bf16; chunk 2 (the last): 64 bf16
  std::vector<float> v(128, 2.0f);
  for (auto [chunk, n] : {std::pair<uint32_t, uint64_t>{0, 128}, {2, 50}}) {
    ASSERT_THAT(testing::Push(**s, {kInitStep, chunk, 0, n, 0, DType::kF32}, v.data()), IsOk());
  }
  const std::byte* where = nullptr;
  (*s)->Fetch({2, 1, 4, 0}, [&](const Status& st, int64_t, std::span<const std::byte> d,
                                std::shared_ptr<const void>) {
    ASSERT_THAT(st, IsOk());
    where = d.data();
  });
  ASSERT_NE(where, nullptr);
  EXPECT_GE(where, block.data());
  EXPECT_LT(where, block.data() + block.size());
  uint16_t first;
  std::memcpy(&first, where, 2);
  EXPECT_EQ(first, FloatToBf16(2.0f));

  auto failing = [](size_t) -> Result<std::span<std::byte>> {
    return ResourceExhausted("no region");
  };
  auto f =
      ShardState::Create(TestLayout(), 0, job, OptimizerConfig{}, nullptr, std::nullopt, failing);
  EXPECT_EQ(f.status().code(), Code::kResourceExhausted);
}

TEST_F(ShardStateTest, ServerSumIsRankOrderedAndMatchesDirectOptimizer) {
  Make(ReductionMode::kServerSum, 2);
  Init();
  std::vector<float> g0(128), g1(128);
  for (int i = 0; i < 128; ++i) {
    g0[i] = 1e-3f * static_cast<float>(i) + 0.1f;
    g1[i] = -3e-4f * static_cast<float>(i * i % 17) + 1e8f * (i == 3);
  }
  // Rank 1 arrives first, in two pieces; the sum must still be g0 + g1.
  ASSERT_THAT(Push({0, 0, 64, 64, 1, DType::kF32}, g1.data() + 64), IsOk());
  ASSERT_THAT(Push({0, 0, 0, 64, 1, DType::kF32}, g1.data()), IsOk());
  ASSERT_THAT(Push({0, 0, 0, 128, 0, DType::kF32}, g0.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 50, 0, DType::kF32}, g0.data()), IsOk());
  EXPECT_EQ(shard_->WaitForGradients(0, std::chrono::milliseconds(1)).code(),
            Code::kDeadlineExceeded);
  ASSERT_THAT(Push({0, 2, 0, 50, 1, DType::kF32}, g1.data()), IsOk());
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].first, 0u);
  EXPECT_EQ((*reports)[1].first, 2u);
  ASSERT_THAT(shard_->ApplyCommit({0, false, 0.5f, 1}), IsOk());
  EXPECT_EQ(shard_->version(), 1);

  // The same update done directly.
  std::vector<float> sum(128), master(128), m(128), v(128);
  std::iota(master.begin(), master.end(), 1.0f);
  for (int i = 0; i < 128; ++i) sum[i] = g0[i] + g1[i];
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr);
  ASSERT_THAT(opt, IsOk());
  ASSERT_TRUE((*opt)
                  ->Update({master, std::as_writable_bytes(std::span<float>(m)),
                            std::as_writable_bytes(std::span<float>(v))},
                           {sum.data(), DType::kF32, 128}, {1, 0.5f, DType::kBF16, {}})
                  .ok());
  auto got = shard_->MasterOf(0);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(0, std::memcmp(got->data(), master.data(), 128 * 4));
}

// Rollback fence: a push from before a rollback never reaches the gradient slots, neither one
// that reaches the shard only after it (an old session's: refused before it reserves anything)
// nor one whose transfer was still landing (it writes into a buffer of its own; FinishPush
// refuses it). Without the fence the first takes rank 0's range and the second overwrites the
// new gradient with garbage.
TEST_F(ShardStateTest, RollbackFencesPushesFromBeforeIt) {
  Make(ReductionMode::kServerSum, 2);
  Init();
  const uint64_t old_gen = shard_->epoch();
  auto in_flight = shard_->BeginPush({0, 0, 0, 128, 0, DType::kF32, old_gen});
  ASSERT_THAT(in_flight, IsOk());
  ASSERT_THAT(shard_->ResetTo(-1, {}, Unavailable("rolling back")), IsOk());
  Init();
  const uint64_t gen = shard_->epoch();
  ASSERT_NE(gen, old_gen);
  EXPECT_EQ(shard_->BeginPush({0, 0, 0, 128, 0, DType::kF32, old_gen}).status().code(),
            Code::kUnavailable);
  std::vector<float> g(128, 0.25f);
  for (uint32_t rank : {0u, 1u}) {
    ASSERT_THAT(Push({0, 0, 0, 128, rank, DType::kF32, gen}, g.data()), IsOk());
    ASSERT_THAT(Push({0, 2, 0, 50, rank, DType::kF32, gen}, g.data()), IsOk());
  }
  // The old transfer lands only now, after the new gradients.
  std::memset(in_flight->destination().data(), 0x7f, in_flight->destination().size());
  EXPECT_EQ(shard_->FinishPush(std::move(*in_flight), Status::Ok()).code(), Code::kUnavailable);
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_NEAR((*reports)[0].second.sum_squares, 128 * 0.5 * 0.5, 1e-9);  // rank sum 0.25 + 0.25
  EXPECT_NEAR((*reports)[1].second.sum_squares, 50 * 0.5 * 0.5, 1e-9);
}

// A worker that dies mid-step and restarts (its new session calls ForgetRank): what its old
// process pushed of the step is dropped, so it can push the whole step again; an old transfer
// still landing is refused; the sum is exactly the one without the crash. Without ForgetRank
// the second push of [0, 64) is ALREADY_EXISTS and the step never completes.
TEST_F(ShardStateTest, ForgetRankLetsARestartedRankPushTheStepAgain) {
  Make(ReductionMode::kServerSum, 2);
  Init();
  std::vector<float> g0(128, 0.5f), g1(128, 0.25f), garbage(128, 1e30f);
  ASSERT_THAT(Push({0, 0, 0, 128, 0, DType::kF32}, g0.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 50, 0, DType::kF32}, g0.data()), IsOk());
  // Rank 1's first process: one piece landed (with wrong bits, to see it dropped), one in flight.
  ASSERT_THAT(Push({0, 0, 0, 64, 1, DType::kF32}, garbage.data()), IsOk());
  auto in_flight = shard_->BeginPush({0, 2, 0, 50, 1, DType::kF32});
  ASSERT_THAT(in_flight, IsOk());
  EXPECT_EQ(shard_->MissingRanks(0), std::vector<uint32_t>{1});
  auto dropped = shard_->ForgetRank(1);
  ASSERT_THAT(dropped, IsOk());
  EXPECT_EQ(*dropped, 64u);  // the landed piece; the one in flight had not landed
  // The restarted rank 1 pushes everything again.
  ASSERT_THAT(Push({0, 0, 0, 128, 1, DType::kF32}, g1.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 50, 1, DType::kF32}, g1.data()), IsOk());
  std::memcpy(in_flight->destination().data(), garbage.data(), in_flight->destination().size());
  EXPECT_EQ(shard_->FinishPush(std::move(*in_flight), Status::Ok()).code(), Code::kUnavailable);
  EXPECT_TRUE(shard_->MissingRanks(0).empty());
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].second.sum_squares, 128 * 0.75 * 0.75);
  EXPECT_EQ((*reports)[1].second.sum_squares, 50 * 0.75 * 0.75);
}

// A rank restarted after its old process completed the step (sealed by WaitForGradients): the
// step is not reopened, and its pushes of it again are received and dropped (OK), so the
// restarted rank does not fail on ALREADY_EXISTS; the reduction is unchanged.
TEST_F(ShardStateTest, ForgetRankLeavesASealedStepAlone) {
  Make(ReductionMode::kServerSum, 2);
  Init();
  std::vector<float> g(128, 0.5f), other(128, 7.0f);
  for (uint32_t rank : {0u, 1u}) {
    ASSERT_THAT(Push({0, 0, 0, 128, rank, DType::kF32}, g.data()), IsOk());
    ASSERT_THAT(Push({0, 2, 0, 50, rank, DType::kF32}, g.data()), IsOk());
  }
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  ASSERT_THAT(shard_->ForgetRank(1), IsOk());
  EXPECT_THAT(Push({0, 0, 0, 128, 1, DType::kF32}, other.data()), IsOk());
  auto reports = shard_->ReduceStep(0);
  ASSERT_THAT(reports, IsOk());
  EXPECT_EQ((*reports)[0].second.sum_squares, 128.0);  // (0.5 + 0.5)^2 per element
  // Reduced again (the driver re-reports after its Report call timed out): the same figures,
  // not the slots added a second time.
  auto again = shard_->ReduceStep(0);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ((*again)[0].second.sum_squares, 128.0);
  // Rank 0's initial values are forgotten on a chunk that still waits for them.
  ASSERT_THAT(shard_->ResetTo(-1, {}, Unavailable("rolling back")), IsOk());
  std::vector<float> v(128, 1.0f);
  ASSERT_THAT(Push({kInitStep, 0, 0, 64, 0, DType::kF32}, v.data()), IsOk());
  ASSERT_THAT(shard_->ForgetRank(0), IsOk());
  Init();  // pushes [0, 128) of chunk 0 again: not ALREADY_EXISTS
}

TEST_F(ShardStateTest, BadPushesChangeNothing) {
  Make(ReductionMode::kServerSum, 2, DType::kF16);
  Init();
  std::vector<uint16_t> h(128, FloatToHalf(0.5f));
  ASSERT_THAT(Push({0, 0, 0, 16, 0, DType::kF16}, h.data()), IsOk());
  const uint32_t crc = shard_->StateCrc();
  struct Case {
    PushRequest r;
    Code code;
  } cases[] = {
      {{0, 0, 0, 16, 0, DType::kF32}, Code::kInvalidArgument},       // wrong dtype
      {{0, 0, 0, 16, 2, DType::kF16}, Code::kInvalidArgument},       // rank >= world
      {{0, 0, 0, 0, 0, DType::kF16}, Code::kInvalidArgument},        // empty
      {{0, 1, 0, 16, 0, DType::kF16}, Code::kOutOfRange},            // chunk on shard 1
      {{0, 99, 0, 16, 0, DType::kF16}, Code::kOutOfRange},           // no such chunk
      {{0, 0, 120, 16, 0, DType::kF16}, Code::kOutOfRange},          // past the chunk
      {{0, 2, 40, 20, 0, DType::kF16}, Code::kOutOfRange},           // into padding
      {{-7, 0, 16, 16, 0, DType::kF16}, Code::kFailedPrecondition},  // stale
      {{1, 0, 16, 16, 0, DType::kF16}, Code::kFailedPrecondition},   // future
      {{0, 0, 8, 16, 0, DType::kF16}, Code::kAlreadyExists},         // overlaps rank 0's push
      // (Initial values again at version 0 are dropped: InitialValuesPushedAgainAreDropped.)
  };
  for (const auto& c : cases) {
    Status s = Push(c.r, h.data());
    EXPECT_EQ(s.code(), c.code) << s.ToString() << " chunk " << c.r.chunk << " off " << c.r.offset;
    EXPECT_FALSE(s.message().empty());
  }
  EXPECT_EQ(shard_->StateCrc(), crc);
  // An abandoned transfer releases its range.
  auto t = shard_->BeginPush({0, 0, 16, 16, 0, DType::kF16});
  ASSERT_THAT(t, IsOk());
  ASSERT_THAT(shard_->FinishPush(std::move(*t), Unavailable("peer died")), IsOk());
  EXPECT_THAT(Push({0, 0, 16, 16, 0, DType::kF16}, h.data()), IsOk());
}

TEST_F(ShardStateTest, PreReducedTakesDisjointSlicesFromAnyRank) {
  Make(ReductionMode::kPreReduced, 2);
  Init();
  std::vector<float> g(128, 0.25f);
  ASSERT_THAT(Push({0, 0, 0, 64, 0, DType::kF32}, g.data()), IsOk());
  EXPECT_EQ(Push({0, 0, 32, 64, 1, DType::kF32}, g.data()).code(), Code::kAlreadyExists);
  ASSERT_THAT(Push({0, 0, 64, 64, 1, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 50, 1, DType::kF32}, g.data()), IsOk());
  EXPECT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  auto r = shard_->ReduceStep(0);
  ASSERT_THAT(r, IsOk());
  EXPECT_DOUBLE_EQ((*r)[0].second.sum_squares, 128 * 0.0625);
}

// Pre-reduced: a rank's new session (it restarted, or re-joined in a new worker generation)
// drops everything pushed of the step's incomplete chunks by any rank, since every rank redoes
// the step; a chunk already complete (sealed) keeps its slices and a second copy of them is
// received and dropped. Without the drop, the ranks' second pushes are ALREADY_EXISTS.
TEST_F(ShardStateTest, PreReducedForgetRankDropsTheUnfinishedStep) {
  Make(ReductionMode::kPreReduced, 2);
  Init();
  std::vector<float> g(128, 0.25f), garbage(128, 1e30f);
  ASSERT_THAT(Push({0, 0, 0, 64, 0, DType::kF32}, garbage.data()), IsOk());  // rank 0's slice
  ASSERT_THAT(Push({0, 2, 0, 25, 1, DType::kF32}, garbage.data()), IsOk());  // rank 1's, then dies
  auto dropped = shard_->ForgetRank(1);
  ASSERT_THAT(dropped, IsOk());
  EXPECT_EQ(*dropped, 64u + 25u);  // both ranks' pushes: every rank pushes the step again
  ASSERT_THAT(Push({0, 0, 0, 64, 0, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 0, 64, 64, 1, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 0, 25, 0, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push({0, 2, 25, 25, 1, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(shard_->WaitForGradients(0, std::chrono::milliseconds(100)), IsOk());
  // Sealed: another re-join leaves the step alone, and the redone pushes are dropped.
  auto none = shard_->ForgetRank(0);
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(*none, 0u);
  EXPECT_THAT(Push({0, 0, 0, 64, 0, DType::kF32}, garbage.data()), IsOk());
  auto r = shard_->ReduceStep(0);
  ASSERT_THAT(r, IsOk());
  EXPECT_DOUBLE_EQ((*r)[0].second.sum_squares, 128 * 0.0625);
  EXPECT_DOUBLE_EQ((*r)[1].second.sum_squares, 50 * 0.0625);
}

TEST_F(ShardStateTest, FetchWaitsForTheNextVersionAndFailsOnShutdown) {
  Make(ReductionMode::kServerSum, 1);
  int64_t seen = -2;
  shard_->Fetch({0, 0, 8, 0}, [&](const Status& s, int64_t v, std::span<const std::byte>,
                                  std::shared_ptr<const void>) {
    EXPECT_THAT(s, IsOk());
    seen = v;
  });
  EXPECT_EQ(seen, -2);  // waiting for init
  Init();
  EXPECT_EQ(seen, 0);
  Status far;
  shard_->Fetch({0, 0, 8, 5}, [&](const Status& s, int64_t, std::span<const std::byte>,
                                  std::shared_ptr<const void>) { far = s; });
  EXPECT_EQ(far.code(), Code::kFailedPrecondition);
  Status bad;
  shard_->Fetch({0, 120, 16, 0}, [&](const Status& s, int64_t, std::span<const std::byte>,
                                     std::shared_ptr<const void>) { bad = s; });
  EXPECT_EQ(bad.code(), Code::kOutOfRange);
  Status pending = Status::Ok();
  bool called = false;
  shard_->Fetch({0, 0, 8, 1}, [&](const Status& s, int64_t, std::span<const std::byte>,
                                  std::shared_ptr<const void>) {
    pending = s;
    called = true;
  });
  EXPECT_FALSE(called);
  shard_->Shutdown(Cancelled("stopping"));
  EXPECT_TRUE(called);
  EXPECT_EQ(pending.code(), Code::kCancelled);
}

}  // namespace
}  // namespace zps::server
