// zps/train/param_access.h — how a model reaches its parameters during a step.
//
// The model never owns its parameters. Per layer, just before the layer runs (in forward, and again
// in backward), it calls Acquire for that layer's parameter ids, uses the fp32 views, and calls
// Release for the same ids when the layer is done. As soon as a layer's backward has produced a
// parameter's gradient it calls PushGrad, so pushes overlap the rest of backward.
//
// Two implementations run the very same model code:
//   - zps::train::ReferenceTrainer (in-process store, zps/train/reference.h);
//   - the zps worker library (parameters fetched from shards).
//
// Thread-safety: a model calls one ParamAccess from one thread. Implementations document their own
// guarantees for other callers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/status.h"

namespace zps::train {

class ParamAccess {
 public:
  virtual ~ParamAccess() = default;

  /// Makes the listed parameters available as fp32 (converted from the 16-bit serving copy).
  /// Returns one view per id, in the order of `param_ids`, each of the parameter's full length.
  /// Views stay valid until Release of the same ids.
  /// Errors: OutOfRange for an unknown id; whatever the transport returns (Unavailable,
  /// DeadlineExceeded, ...). On error nothing stays acquired.
  virtual Result<std::vector<std::span<const float>>> Acquire(
      std::span<const uint32_t> param_ids) = 0;

  /// Ends the use of the views of `param_ids` (the same set that was acquired). Never fails.
  virtual void Release(std::span<const uint32_t> param_ids) = 0;

  /// Hands over the gradient of one parameter for this step: fp32, the parameter's full length,
  /// already multiplied by the step's loss scale. Called exactly once per parameter per step.
  /// The span is valid only during the call: an implementation that sends asynchronously copies
  /// (or converts to its push dtype) before returning.
  /// Errors: InvalidArgument for a wrong length; transport errors.
  virtual Status PushGrad(uint32_t param_id, std::span<const float> grad) = 0;
};

}  // namespace zps::train
