// The coordinator's control-plane calls (shard 0): one line each over CoordinatorService
// (shard/rpc_service.h). The long-polls (a job, a join, a report, a commit, a checkpoint) are
// answered from the coordinator's callbacks.
#include "coordinator/coordinator_service.h"
#include "shard/rpc_service.h"
#include "zps/common/messages.h"

namespace zps::server {

void RegisterCoordinatorRpcs(rpc::Server& rpc, const RpcMetering& metering, CoordinatorService* s) {
  using rpc_adapt::Async;
  using rpc_adapt::NoRequest;
  using rpc_adapt::Sync;
  using P = const rpc::Peer&;
  rpc.Register(msg::kRegisterShard,
               metering.timed(Sync<msg::RegisterShard>(
                   [s](P p, const auto& m) { return s->RegisterShard(p, m); })));
  rpc.Register(msg::kAwaitJob, Async<NoRequest, JobSpec>(metering, [s](P, NoRequest, auto done) {
                 s->AwaitJob(std::move(done));
               }));
  rpc.Register(msg::kJoin,
               Async<msg::Join, msg::JoinReply>(metering, [s](P p, const auto& m, auto done) {
                 s->Join(p, m, std::move(done));
               }));
  rpc.Register(msg::kReport,
               Async<msg::Report, CommitInfo>(
                   metering, [s](P, const auto& m, auto done) { s->Report(m, std::move(done)); }));
  rpc.Register(msg::kAwaitCommit,
               Async<msg::AwaitCommit, CommitInfo>(metering, [s](P p, const auto& m, auto done) {
                 s->AwaitCommit(p, m, std::move(done));
               }));
  rpc.Register(msg::kCheckpointReport,
               metering.timed(Sync<msg::CheckpointReport>(
                   [s](P p, const auto& m) { return s->CheckpointReport(p, m); })));
  rpc.Register(
      msg::kShardSync,
      metering.timed(Sync<msg::ShardSync>([s](P p, const auto& m) { return s->ShardSync(p, m); })));
  rpc.Register(msg::kCheckpointNow,
               Async<NoRequest, msg::CheckpointDone>(metering, [s](P p, NoRequest, auto done) {
                 s->CheckpointNow(p, std::move(done));
               }));
}

}  // namespace zps::server
