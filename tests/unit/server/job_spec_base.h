// job_spec_base.h — the jobs the JobSpec tests start from: parameters a {100}, b {30} and
// c {7, 9} in chunks of 128 elements (aligned to 64) over 2 shards, world size 2, every other
// field at its default (BaseJobSpec), or with the optimizer-surface fields (those version 2 of
// the encoding added) away from theirs (SurfaceJobSpec).
#pragma once

#include <gtest/gtest.h>

#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {

inline JobSpec BaseJobSpec() {
  auto l = Layout::Build({{"a", {100}}, {"b", {30}}, {"c", {7, 9}}},
                         {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
  EXPECT_THAT(l, IsOk());
  JobSpec j{*l, {}, {}, {}};
  j.shard.world_size = 2;
  return j;
}

inline JobSpec SurfaceJobSpec() {
  JobSpec j = BaseJobSpec();
  j.shard.serving_dtype = DType::kF32;
  j.shard.accumulation_steps = 4;
  j.shard.param_groups = {{1e-3f, 0.01f}, {5e-4f, 0.0f}};
  j.shard.param_group = {0, 1, 1};
  j.shard.frozen = {0, 0, 1};
  j.shard.lr_schedule.kind = LrScheduleKind::kWarmupCosineLR;
  j.shard.lr_schedule.total_num_steps = 1000;
  j.shard.lr_schedule.warmup_num_steps = 50;
  j.shard.lr_schedule.warmup_min_ratio = 0.05;
  j.shard.lr_schedule.cos_min_ratio = 0.001;
  j.shard.lr_schedule.warmup_type = WarmupType::kLinear;
  return j;
}

}  // namespace zps::server::testing
