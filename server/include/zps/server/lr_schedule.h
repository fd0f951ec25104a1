// zps/server/lr_schedule.h — the learning-rate schedules the shards compute each step, with
// DeepSpeed's names, parameters and step convention (docs/optimizer.md "Learning-rate
// schedules" has the exact formulas).
//
// Step index: the lr of an optimizer update depends only on `applied`, the number of updates
// applied before it (CommitOrder::optimizer_step - 1). Skipped (fp16 overflow) steps do not count,
// as DeepSpeed does not step its scheduler on overflow. DeepSpeed builds the scheduler with
// last_batch_iteration = -1 (which sets the initial lr) and steps it after every applied update,
// so update number `applied` runs with the scheduler at iteration i = applied - 1.
// Because `applied` is the checkpointed optimizer step, a resumed job continues exactly.
//
// WarmupLR and WarmupDecayLR give an ABSOLUTE lr: every group gets the same scheduled value (its
// own lr is ignored), as DeepSpeed sets every param group's lr. WarmupCosineLR gives a RATIO that
// multiplies each group's base lr. Values are computed in double and cast to float once.
//
// Thread-safety: value types; LrSchedule is immutable.
#pragma once

#include <cstdint>
#include <string_view>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"

namespace zps::server {

// LrScheduleKind, WarmupType and LrScheduleConfig (the schedule's parameters) are part of the
// job spec: zps/common/job_spec.h.

class LrSchedule {
 public:
  /// `config` must be valid (Validate()); an invalid one behaves as kNone.
  explicit LrSchedule(const LrScheduleConfig& config);

  const LrScheduleConfig& config() const { return config_; }
  /// The lr, in double, of the update that has `applied` (>= 0) updates before it, for a group
  /// whose own lr is `base_lr`.
  double LrAt(int64_t applied, double base_lr) const;
  /// LrAt cast to float once: what the fused optimizer uses.
  float LrFor(int64_t applied, float base_lr) const {
    return static_cast<float>(LrAt(applied, static_cast<double>(base_lr)));
  }
  /// DeepSpeed's scheduler value at iteration `i` (>= -1): the gamma-interpolated lr for
  /// WarmupLR/WarmupDecayLR, the ratio for WarmupCosineLR (1 for none).
  double ValueAtIteration(int64_t i) const;

 private:
  LrScheduleConfig config_;
};

}  // namespace zps::server
