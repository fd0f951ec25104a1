#include "zps/server/coordinator.h"

#include "zps/common/logging.h"

namespace zps::server {

Coordinator::Coordinator(uint32_t num_shards) : num_shards_(num_shards), endpoints_(num_shards) {}

Coordinator::~Coordinator() { Shutdown(Cancelled("coordinator stopped")); }

Status Coordinator::RegisterShard(uint32_t ordinal, std::string endpoint) {
  if (ordinal >= num_shards_) {
    return OutOfRange("shard ordinal " + std::to_string(ordinal) + " >= " +
                      std::to_string(num_shards_));
  }
  if (endpoint.empty()) return InvalidArgument("shard endpoint is empty");
  std::lock_guard<std::mutex> lock(mu_);
  ZPS_LOG(INFO) << "shard " << ordinal << " registered at " << endpoint;
  endpoints_[ordinal] = std::move(endpoint);
  return Status::Ok();
}

bool Coordinator::AllShardsRegistered() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : endpoints_) {
    if (e.empty()) return false;
  }
  return true;
}

void Coordinator::AwaitJob(JobCallback cb) {
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) {
    Status s = shutdown_reason_;
    lock.unlock();
    cb(s);
    return;
  }
  if (job_) {
    JobSpec j = *job_;
    lock.unlock();
    cb(std::move(j));
    return;
  }
  job_waiters_.push_back(std::move(cb));
}

Result<JoinInfo> Coordinator::Join(uint32_t rank, const std::optional<JobSpec>& spec,
                                   uint64_t hash) {
  std::vector<JobCallback> waiters;
  JoinInfo info;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    info.job_hash = job_->Hash();
    info.resume_step = step_;
    info.loss_scale = commit_->loss_scale();
    info.shard_endpoints = endpoints_;
  }
  if (!waiters.empty()) {
    JobSpec j = *spec;
    for (auto& w : waiters) w(j);
  }
  return info;
}

void Coordinator::Report(int64_t step, uint32_t ordinal,
                         const std::vector<std::pair<uint32_t, ChunkReport>>& reports,
                         CommitCallback cb) {
  std::vector<CommitCallback> done;
  CommitInfo decided;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto fail = [&](const Status& s) {
      lock.unlock();
      cb(s);
    };
    if (shutdown_) return fail(shutdown_reason_);
    if (!job_) return fail(FailedPrecondition("no job registered"));
    if (step != step_) {
      return fail(FailedPrecondition("report for step " + std::to_string(step) +
                                     " while the job is at step " + std::to_string(step_)));
    }
    for (const auto& [chunk, r] : reports) {
      if (chunk >= reports_.size() || job_->layout.shard_of_chunk(chunk) != ordinal) {
        return fail(InvalidArgument("chunk " + std::to_string(chunk) + " is not on shard " +
                                    std::to_string(ordinal)));
      }
      if (reports_[chunk]) {
        return fail(AlreadyExists("chunk " + std::to_string(chunk) + " already reported"));
      }
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
    decided = {step, d.skip, d.grad_scale, d.global_norm, d.loss_scale, d.next_loss_scale,
               optimizer_step_};
    history_.push_back(decided);
    if (history_.size() > kHistory) history_.pop_front();
    ++step_;
    reports_.assign(reports_.size(), std::nullopt);
    reported_ = 0;
    auto range = commit_waiters_.equal_range(step);
    for (auto it = range.first; it != range.second; ++it) done.push_back(std::move(it->second));
    commit_waiters_.erase(range.first, range.second);
  }
  if (decided.skip) {
    ZPS_LOG(WARNING) << "step " << decided.step << " skipped (non-finite gradient); loss scale -> "
                     << decided.next_loss_scale;
  }
  for (auto& w : done) w(decided);
}

void Coordinator::AwaitCommit(int64_t step, CommitCallback cb) {
  std::unique_lock<std::mutex> lock(mu_);
  Status bad;
  if (shutdown_) {
    bad = shutdown_reason_;
  } else if (step < step_) {
    for (const auto& h : history_) {
      if (h.step == step) {
        CommitInfo c = h;
        lock.unlock();
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
    lock.unlock();
    cb(bad);
    return;
  }
  commit_waiters_.emplace(step, std::move(cb));
}

int64_t Coordinator::step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

void Coordinator::Shutdown(const Status& reason) {
  std::vector<JobCallback> jobs;
  std::multimap<int64_t, CommitCallback> commits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    shutdown_reason_ = reason;
    jobs.swap(job_waiters_);
    commits.swap(commit_waiters_);
  }
  for (auto& j : jobs) j(reason);
  for (auto& [s, c] : commits) c(reason);
}

}  // namespace zps::server
