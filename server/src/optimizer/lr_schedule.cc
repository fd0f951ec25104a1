// LrSchedule: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR (deepspeed/runtime/
// lr_schedules.py), transcribed operation for operation in double so that a Python LambdaLR with
// the formulas of docs/optimizer.md gives the same doubles.
#include "zps/server/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace zps::server {

std::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kNone:
      return "none";
    case LrScheduleKind::kWarmupLR:
      return "WarmupLR";
    case LrScheduleKind::kWarmupDecayLR:
      return "WarmupDecayLR";
    case LrScheduleKind::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "unknown";
}

Result<LrScheduleKind> ParseLrScheduleKind(std::string_view text) {
  if (text == "none") return LrScheduleKind::kNone;
  if (text == "WarmupLR") return LrScheduleKind::kWarmupLR;
  if (text == "WarmupDecayLR") return LrScheduleKind::kWarmupDecayLR;
  if (text == "WarmupCosineLR") return LrScheduleKind::kWarmupCosineLR;
  return InvalidArgument(
      "lr schedule must be none, WarmupLR, WarmupDecayLR or WarmupCosineLR; got '" +
      std::string(text) + "'");
}

Result<WarmupType> ParseWarmupType(std::string_view text) {
  if (text == "log") return WarmupType::kLog;
  if (text == "linear") return WarmupType::kLinear;
  return InvalidArgument("lr schedule: warmup_type must be log or linear; got '" +
                         std::string(text) + "'");
}

namespace {
Status Bad(std::string_view field, std::string_view rule) {
  return InvalidArgument("lr schedule: " + std::string(field) + " " + std::string(rule));
}
bool NonNegFinite(double x) { return std::isfinite(x) && x >= 0.0; }
}  // namespace

Status LrScheduleConfig::Validate() const {
  if (static_cast<uint8_t>(kind) > static_cast<uint8_t>(LrScheduleKind::kWarmupCosineLR)) {
    return Bad("kind", "is unknown (" + std::to_string(static_cast<int>(kind)) + ")");
  }
  if (static_cast<uint8_t>(warmup_type) > static_cast<uint8_t>(WarmupType::kLinear)) {
    return Bad("warmup_type", "must be log or linear");
  }
  if (!NonNegFinite(warmup_min_lr)) return Bad("warmup_min_lr", "must be finite and >= 0");
  if (!NonNegFinite(warmup_max_lr)) return Bad("warmup_max_lr", "must be finite and >= 0");
  if (!NonNegFinite(warmup_min_ratio)) return Bad("warmup_min_ratio", "must be finite and >= 0");
  if (!NonNegFinite(cos_min_ratio)) return Bad("cos_min_ratio", "must be finite and >= 0");
  if (warmup_num_steps < 1) {
    return Bad("warmup_num_steps", "must be >= 1, got " + std::to_string(warmup_num_steps));
  }
  if ((kind == LrScheduleKind::kWarmupDecayLR || kind == LrScheduleKind::kWarmupCosineLR) &&
      total_num_steps < 1) {
    return Bad("total_num_steps", "must be >= 1 for " + std::string(LrScheduleKindName(kind)) +
                                      ", got " + std::to_string(total_num_steps));
  }
  if (total_num_steps < 0) return Bad("total_num_steps", "must be >= 0");
  return Status::Ok();
}

double LrScheduleConfig::MaxValue() const {
  switch (kind) {
    case LrScheduleKind::kNone:
      return 1.0;
    case LrScheduleKind::kWarmupLR:
    case LrScheduleKind::kWarmupDecayLR:
      return std::max(warmup_min_lr, warmup_max_lr);
    case LrScheduleKind::kWarmupCosineLR:
      return std::max({1.0, warmup_min_ratio, cos_min_ratio});
  }
  return 1.0;
}

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
