// job_spec_base.h — the job the JobSpec tests start from: parameters a {100}, b {30} and
// c {7, 9} in chunks of 128 elements (aligned to 64) over 2 shards, world size 2, every other
// field at its default.
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

}  // namespace zps::server::testing
