// Validation of the job spec's parts: OptimizerConfig, CommitConfig, LrScheduleConfig and
// ShardJob (against the layout and optimizer). Every error is InvalidArgument naming the field.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "zps/common/job_spec.h"

namespace zps {
namespace {

std::string Num(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

Status BadOptimizer(std::string_view field, std::string_view rule, float got) {
  return InvalidArgument("optimizer config: " + std::string(field) + " " + std::string(rule) +
                         ", got " + Num(got));
}

Status BadSchedule(std::string_view field, std::string_view rule) {
  return InvalidArgument("lr schedule: " + std::string(field) + " " + std::string(rule));
}

bool NonNegFinite(double x) { return std::isfinite(x) && x >= 0.0; }

}  // namespace

Status OptimizerConfig::Validate() const {
  if (kind != OptimizerKind::kAdam && kind != OptimizerKind::kAdamW &&
      kind != OptimizerKind::kSgd) {
    return InvalidArgument("optimizer config: unknown kind " +
                           std::to_string(static_cast<int>(kind)));
  }
  // `!(x >= 0)` rather than `x < 0` so that NaN fails every check.
  if (!std::isfinite(lr) || !(lr >= 0.0f)) return BadOptimizer("lr", "must be finite and >= 0", lr);
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return BadOptimizer("beta1", "must be in [0, 1)", beta1);
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return BadOptimizer("beta2", "must be in [0, 1)", beta2);
  if (!std::isfinite(eps) || !(eps > 0.0f))
    return BadOptimizer("eps", "must be finite and > 0", eps);
  if (!std::isfinite(weight_decay) || !(weight_decay >= 0.0f)) {
    return BadOptimizer("weight_decay", "must be finite and >= 0", weight_decay);
  }
  if (!(momentum >= 0.0f && momentum < 1.0f))
    return BadOptimizer("momentum", "must be in [0, 1)", momentum);
  if (nesterov && !(momentum > 0.0f)) {
    return InvalidArgument("optimizer config: nesterov needs momentum > 0");
  }
  // Decoupled decay multiplies the weights by (1 - lr*weight_decay); past 1 it flips their sign,
  // which is never intended.
  if (kind == OptimizerKind::kAdamW && static_cast<double>(lr) * weight_decay > 1.0) {
    return InvalidArgument("optimizer config: adamw needs lr * weight_decay <= 1, got " + Num(lr) +
                           " * " + Num(weight_decay));
  }
  if (state_dtype != StateDType::kF32 && state_dtype != StateDType::kBF16 &&
      state_dtype != StateDType::kInt8) {
    return InvalidArgument("optimizer config: unknown state_dtype " +
                           std::to_string(static_cast<int>(state_dtype)));
  }
  return Status::Ok();
}

Status CommitConfig::Validate() const {
  if (!(max_grad_norm >= 0.0) || !std::isfinite(max_grad_norm)) {
    return InvalidArgument("max_grad_norm must be a finite number >= 0");
  }
  if (!(grad_divisor > 0.0) || !std::isfinite(grad_divisor)) {
    return InvalidArgument("grad_divisor must be > 0");
  }
  if (dynamic_loss_scale) {
    if (!(initial_loss_scale > 0.0) || !std::isfinite(initial_loss_scale)) {
      return InvalidArgument("initial_loss_scale must be > 0");
    }
    if (!(scale_factor > 1.0) || !std::isfinite(scale_factor)) {
      return InvalidArgument("scale_factor must be > 1");
    }
    if (scale_window < 1) return InvalidArgument("scale_window must be >= 1");
    if (!(min_loss_scale > 0.0) || min_loss_scale > initial_loss_scale) {
      return InvalidArgument("min_loss_scale must be in (0, initial_loss_scale]");
    }
  }
  return Status::Ok();
}

Status LrScheduleConfig::Validate() const {
  if (static_cast<uint8_t>(kind) > static_cast<uint8_t>(LrScheduleKind::kWarmupCosineLR)) {
    return BadSchedule("kind", "is unknown (" + std::to_string(static_cast<int>(kind)) + ")");
  }
  if (static_cast<uint8_t>(warmup_type) > static_cast<uint8_t>(WarmupType::kLinear)) {
    return BadSchedule("warmup_type", "must be log or linear");
  }
  if (!NonNegFinite(warmup_min_lr)) return BadSchedule("warmup_min_lr", "must be finite and >= 0");
  if (!NonNegFinite(warmup_max_lr)) return BadSchedule("warmup_max_lr", "must be finite and >= 0");
  if (!NonNegFinite(warmup_min_ratio))
    return BadSchedule("warmup_min_ratio", "must be finite and >= 0");
  if (!NonNegFinite(cos_min_ratio)) return BadSchedule("cos_min_ratio", "must be finite and >= 0");
  if (warmup_num_steps < 1) {
    return BadSchedule("warmup_num_steps", "must be >= 1, got " + std::to_string(warmup_num_steps));
  }
  if ((kind == LrScheduleKind::kWarmupDecayLR || kind == LrScheduleKind::kWarmupCosineLR) &&
      total_num_steps < 1) {
    return BadSchedule("total_num_steps", "must be >= 1 for " +
                                              std::string(LrScheduleKindName(kind)) + ", got " +
                                              std::to_string(total_num_steps));
  }
  if (total_num_steps < 0) return BadSchedule("total_num_steps", "must be >= 0");
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

Status ValidateShardJob(const ShardJob& job, const Layout& layout,
                        const OptimizerConfig& optimizer) {
  if (job.world_size == 0 || job.world_size > 65536) {
    return InvalidArgument("world_size must be in [1, 65536]");
  }
  // int8-block: quantized weights (zps/common/serving_quant.h). int4 weights are not offered.
  if (job.serving_dtype != DType::kF16 && job.serving_dtype != DType::kBF16 &&
      job.serving_dtype != DType::kF32 && job.serving_dtype != DType::kI8Block) {
    return InvalidArgument("serving_dtype must be fp16, bf16, fp32 or int8-block");
  }
  // A shard updates each parameter run of a chunk in its own call, and a run must start on an
  // int8 block (zps/server/optimizer.h); runs start at multiples of align_elems.
  if (optimizer.state_dtype == StateDType::kInt8 &&
      layout.options().align_elems % kInt8StateBlockElems != 0) {
    return InvalidArgument("optimizer.state_dtype int8 needs align_elems to be a multiple of " +
                           std::to_string(kInt8StateBlockElems) + ", got " +
                           std::to_string(layout.options().align_elems));
  }
  if (job.accumulation_steps == 0 || job.accumulation_steps > 1024 ||
      uint64_t{job.world_size} * job.accumulation_steps > 65536) {
    return InvalidArgument(
        "accumulation_steps must be in [1, 1024] with world_size * "
        "accumulation_steps <= 65536, got " +
        std::to_string(job.accumulation_steps));
  }
  if (job.update_mode != UpdateMode::kSync && job.update_mode != UpdateMode::kSpeculative) {
    return InvalidArgument("update_mode must be sync or speculative");
  }
  if (job.param_groups.size() > 65536) {
    return InvalidArgument("param_groups: at most 65536 groups");
  }
  ZPS_RETURN_IF_ERROR(job.lr_schedule.Validate());
  const double max_factor = job.lr_schedule.MaxValue();
  std::vector<ParamGroup> groups = job.param_groups;
  if (groups.empty()) groups.push_back({optimizer.lr, optimizer.weight_decay});
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    const std::string name =
        job.param_groups.empty() ? "optimizer" : "param_groups[" + std::to_string(i) + "]";
    if (!std::isfinite(g.lr) || !(g.lr >= 0.0f)) {
      return InvalidArgument(name + ".lr must be finite and >= 0");
    }
    if (!std::isfinite(g.weight_decay) || !(g.weight_decay >= 0.0f)) {
      return InvalidArgument(name + ".weight_decay must be finite and >= 0");
    }
    if (optimizer.kind == OptimizerKind::kAdamW) {
      // The largest lr the schedule gives this group (absolute kinds ignore the group's lr).
      const bool absolute = job.lr_schedule.kind == LrScheduleKind::kWarmupLR ||
                            job.lr_schedule.kind == LrScheduleKind::kWarmupDecayLR;
      const double max_lr = absolute ? static_cast<double>(static_cast<float>(max_factor))
                                     : static_cast<double>(static_cast<float>(g.lr * max_factor));
      if (max_lr * g.weight_decay > 1.0) {
        return InvalidArgument(name +
                               ": adamw needs lr * weight_decay <= 1 at every step (largest "
                               "scheduled lr " +
                               std::to_string(max_lr) + ")");
      }
    }
  }
  const size_t np = layout.num_params();
  if (!job.param_group.empty()) {
    if (job.param_groups.empty()) {
      return InvalidArgument("param_group is set but param_groups is empty");
    }
    if (job.param_group.size() != np) {
      return InvalidArgument("param_group has " + std::to_string(job.param_group.size()) +
                             " entries for " + std::to_string(np) + " parameters");
    }
    for (size_t p = 0; p < np; ++p) {
      if (job.param_group[p] >= job.param_groups.size()) {
        return InvalidArgument("param_group[" + std::to_string(p) +
                               "] = " + std::to_string(job.param_group[p]) + " is not a group (" +
                               std::to_string(job.param_groups.size()) + " groups)");
      }
    }
  }
  if (!job.frozen.empty()) {
    if (job.frozen.size() != np) {
      return InvalidArgument("frozen has " + std::to_string(job.frozen.size()) + " entries for " +
                             std::to_string(np) + " parameters");
    }
    for (size_t p = 0; p < np; ++p) {
      if (job.frozen[p] > 1) {
        return InvalidArgument("frozen[" + std::to_string(p) + "] must be 0 or 1");
      }
    }
  }
  return Status::Ok();
}

}  // namespace zps
