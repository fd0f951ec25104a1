#include "coordinator/coordinator_service.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zps/common/logging.h"

namespace zps::server {

Status CoordinatorService::RegisterShard(const rpc::Peer& peer, const msg::RegisterShard& m) {
  if (peer.role != rpc::PeerRole::kShard || peer.rank != m.ordinal) {
    return InvalidArgument("RegisterShard must come from shard " + std::to_string(m.ordinal) +
                           "'s own connection");
  }
  return c_->RegisterShard(m.ordinal, m.endpoint, peer.session_id);
}

void CoordinatorService::AwaitJob(Done<JobSpec> done) { c_->AwaitJob(std::move(done)); }

void CoordinatorService::Join(const rpc::Peer& peer, const msg::Join& m,
                              Done<msg::JoinReply> done) {
  std::optional<JobSpec> spec;
  if (!m.job_spec.empty()) {
    auto j = JobSpec::Deserialize(m.job_spec);
    if (!j.ok()) return done(j.status().WithContext("job spec"));
    spec = std::move(*j);
  }
  auto info = c_->Join(m.rank, spec, m.job_hash, peer.session_id);
  if (!info.ok()) return done(info.status());
  // A new worker generation (a pre-reduced rank re-joined) drops the old communicator's
  // rendezvous keys and fails its parked Gets now, not at the next kv call.
  kv_->Advance(c_->kv_generation());
  ZPS_LOG(INFO) << "rank " << m.rank << " joined from " << peer.remote << ", resume at step "
                << info->resume_step;
  c_->AwaitJob([info = *info, done = std::move(done)](const Result<JobSpec>& j) {
    if (!j.ok()) return done(j.status());
    msg::JoinReply reply;
    reply.job_hash = info.job_hash;
    reply.resume_step = info.resume_step;
    reply.loss_scale = info.loss_scale;
    reply.shard_endpoints = info.shard_endpoints;
    reply.layout = j->layout.Serialize();
    reply.reduction_mode = static_cast<msg::ReductionMode>(j->shard.mode);
    reply.world_size = j->shard.world_size;
    reply.grad_dtype = j->shard.grad_dtype;
    reply.serving_dtype = j->shard.serving_dtype;
    reply.accumulation_steps = j->shard.accumulation_steps;
    done(reply);
  });
}

void CoordinatorService::Report(const msg::Report& m, Done<CommitInfo> done) {
  std::vector<std::pair<uint32_t, ChunkReport>> reports;
  reports.reserve(m.chunks.size());
  for (const auto& ch : m.chunks) {
    reports.emplace_back(ch.chunk, ChunkReport{ch.sum_squares, ch.non_finite});
  }
  c_->Report(m.step, m.ordinal, reports,
             [hook = hook_, done = std::move(done)](const Result<CommitInfo>& ci) {
               if (ci.ok() && hook) hook("decide", ci->step);  // decided, not yet told
               done(ci);
             });
}

void CoordinatorService::AwaitCommit(const rpc::Peer& peer, const msg::AwaitCommit& m,
                                     Done<CommitInfo> done) {
  c_->AwaitCommit(m.step, std::move(done), peer.session_id);
}

Status CoordinatorService::CheckpointReport(const rpc::Peer& peer, const msg::CheckpointReport& m) {
  if (peer.role != rpc::PeerRole::kShard || peer.rank != m.ordinal) {
    return InvalidArgument("a checkpoint report must come from the shard itself");
  }
  return c_->ReportCheckpoints(m);
}

Result<msg::ShardSyncReply> CoordinatorService::ShardSync(const rpc::Peer& peer,
                                                          const msg::ShardSync& m) {
  if (peer.role != rpc::PeerRole::kShard || peer.rank != m.ordinal) {
    return InvalidArgument("a shard sync must come from the shard itself");
  }
  return c_->ShardSync(m);
}

void CoordinatorService::CheckpointNow(const rpc::Peer& peer, Done<msg::CheckpointDone> done) {
  ZPS_LOG(INFO) << "checkpoint requested by " << peer.name << " from " << peer.remote;
  c_->RequestCheckpoint(std::move(done));
}

}  // namespace zps::server
