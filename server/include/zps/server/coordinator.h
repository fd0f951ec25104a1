// zps/server/coordinator.h — the job's coordinator logic (one per job, by default inside shard 0),
// apart from any wire.
//
// It holds the job spec, the shard directory, the current step and the step decisions:
//   - Shards Register (ordinal + their control endpoint) and AwaitJob (long-poll).
//   - Rank 0 Joins with the job spec; other ranks Join with its hash and get a clear error on a
//     mismatch. A Join returns the step to resume from.
//   - Each shard Reports its per-chunk statistics for a step; once every chunk of the layout has
//     reported, StepCommit decides and every waiter (shards and workers) gets the decision.
//   - Checkpoints: the decision of step s carries `checkpoint` when s + 1 is a multiple of
//     checkpoint_every or a checkpoint was requested (RequestCheckpoint); shards then write
//     version s + 1 and report it (ReportCheckpoints). A global checkpoint is complete once every
//     shard committed it (CoordinatorCatalog, when there is one).
//   - Recovery (docs/checkpoints.md): when a shard is lost or (re-)registers while a job exists,
//     the job enters kRecovering with a new epoch: every waiter fails with Unavailable, Joins and
//     Reports are refused (Unavailable). Once every shard is connected and has listed its local
//     checkpoints, the target is the newest step every shard holds (0 = start over); shards
//     restore it and say so (ShardSync ready); then the job runs again from that step. A shard
//     that cannot load the target (DataLoss) reports a list without it: the coordinator then
//     starts another recovery round and picks the newest step every shard still holds.
//   - Pre-reduced jobs (the ranks reduce among themselves through a communicator built in the
//     kv store): the ranks that joined since the last regrouping form the current *worker
//     generation*. A rank that joins while it is already a member (its process restarted, or it
//     re-joined after an error) starts a new one: the kv generation moves on (the old
//     communicator's rendezvous keys are dropped), every worker waiting in AwaitCommit gets
//     Unavailable, and an AwaitCommit from a session of an older generation is refused, so every
//     rank re-joins and restarts the step with a new communicator (tests/integration/recovery/
//     worker_death.sh pre-*). The members of one generation all resume at the same step.
//   - Every decision carries the newest checkpoint complete on every shard
//     (CommitInfo::protect_checkpoint): shards never garbage-collect it, so a shard whose
//     checkpoints keep failing (disk full) cannot leave the job without a common recovery point.
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
#include "zps/common/thread_annotations.h"
#include "zps/server/job.h"
#include "zps/server/step_commit.h"

namespace zps::server {

using CommitInfo = msg::CommitInfo;

class CoordinatorCatalog;

struct CoordinatorOptions {
  int64_t checkpoint_every = 0;           // Default: 0 = only on request.
  CoordinatorCatalog* catalog = nullptr;  // Default: none (no durable job state). Not owned.
};

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
  using CheckpointCallback = std::function<void(const Result<msg::CheckpointDone>&)>;

  explicit Coordinator(uint32_t num_shards, const CoordinatorOptions& options = {});
  ~Coordinator();

  uint32_t num_shards() const { return num_shards_; }

  /// Restores the job spec and epoch from the catalog (if any): a restarted coordinator then
  /// recovers the job. Errors: from the catalog (DataLoss, IoError).
  Status LoadCatalog();

  /// A shard announces itself (`session`: its control connection, for ShardLost). Errors:
  /// OutOfRange for a bad ordinal; InvalidArgument for an empty endpoint. Re-registering (a
  /// restarted shard) replaces the endpoint and, while a job exists, starts a recovery.
  Status RegisterShard(uint32_t ordinal, std::string endpoint, uint64_t session = 0);
  /// The control connection `session` of shard `ordinal` closed: recovery if it was current.
  void ShardLost(uint32_t ordinal, uint64_t session);
  /// A shard's local checkpoint list and, optionally, the outcome of one checkpoint (a failed
  /// one is logged and not recorded). During a recovery, a list without the chosen target (the
  /// shard could not load it) starts another round. Errors: OutOfRange (ordinal), from the
  /// catalog.
  Status ReportCheckpoints(const msg::CheckpointReport& report);
  /// Where the job stands for a shard (and, with `ready`, that it restored the target).
  /// Errors: OutOfRange (ordinal).
  Result<msg::ShardSyncReply> ShardSync(const msg::ShardSync& sync);
  /// Orders a checkpoint at the next step boundary; cb gets the step once it is complete on
  /// every shard, or the first shard's failure. A waiter still pending when a recovery starts
  /// (a shard lost or re-registered, a rollback to an older checkpoint) gets Unavailable; at
  /// Shutdown it gets Shutdown's reason, which zps-server makes Unavailable (Cancelled only when
  /// the destructor is the first to shut down). Errors (to cb, at once): FailedPrecondition (no
  /// job), Unavailable (recovering), Shutdown's reason (after Shutdown).
  void RequestCheckpoint(CheckpointCallback cb);
  msg::JobPhase phase() const;
  uint64_t epoch() const;
  /// The generation of the kv rendezvous store: ((epoch + 1) << 32) + the worker generations
  /// started since the coordinator started (pre-reduced re-joins). Grows with both.
  uint64_t kv_generation() const;
  /// Ok, or Shutdown's reason once the job stopped.
  Status stopped() const;
  bool AllShardsRegistered() const;

  /// Answers with the job once rank 0 has registered one.
  void AwaitJob(JobCallback cb);

  /// Rank 0 passes the spec; other ranks pass nullopt and the hash of the spec they built.
  /// Errors: InvalidArgument (rank/world), FailedPrecondition (hash mismatch, no job yet for a
  /// rank != 0, shards missing), plus JobSpec::Validate errors.
  /// `session`: the caller's control connection (0: none), which AwaitCommit checks against the
  /// worker generation in pre-reduced jobs (see above).
  Result<JoinInfo> Join(uint32_t rank, const std::optional<JobSpec>& spec, uint64_t hash,
                        uint64_t session = 0);

  /// A shard's per-chunk reports for `step` (chunk ids must belong to that shard, once each).
  /// Errors (to cb): FailedPrecondition for a step other than the current one, InvalidArgument
  /// for foreign or duplicate chunks. cb gets the decision once every chunk has reported.
  void Report(int64_t step, uint32_t ordinal,
              const std::vector<std::pair<uint32_t, ChunkReport>>& reports, CommitCallback cb);

  /// The decision of `step`: now if known (the last kHistory steps), else when it is made.
  /// Errors: FailedPrecondition for a step too old or too far ahead; Unavailable in a
  /// pre-reduced job for a worker `session` of an older worker generation (at once), and for
  /// every waiting worker when a new generation starts (a rank re-joined).
  void AwaitCommit(int64_t step, CommitCallback cb, uint64_t session = 0);

  int64_t step() const;
  /// Checkpoint requests waiting (RequestCheckpoint) for the end of the step in progress.
  size_t checkpoint_waiters() const;
  /// The shards whose report of the step in progress has not arrived (ascending; empty without
  /// a job). In the Status document, so that a worker whose AwaitCommit timed out names them.
  std::vector<uint32_t> awaiting_reports() const;
  /// Fails every waiter. Idempotent.
  void Shutdown(const Status& reason);

  static constexpr size_t kHistory = 64;

 private:
  struct ShardEntry {
    std::string endpoint;
    uint64_t session = 0;
    bool connected = false;
    bool listed = false;  // sent its checkpoint list since registering
    std::vector<int64_t> checkpoints;
    bool ready = false;  // restored the target of the current epoch
    msg::ResumeState state;
  };
  void StartRecovery(const std::string& reason, std::vector<CommitCallback>& failed,
                     std::vector<CheckpointCallback>& failed_ckpt) REQUIRES(mu_);
  void PersistEpoch() REQUIRES(mu_);
  bool AdvanceRecovery() REQUIRES(mu_);  // true when the job runs again

  const uint32_t num_shards_;
  const CoordinatorOptions opts_;
  mutable Mutex mu_;
  std::vector<std::string> endpoints_ GUARDED_BY(mu_);
  std::vector<ShardEntry> shards_ GUARDED_BY(mu_);
  msg::JobPhase phase_ GUARDED_BY(mu_) = msg::JobPhase::kNoJob;
  uint64_t epoch_ GUARDED_BY(mu_) = 0;
  int64_t target_ GUARDED_BY(mu_) = -1;   // recovery target, -1 unknown
  int64_t complete_ GUARDED_BY(mu_) = 0;  // newest checkpoint complete on
                                          // every shard (0: none)
  bool checkpoint_requested_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<int64_t, CheckpointCallback>> checkpoint_waiters_ GUARDED_BY(mu_);
  std::optional<JobSpec> job_ GUARDED_BY(mu_);
  std::optional<StepCommit> commit_ GUARDED_BY(mu_);
  int64_t step_ GUARDED_BY(mu_) = 0;
  int64_t optimizer_step_ GUARDED_BY(mu_) = 0;
  std::vector<std::optional<ChunkReport>> reports_ GUARDED_BY(mu_);  // index = chunk
  uint32_t reported_ GUARDED_BY(mu_) = 0;
  std::deque<CommitInfo> history_ GUARDED_BY(mu_);
  std::vector<JobCallback> job_waiters_ GUARDED_BY(mu_);
  std::multimap<int64_t, CommitCallback> commit_waiters_ GUARDED_BY(mu_);
  // Workers' AwaitCommit waiters (apart from the shards' reports: a new worker generation fails
  // only these), by step.
  std::multimap<int64_t, CommitCallback> worker_waiters_ GUARDED_BY(mu_);
  // Pre-reduced jobs: the current worker generation (rank -> the session that joined), the step
  // its members resume at, how many generations started, and every session that ever joined
  // (session -> rank; AwaitCommit of a session not among the members is refused).
  std::map<uint32_t, uint64_t> members_ GUARDED_BY(mu_);
  int64_t members_step_ GUARDED_BY(mu_) = 0;
  uint64_t worker_generations_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, uint32_t> joined_sessions_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
  Status shutdown_reason_ GUARDED_BY(mu_);
};

}  // namespace zps::server
