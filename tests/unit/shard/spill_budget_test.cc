// The spill budget check (zps/common/spill_budget.h) that the launchers run before any shard
// starts must decide exactly what each shard's ChunkStore decides at Create, with the same
// advice: a budget one byte short of the pipeline fails in both with the same message, and the
// smallest budget that holds the pipeline starts a spilling shard.
#include "zps/common/spill_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "zps/server/shard_state.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using zps::testing::SpillDir;

// 2 shards of 8 chunks of at most 1024 elements each (the last one shorter), so that a budget of
// the pipeline's 5 buffers spills.
JobSpec TwoShardJob(OptimizerKind kind, float momentum) {
  auto l = Layout::Build({{"a", {5000}}, {"b", {3, 1000}}, {"c", {7777}}, {"d", {100}}},
                         {.chunk_elems = 1024, .align_elems = 64, .num_shards = 2});
  EXPECT_THAT(l, IsOk());
  JobSpec job{*l, {}, {}, {}};
  job.shard = {ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
  job.optimizer.kind = kind;
  job.optimizer.momentum = momentum;
  return job;
}

// What shard `ordinal` says when it creates its state under `budget`.
Status ShardSays(const JobSpec& job, uint32_t ordinal, uint64_t budget) {
  ChunkStoreOptions so;
  so.memory_budget = budget;
  so.serving_records = false;
  so.spill_dir = SpillDir();
  so.file_prefix = "spill-budget-test-" + std::to_string(::getpid());
  auto s = ShardState::Create(job.layout, ordinal, job.shard, job.optimizer, nullptr, so);
  return s.status();
}

TEST(SpillBudget, LaunchersAndShardsAgreeOnTheLimitAndTheAdvice) {
  struct Case {
    OptimizerKind kind;
    float momentum;
    uint64_t arrays;  // fp32 arrays per element: master + moments
  };
  for (const Case& c : {Case{OptimizerKind::kAdamW, 0.0f, 3}, Case{OptimizerKind::kSgd, 0.9f, 2},
                        Case{OptimizerKind::kSgd, 0.0f, 1}}) {
    SCOPED_TRACE(c.arrays);
    const JobSpec job = TwoShardJob(c.kind, c.momentum);
    const uint64_t record = c.arrays * 1024 * 4;  // the largest chunk's state record
    EXPECT_EQ(StateRecordBytes(job.optimizer, 1024), record);
    const uint64_t pipeline = (kSpillReadAhead + 1 + kSpillWriteBehind) * record;

    const Status launcher = CheckJobMemoryBudget(job, pipeline - 1);
    ASSERT_THAT(launcher, StatusIs(Code::kResourceExhausted));
    const Status shard = ShardSays(job, 0, pipeline - 1);
    ASSERT_THAT(shard, StatusIs(Code::kResourceExhausted));
    // The same advice; each says where it was decided.
    EXPECT_EQ(launcher.message(),
              "shard 0: " + shard.message().substr(shard.message().find("memory_budget")));
    EXPECT_NE(launcher.message().find("raise the budget to at least " + std::to_string(pipeline) +
                                      " bytes"),
              std::string::npos)
        << launcher.message();
    EXPECT_NE(shard.message().find("chunk store: memory_budget"), std::string::npos)
        << shard.message();

    // The smallest budget that holds the pipeline: both start (the shard spills everything).
    EXPECT_THAT(CheckJobMemoryBudget(job, pipeline), IsOk());
    EXPECT_THAT(ShardSays(job, 0, pipeline), IsOk());
    EXPECT_THAT(ShardSays(job, 1, pipeline), IsOk());
  }
}

// Compact moments shrink the state record; the launcher sizes it as the shard's store does.
TEST(SpillBudget, LaunchersAndShardsAgreeForEveryStateDType) {
  for (StateDType dtype : {StateDType::kF32, StateDType::kBF16, StateDType::kInt8}) {
    SCOPED_TRACE(StateDTypeName(dtype));
    // 16 chunks of 8192 elements, 8 a shard: more than the pipeline's 5 buffers, so it spills.
    auto l = Layout::Build({{"w", {16 * 8192}}},
                           {.chunk_elems = 8192, .align_elems = 64, .num_shards = 2});
    ASSERT_THAT(l, IsOk());
    JobSpec job{*l, {}, {}, {}};
    job.shard = {ReductionMode::kServerSum, 1, DType::kF32, DType::kBF16};
    job.optimizer.state_dtype = dtype;
    // 8192 elements: the fp32 master (32 KiB), then m and v, each on a 4 KiB boundary.
    const uint64_t moment = dtype == StateDType::kF32    ? 32768
                            : dtype == StateDType::kBF16 ? 16384
                                                         : 12288;  // 128 blocks of 66 bytes
    const uint64_t record = 32768 + 2 * moment;
    EXPECT_EQ(StateRecordBytes(job.optimizer, 8192), record);
    const uint64_t pipeline = (kSpillReadAhead + 1 + kSpillWriteBehind) * record;
    ASSERT_THAT(CheckJobMemoryBudget(job, pipeline - 1), StatusIs(Code::kResourceExhausted));
    ASSERT_THAT(ShardSays(job, 0, pipeline - 1), StatusIs(Code::kResourceExhausted));
    EXPECT_THAT(CheckJobMemoryBudget(job, pipeline), IsOk());
    EXPECT_THAT(ShardSays(job, 0, pipeline), IsOk());
  }
}

TEST(SpillBudget, NoBudgetOrEverythingResidentNeedsNoPipeline) {
  const JobSpec job = TwoShardJob(OptimizerKind::kAdamW, 0.0f);
  EXPECT_THAT(CheckJobMemoryBudget(job, 0), IsOk());
  // Shard 0 holds 8 records of at most 12 KiB: all resident in 1 MiB.
  EXPECT_THAT(CheckJobMemoryBudget(job, 1 << 20), IsOk());
  EXPECT_THAT(ShardSays(job, 0, 1 << 20), IsOk());
}

}  // namespace
}  // namespace zps::server
