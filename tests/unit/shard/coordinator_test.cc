#include "zps/server/coordinator.h"

#include <gtest/gtest.h>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

JobSpec MakeJob(uint32_t world, double clip = 0.0) {
  auto l = Layout::Build({{"w", {300}}}, {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
  EXPECT_THAT(l, IsOk());
  JobSpec j{*l, {}, {}, {}};
  j.shard.world_size = world;
  j.commit.max_grad_norm = clip;
  j.commit.grad_divisor = world;  // average the rank sums
  return j;
}

TEST(Coordinator, JoinValidatesAndReportsDecide) {
  Coordinator c(2);
  JobSpec job = MakeJob(2, 1.0);
  EXPECT_EQ(c.Join(0, job, job.Hash()).status().code(), Code::kUnavailable);  // no shards yet
  ASSERT_THAT(c.RegisterShard(0, "127.0.0.1:7000"), IsOk());
  ASSERT_THAT(c.RegisterShard(1, "127.0.0.1:7001"), IsOk());
  EXPECT_FALSE(c.RegisterShard(2, "x").ok());
  EXPECT_EQ(c.Join(1, std::nullopt, 42).status().code(), Code::kUnavailable);  // before rank 0

  bool got_job = false;
  c.AwaitJob([&](const Result<JobSpec>& j) { got_job = j.ok(); });
  auto j0 = c.Join(0, job, job.Hash());
  ASSERT_THAT(j0, IsOk());
  EXPECT_TRUE(got_job);
  EXPECT_EQ(j0->resume_step, 0);
  EXPECT_EQ(j0->shard_endpoints[1], "127.0.0.1:7001");
  EXPECT_EQ(c.Join(1, std::nullopt, 42).status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(c.Join(1, std::nullopt, job.Hash()), IsOk());
  EXPECT_EQ(c.Join(2, std::nullopt, job.Hash()).status().code(), Code::kInvalidArgument);

  // 3 chunks: 0 and 2 on shard 0, 1 on shard 1. Norm = sqrt(9+16+0)/2 = 2.5 -> clipped to 1.
  Result<CommitInfo> worker = Internal("unset");
  c.AwaitCommit(0, [&](const Result<CommitInfo>& r) { worker = r; });
  Result<CommitInfo> s0 = Internal("unset"), s1 = Internal("unset");
  c.Report(0, 1, {{0, {}}}, [&](const Result<CommitInfo>& r) { s1 = r; });
  EXPECT_EQ(s1.status().code(), Code::kInvalidArgument);  // chunk 0 is not on shard 1
  Result<CommitInfo> s1_first = Internal("unset");
  c.Report(0, 1, {{1, {16.0, false}}}, [&](const Result<CommitInfo>& r) { s1_first = r; });
  EXPECT_FALSE(s1_first.ok());  // still waiting (unset)
  // The shard's long-poll gave up and it reports the same again: it waits too (was
  // ALREADY_EXISTS, which made the shard re-send in a loop); different figures are refused.
  Result<CommitInfo> s1_other = Internal("unset");
  c.Report(0, 1, {{1, {17.0, false}}}, [&](const Result<CommitInfo>& r) { s1_other = r; });
  EXPECT_EQ(s1_other.status().code(), Code::kAlreadyExists);
  c.Report(0, 1, {{1, {16.0, false}}}, [&](const Result<CommitInfo>& r) { s1 = r; });
  EXPECT_FALSE(s1.ok());  // waiting
  c.Report(0, 0, {{0, {9.0, false}}, {2, {0.0, false}}},
           [&](const Result<CommitInfo>& r) { s0 = r; });
  ASSERT_THAT(s0, IsOk());
  ASSERT_THAT(s1, IsOk());
  ASSERT_THAT(s1_first, IsOk());
  ASSERT_THAT(worker, IsOk());
  EXPECT_FALSE(s0->skip);
  EXPECT_DOUBLE_EQ(s0->global_norm, 2.5);
  EXPECT_FLOAT_EQ(s0->grad_scale, static_cast<float>(0.5 * (1.0 / (2.5 + 1e-6))));
  EXPECT_EQ(s0->optimizer_step, 1);
  EXPECT_EQ(c.step(), 1);
  // History answers late askers; the future is refused.
  bool again = false;
  c.AwaitCommit(0, [&](const Result<CommitInfo>& r) { again = r.ok() && r->step == 0; });
  EXPECT_TRUE(again);
  Status ahead;
  c.AwaitCommit(5, [&](const Result<CommitInfo>& r) { ahead = r.status(); });
  EXPECT_EQ(ahead.code(), Code::kFailedPrecondition);
}

// Pre-reduced: a rank joining again (restarted, or re-joining after an error) starts a new
// worker generation: the kv generation moves on, waiting workers get UNAVAILABLE, a session of
// the older generation is refused at AwaitCommit, and the ranks that join next (at the same
// step) form the new generation. Server-sum re-joins change nothing for the other ranks.
TEST(Coordinator, PreReducedRejoinStartsAWorkerGeneration) {
  for (ReductionMode mode : {ReductionMode::kPreReduced, ReductionMode::kServerSum}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const bool pre = mode == ReductionMode::kPreReduced;
    Coordinator c(2);
    JobSpec job = MakeJob(2);
    job.shard.mode = mode;
    ASSERT_THAT(c.RegisterShard(0, "a:1"), IsOk());
    ASSERT_THAT(c.RegisterShard(1, "b:1"), IsOk());
    ASSERT_THAT(c.Join(0, job, job.Hash(), /*session=*/10), IsOk());
    ASSERT_THAT(c.Join(1, std::nullopt, job.Hash(), 11), IsOk());
    const uint64_t g0 = c.kv_generation();
    EXPECT_EQ(g0 >> 32, c.epoch() + 1);
    Result<CommitInfo> waiting = Internal("unset");
    c.AwaitCommit(
        0, [&](const Result<CommitInfo>& r) { waiting = r; }, 10);
    EXPECT_EQ(waiting.status().code(), Code::kInternal);  // still waiting
    // Rank 1's process restarts and joins again.
    auto again = c.Join(1, std::nullopt, job.Hash(), 12);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(again->resume_step, 0);
    if (!pre) {
      EXPECT_EQ(c.kv_generation(), g0);
      EXPECT_EQ(waiting.status().code(), Code::kInternal);  // rank 0 only waits
      continue;
    }
    EXPECT_EQ(c.kv_generation(), g0 + 1);
    EXPECT_EQ(waiting.status().code(), Code::kUnavailable);
    EXPECT_NE(waiting.status().message().find("rank 1 re-joined the job at step 0"),
              std::string::npos)
        << waiting.status().ToString();
    // Rank 0's old session is of the older generation: refused at once.
    Status old_session;
    c.AwaitCommit(
        0, [&](const Result<CommitInfo>& r) { old_session = r.status(); }, 10);
    EXPECT_EQ(old_session.code(), Code::kUnavailable);
    EXPECT_NE(old_session.message().find("older worker generation"), std::string::npos);
    // Rank 0 re-joins: a member of the new generation, no further regrouping; the new
    // session waits for the decision, which every waiter of the step gets.
    ASSERT_THAT(c.Join(0, job, job.Hash(), 13), IsOk());
    EXPECT_EQ(c.kv_generation(), g0 + 1);
    Result<CommitInfo> r0 = Internal("unset"), r1 = Internal("unset");
    c.AwaitCommit(
        0, [&](const Result<CommitInfo>& r) { r0 = r; }, 13);
    c.AwaitCommit(
        0, [&](const Result<CommitInfo>& r) { r1 = r; }, 12);
    c.Report(0, 1, {{1, {1.0, false}}}, [](const Result<CommitInfo>&) {});
    c.Report(0, 0, {{0, {1.0, false}}, {2, {1.0, false}}}, [](const Result<CommitInfo>&) {});
    EXPECT_TRUE(r0.ok() && r1.ok()) << r0.status().ToString() << r1.status().ToString();
    EXPECT_EQ(c.step(), 1);
    // A rank joining a generation still forming at an older step starts another one, so the
    // members of a generation always resume at the same step.
    ASSERT_THAT(c.Join(1, std::nullopt, job.Hash(), 14), IsOk());  // again: regroup at step 1
    EXPECT_EQ(c.kv_generation(), g0 + 2);
    c.Report(1, 1, {{1, {1.0, false}}}, [](const Result<CommitInfo>&) {});  // sealed before
    c.Report(1, 0, {{0, {1.0, false}}, {2, {1.0, false}}}, [](const Result<CommitInfo>&) {});
    ASSERT_EQ(c.step(), 2);
    auto late = c.Join(0, job, job.Hash(), 15);  // not a member, but step 1 is decided
    ASSERT_THAT(late, IsOk());
    EXPECT_EQ(late->resume_step, 2);
    EXPECT_EQ(c.kv_generation(), g0 + 3);
    Status stale;  // rank 1's session of generation g0 + 2 (at step 1)
    c.AwaitCommit(
        2, [&](const Result<CommitInfo>& r) { stale = r.status(); }, 14);
    EXPECT_EQ(stale.code(), Code::kUnavailable);
  }
}

TEST(Coordinator, OverflowSkipsAndLowersTheScale) {
  Coordinator c(2);
  JobSpec job = MakeJob(1);
  job.commit.dynamic_loss_scale = true;
  job.commit.initial_loss_scale = 1024;
  ASSERT_THAT(c.RegisterShard(0, "a:1"), IsOk());
  ASSERT_THAT(c.RegisterShard(1, "b:1"), IsOk());
  ASSERT_THAT(c.Join(0, job, job.Hash()), IsOk());
  Result<CommitInfo> r = Internal("unset");
  c.Report(0, 1, {{1, {1.0, true}}}, [](const Result<CommitInfo>&) {});
  c.Report(0, 0, {{0, {1.0, false}}, {2, {1.0, false}}},
           [&](const Result<CommitInfo>& x) { r = x; });
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->skip);
  EXPECT_EQ(r->optimizer_step, 0);
  EXPECT_DOUBLE_EQ(r->loss_scale, 1024);
  EXPECT_DOUBLE_EQ(r->next_loss_scale, 512);
  Status stale;
  c.Report(0, 0, {{0, {}}}, [&](const Result<CommitInfo>& x) { stale = x.status(); });
  EXPECT_EQ(stale.code(), Code::kFailedPrecondition);
}

msg::CheckpointReport Listing(uint32_t ordinal, std::vector<int64_t> steps) {
  msg::CheckpointReport r;
  r.ordinal = ordinal;
  r.steps = std::move(steps);
  return r;
}

// Recovery: the target is the newest step every shard lists; a shard that then finds it
// unloadable lists it no more, and the coordinator picks again (a new epoch). Decisions carry the
// newest complete checkpoint, which shards must not garbage-collect.
TEST(Coordinator, ShardThatCannotLoadTheTargetMakesItPickAnOlderOne) {
  Coordinator c(2);
  JobSpec job = MakeJob(1);
  ASSERT_THAT(c.RegisterShard(0, "a:1"), IsOk());
  ASSERT_THAT(c.RegisterShard(1, "b:1"), IsOk());
  ASSERT_THAT(c.Join(0, job, job.Hash()), IsOk());
  ASSERT_THAT(c.ReportCheckpoints(Listing(0, {5, 10})), IsOk());
  ASSERT_THAT(c.ReportCheckpoints(Listing(1, {5})), IsOk());  // 10 failed on shard 1
  Result<CommitInfo> d = Internal("unset");
  c.Report(0, 1, {{1, {1.0, false}}}, [](const Result<CommitInfo>&) {});
  c.Report(0, 0, {{0, {1.0, false}}, {2, {1.0, false}}},
           [&](const Result<CommitInfo>& x) { d = x; });
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->protect_checkpoint, 5);

  ASSERT_THAT(c.ReportCheckpoints(Listing(1, {5, 10})), IsOk());
  c.ShardLost(1, 0);
  ASSERT_THAT(c.RegisterShard(1, "b:1"), IsOk());
  ASSERT_THAT(c.ReportCheckpoints(Listing(1, {5, 10})), IsOk());
  auto r = c.ShardSync({0, c.epoch(), false, {}});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->phase, msg::JobPhase::kRecovering);
  EXPECT_EQ(r->target_step, 10);
  const uint64_t first = r->epoch;
  // Shard 0 meets DataLoss in checkpoint 10 and lists it no more.
  ASSERT_THAT(c.ReportCheckpoints(Listing(0, {5})), IsOk());
  r = c.ShardSync({0, first, false, {}});
  ASSERT_THAT(r, IsOk());
  EXPECT_GT(r->epoch, first);
  EXPECT_EQ(r->target_step, 5);
  for (uint32_t s : {0u, 1u}) {
    r = c.ShardSync({s, r->epoch, true, {5, 1.0, 0, 5}});
    ASSERT_THAT(r, IsOk());
  }
  EXPECT_EQ(r->phase, msg::JobPhase::kRunning);
  EXPECT_EQ(c.step(), 5);
}

TEST(Coordinator, ShutdownFailsWaiters) {
  Coordinator c(1);
  Status s;
  c.AwaitJob([&](const Result<JobSpec>& j) { s = j.status(); });
  c.Shutdown(Cancelled("bye"));
  EXPECT_EQ(s.code(), Code::kCancelled);
}

}  // namespace
}  // namespace zps::server
