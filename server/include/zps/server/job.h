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

  /// Stable binary form, versioned: version 1 when every ShardJob field added in version 2
  /// (accumulation_steps, param_groups, param_group, frozen, lr_schedule) has its default (the
  /// bytes of older builds), else version 2; version 3 (version 2's fields, then update_mode)
  /// when update_mode is not sync. docs/optimizer.md lists the fields.
  std::vector<std::byte> Serialize() const;
  /// Reads versions 1 (new fields at their defaults), 2 and 3, then Validate(). Errors:
  /// InvalidArgument (bad magic, unknown version, a truncated or malformed field, or Validate's).
  static Result<JobSpec> Deserialize(std::span<const std::byte> bytes);
  /// Hash of the serialised form: equal specs, equal hashes, on every process.
  uint64_t Hash() const;
  /// Errors: InvalidArgument naming the field: OptimizerConfig::Validate, ValidateShardJob
  /// (shard_state.h: world_size, serving_dtype, accumulation_steps, param_groups, param_group,
  /// frozen, lr_schedule), CommitConfig::Validate.
  Status Validate() const;
};

}  // namespace zps::server
