// zps/server/step_commit.h — the coordinator's per-step decision.
//
// While gradients land, each shard reports, per chunk, the sum of squares of the reduced (summed,
// still loss-scaled) gradient and a non-finite flag. Decide() combines the reports IN CHUNK ORDER
// (so the result does not depend on arrival order), forms the global gradient norm, and decides:
//   - skip: a non-finite gradient anywhere (fp16 overflow). With dynamic loss scaling the scale is
//     divided by `scale_factor` (not below `min_loss_scale`).
//   - commit: one grad_scale = 1 / (loss_scale x grad_divisor) x clip coefficient, where the clip
//     coefficient is min(1, max_grad_norm / (norm + 1e-6)) when clipping is on.
// After `scale_window` consecutive good steps the loss scale grows by `scale_factor`.
// All arithmetic is in double and rounded to float once, so every process that feeds the same
// reports gets the same bits.
//
// Thread-safety: not thread-safe; the coordinator calls it from one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"

namespace zps::server {

// CommitConfig (the decision's parameters) is part of the job spec: zps/common/job_spec.h.

struct ChunkReport {
  double sum_squares = 0.0;
  bool non_finite = false;
};

struct CommitDecision {
  bool skip = false;
  float grad_scale = 0.0f;       // multiply each reduced gradient element by this
  double global_norm = 0.0;      // of the unscaled, averaged gradient (NaN when skipped)
  double loss_scale = 1.0;       // the scale the gradients of this step were computed with
  double next_loss_scale = 1.0;  // the scale workers use for the next step
};

class StepCommit {
 public:
  /// Call config.Validate() first; an invalid config is a programming error here.
  explicit StepCommit(const CommitConfig& config);

  /// The grad_scale Decide gives a step computed at `loss_scale` that does not clip: the value a
  /// speculative update assumes (ShardState). The same double arithmetic, rounded once.
  static float UnclippedScale(double loss_scale, double grad_divisor) {
    return static_cast<float>(1.0 / (loss_scale * grad_divisor) * 1.0);
  }

  /// The loss scale workers must use for the current step.
  double loss_scale() const { return loss_scale_; }

  /// Decides the step from the per-chunk reports (index = chunk id order).
  CommitDecision Decide(std::span<const ChunkReport> reports);

  /// Loss-scaler state, for checkpoints.
  struct State {
    double loss_scale = 1.0;
    int64_t good_steps = 0;
  };
  State state() const { return {loss_scale_, good_steps_}; }
  /// Errors: InvalidArgument for a non-positive or non-finite scale or negative count.
  Status Restore(const State& s);

 private:
  CommitConfig config_;
  double loss_scale_;
  int64_t good_steps_ = 0;
};

}  // namespace zps::server
