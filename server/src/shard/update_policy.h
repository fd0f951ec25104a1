// ShardState's update policy: when the optimizer runs on a chunk, and from what state.
//   SyncUpdate (UpdateMode::kSync): at ApplyCommit, over every chunk: the store's pipelined
//     pass, or chunk by chunk in RAM (out of place while a snapshot still needs the old state).
//   SpeculativeUpdate (UpdateMode::kSpeculative): each chunk as soon as its gradient is complete,
//     into a spare, on the "zps-speculate" thread, assuming the armed order (no clip, no skip);
//     the commit publishes the spare, redoes the chunk from its untouched live state, or drops
//     the spare. Bit-identical to sync in every case.
// Both, with the per-chunk reduction and fused update they share (ShardState::ReduceChunk,
// ShardState::UpdateChunk, ShardState::UpdateForSnapshot), are in update_policy.cc.
//
// Lock order: a policy has no lock of its own. ShardState::mu_ guards its fields (GUARDED_BY
// names it through s_); it is taken after nothing the policy holds, and a snapshot's mutex and
// the store's are taken only without it (Apply runs without mu_). The hooks marked "mu_ held"
// are called by ShardState under mu_ and assert it: the analysis cannot follow the owner's lock
// through a virtual call on another object.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "shard/shard_chunk.h"
#include "zps/common/status.h"
#include "zps/common/thread_pool.h"
#include "zps/server/optimizer.h"
#include "zps/server/shard_state.h"

namespace zps::server {

class ShardState::UpdatePolicy {
 public:
  /// The job's policy: speculative for a speculative job with chunks (`spares`: the spare sets
  /// that fit the budget with a store; RAM state has one per chunk), sync otherwise. Call after
  /// the chunk table, the serving copies and the store are made. Errors: ResourceExhausted (the
  /// spares), from Optimizer::Create / ThreadPool::Create.
  static Result<std::unique_ptr<UpdatePolicy>> Create(ShardState* state,
                                                      const OptimizerConfig& optimizer,
                                                      ThreadPool* pool, uint64_t spares);
  /// The sync policy, which needs nothing (a ShardState always has a policy).
  static std::unique_ptr<UpdatePolicy> Sync(ShardState* state);
  virtual ~UpdatePolicy() = default;
  UpdatePolicy(const UpdatePolicy&) = delete;
  UpdatePolicy& operator=(const UpdatePolicy&) = delete;

  // ---- mu_ held ----
  /// Chunk `c`'s gradient of its step is complete (FinishPush).
  virtual void OnComplete(Chunk& c) = 0;
  /// No chunk is being reduced by the policy: ReduceStep may read every report.
  virtual bool ReductionsDone() const = 0;
  /// A reduction that failed on the policy's thread (ReduceStep returns it).
  virtual Status ReductionError() const = 0;
  /// ReduceStep reduced the chunks `mine` (indices) of `step` itself.
  virtual void OnReduced(int64_t step, const std::vector<size_t>& mine) = 0;
  /// ApplyCommit may start its update (what the policy is still doing may run beside it).
  virtual bool CommitReady() const = 0;
  /// The commit published chunk `c` (its spare, if any, is free again).
  virtual void OnPublished(Chunk& c) = 0;
  /// The commit published every chunk; `next`: the order to assume for the next step.
  virtual void OnCommitted(const std::optional<CommitOrder>& next) = 0;
  /// Nothing reads the live state or the slots on the policy's behalf (ResetTo waits for it).
  virtual bool Idle() const = 0;
  /// A rollback: forgets what is queued, armed or failed.
  virtual void Reset() = 0;
  virtual SpeculationStats stats() const = 0;

  // ---- mu_ not held ----
  /// The update of every chunk for `order` (ApplyCommit, once CommitReady): run, publish a
  /// spare, redo, or nothing when skipped. `snap`: the open snapshot of a background
  /// checkpoint, or null.
  virtual Status Apply(const CommitOrder& order, const std::shared_ptr<Snapshot>& snap) = 0;
  /// Chunks of `assumed.step` that complete from now on are updated with `assumed` (takes mu_).
  virtual void Arm(const CommitOrder& assumed) = 0;
  /// Wakes the policy's thread (after Shutdown set shutdown_).
  virtual void Wake() = 0;
  /// Stops and joins the policy's thread.
  virtual void Stop() = 0;

 protected:
  explicit UpdatePolicy(ShardState* state) : s_(state) {}
  ShardState* const s_;
};

}  // namespace zps::server
