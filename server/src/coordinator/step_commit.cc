#include "zps/server/step_commit.h"

#include <cmath>
#include <string>

namespace zps::server {

StepCommit::StepCommit(const CommitConfig& config)
    : config_(config), loss_scale_(config.dynamic_loss_scale ? config.initial_loss_scale : 1.0) {}

CommitDecision StepCommit::Decide(std::span<const ChunkReport> reports) {
  CommitDecision d;
  d.loss_scale = loss_scale_;
  double total = 0.0;
  bool non_finite = false;
  for (const auto& r : reports) {
    total += r.sum_squares;
    non_finite = non_finite || r.non_finite || !std::isfinite(r.sum_squares);
  }
  const double base = 1.0 / (loss_scale_ * config_.grad_divisor);
  if (non_finite) {
    d.skip = true;
    d.global_norm = std::nan("");
    if (config_.dynamic_loss_scale) {
      loss_scale_ = std::max(config_.min_loss_scale, loss_scale_ / config_.scale_factor);
    }
    good_steps_ = 0;
    d.next_loss_scale = loss_scale_;
    return d;
  }
  d.global_norm = std::sqrt(total) * base;
  double clip = 1.0;
  if (config_.max_grad_norm > 0.0 && d.global_norm > config_.max_grad_norm) {
    clip = config_.max_grad_norm / (d.global_norm + 1e-6);
  }
  d.grad_scale = static_cast<float>(base * clip);
  if (config_.dynamic_loss_scale && ++good_steps_ >= config_.scale_window) {
    loss_scale_ *= config_.scale_factor;
    good_steps_ = 0;
  }
  d.next_loss_scale = loss_scale_;
  return d;
}

Status StepCommit::Restore(const State& s) {
  if (!(s.loss_scale > 0.0) || !std::isfinite(s.loss_scale) || s.good_steps < 0) {
    return InvalidArgument("bad loss-scaler state");
  }
  loss_scale_ = s.loss_scale;
  good_steps_ = s.good_steps;
  return Status::Ok();
}

}  // namespace zps::server
