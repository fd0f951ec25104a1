#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "zps/server/checkpoint_catalog.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {
namespace {

TEST(CoordinatorCatalog, GlobalCheckpointCompletesOnlyWhenEveryShardCommitted) {
  TempDir dir;
  CheckpointOptions o;
  o.keep = 2;
  auto cat = CoordinatorCatalog::Open(dir.sub("coord"), o);
  ASSERT_THAT(cat, IsOk());
  auto& c = **cat;
  EXPECT_EQ(c.LatestGlobalComplete().status().code(), Code::kNotFound);
  EXPECT_EQ(*c.RecordShardCheckpoint(10, 0, 3), false);
  EXPECT_EQ(*c.RecordShardCheckpoint(10, 2, 3), false);
  EXPECT_EQ(*c.RecordShardCheckpoint(10, 2, 3), false);  // repeated: harmless
  EXPECT_EQ(c.LatestGlobalComplete().status().code(), Code::kNotFound);
  EXPECT_EQ(*c.RecordShardCheckpoint(10, 1, 3), true);
  EXPECT_EQ(*c.RecordShardCheckpoint(10, 1, 3), false);  // completes exactly once
  EXPECT_EQ(*c.LatestGlobalComplete(), 10);
  EXPECT_EQ(c.RecordShardCheckpoint(20, 3, 3).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c.RecordShardCheckpoint(10, 0, 4).status().code(), Code::kInvalidArgument);
  // 20 partial: the latest complete stays 10.
  EXPECT_EQ(*c.RecordShardCheckpoint(20, 0, 3), false);
  EXPECT_EQ(*c.LatestGlobalComplete(), 10);
  auto all = c.ListGlobal();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_TRUE((*all)[0].complete);
  EXPECT_EQ((*all)[1].committed, std::vector<uint32_t>({0}));

  const std::string placement = "shard0=a:1,shard1=b:2";
  ASSERT_THAT(c.PutPlacement(std::as_bytes(std::span(placement.data(), placement.size()))), IsOk());
  ASSERT_THAT(c.PutStep(21), IsOk());
  cat->reset();
  // Everything survives a restart.
  auto again = CoordinatorCatalog::Open(dir.sub("coord"), o);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*(*again)->GetStep(), 21);
  EXPECT_EQ((*again)->GetPlacement()->size(), placement.size());
  EXPECT_EQ((*again)->GetRegistry().status().code(), Code::kNotFound);
  EXPECT_EQ(*(*again)->LatestGlobalComplete(), 10);
  // Rollback forgets 20; completing 30, 40 and 50 keeps the newest two.
  ASSERT_THAT((*again)->DropGlobalAfter(10), IsOk());
  EXPECT_EQ((*again)->ListGlobal()->size(), 1u);
  for (int64_t step : {30, 40, 50}) {
    for (uint32_t s = 0; s < 3; ++s)
      ASSERT_THAT((*again)->RecordShardCheckpoint(step, s, 3), IsOk());
  }
  all = (*again)->ListGlobal();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].step, 40);
  EXPECT_EQ((*all)[1].step, 50);
}

TEST(CoordinatorCatalog, JobSpecRoundTrip) {
  TempDir dir;
  auto cat = CoordinatorCatalog::Open(dir.sub("coord"), {});
  ASSERT_THAT(cat, IsOk());
  JobSpec spec;
  spec.layout = SmallLayout(2);
  spec.shard.world_size = 2;
  ASSERT_THAT(spec.Validate(), IsOk());
  ASSERT_THAT((*cat)->PutJobSpec(spec), IsOk());
  auto got = (*cat)->GetJobSpec();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->Hash(), spec.Hash());
}

// A job with the optimizer surface (job spec version 2) survives the catalog, after a reopen too:
// a restarted coordinator gives the shards the same groups, frozen set, schedule and accumulation.
TEST(CoordinatorCatalog, JobSpecWithOptimizerSurfaceSurvivesAReopen) {
  TempDir dir;
  JobSpec spec;
  spec.layout = SmallLayout(2);
  spec.shard.world_size = 2;
  spec.shard.serving_dtype = DType::kF32;
  spec.shard.accumulation_steps = 3;
  spec.shard.param_groups = {{2e-3f, 0.05f}, {1e-4f, 0.0f}};
  spec.shard.param_group.assign(spec.layout.num_params(), 1);
  spec.shard.param_group[0] = 0;
  spec.shard.frozen.assign(spec.layout.num_params(), 0);
  spec.shard.frozen.back() = 1;
  spec.shard.lr_schedule.kind = LrScheduleKind::kWarmupDecayLR;
  spec.shard.lr_schedule.total_num_steps = 500;
  spec.shard.lr_schedule.warmup_num_steps = 20;
  ASSERT_THAT(spec.Validate(), IsOk());
  {
    auto cat = CoordinatorCatalog::Open(dir.sub("coord"), {});
    ASSERT_THAT(cat, IsOk());
    ASSERT_THAT((*cat)->PutJobSpec(spec), IsOk());
  }
  auto cat = CoordinatorCatalog::Open(dir.sub("coord"), {});
  ASSERT_THAT(cat, IsOk());
  auto got = (*cat)->GetJobSpec();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->Hash(), spec.Hash());
  EXPECT_EQ(got->Serialize(), spec.Serialize());
  EXPECT_EQ(got->shard.lr_schedule, spec.shard.lr_schedule);
  EXPECT_EQ(got->shard.frozen, spec.shard.frozen);
  EXPECT_EQ(got->shard.param_groups, spec.shard.param_groups);
  EXPECT_EQ(got->shard.accumulation_steps, 3u);
}

}  // namespace
}  // namespace zps::server::testing
