// ShardState's optimizer surface, in process, against direct computations: fp32 serving copies,
// parameter groups (two groups in one chunk), frozen parameters, the lr schedule, and gradient
// accumulation over k micro-batches (k = 2 equals one push of the sum).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "shard_steps.h"
#include "zps/server/lr_schedule.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

// One shard, one chunk of kN: a = [0, 60), padding [60, 64), b = [64, 104) (the
// last chunk of a layout ends where its last parameter does).
constexpr size_t kN = 104;
Layout TwoParams() {
  auto l = Layout::Build({{"a", {60}}, {"b", {40}}},
                         {.chunk_elems = 128, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  EXPECT_EQ(l->chunk_size(0), kN);
  return *l;
}

std::vector<float> Values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * u(rng);
  return v;
}

using testing::Push;

// Initial values of both parameters (rank 0, micro 0); returns the chunk's master.
std::vector<float> InitTwo(ShardState& s) {
  std::vector<float> master(kN, 0.0f);
  auto v = Values(104, 1, 1.0f);
  std::copy(v.begin(), v.begin() + 60, master.begin());
  std::copy(v.begin() + 64, v.begin() + 104, master.begin() + 64);
  EXPECT_THAT(Push(s, {kInitStep, 0, 0, 60, 0, DType::kF32}, master.data()), IsOk());
  EXPECT_THAT(Push(s, {kInitStep, 0, 64, 40, 0, DType::kF32}, master.data() + 64), IsOk());
  EXPECT_EQ(s.version(), 0);
  return master;
}

std::vector<std::byte> FetchBytes(ShardState& s, uint32_t chunk, uint64_t off, uint64_t n,
                                  int64_t min_version) {
  std::vector<std::byte> out;
  s.Fetch({chunk, off, n, min_version}, [&](const Status& st, int64_t, std::span<const std::byte> d,
                                            std::shared_ptr<const void>) {
    ASSERT_THAT(st, IsOk());
    out.assign(d.begin(), d.end());
  });
  return out;
}

// Direct: the fused optimizer over master[begin, end) with the given lr / weight decay.
void DirectUpdate(const OptimizerConfig& base, float lr, float wd, std::vector<float>& master,
                  std::vector<float>& m, std::vector<float>& v, const std::vector<float>& grad,
                  size_t begin, size_t end, int64_t step, float scale) {
  OptimizerConfig c = base;
  c.lr = lr;
  c.weight_decay = wd;
  auto opt = Optimizer::Create(c, nullptr);
  ASSERT_THAT(opt, IsOk());
  const size_t n = end - begin;
  UpdateParams up;
  up.step = step;
  up.grad_scale = scale;
  ASSERT_TRUE((*opt)
                  ->Update({{master.data() + begin, n},
                            std::as_writable_bytes(std::span<float>(m.data() + begin, n)),
                            std::as_writable_bytes(std::span<float>(v.data() + begin, n))},
                           {grad.data() + begin, DType::kF32, n}, up)
                  .ok());
}

void Commit(ShardState& s, int64_t step, int64_t optimizer_step, float scale, bool skip = false) {
  ASSERT_THAT(s.WaitForGradients(step, std::chrono::milliseconds(1000)), IsOk());
  ASSERT_THAT(s.ReduceStep(step), IsOk());
  ASSERT_THAT(s.ApplyCommit({step, skip, scale, optimizer_step}), IsOk());
}

TEST(ShardStateFp32Serving, ServesTheMasterBitsAfterInitUpdateAndRestore) {
  const Layout layout = TwoParams();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kF32};
  size_t asked = 0;
  std::vector<std::byte> block;
  auto alloc = [&](size_t bytes) -> Result<std::span<std::byte>> {
    asked = bytes;
    block.resize(bytes + 64);
    auto* p = block.data();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return std::span<std::byte>(p, bytes);
  };
  auto s = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, std::nullopt, alloc);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(asked, (kN * 4 + 63) / 64 * 64);  // 4 bytes an element, 64-byte aligned
  const auto master0 = InitTwo(**s);
  auto got = FetchBytes(**s, 0, 10, 50, 0);
  ASSERT_EQ(got.size(), 50u * 4);
  EXPECT_EQ(0, std::memcmp(got.data(), master0.data() + 10, got.size()));
  const auto g = Values(kN, 2, 0.1f);
  ASSERT_THAT(Push(**s, {0, 0, 0, 60, 0, DType::kF32}, g.data()), IsOk());
  ASSERT_THAT(Push(**s, {0, 0, 64, 40, 0, DType::kF32}, g.data() + 64), IsOk());
  Commit(**s, 0, 1, 1.0f);
  auto master1 = (*s)->MasterOf(0);
  ASSERT_THAT(master1, IsOk());
  EXPECT_NE(*master1, master0);
  got = FetchBytes(**s, 0, 0, kN, 1);
  ASSERT_EQ(got.size(), kN * 4);
  EXPECT_EQ(0, std::memcmp(got.data(), master1->data(), got.size()));
  // A restore recomputes the copy from the loaded master.
  const auto loaded = Values(kN, 9, 2.0f);
  ASSERT_TRUE(
      (*s)->ResetTo(
              5,
              [&](uint32_t, std::span<float> ms, std::span<std::byte> m, std::span<std::byte> v) {
                std::copy(loaded.begin(), loaded.end(), ms.begin());
                std::fill(m.begin(), m.end(), std::byte{0});
                std::fill(v.begin(), v.end(), std::byte{0});
                return Status::Ok();
              },
              Unavailable("test"))
          .ok());
  got = FetchBytes(**s, 0, 0, kN, 5);
  EXPECT_EQ(0, std::memcmp(got.data(), loaded.data(), got.size()));
}

// Two groups in one chunk: each run (a with its padding, b with the chunk's tail) gets its own
// lr and weight decay, exactly as a direct update of that range with those values.
TEST(ShardStateGroups, TwoGroupsInOneChunkMatchDirectUpdates) {
  const Layout layout = TwoParams();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  job.param_groups = {{0.01f, 0.1f}, {0.002f, 0.0f}};
  job.param_group = {0, 1};
  OptimizerConfig opt;  // adamw; its lr / weight_decay are not used
  opt.lr = 0.5f;
  auto s = ShardState::Create(layout, 0, job, opt, nullptr);
  ASSERT_THAT(s, IsOk());
  auto master = InitTwo(**s);
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  for (int64_t step = 0; step < 3; ++step) {
    auto g = Values(kN, 10 + static_cast<uint32_t>(step), 0.1f);
    ASSERT_THAT(Push(**s, {step, 0, 0, 60, 0, DType::kF32}, g.data()), IsOk());
    ASSERT_THAT(Push(**s, {step, 0, 64, 40, 0, DType::kF32}, g.data() + 64), IsOk());
    for (size_t i = 60; i < 64; ++i) g[i] = 0.0f;  // padding is never pushed
    for (size_t i = 104; i < kN; ++i) g[i] = 0.0f;
    Commit(**s, step, step + 1, 0.75f);
    DirectUpdate(opt, 0.01f, 0.1f, master, m, v, g, 0, 64, step + 1, 0.75f);
    DirectUpdate(opt, 0.002f, 0.0f, master, m, v, g, 64, kN, step + 1, 0.75f);
    auto got = (*s)->MasterOf(0);
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(0, std::memcmp(got->data(), master.data(), kN * 4)) << "step " << step;
  }
}

// A frozen parameter: fetched as usual, never pushed, not waited for, not in the norm, and its
// master and serving bytes are unchanged by steps.
TEST(ShardStateFrozen, FrozenParameterIsServedButNeverPushedOrUpdated) {
  const Layout layout = TwoParams();
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  job.frozen = {0, 1};  // b frozen
  auto s = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(s, IsOk());
  const auto master0 = InitTwo(**s);
  const auto serving_b0 = FetchBytes(**s, 0, 64, 40, 0);
  ASSERT_EQ(serving_b0.size(), 80u);
  const auto g0 = Values(60, 3, 0.1f), g1 = Values(60, 4, 0.1f);
  EXPECT_EQ(Push(**s, {0, 0, 64, 40, 0, DType::kF32}, g0.data()).code(), Code::kInvalidArgument);
  ASSERT_THAT(Push(**s, {0, 0, 0, 60, 0, DType::kF32}, g0.data()), IsOk());
  ASSERT_THAT(Push(**s, {0, 0, 0, 60, 1, DType::kF32}, g1.data()), IsOk());
  ASSERT_THAT((*s)->WaitForGradients(0, std::chrono::milliseconds(1000)), IsOk());
  auto rep = (*s)->ReduceStep(0);
  ASSERT_THAT(rep, IsOk());
  std::vector<float> sum(kN, 0.0f);
  for (size_t i = 0; i < 60; ++i) sum[i] = g0[i] + g1[i];
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr);
  auto direct = (*opt)->ComputeGradStats({sum.data(), DType::kF32, kN});
  ASSERT_THAT(direct, IsOk());
  EXPECT_EQ((*rep)[0].second.sum_squares, direct->sum_squares);  // b's initial values excluded
  ASSERT_THAT((*s)->ApplyCommit({0, false, 0.5f, 1}), IsOk());
  auto m1 = (*s)->MasterOf(0);
  ASSERT_THAT(m1, IsOk());
  EXPECT_EQ(0, std::memcmp(m1->data() + 64, master0.data() + 64, (kN - 64) * 4));  // b
  EXPECT_NE(0, std::memcmp(m1->data(), master0.data(), 60 * 4));                   // a was trained
  EXPECT_EQ(FetchBytes(**s, 0, 64, 40, 1), serving_b0);
}

// A chunk holding only frozen parameters is complete without any push.
TEST(ShardStateFrozen, AllFrozenChunkNeedsNoPush) {
  const Layout layout = TwoParams();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  job.frozen = {1, 1};
  auto s = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(s, IsOk());
  const auto master0 = InitTwo(**s);
  Commit(**s, 0, 1, 1.0f);
  auto m1 = (*s)->MasterOf(0);
  ASSERT_THAT(m1, IsOk());
  EXPECT_EQ(*m1, master0);
  EXPECT_EQ((*s)->version(), 1);
}

// The schedule's lr at optimizer_step - 1 drives each update; a skipped step changes nothing and
// the next update uses the same optimizer_step the coordinator hands out (not advanced).
TEST(ShardStateSchedule, ScheduledLrPerUpdateMatchesDirectUpdates) {
  const Layout layout = TwoParams();
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  job.lr_schedule.kind = LrScheduleKind::kWarmupCosineLR;
  job.lr_schedule.total_num_steps = 6;
  job.lr_schedule.warmup_num_steps = 2;
  job.lr_schedule.warmup_min_ratio = 0.25;
  job.lr_schedule.warmup_type = WarmupType::kLinear;
  job.param_groups = {{0.01f, 0.0f}, {0.004f, 0.0f}};
  job.param_group = {0, 1};
  OptimizerConfig opt;
  auto s = ShardState::Create(layout, 0, job, opt, nullptr);
  ASSERT_THAT(s, IsOk());
  auto master = InitTwo(**s);
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  const LrSchedule sched(job.lr_schedule);
  int64_t applied = 0;
  for (int64_t step = 0; step < 5; ++step) {
    auto g = Values(kN, 40 + static_cast<uint32_t>(step), 0.1f);
    ASSERT_THAT(Push(**s, {step, 0, 0, 60, 0, DType::kF32}, g.data()), IsOk());
    ASSERT_THAT(Push(**s, {step, 0, 64, 40, 0, DType::kF32}, g.data() + 64), IsOk());
    for (size_t i = 60; i < 64; ++i) g[i] = 0.0f;
    for (size_t i = 104; i < kN; ++i) g[i] = 0.0f;
    const bool skip = step == 2;
    Commit(**s, step, applied + 1, 1.0f, skip);
    if (!skip) {
      // Written out: iteration i = applied - 1; warmup ratio 0.25 + (i / 2) * 0.75, then cosine.
      double ratio = 0.0;
      const int64_t i = applied - 1;
      if (i >= 0 && i < 2) ratio = 0.25 + (static_cast<double>(i) / 2.0) * (1.0 - 0.25);
      if (i >= 2) {
        const double progress = std::min(1.0, static_cast<double>(i - 2 + 1) / 4.0);
        ratio =
            0.0001 + (1.0 - 0.0001) * ((1.0 + std::cos(3.14159265358979323846 * progress)) / 2.0);
      }
      EXPECT_EQ(sched.LrFor(applied, 0.01f),
                static_cast<float>(static_cast<double>(0.01f) * ratio));
      DirectUpdate(opt, sched.LrFor(applied, 0.01f), 0.0f, master, m, v, g, 0, 64, applied + 1,
                   1.0f);
      DirectUpdate(opt, sched.LrFor(applied, 0.004f), 0.0f, master, m, v, g, 64, kN, applied + 1,
                   1.0f);
      ++applied;
    }
    auto got = (*s)->MasterOf(0);
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(0, std::memcmp(got->data(), master.data(), kN * 4)) << "step " << step;
  }
}

// Accumulation: world 2 x k 2, contributors rank * 2 + micro pushed in any order, equals one
// contributor pushing ((g0 + g1) + g2) + g3, bit for bit (server-sum and pre-reduced).
TEST(ShardStateAccumulation, TwoMicroBatchesEqualOnePushOfTheSum) {
  auto l = Layout::Build({{"w", {100}}}, {.chunk_elems = 128, .align_elems = 64, .num_shards = 1});
  ASSERT_THAT(l, IsOk());
  for (ReductionMode mode : {ReductionMode::kServerSum, ReductionMode::kPreReduced}) {
    ShardJob acc_job{mode, 2, DType::kF32, DType::kBF16};
    acc_job.accumulation_steps = 2;
    ShardJob one_job{ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
    auto a = ShardState::Create(*l, 0, acc_job, OptimizerConfig{}, nullptr);
    auto b = ShardState::Create(*l, 0, one_job, OptimizerConfig{}, nullptr);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
    const auto init = Values(100, 5, 1.0f);
    ASSERT_THAT(Push(**a, {kInitStep, 0, 0, 100, 0, DType::kF32}, init.data()), IsOk());
    ASSERT_THAT(Push(**b, {kInitStep, 0, 0, 100, 0, DType::kF32}, init.data()), IsOk());
    std::vector<std::vector<float>> g;
    for (uint32_t c = 0; c < 4; ++c) g.push_back(Values(100, 20 + c, c == 2 ? 1e3f : 0.1f));
    std::vector<float> sum(100);
    for (size_t i = 0; i < 100; ++i) sum[i] = ((g[0][i] + g[1][i]) + g[2][i]) + g[3][i];
    if (mode == ReductionMode::kServerSum) {
      for (uint32_t c : {3u, 1u, 0u, 2u}) {  // arrival order does not matter
        ASSERT_TRUE(
            Push(**a, {0, 0, 0, 100, c, DType::kF32, std::nullopt, c / 2}, g[c].data()).ok());
      }
    } else {
      // Pre-reduced: micro m's slot is g_m0 + g_m1 summed by the workers; rank 0 pushes [0, 50)
      // and rank 1 [50, 100) of each micro-batch. Here micro 0 = g0 + g1, micro 1 = g2 + g3.
      std::vector<float> m0(100), m1(100);
      for (size_t i = 0; i < 100; ++i) {
        m0[i] = g[0][i] + g[1][i];
        m1[i] = g[2][i] + g[3][i];
      }
      ASSERT_TRUE(
          Push(**a, {0, 0, 50, 50, 3, DType::kF32}, m1.data() + 50).ok());       // rank 1 micro 1
      ASSERT_THAT(Push(**a, {0, 0, 0, 50, 0, DType::kF32}, m0.data()), IsOk());  // rank 0 micro 0
      ASSERT_TRUE(
          Push(**a, {0, 0, 50, 50, 2, DType::kF32}, m0.data() + 50).ok());       // rank 1 micro 0
      ASSERT_THAT(Push(**a, {0, 0, 0, 50, 1, DType::kF32}, m1.data()), IsOk());  // rank 0 micro 1
      for (size_t i = 0; i < 100; ++i) sum[i] = m0[i] + m1[i];
    }
    ASSERT_THAT(Push(**b, {0, 0, 0, 100, 0, DType::kF32}, sum.data()), IsOk());
    ASSERT_THAT((*a)->WaitForGradients(0, std::chrono::milliseconds(1000)), IsOk());
    auto ra = (*a)->ReduceStep(0);
    auto rb = (*b)->ReduceStep(0);
    ASSERT_THAT(ra, IsOk());
    ASSERT_THAT(rb, IsOk());
    EXPECT_EQ((*ra)[0].second.sum_squares, (*rb)[0].second.sum_squares);
    ASSERT_THAT((*a)->ApplyCommit({0, false, 0.25f, 1}), IsOk());  // grad_divisor world * k = 4
    ASSERT_THAT((*b)->ApplyCommit({0, false, 0.25f, 1}), IsOk());
    EXPECT_EQ(*(*a)->ChunkCrc(0), *(*b)->ChunkCrc(0));
    EXPECT_EQ(*(*a)->MasterOf(0), *(*b)->MasterOf(0));
  }
}

TEST(ShardStateAccumulation, ContributorIsValidated) {
  auto l = Layout::Build({{"w", {100}}}, {.chunk_elems = 128, .align_elems = 64, .num_shards = 1});
  ASSERT_THAT(l, IsOk());
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  job.accumulation_steps = 2;
  auto s = ShardState::Create(*l, 0, job, OptimizerConfig{}, nullptr);
  ASSERT_THAT(s, IsOk());
  const auto v = Values(100, 1, 1.0f);
  // Initial values use micro 0.
  EXPECT_EQ(Push(**s, {kInitStep, 0, 0, 100, 1, DType::kF32}, v.data()).code(),
            Code::kInvalidArgument);
  ASSERT_THAT(Push(**s, {kInitStep, 0, 0, 100, 0, DType::kF32}, v.data()), IsOk());
  EXPECT_EQ(Push(**s, {0, 0, 0, 100, 4, DType::kF32}, v.data()).code(), Code::kInvalidArgument);
  // Contributor 2 is rank 1's micro 0: rank 0's session may not push it.
  EXPECT_EQ(Push(**s, {0, 0, 0, 100, 2, DType::kF32, std::nullopt, 0}, v.data()).code(),
            Code::kInvalidArgument);
  EXPECT_THAT(Push(**s, {0, 0, 0, 100, 2, DType::kF32, std::nullopt, 1}, v.data()), IsOk());
  EXPECT_EQ(Push(**s, {0, 0, 0, 100, 2, DType::kF32, std::nullopt, 1}, v.data()).code(),
            Code::kAlreadyExists);
  // Three of four contributions: not complete.
  EXPECT_THAT(Push(**s, {0, 0, 0, 100, 0, DType::kF32}, v.data()), IsOk());
  EXPECT_THAT(Push(**s, {0, 0, 0, 100, 1, DType::kF32}, v.data()), IsOk());
  EXPECT_EQ((*s)->WaitForGradients(0, std::chrono::milliseconds(1)).code(),
            Code::kDeadlineExceeded);
  EXPECT_THAT(Push(**s, {0, 0, 0, 100, 3, DType::kF32}, v.data()), IsOk());
  EXPECT_THAT((*s)->WaitForGradients(0, std::chrono::milliseconds(1000)), IsOk());
}

}  // namespace
}  // namespace zps::server
