// CoordinatorService — the coordinator's control-plane calls, apart from the wire. Each takes a
// decoded request and the caller (rpc::Peer: its role, rank and session), checks who may make
// the call, and calls the Coordinator; a join also moves the rendezvous store (KvStore) to the
// new worker generation. coordinator_rpc_service.cc registers each as a one-line handler.
//
// Thread-safety: every method is thread-safe (the Coordinator and KvStore are). Callbacks run
// once, on the calling thread or on the thread that completes the wait (a report, a join).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/common/status.h"
#include "zps/server/coordinator.h"
#include "zps/server/job.h"
#include "zps/server/kv_store.h"

namespace zps::server {

class CoordinatorService {
 public:
  template <typename T>
  using Done = std::function<void(const Result<T>&)>;
  /// Crash-injection points for the recovery tests (MaybeCrashAt): called with "decide" and the
  /// step once a step is decided, before any shard is told.
  using TestHook = std::function<void(std::string_view point, int64_t step)>;

  /// Not owned; both must outlive the service.
  CoordinatorService(Coordinator* coordinator, KvStore* kv, TestHook hook = {})
      : c_(coordinator), kv_(kv), hook_(std::move(hook)) {}

  /// kRegisterShard. Errors: InvalidArgument (not from the shard's own connection); from
  /// Coordinator::RegisterShard.
  Status RegisterShard(const rpc::Peer& peer, const msg::RegisterShard& m);
  /// kAwaitJob: the job once registered. Errors: from Coordinator::AwaitJob.
  void AwaitJob(Done<JobSpec> done);
  /// kJoin: joins worker rank m.rank (rank 0 registers m.job_spec), then answers once the job
  /// is known. Errors: the spec's (with context "job spec"); from Coordinator::Join/AwaitJob.
  void Join(const rpc::Peer& peer, const msg::Join& m, Done<msg::JoinReply> done);
  /// kReport: a shard's chunk statistics for a step; answered with the step's decision.
  void Report(const msg::Report& m, Done<CommitInfo> done);
  /// kAwaitCommit: a worker's long-poll for the decision of m.step.
  void AwaitCommit(const rpc::Peer& peer, const msg::AwaitCommit& m, Done<CommitInfo> done);
  /// kCheckpointReport. Errors: InvalidArgument (not from the shard itself); from
  /// Coordinator::ReportCheckpoints.
  Status CheckpointReport(const rpc::Peer& peer, const msg::CheckpointReport& m);
  /// kShardSync. Errors: InvalidArgument (not from the shard itself); from
  /// Coordinator::ShardSync.
  Result<msg::ShardSyncReply> ShardSync(const rpc::Peer& peer, const msg::ShardSync& m);
  /// kCheckpointNow: answered once a global checkpoint is complete on every shard.
  void CheckpointNow(const rpc::Peer& peer, Done<msg::CheckpointDone> done);

 private:
  Coordinator* c_;
  KvStore* kv_;
  TestHook hook_;
};

}  // namespace zps::server
