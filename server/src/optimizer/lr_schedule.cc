// LrSchedule: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR (deepspeed/runtime/
// lr_schedules.py), transcribed operation for operation in double so that a Python LambdaLR with
// the formulas of docs/optimizer.md gives the same doubles.
#include "zps/server/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace zps::server {

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  if (!config_.Validate().ok()) config_ = LrScheduleConfig{};
}

double LrSchedule::ValueAtIteration(int64_t i) const {
  const LrScheduleConfig& c = config_;
  if (c.kind == LrScheduleKind::kNone) return 1.0;
  const int64_t w = std::max<int64_t>(2, c.warmup_num_steps);
  const double wd = static_cast<double>(w);
  const double id = static_cast<double>(i);
  // Warmup progress in [0, 1): DeepSpeed's gamma (WarmupLR) or raw ratio (WarmupCosineLR).
  auto warm = [&]() -> double {
    if (c.warmup_type == WarmupType::kLog) return (1.0 / std::log(wd)) * std::log(id + 1.0);
    return id / wd;
  };
  if (c.kind == LrScheduleKind::kWarmupCosineLR) {
    if (i < 0) return 0.0;  // DeepSpeed's get_lr before the first scheduler step
    if (i < w) return c.warmup_min_ratio + warm() * (1.0 - c.warmup_min_ratio);
    const double real_last = static_cast<double>(i - w + 1);
    const double real_total = static_cast<double>(std::max<int64_t>(1, c.total_num_steps - w));
    const double progress = std::min(1.0, real_last / real_total);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
  }
  // WarmupLR / WarmupDecayLR: min_lr + delta_lr * gamma.
  if (i < 0) return c.warmup_min_lr;  // get_lr before the first step returns min_lrs
  double gamma = 1.0;
  if (i < w) {
    gamma = warm();
  } else if (c.kind == LrScheduleKind::kWarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(c.total_num_steps - i) /
                              std::max(1.0, static_cast<double>(c.total_num_steps - w)));
  }
  return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
}

double LrSchedule::LrAt(int64_t applied, double base_lr) const {
  switch (config_.kind) {
    case LrScheduleKind::kNone:
      return base_lr;
    case LrScheduleKind::kWarmupLR:
    case LrScheduleKind::kWarmupDecayLR:
      return ValueAtIteration(applied - 1);
    case LrScheduleKind::kWarmupCosineLR:
      return base_lr * ValueAtIteration(applied - 1);
  }
  return base_lr;
}

}  // namespace zps::server
