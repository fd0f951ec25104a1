#include "zps/server/coordinator.h"

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"
#include "zps/server/checkpoint_catalog.h"

namespace zps::server {

Coordinator::Coordinator(uint32_t num_shards, const CoordinatorOptions& options)
    : num_shards_(num_shards), opts_(options), endpoints_(num_shards), shards_(num_shards) {}

Coordinator::~Coordinator() { Shutdown(Cancelled("coordinator stopped")); }

Status Coordinator::RegisterShard(uint32_t ordinal, std::string endpoint, uint64_t session) {
  if (ordinal >= num_shards_) {
    return OutOfRange("shard ordinal " + std::to_string(ordinal) +
                      " >= " + std::to_string(num_shards_));
  }
  if (endpoint.empty()) return InvalidArgument("shard endpoint is empty");
  std::vector<CommitCallback> failed;
  std::vector<CheckpointCallback> failed_ckpt;
  {
    MutexLock lock(&mu_);
    ZPS_LOG(INFO) << "shard " << ordinal << " registered at " << endpoint;
    endpoints_[ordinal] = endpoint;
    ShardEntry& e = shards_[ordinal];
    e.endpoint = std::move(endpoint);
    e.session = session;
    e.connected = true;
    e.listed = false;
    e.ready = false;
    if (job_) {
      StartRecovery("shard " + std::to_string(ordinal) + " (re)registered", failed, failed_ckpt);
    }
  }
  const Status why = Unavailable("the job is rolling back: a shard restarted; re-join");
  for (auto& cb : failed) cb(why);
  for (auto& cb : failed_ckpt) cb(why);
  return Status::Ok();
}

Status Coordinator::LoadCatalog() {
  if (opts_.catalog == nullptr) return Status::Ok();
  auto spec = opts_.catalog->GetJobSpec();
  if (!spec.ok()) {
    if (spec.status().code() == Code::kNotFound) return Status::Ok();
    return spec.status().WithContext("coordinator catalog: job spec");
  }
  uint64_t epoch = 0;
  auto e = opts_.catalog->GetEpoch();
  if (e.ok()) {
    epoch = *e;
  } else if (e.status().code() != Code::kNotFound) {
    return e.status().WithContext("coordinator catalog: epoch");
  }
  MutexLock lock(&mu_);
  job_ = std::move(*spec);
  commit_.emplace(job_->commit);
  reports_.assign(job_->layout.num_chunks(), std::nullopt);
  epoch_ = epoch;
  std::vector<CommitCallback> none;
  std::vector<CheckpointCallback> none_ckpt;
  StartRecovery("the coordinator restarted", none, none_ckpt);
  ZPS_LOG(INFO) << "job restored from the coordinator catalog (" << job_->layout.num_chunks()
                << " chunks); waiting for every shard to recover it";
  return Status::Ok();
}

void Coordinator::PersistEpoch() {
  if (opts_.catalog == nullptr) return;
  Status s = opts_.catalog->PutEpoch(epoch_);
  if (!s.ok()) ZPS_LOG(ERROR) << "coordinator catalog: cannot store the epoch: " << s.ToString();
}

void Coordinator::StartRecovery(const std::string& reason, std::vector<CommitCallback>& failed,
                                std::vector<CheckpointCallback>& failed_ckpt) {
  ++epoch_;
  PersistEpoch();
  phase_ = msg::JobPhase::kRecovering;
  target_ = -1;
  for (auto& e : shards_) e.ready = false;
  reports_.assign(reports_.size(), std::nullopt);
  reported_ = 0;
  history_.clear();
  for (auto& [st, cb] : commit_waiters_) failed.push_back(std::move(cb));
  commit_waiters_.clear();
  for (auto& [st, cb] : worker_waiters_) failed.push_back(std::move(cb));
  worker_waiters_.clear();
  members_.clear();  // every rank re-joins after a rollback: the next joins form a generation
  joined_sessions_.clear();
  for (auto& [st, cb] : checkpoint_waiters_) failed_ckpt.push_back(std::move(cb));
  checkpoint_waiters_.clear();
  checkpoint_requested_ = false;
  ZPS_LOG(WARNING) << "job recovery (epoch " << epoch_ << "): " << reason;
}

void Coordinator::ShardLost(uint32_t ordinal, uint64_t session) {
  if (ordinal >= num_shards_) return;
  std::vector<CommitCallback> failed;
  std::vector<CheckpointCallback> failed_ckpt;
  {
    MutexLock lock(&mu_);
    ShardEntry& e = shards_[ordinal];
    if (!e.connected || e.session != session || shutdown_) return;
    e.connected = false;
    e.listed = false;
    ZPS_LOG(WARNING) << "shard " << ordinal << " lost its control connection";
    if (job_) StartRecovery("shard " + std::to_string(ordinal) + " lost", failed, failed_ckpt);
  }
  const Status why = Unavailable("the job is rolling back: shard " + std::to_string(ordinal) +
                                 " was lost; re-join");
  for (auto& cb : failed) cb(why);
  for (auto& cb : failed_ckpt) cb(why);
}

Status Coordinator::ReportCheckpoints(const msg::CheckpointReport& r) {
  if (r.ordinal >= num_shards_) {
    return OutOfRange("shard ordinal " + std::to_string(r.ordinal) +
                      " >= " + std::to_string(num_shards_));
  }
  std::vector<std::pair<CheckpointCallback, Result<msg::CheckpointDone>>> done;
  std::vector<CommitCallback> rolled_back;
  std::vector<CheckpointCallback> rolled_back_ckpt;
  Status result;
  {
    MutexLock lock(&mu_);
    ShardEntry& e = shards_[r.ordinal];
    e.checkpoints = r.steps;
    e.listed = true;
    if (phase_ == msg::JobPhase::kRecovering && target_ > 0 &&
        !std::binary_search(r.steps.begin(), r.steps.end(), target_)) {
      // The shard found the target unloadable (its restore met DataLoss): pick again among the
      // steps every shard still holds.
      StartRecovery("shard " + std::to_string(r.ordinal) + " cannot load checkpoint " +
                        std::to_string(target_) + "; choosing an older one",
                    rolled_back, rolled_back_ckpt);
    }
    std::vector<int64_t> record = r.steps;
    if (r.has_result && r.result_code != 0) {
      Status failed = msg::StatusFromWire(r.result_code, r.result_message)
                          .WithContext("shard " + std::to_string(r.ordinal) +
                                       " checkpoint of step " + std::to_string(r.result_step));
      ZPS_LOG(ERROR) << failed.ToString();
      for (auto& [min_step, cb] : checkpoint_waiters_) done.emplace_back(std::move(cb), failed);
      checkpoint_waiters_.clear();
      record.clear();
    }
    for (int64_t step : record) {
      bool complete = false;
      if (opts_.catalog != nullptr) {
        auto c = opts_.catalog->RecordShardCheckpoint(step, r.ordinal, num_shards_);
        if (!c.ok()) {
          result = c.status().WithContext("coordinator catalog");
          ZPS_LOG(ERROR) << result.ToString();
          continue;
        }
        complete = *c;
      } else {
        complete = std::all_of(shards_.begin(), shards_.end(), [&](const ShardEntry& s) {
          return std::binary_search(s.checkpoints.begin(), s.checkpoints.end(), step);
        });
      }
      if (!complete) continue;
      complete_ = std::max(complete_, step);
      if (r.has_result && step == r.result_step) {
        ZPS_LOG(INFO) << "checkpoint of step " << step << " complete on all " << num_shards_
                      << " shards";
      }
      if (opts_.catalog != nullptr) {
        Status ps = opts_.catalog->PutStep(step);
        if (!ps.ok()) ZPS_LOG(ERROR) << "coordinator catalog: " << ps.ToString();
      }
      auto keep = checkpoint_waiters_.begin();
      for (auto it = checkpoint_waiters_.begin(); it != checkpoint_waiters_.end(); ++it) {
        if (it->first <= step) {
          done.emplace_back(std::move(it->second), msg::CheckpointDone{step, num_shards_});
        } else {
          *keep++ = std::move(*it);
        }
      }
      checkpoint_waiters_.erase(keep, checkpoint_waiters_.end());
    }
  }
  for (auto& [cb, res] : done) cb(res);
  const Status why = Unavailable("the job is rolling back to an older checkpoint; re-join");
  for (auto& cb : rolled_back) cb(why);
  for (auto& cb : rolled_back_ckpt) cb(why);
  return result;
}

bool Coordinator::AdvanceRecovery() {
  if (phase_ != msg::JobPhase::kRecovering) return false;
  if (target_ < 0) {
    for (const auto& e : shards_) {
      if (!e.connected || !e.listed) return false;
    }
    // The newest step every shard holds.
    int64_t target = 0;
    for (int64_t s : shards_[0].checkpoints) {
      bool everywhere = std::all_of(shards_.begin(), shards_.end(), [&](const ShardEntry& e) {
        return std::binary_search(e.checkpoints.begin(), e.checkpoints.end(), s);
      });
      if (everywhere) target = std::max(target, s);
    }
    target_ = target;
    complete_ = target;  // later ones are dropped everywhere
    for (auto& e : shards_) {
      e.checkpoints.erase(std::upper_bound(e.checkpoints.begin(), e.checkpoints.end(), target),
                          e.checkpoints.end());
    }
    if (opts_.catalog != nullptr) {
      Status s = opts_.catalog->DropGlobalAfter(target);
      if (!s.ok()) ZPS_LOG(ERROR) << "coordinator catalog: " << s.ToString();
    }
    ZPS_LOG(WARNING) << "job recovery (epoch " << epoch_ << "): rolling back to step " << target
                     << (target == 0 ? " (no checkpoint on every shard: starting over)" : "");
  }
  for (const auto& e : shards_) {
    if (!e.connected || !e.ready) return false;
  }
  commit_.emplace(job_->commit);
  optimizer_step_ = 0;
  if (target_ > 0) {
    const msg::ResumeState& rs = shards_[0].state;
    for (uint32_t i = 1; i < num_shards_; ++i) {
      const msg::ResumeState& o = shards_[i].state;
      if (o.loss_scale != rs.loss_scale || o.good_steps != rs.good_steps ||
          o.optimizer_step != rs.optimizer_step) {
        ZPS_LOG(ERROR) << "shard " << i << " restored step " << target_
                       << " with other optimizer counters than shard 0; using shard 0's";
      }
    }
    Status s = commit_->Restore({rs.loss_scale, rs.good_steps});
    if (!s.ok()) ZPS_LOG(ERROR) << "cannot restore the loss scaler: " << s.ToString();
    optimizer_step_ = rs.optimizer_step;
  }
  step_ = target_;
  reports_.assign(reports_.size(), std::nullopt);
  reported_ = 0;
  history_.clear();
  phase_ = msg::JobPhase::kRunning;
  if (opts_.catalog != nullptr) {
    Status s = opts_.catalog->PutStep(step_);
    if (!s.ok()) ZPS_LOG(ERROR) << "coordinator catalog: " << s.ToString();
  }
  ZPS_LOG(WARNING) << "job recovered (epoch " << epoch_ << "): resuming at step " << step_;
  return true;
}

Result<msg::ShardSyncReply> Coordinator::ShardSync(const msg::ShardSync& sync) {
  if (sync.ordinal >= num_shards_) {
    return OutOfRange("shard ordinal " + std::to_string(sync.ordinal) +
                      " >= " + std::to_string(num_shards_));
  }
  MutexLock lock(&mu_);
  if (shutdown_) return shutdown_reason_;
  if (!job_) return msg::ShardSyncReply{epoch_, msg::JobPhase::kNoJob, -1};
  ShardEntry& e = shards_[sync.ordinal];
  if (phase_ == msg::JobPhase::kRecovering) {
    AdvanceRecovery();  // may fix the target
    if (phase_ == msg::JobPhase::kRecovering && sync.ready && sync.epoch == epoch_ &&
        target_ >= 0 && sync.state.step == target_ && e.connected) {
      e.ready = true;
      e.state = sync.state;
      AdvanceRecovery();
    }
  }
  return msg::ShardSyncReply{epoch_, phase_, phase_ == msg::JobPhase::kRunning ? step_ : target_};
}

void Coordinator::RequestCheckpoint(CheckpointCallback cb) {
  MutexLock lock(&mu_);
  Status bad;
  if (shutdown_) {
    bad = shutdown_reason_;
  } else if (!job_) {
    bad = FailedPrecondition("no job registered: nothing to checkpoint");
  } else if (phase_ != msg::JobPhase::kRunning) {
    bad = Unavailable("the job is recovering; retry the checkpoint request later");
  }
  if (!bad.ok()) {
    lock.Unlock();
    cb(bad);
    return;
  }
  checkpoint_requested_ = true;
  checkpoint_waiters_.emplace_back(step_ + 1, std::move(cb));
  ZPS_LOG(INFO) << "checkpoint requested: at the end of step " << step_;
}

std::vector<uint32_t> Coordinator::awaiting_reports() const {
  MutexLock lock(&mu_);
  std::vector<uint32_t> out;
  if (!job_) return out;
  for (uint32_t c = 0; c < reports_.size(); ++c) {
    const uint32_t shard = job_->layout.shard_of_chunk(c);
    if (!reports_[c] && std::find(out.begin(), out.end(), shard) == out.end()) out.push_back(shard);
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t Coordinator::checkpoint_waiters() const {
  MutexLock lock(&mu_);
  return checkpoint_waiters_.size();
}

msg::JobPhase Coordinator::phase() const {
  MutexLock lock(&mu_);
  return phase_;
}

uint64_t Coordinator::epoch() const {
  MutexLock lock(&mu_);
  return epoch_;
}

uint64_t Coordinator::kv_generation() const {
  MutexLock lock(&mu_);
  return ((epoch_ + 1) << 32) + worker_generations_;
}

Status Coordinator::stopped() const {
  MutexLock lock(&mu_);
  return shutdown_ ? shutdown_reason_ : Status::Ok();
}

bool Coordinator::AllShardsRegistered() const {
  MutexLock lock(&mu_);
  for (const auto& e : endpoints_) {
    if (e.empty()) return false;
  }
  return true;
}

void Coordinator::AwaitJob(JobCallback cb) {
  MutexLock lock(&mu_);
  if (shutdown_) {
    Status s = shutdown_reason_;
    lock.Unlock();
    cb(s);
    return;
  }
  if (job_) {
    JobSpec j = *job_;
    lock.Unlock();
    cb(std::move(j));
    return;
  }
  job_waiters_.push_back(std::move(cb));
}

Result<JoinInfo> Coordinator::Join(uint32_t rank, const std::optional<JobSpec>& spec, uint64_t hash,
                                   uint64_t session) {
  std::vector<JobCallback> waiters;
  std::vector<CommitCallback> regrouped;  // workers of the older generation, waiting
  std::string regroup_why;
  JoinInfo info;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return shutdown_reason_;
    for (uint32_t i = 0; i < num_shards_; ++i) {
      if (endpoints_[i].empty()) {
        return Unavailable("shard " + std::to_string(i) + " has not registered yet");
      }
    }
    if (spec) {
      ZPS_RETURN_IF_ERROR(spec->Validate());
      if (spec->Hash() != hash) return InvalidArgument("job spec does not match its hash");
      if (spec->layout.options().num_shards != num_shards_) {
        return InvalidArgument("the job's layout is for " +
                               std::to_string(spec->layout.options().num_shards) +
                               " shards; this cluster has " + std::to_string(num_shards_));
      }
    }
    if (!job_) {
      if (!spec) {
        return Unavailable("no job registered yet: rank 0 registers it (retry)");
      }
      if (rank != 0) return FailedPrecondition("only rank 0 registers the job");
      job_ = *spec;
      CommitConfig cc = spec->commit;
      commit_.emplace(cc);
      reports_.assign(spec->layout.num_chunks(), std::nullopt);
      waiters.swap(job_waiters_);
      phase_ = msg::JobPhase::kRunning;
      if (opts_.catalog != nullptr) {
        ZPS_RETURN_IF_ERROR(opts_.catalog->PutJobSpec(*spec).WithContext("coordinator catalog"));
        PersistEpoch();
      }
      ZPS_LOG(INFO) << "job registered: " << spec->layout.num_params() << " parameters, "
                    << spec->layout.total_elems() << " elements in " << spec->layout.num_chunks()
                    << " chunks, world size " << spec->shard.world_size;
    } else if (job_->Hash() != hash) {
      return FailedPrecondition("job spec mismatch: rank " + std::to_string(rank) +
                                " built a different model/layout/optimizer (hash " +
                                std::to_string(hash) + ", registered " +
                                std::to_string(job_->Hash()) + ")");
    }
    if (rank >= job_->shard.world_size) {
      return InvalidArgument("rank " + std::to_string(rank) + " >= world size " +
                             std::to_string(job_->shard.world_size));
    }
    if (phase_ != msg::JobPhase::kRunning) {
      return Unavailable("the job is recovering (epoch " + std::to_string(epoch_) +
                         "): shards are restoring a checkpoint; retry");
    }
    if (job_->shard.mode == ReductionMode::kPreReduced) {
      // A member joining again (its process restarted, or it re-joined after an error), or a
      // rank joining a generation still forming at an older step (that step was decided
      // meanwhile): a new generation, which every rank joins at the step in progress.
      const bool again = members_.count(rank) != 0;
      if (again || (!members_.empty() && members_step_ != step_)) {
        ++worker_generations_;
        members_.clear();
        for (auto& [st, cb] : worker_waiters_) regrouped.push_back(std::move(cb));
        worker_waiters_.clear();
        regroup_why = "rank " + std::to_string(rank) + (again ? " re-joined" : " joined") +
                      " the job at step " + std::to_string(step_) +
                      ": in a pre-reduced job every rank restarts the step with a new "
                      "communicator; re-join";
        ZPS_LOG(WARNING) << "rank " << rank << (again ? " re-joined" : " joined")
                         << " the job at step " << step_ << ": worker generation "
                         << worker_generations_ << " (pre-reduced: every rank re-joins and "
                         << "restarts the step with a new communicator)";
      }
      if (members_.empty()) members_step_ = step_;
      members_[rank] = session;
      if (session != 0) joined_sessions_[session] = rank;
    }
    info.job_hash = job_->Hash();
    info.resume_step = step_;
    info.loss_scale = commit_->loss_scale();
    info.shard_endpoints = endpoints_;
  }
  if (!waiters.empty()) {
    JobSpec j = *spec;
    for (auto& w : waiters) w(j);
  }
  for (auto& cb : regrouped) cb(Unavailable(regroup_why));
  return info;
}

void Coordinator::Report(int64_t step, uint32_t ordinal,
                         const std::vector<std::pair<uint32_t, ChunkReport>>& reports,
                         CommitCallback cb) {
  std::vector<CommitCallback> done;
  CommitInfo decided;
  {
    MutexLock lock(&mu_);
    // Each use returns at once: the analysis cannot follow a lambda that releases the lock.
    auto fail = [&](const Status& s) NO_THREAD_SAFETY_ANALYSIS {
      lock.Unlock();
      cb(s);
    };
    if (shutdown_) return fail(shutdown_reason_);
    if (!job_) return fail(FailedPrecondition("no job registered"));
    if (phase_ != msg::JobPhase::kRunning) {
      return fail(Unavailable("the job is recovering: report refused"));
    }
    if (step != step_) {
      return fail(FailedPrecondition("report for step " + std::to_string(step) +
                                     " while the job is at step " + std::to_string(step_)));
    }
    size_t again = 0;  // chunks reported before with the same figures
    for (const auto& [chunk, r] : reports) {
      if (chunk >= reports_.size() || job_->layout.shard_of_chunk(chunk) != ordinal) {
        return fail(InvalidArgument("chunk " + std::to_string(chunk) + " is not on shard " +
                                    std::to_string(ordinal)));
      }
      if (reports_[chunk]) {
        if (reports_[chunk]->sum_squares == r.sum_squares &&
            reports_[chunk]->non_finite == r.non_finite) {
          ++again;
          continue;
        }
        return fail(AlreadyExists("chunk " + std::to_string(chunk) + " already reported"));
      }
    }
    if (again != 0) {
      if (again != reports.size()) {
        return fail(AlreadyExists("a report of step " + std::to_string(step) +
                                  " that repeats only part of an earlier one"));
      }
      // The shard's earlier long-poll gave up (its call timed out) and it sent the same report
      // again: wait for the decision on this one too (was ALREADY_EXISTS, and the shard re-sent
      // it in a loop).
      commit_waiters_.emplace(step, std::move(cb));
      return;
    }
    for (const auto& [chunk, r] : reports) {
      reports_[chunk] = r;
      ++reported_;
    }
    commit_waiters_.emplace(step, std::move(cb));
    if (reported_ < reports_.size()) return;
    std::vector<ChunkReport> ordered;
    ordered.reserve(reports_.size());
    for (auto& r : reports_) ordered.push_back(*r);
    CommitDecision d = commit_->Decide(ordered);
    if (!d.skip) ++optimizer_step_;
    const bool checkpoint = checkpoint_requested_ || (opts_.checkpoint_every > 0 &&
                                                      (step + 1) % opts_.checkpoint_every == 0);
    checkpoint_requested_ = false;
    decided = {step,
               d.skip,
               d.grad_scale,
               d.global_norm,
               d.loss_scale,
               d.next_loss_scale,
               optimizer_step_,
               commit_->state().good_steps,
               checkpoint};
    decided.protect_checkpoint = complete_;
    history_.push_back(decided);
    if (history_.size() > kHistory) history_.pop_front();
    ++step_;
    reports_.assign(reports_.size(), std::nullopt);
    reported_ = 0;
    auto range = commit_waiters_.equal_range(step);
    for (auto it = range.first; it != range.second; ++it) done.push_back(std::move(it->second));
    commit_waiters_.erase(range.first, range.second);
    auto workers = worker_waiters_.equal_range(step);
    for (auto it = workers.first; it != workers.second; ++it) done.push_back(std::move(it->second));
    worker_waiters_.erase(workers.first, workers.second);
  }
  if (decided.skip) {
    ZPS_LOG(WARNING) << "step " << decided.step << " skipped (non-finite gradient); loss scale -> "
                     << decided.next_loss_scale;
  }
  for (auto& w : done) w(decided);
}

void Coordinator::AwaitCommit(int64_t step, CommitCallback cb, uint64_t session) {
  MutexLock lock(&mu_);
  Status bad;
  auto joined = joined_sessions_.find(session);
  if (shutdown_) {
    bad = shutdown_reason_;
  } else if (phase_ != msg::JobPhase::kRunning) {
    bad = Unavailable("the job is recovering; re-join");
  } else if (session != 0 && joined != joined_sessions_.end() &&
             !(members_.count(joined->second) != 0 && members_[joined->second] == session)) {
    bad = Unavailable("rank " + std::to_string(joined->second) +
                      " belongs to an older worker generation (another rank re-joined the job): "
                      "in a pre-reduced job every rank restarts the step with a new "
                      "communicator; re-join");
  } else if (step < step_) {
    for (const auto& h : history_) {
      if (h.step == step) {
        CommitInfo c = h;
        lock.Unlock();
        cb(c);
        return;
      }
    }
    bad = FailedPrecondition("step " + std::to_string(step) + " is too old to report");
  } else if (step > step_) {
    bad = FailedPrecondition("step " + std::to_string(step) + " is ahead of the job (at " +
                             std::to_string(step_) + ")");
  }
  if (!bad.ok()) {
    lock.Unlock();
    cb(bad);
    return;
  }
  (joined != joined_sessions_.end() ? worker_waiters_ : commit_waiters_)
      .emplace(step, std::move(cb));
}

int64_t Coordinator::step() const {
  MutexLock lock(&mu_);
  return step_;
}

void Coordinator::Shutdown(const Status& reason) {
  std::vector<JobCallback> jobs;
  std::multimap<int64_t, CommitCallback> commits;
  std::vector<std::pair<int64_t, CheckpointCallback>> ckpts;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    shutdown_reason_ = reason;
    jobs.swap(job_waiters_);
    commits.swap(commit_waiters_);
    commits.merge(worker_waiters_);
    ckpts.swap(checkpoint_waiters_);
  }
  for (auto& j : jobs) j(reason);
  for (auto& [s, c] : commits) c(reason);
  for (auto& [s, c] : ckpts) c(reason);
}

}  // namespace zps::server
