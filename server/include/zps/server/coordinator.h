// zps/server/coordinator.h — the job's coordinator logic (one per job, by default inside shard 0),
// apart from any wire.
//
// It holds the job spec, the shard directory, the current step and the step decisions:
//   - Shards Register (ordinal + their control endpoint) and AwaitJob (long-poll).
//   - Rank 0 Joins with the job spec; other ranks Join with its hash and get a clear error on a
//     mismatch. A Join returns the step to resume from.
//   - Each shard Reports its per-chunk statistics for a step; once every chunk of the layout has
//     reported, StepCommit decides and every waiter (shards and workers) gets the decision.
//
// Callbacks run on the thread that completes them (a report, or the caller itself when the
// answer is ready), after the internal lock is released.
// Thread-safety: all public methods are thread-safe. Lock order: mu_ only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zps/common/messages.h"
#include "zps/common/status.h"
#include "zps/server/job.h"
#include "zps/server/step_commit.h"

namespace zps::server {

using CommitInfo = msg::CommitInfo;

struct JoinInfo {
  uint64_t job_hash = 0;
  int64_t resume_step = 0;
  double loss_scale = 1.0;
  std::vector<std::string> shard_endpoints;  // index = shard ordinal
};

class Coordinator {
 public:
  using JobCallback = std::function<void(const Result<JobSpec>&)>;
  using CommitCallback = std::function<void(const Result<CommitInfo>&)>;

  explicit Coordinator(uint32_t num_shards);
  ~Coordinator();

  uint32_t num_shards() const { return num_shards_; }

  /// A shard announces itself. Errors: OutOfRange for a bad ordinal; InvalidArgument for an
  /// empty endpoint. Re-registering (a restarted shard) replaces the endpoint.
  Status RegisterShard(uint32_t ordinal, std::string endpoint);
  bool AllShardsRegistered() const;

  /// Answers with the job once rank 0 has registered one.
  void AwaitJob(JobCallback cb);

  /// Rank 0 passes the spec; other ranks pass nullopt and the hash of the spec they built.
  /// Errors: InvalidArgument (rank/world), FailedPrecondition (hash mismatch, no job yet for a
  /// rank != 0, shards missing), plus JobSpec::Validate errors.
  Result<JoinInfo> Join(uint32_t rank, const std::optional<JobSpec>& spec, uint64_t hash);

  /// A shard's per-chunk reports for `step` (chunk ids must belong to that shard, once each).
  /// Errors (to cb): FailedPrecondition for a step other than the current one, InvalidArgument
  /// for foreign or duplicate chunks. cb gets the decision once every chunk has reported.
  void Report(int64_t step, uint32_t ordinal,
              const std::vector<std::pair<uint32_t, ChunkReport>>& reports, CommitCallback cb);

  /// The decision of `step`: now if known (the last kHistory steps), else when it is made.
  /// Errors: FailedPrecondition for a step too old or too far ahead.
  void AwaitCommit(int64_t step, CommitCallback cb);

  int64_t step() const;
  /// Fails every waiter. Idempotent.
  void Shutdown(const Status& reason);

  static constexpr size_t kHistory = 64;

 private:
  const uint32_t num_shards_;
  mutable std::mutex mu_;
  std::vector<std::string> endpoints_;          // guarded by mu_
  std::optional<JobSpec> job_;                  // guarded by mu_
  std::optional<StepCommit> commit_;            // guarded by mu_
  int64_t step_ = 0;                            // guarded by mu_
  int64_t optimizer_step_ = 0;                  // guarded by mu_
  std::vector<std::optional<ChunkReport>> reports_;  // guarded by mu_; index = chunk
  uint32_t reported_ = 0;                       // guarded by mu_
  std::deque<CommitInfo> history_;              // guarded by mu_
  std::vector<JobCallback> job_waiters_;        // guarded by mu_
  std::multimap<int64_t, CommitCallback> commit_waiters_;  // guarded by mu_
  bool shutdown_ = false;                       // guarded by mu_
  Status shutdown_reason_;                      // guarded by mu_
};

}  // namespace zps::server
