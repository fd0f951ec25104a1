// zps/server/job.h — the job description rank 0 registers with the coordinator, which every
// other rank and every shard must agree with (checked through Hash()).
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/server/optimizer.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"

namespace zps::server {

struct JobSpec {
  Layout layout;
  ShardJob shard;
  OptimizerConfig optimizer;
  CommitConfig commit;

  /// Stable binary form; Deserialize validates every field (layout, dtypes, configs).
  std::vector<std::byte> Serialize() const;
  static Result<JobSpec> Deserialize(std::span<const std::byte> bytes);
  /// Hash of the serialised form: equal specs, equal hashes, on every process.
  uint64_t Hash() const;
  /// Errors: InvalidArgument when the parts disagree (e.g. the layout's num_shards).
  Status Validate() const;
};

}  // namespace zps::server
