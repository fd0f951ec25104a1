// Error feedback for block-quantized gradient pushes (grad_dtype int8 / int4 blocks).
//
// A worker keeps, per parameter range it pushes, the fp32 residual of its last quantization:
// each push encodes q = Q(g + r) and keeps r = (g + r) - deq(q), so what the shards sum over
// the pushes of a range is the sum of the true gradients minus the current residual: nothing is
// lost over time, only delayed, by less than one block-quantum per element.
//
// A range is keyed by (parameter, first element, length): a whole parameter (server-sum) or the
// slice a pre-reduced rank pushes. Every push of a range uses and updates the same residual, so
// with gradient accumulation the residual carries from micro-batch to micro-batch and from step
// to step. Reset() zeroes every residual (a checkpoint step: docs/checkpoints.md).
//
// Thread-safety: every method may be called from any thread. Pushes of different ranges
// quantize in parallel; two pushes of the same range are serialised (their order is the
// caller's: the residual makes the result depend on it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::worker {

class GradResiduals {
 public:
  /// Residuals for pushes of `dtype` (IsBlockQuantized). `feedback` false: every push is
  /// quantized on its own and the residual is dropped (a test and benchmark switch that shows
  /// what the feedback is for).
  explicit GradResiduals(DType dtype, bool feedback = true);

  /// Encodes elements [begin, begin + grad.size()) of parameter `param` as consecutive push
  /// pieces of `piece_lengths` elements (in order, summing to grad.size()), each quantized on
  /// its own with its blocks from its first element (grad_quant.h), into `out`, which must hold
  /// exactly the sum of PushBytes of the pieces. Errors: InvalidArgument (lengths or `out` that
  /// do not add up; nothing is written or updated then).
  Status Encode(uint32_t param, uint64_t begin, std::span<const float> grad,
                std::span<const uint64_t> piece_lengths, std::span<std::byte> out);

  /// Zeroes every residual.
  void Reset();

  /// The residual of a range (a copy; empty if it was never pushed). For tests.
  std::vector<float> Residual(uint32_t param, uint64_t begin, uint64_t length) const;

 private:
  using Key = std::tuple<uint32_t, uint64_t, uint64_t>;  // param, begin, length
  struct Range {
    Mutex mu;
    std::vector<float> r GUARDED_BY(mu);
  };
  Range& Find(const Key& key);

  const DType dtype_;
  const bool feedback_;
  // Lock order: mu_, then a Range's mu (Reset); Encode holds only the Range's.
  mutable Mutex mu_;
  std::map<Key, std::unique_ptr<Range>> ranges_ GUARDED_BY(mu_);  // entries are never erased
};

}  // namespace zps::worker
