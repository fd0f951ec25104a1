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

#include "zps/common/status.h"

namespace zps::server {

enum class LrScheduleKind : uint8_t {
  kNone = 0,            // each group's own lr, constant
  kWarmupLR = 1,        // DeepSpeed "WarmupLR"
  kWarmupDecayLR = 2,   // DeepSpeed "WarmupDecayLR"
  kWarmupCosineLR = 3,  // DeepSpeed "WarmupCosineLR"
};
enum class WarmupType : uint8_t { kLog = 0, kLinear = 1 };

/// "none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR" (DeepSpeed's scheduler type names).
std::string_view LrScheduleKindName(LrScheduleKind kind);
/// Errors: InvalidArgument for another name.
Result<LrScheduleKind> ParseLrScheduleKind(std::string_view text);
/// "log", "linear". Errors: InvalidArgument for another name.
Result<WarmupType> ParseWarmupType(std::string_view text);

/// The schedule's parameters, DeepSpeed's JSON names. Fields a kind does not use are ignored (but
/// still validated and serialised). Validate() rejects bad values with InvalidArgument naming the
/// field.
struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kNone;  // Default: none
  // WarmupLR, WarmupDecayLR:
  double warmup_min_lr = 0.0;    // Default: 0. Finite, >= 0.
  double warmup_max_lr = 0.001;  // Default: 0.001. Finite, >= 0.
  // All warmup kinds. DeepSpeed uses max(2, warmup_num_steps) (so does zps).
  int64_t warmup_num_steps = 1000;            // Default: 1000. >= 1.
  WarmupType warmup_type = WarmupType::kLog;  // Default: log
  // WarmupDecayLR, WarmupCosineLR:
  int64_t total_num_steps = 0;  // Default: 0 (must be set, >= 1, for those kinds).
  // WarmupCosineLR:
  double warmup_min_ratio = 0.0;  // Default: 0. Finite, >= 0.
  double cos_min_ratio = 0.0001;  // Default: 0.0001. Finite, >= 0.

  Status Validate() const;
  /// The largest factor (absolute lr for WarmupLR/WarmupDecayLR, ratio for WarmupCosineLR, 1 for
  /// none) the schedule can produce: for the AdamW check lr * weight_decay <= 1.
  double MaxValue() const;
  bool operator==(const LrScheduleConfig&) const = default;
};

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
