// Internal to zps-server: the shard's step driver and its durable side.
//
// ShardCheckpoints wraps the shard's CheckpointStore (<data-dir>/checkpoints): writing the state
// at its current version with the loss-scaler/optimizer counters, restoring a step, listing.
// ShardDriver runs on the "shard-driver" thread: connect to the coordinator (backoff), register,
// list the local checkpoints, get the job, sync with the coordinator (restoring the step it rolls
// back to), then run steps: wait for gradients -> reduce -> report -> apply -> publish ->
// checkpoint when the decision says so. On losing the coordinator or a recovery order it fences
// the data plane (waiting fetches and old sessions get Unavailable) and syncs again.
//
// Thread-safety: ShardDriver::Run on one thread; Interrupt from any; ShutdownCheckpoint after
// Run returned. ShardCheckpoints: one thread (the driver) at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/messages.h"
#include "zps/common/metrics.h"
#include "zps/common/pacer.h"
#include "zps/common/rpc.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/thread_pool.h"
#include "zps/server/checkpoint.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/server/shard_state.h"

namespace zps::server {

/// Test hook: ZPS_TEST_CRASH_AT=<point>:<step> makes the process SIGKILL itself when it reaches
/// `point` at `step`, and <point>:<step>+ the first time it reaches `point` at `step` or later (a
/// point that a step may pass without, such as speculate). Points: push, update, decide,
/// checkpoint, after-checkpoint, speculate, speculating (before each chunk's speculative update),
/// checkpoint-background. It logs "ZPS_TEST_CRASH_AT=<spec>: killing this process at
/// <point>:<step>" first. Honest crash points for the recovery test; nothing happens when the
/// variable is unset.
void MaybeCrashAt(std::string_view point, int64_t step);

class ShardCheckpoints {
 public:
  /// Opens <data_dir>/checkpoints with `options` (kept for reopens). Errors: as
  /// CheckpointStore::Open.
  static Result<std::unique_ptr<ShardCheckpoints>> Open(const std::string& data_dir,
                                                        const CheckpointOptions& options = {});
  /// Records the job. Errors: FailedPrecondition (a different layout or shard already recorded,
  /// or a checkpoint of another optimizer.state_dtype, which the message names: a checkpoint is
  /// restored only into its own state dtype); from the store.
  Status Bind(const JobSpec& job, uint32_t ordinal);
  /// Steps of the complete local checkpoints, ascending, less those marked unusable; with
  /// `verify` every value is read and corrupt ones are left out (with an error naming the
  /// checkpoint and the DataLoss). Errors: IoError.
  Result<std::vector<int64_t>> Steps(bool verify);
  /// Writes the state at its current version (`rs.step`). An existing checkpoint of that step is
  /// kept (OK). After a failed write the store is reopened (RocksDB refuses writes after an
  /// I/O error), so the next checkpoint is tried afresh; committed ones stay readable. Errors:
  /// FailedPrecondition, ResourceExhausted (disk full: the message names the directory),
  /// IoError.
  Status Write(const ShardState& state, const msg::ResumeState& rs);
  /// Called after each chunk is added with the elements of the chunks added so far (the
  /// background writer paces itself and has a test kill point there).
  using AfterChunk = std::function<void(uint64_t elems_written)>;
  /// As Write, from a snapshot (ShardState::BeginSnapshot) of step `rs.step`, on any one thread
  /// while no other method runs. `after_chunk` may be empty.
  Status WriteSnapshot(ShardState::Snapshot& snap, const msg::ResumeState& rs,
                       const AfterChunk& after_chunk);
  /// Loads checkpoint `step` into `state` (ShardState::ResetTo). Errors: NotFound, DataLoss,
  /// IoError, InvalidArgument (a checkpoint of another layout), FailedPrecondition (of another
  /// state dtype than the job Bind recorded).
  Result<msg::ResumeState> Restore(ShardState& state, int64_t step, const Status& reason);
  /// Leaves `step` out of Steps from now on (it could not be restored).
  void MarkUnusable(int64_t step) { unusable_.push_back(step); }
  /// Garbage collection keeps `step` (CheckpointStore::Protect).
  void Protect(int64_t step) {
    protected_ = step > 0 ? step : -1;  // 0: no checkpoint is complete everywhere yet
    if (store_) store_->Protect(protected_);
  }
  /// Forgets checkpoints after `step` (a rollback), so they can be taken again.
  Status DropAfter(int64_t step);

 private:
  ShardCheckpoints(std::string dir, CheckpointOptions options,
                   std::unique_ptr<CheckpointStore> store)
      : dir_(std::move(dir)), options_(options), store_(std::move(store)) {}
  using Visit = std::function<Status(const ShardState::ChunkVisitor&)>;
  Status WriteVisited(const Visit& visit, const msg::ResumeState& rs,
                      const AfterChunk& after_chunk);
  Status WriteOnce(const Visit& visit, const msg::ResumeState& rs, const AfterChunk& after_chunk);
  // FailedPrecondition naming both dtypes when `c` holds another state dtype than the job's.
  Status CheckStateDType(const CheckpointInfo& c) const;
  // Closes and opens the store (writable; read-only when that fails for lack of room, or none
  // when even that fails). Errors: from the writable open.
  Status Reopen();
  // A store is open (`writable`: not read-only), reopening one a failed write left read-only or
  // closed. Errors: from CheckpointStore::Open.
  Status Ready(bool writable);

  std::string dir_;                            // <data-dir>/checkpoints
  CheckpointOptions options_;                  // as opened (writable)
  std::unique_ptr<CheckpointStore> store_;     // null only after a failed reopen (Ready retries)
  std::vector<int64_t> unusable_;              // steps found corrupt or unloadable (until dropped)
  int64_t protected_ = -1;                     // re-applied to a reopened store
  StateDType state_dtype_ = StateDType::kF32;  // the job's (Bind): how checkpoints pack m and v
};

/// What the driver needs from the ShardServer (callbacks run on the driver thread).
struct DriverHost {
  const ShardServerOptions* opts = nullptr;
  uint16_t rpc_port = 0;
  ThreadPool* pool = nullptr;
  std::function<bool()> stopping;
  /// Memory for the serving copies (ShardState's ServingAllocator); may be empty. If it fails,
  /// the driver falls back to heap memory.
  ServingAllocator serving_alloc;
  /// Takes the shard state once the job is known (publishes it to the handlers).
  std::function<ShardState*(std::unique_ptr<ShardState>, const JobSpec&)> publish_state;
  /// accept = true: workers may connect. false: refuse workers, fence their sessions and fail
  /// waiting fetches with `reason`.
  std::function<void(bool accept, const Status& reason)> set_serving;
  /// The ranks in [0, world) with no worker session on this shard now (for the step-timeout
  /// message in pre-reduced mode, where pushed slices have no per-rank owner); may be empty.
  std::function<std::vector<uint32_t>(uint32_t world)> absent_ranks;
  /// Refreshes the spill tier's metrics from ShardState::storage_stats (after each update and
  /// checkpoint; may be empty).
  std::function<void()> storage_metrics;
  /// Called after each update pass has published `version` on every local chunk (may be empty):
  /// the server tells its worker sessions (kAmServingNotice).
  std::function<void(int64_t version)> published;
  const metrics::Histogram* optimizer_pass = nullptr;
  const metrics::Counter* optimizer_bytes = nullptr;
  const metrics::Histogram* step_duration = nullptr;
  const metrics::Gauge* current_step = nullptr;
  const metrics::Histogram* checkpoint_duration = nullptr;
  const metrics::Gauge* checkpoint_last_success = nullptr;
};

class ShardDriver {
 public:
  ShardDriver(DriverHost host, std::unique_ptr<ShardCheckpoints> checkpoints);
  ~ShardDriver();
  /// Runs until Stop (Cancelled) or a fatal error.
  Status Run();
  /// Closes the coordinator connection (waits in Run then fail at once). Any thread.
  void Interrupt();
  /// After Run returned on a clean stop: checkpoints the state if it is at a step boundary not
  /// yet checkpointed (clean shutdown). Errors: as ShardCheckpoints::Write.
  Status ShutdownCheckpoint();

 private:
  Status Connect();
  Status AwaitJob();
  Result<int64_t> SyncToJob();
  Status RunSteps(int64_t start);
  void CheckpointAndReport(int64_t step);
  // The checkpoint of `step` (the state's version): in the background when possible (a
  // snapshot), else as CheckpointAndReport. Waits first for a background write still running
  // (logged: a second checkpoint does not start before the first committed).
  void StartCheckpoint(int64_t step);
  // Reports a finished background write (`wait`: waits for one still running). Returns true
  // when none is running any more.
  bool FinishCheckpoint(bool wait);
  // The speculation order assumed for `step` at `loss_scale` after `applied` updates.
  CommitOrder Assumed(int64_t step, double loss_scale, int64_t applied) const;
  Status ReportCheckpoints(const std::optional<std::pair<int64_t, Status>>& result);
  // The restore of the recovery target `step` failed: on DataLoss or NotFound, reports the local
  // list without it (the coordinator then picks an older step); other errors are returned.
  Status OfferOlderCheckpoint(int64_t step, const Status& failed);
  Result<msg::ShardSyncReply> Sync(bool ready);
  Result<std::vector<std::byte>> Call(uint16_t type, std::span<const std::byte> payload,
                                      std::chrono::milliseconds timeout);
  bool Connected();

  DriverHost host_;
  std::unique_ptr<ShardCheckpoints> ckpt_;
  Mutex mu_;
  std::unique_ptr<rpc::Client> coord_ GUARDED_BY(mu_);  // (replaced by the driver only)
  bool interrupted_ GUARDED_BY(mu_) = false;
  // Driver thread only:
  std::optional<JobSpec> job_;
  ShardState* state_ = nullptr;
  bool synced_ = false;  // state_ matches the job at epoch_
  uint64_t epoch_ = 0;
  bool verified_ = false;    // the startup listing (with verification) was done
  bool resync_ = false;      // RunSteps stopped for a recovery
  msg::ResumeState resume_;  // counters at state_'s version
  int64_t last_checkpoint_ = -1;
  double step_seconds_ = 0.0;  // recent step time (moving average; paces background writes)
  double commit_tail_ = -1.0;  // the last background write's commit, seconds (-1: none yet)
  // The background checkpoint writer ("zps-ckpt-write"): at most one; joined by the driver.
  struct BackgroundWrite {
    std::thread thread;
    std::shared_ptr<ShardState::Snapshot> snap;
    int64_t step = 0;
    std::chrono::steady_clock::time_point t0;
    std::atomic<bool> done{false};
    Status result;                                     // set before done
    std::unique_ptr<Pacer> pacer;                      // --checkpoint-pace
    std::chrono::steady_clock::time_point last_chunk;  // writer thread only, until done
    double commit_seconds = 0.0;  // from the last chunk to the commit's end; set before done
  };
  std::unique_ptr<BackgroundWrite> bg_;
  std::optional<int64_t> pending_protect_;  // Protect deferred while bg_ runs
};

}  // namespace zps::server
