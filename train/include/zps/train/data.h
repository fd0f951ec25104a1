// zps/train/data.h — offline text and a deterministic, rank-disjoint batch loader.
//
// The corpus is raw bytes. By default it is every regular file (symbolic links skipped, so no text
// appears twice) of Debian's /usr/share/common-licenses, concatenated in sorted name order: present
// on every Debian system (package base-files), about 300 KB of English.
//
// The loader cuts the corpus into non-overlapping windows of seq_len + 1 bytes. The last
// `eval_windows` windows are held out for evaluation. Each epoch visits the training windows in a
// seeded permutation; one step consumes world x batch windows, rank r taking the r-th run of
// `batch`. So within a step no two samples (of any ranks) share a byte, every rank's micro-batch is
// a pure function of (seed, step, rank), and a world of W ranks sees the same global batch as one
// process that loads ranks 0..W-1 in turn.
//
// Thread-safety: a DataLoader is immutable after Create(); Batch/EvalBatch are const and may be
// called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps::train {

inline constexpr std::string_view kDefaultCorpusDir = "/usr/share/common-licenses";

/// Loads a corpus: `path` empty means kDefaultCorpusDir; a directory means its regular files in
/// sorted order, concatenated; a file is read whole. Errors: NotFound, IoError, InvalidArgument
/// for an empty corpus or one above 4 GiB.
Result<std::string> LoadCorpus(const std::string& path);

struct DataOptions {
  int seq_len = 128;       // Default: 128. Must equal the model's seq_len.
  int batch = 8;           // Default: 8. Sequences per rank per step.
  int rank = 0;            // Default: 0. In [0, world).
  int world = 1;           // Default: 1.
  uint64_t seed = 1;       // Default: 1. Seeds the epoch permutations.
  int eval_windows = 128;  // Default: 128. Held-out windows at the corpus end (0 = none).
};

class DataLoader {
 public:
  /// Errors: InvalidArgument for bad options or a corpus with fewer than world x batch training
  /// windows (plus eval_windows).
  static Result<std::unique_ptr<DataLoader>> Create(std::string corpus, const DataOptions& options);

  const DataOptions& options() const { return options_; }
  int64_t train_windows() const { return train_windows_; }
  /// Steps in one epoch (the remainder of windows that does not fill a step is skipped).
  int64_t steps_per_epoch() const { return train_windows_ / (options_.world * options_.batch); }
  /// Bytes of one micro-batch: batch x (seq_len + 1).
  size_t batch_bytes() const;

  /// This rank's micro-batch for `step` (0-based), into `out` (batch_bytes() long).
  /// Errors: InvalidArgument for a negative step or a wrong buffer size.
  Status Batch(int64_t step, std::span<uint8_t> out) const;
  /// As Batch, for another rank of the same world (the reference trainer loads every rank).
  Status BatchForRank(int64_t step, int rank, std::span<uint8_t> out) const;
  /// Window index (in corpus order) of sample i of `rank` at `step` — for tests.
  int64_t WindowOf(int64_t step, int rank, int i) const;

  /// Held-out windows [first, first + count) as `count` rows. Errors: OutOfRange past the end.
  Status EvalBatch(int first, int count, std::span<uint8_t> out) const;
  int eval_windows() const { return options_.eval_windows; }

 private:
  DataLoader(std::string corpus, const DataOptions& options, int64_t train_windows);
  std::vector<int64_t> Permutation(int64_t epoch) const;

  std::string corpus_;
  DataOptions options_;
  int64_t train_windows_;
};

}  // namespace zps::train
