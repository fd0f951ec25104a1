// zps/train/held_out.h — the held-out loss zps-train prints: the mean loss over every held-out
// window of a DataLoader (its last eval_windows windows), evaluated in batches.
//
// One definition serves both modes: the reference trainer and rank 0 of a distributed run pass
// their own evaluator (the same model code over their own parameter access), and the windows, the
// batches and the averaging are this class's, so equal parameters print equal bits.
//
// The loss: the windows [0, n) in order, cut into batches of `rows_per_batch` rows (the last may
// be shorter); each batch's mean token loss L_b (a double, from the evaluator) over its r_b rows;
// the result is (sum_b L_b * r_b) / n, summed in batch order in double. Every window has the same
// seq_len tokens, so that is the mean over every held-out token.
//
// Thread-safety: immutable after Create(); Loss() is const but calls the evaluator, whose own
// thread-safety applies.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zps/common/status.h"
#include "zps/train/data.h"

namespace zps::train {

class HeldOutSet {
 public:
  /// The mean token loss of `rows` windows (rows x (seq_len + 1) bytes, Model::Evaluate's layout).
  using Evaluator = std::function<Result<double>(std::span<const uint8_t> tokens, int rows)>;

  /// Copies the loader's held-out windows. Errors: InvalidArgument when rows_per_batch < 1.
  static Result<HeldOutSet> Create(const DataLoader& loader, int rows_per_batch);

  int windows() const { return windows_; }
  int rows_per_batch() const { return rows_per_batch_; }

  /// The held-out loss as the header says; NaN when there are no held-out windows (the evaluator
  /// is not called). Errors: the evaluator's first error (later batches are not evaluated).
  Result<double> Loss(const Evaluator& eval) const;

 private:
  HeldOutSet(int windows, int rows_per_batch, size_t window_bytes, std::vector<uint8_t> tokens)
      : windows_(windows),
        rows_per_batch_(rows_per_batch),
        window_bytes_(window_bytes),
        tokens_(std::move(tokens)) {}

  int windows_;
  int rows_per_batch_;
  size_t window_bytes_;
  std::vector<uint8_t> tokens_;
};

}  // namespace zps::train
