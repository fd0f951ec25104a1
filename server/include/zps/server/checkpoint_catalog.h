// zps/server/checkpoint_catalog.h — the coordinator's durable job state, in its own RocksDB
// database: the job spec, opaque registry and placement blobs, the current step, and global
// checkpoint records. A global checkpoint of step S is complete only once every shard has reported
// committing S; the report that completes it writes the completion record in the same synced
// batch, so "complete" is never seen without all its shard reports.
//
// Recovery: LatestGlobalComplete() is the step the job rolls back to; DropGlobalAfter(S) forgets
// later, partial ones (and shards drop theirs with CheckpointStore::DropCheckpointsAfter).
//
// Thread-safety: all methods are thread-safe (record updates are serialised internally).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/checkpoint.h"
#include "zps/server/job.h"

namespace zps::server {

struct GlobalCheckpoint {
  int64_t step = 0;
  uint32_t num_shards = 0;
  std::vector<uint32_t> committed;  // shards that reported, ascending
  bool complete = false;
};

class CoordinatorCatalog {
 public:
  /// Opens (or creates) the database in `dir`; `options.keep` bounds the complete global
  /// checkpoints remembered. Errors: as CheckpointStore::Open.
  static Result<std::unique_ptr<CoordinatorCatalog>> Open(const std::string& dir,
                                                          const CheckpointOptions& options);
  ~CoordinatorCatalog();
  CoordinatorCatalog(const CoordinatorCatalog&) = delete;
  CoordinatorCatalog& operator=(const CoordinatorCatalog&) = delete;

  /// Each Put is one synced write. Errors: FailedPrecondition (read-only), ResourceExhausted,
  /// IoError. Each Get: NotFound (never stored), DataLoss (CRC or decoding), IoError.
  Status PutJobSpec(const JobSpec& spec);
  Result<JobSpec> GetJobSpec() const;
  Status PutRegistry(std::span<const std::byte> registry);
  Result<std::vector<std::byte>> GetRegistry() const;
  Status PutPlacement(std::span<const std::byte> placement);
  Result<std::vector<std::byte>> GetPlacement() const;
  Status PutStep(int64_t step);
  Result<int64_t> GetStep() const;
  /// The recovery epoch (Coordinator): bumped, synced, on every rollback, so a restarted
  /// coordinator never reuses one.
  Status PutEpoch(uint64_t epoch);
  Result<uint64_t> GetEpoch() const;

  /// Records that `shard` committed checkpoint `step`. Returns true when this report completed
  /// the global checkpoint (exactly once per step); a repeated report is harmless (false).
  /// Completing a step removes complete ones beyond `keep` and partial ones older than the
  /// oldest kept. Errors: InvalidArgument (shard ≥ num_shards, num_shards 0 or different from an
  /// earlier report of the step), ResourceExhausted, IoError, DataLoss.
  Result<bool> RecordShardCheckpoint(int64_t step, uint32_t shard, uint32_t num_shards);
  /// Global checkpoints (complete and partial), oldest first. Errors: DataLoss, IoError.
  Result<std::vector<GlobalCheckpoint>> ListGlobal() const;
  /// The newest complete global checkpoint. Errors: NotFound (none), DataLoss, IoError.
  Result<int64_t> LatestGlobalComplete() const;
  /// Forgets every global checkpoint with a step > `step`. Errors: ResourceExhausted, IoError.
  Status DropGlobalAfter(int64_t step);

 private:
  explicit CoordinatorCatalog(std::unique_ptr<CheckpointStore> store, uint32_t keep);
  Result<GlobalCheckpoint> ReadGlobal(int64_t step) const;
  Status WriteGlobal(const GlobalCheckpoint& g);

  std::unique_ptr<CheckpointStore> store_;  // catalog part only
  uint32_t keep_;
  Mutex mu_;  // serialises read-modify-write of global records
};

}  // namespace zps::server
