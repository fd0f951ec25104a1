#include "zps/train/held_out.h"

#include <algorithm>
#include <cmath>

namespace zps::train {

Result<HeldOutSet> HeldOutSet::Create(const DataLoader& loader, int rows_per_batch) {
  if (rows_per_batch < 1) return InvalidArgument("held-out: rows_per_batch must be >= 1");
  const int n = loader.eval_windows();
  const size_t w = static_cast<size_t>(loader.options().seq_len) + 1;
  std::vector<uint8_t> tokens(static_cast<size_t>(n) * w);
  if (n > 0) ZPS_RETURN_IF_ERROR(loader.EvalBatch(0, n, tokens));
  return HeldOutSet(n, rows_per_batch, w, std::move(tokens));
}

Result<double> HeldOutSet::Loss(const Evaluator& eval) const {
  if (windows_ == 0) return std::nan("");
  double sum = 0.0;
  for (int first = 0; first < windows_; first += rows_per_batch_) {
    const int rows = std::min(rows_per_batch_, windows_ - first);
    const std::span<const uint8_t> batch(
        tokens_.data() + static_cast<size_t>(first) * window_bytes_,
        static_cast<size_t>(rows) * window_bytes_);
    ZPS_ASSIGN_OR_RETURN(const double loss, eval(batch, rows));
    sum += loss * rows;
  }
  return sum / windows_;
}

}  // namespace zps::train
