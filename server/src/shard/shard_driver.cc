#include "shard_driver.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "shard/snapshot_manager.h"
#include "zps/common/bytes.h"
#include "zps/common/config.h"
#include "zps/common/logging.h"

namespace zps::server {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// ZPS_TEST_CRASH_AT, parsed once: <point>:<step>, or <point>:<step>+ for that step or later.
struct CrashSpec {
  std::string text;  // as given, for the log line; empty when unset
  std::string point;
  int64_t step = 0;
  bool or_later = false;
  bool valid = false;
};

CrashSpec ParseCrashSpec(const char* env) {
  CrashSpec c;
  if (env == nullptr) return c;
  c.text = env;
  std::string_view s = c.text;
  c.or_later = s.ends_with('+');
  if (c.or_later) s.remove_suffix(1);
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return c;
  c.point = std::string(s.substr(0, colon));
  const std::string_view digits = s.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), c.step);
  c.valid = ec == std::errc() && end == digits.data() + digits.size();
  return c;
}

}  // namespace

void MaybeCrashAt(std::string_view point, int64_t step) {
  static const CrashSpec spec = ParseCrashSpec(std::getenv("ZPS_TEST_CRASH_AT"));
  if (!spec.valid || point != spec.point) return;
  if (spec.or_later ? step < spec.step : step != spec.step) return;
  ZPS_LOG(WARNING) << "ZPS_TEST_CRASH_AT=" << spec.text << ": killing this process at " << point
                   << ":" << step;
  ::raise(SIGKILL);
}

// ---- ShardCheckpoints -------------------------------------------------------------------------

namespace {
// host:port at which this process reaches its own control port bound to `bind`.
std::string SelfAddress(const std::string& bind, uint16_t port) {
  const std::string p = std::to_string(port);
  if (bind.empty() || bind == "0.0.0.0") return "127.0.0.1:" + p;
  if (bind == "::" || bind == "[::]") return "[::1]:" + p;
  if (bind.find(':') != std::string::npos && bind.front() != '[') return "[" + bind + "]:" + p;
  return bind + ":" + p;
}
constexpr uint32_t kStateMagic = 0x5a505331;  // "ZPS1": the resume-state blob's version

std::vector<std::byte> EncodeResume(const msg::ResumeState& rs) {
  ByteWriter w;
  w.U32(kStateMagic);
  w.I64(rs.step);
  w.F64(rs.loss_scale);
  w.I64(rs.good_steps);
  w.I64(rs.optimizer_step);
  return w.Take();
}

Result<msg::ResumeState> DecodeResume(std::span<const std::byte> b) {
  ByteReader r(b);
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("magic"));
  if (magic != kStateMagic) return DataLoss("checkpoint state blob: unknown format");
  msg::ResumeState rs;
  ZPS_ASSIGN_OR_RETURN(rs.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(rs.loss_scale, r.F64("loss_scale"));
  ZPS_ASSIGN_OR_RETURN(rs.good_steps, r.I64("good_steps"));
  ZPS_ASSIGN_OR_RETURN(rs.optimizer_step, r.I64("optimizer_step"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("checkpoint state blob"));
  return rs;
}
}  // namespace

Result<std::unique_ptr<ShardCheckpoints>> ShardCheckpoints::Open(const std::string& data_dir,
                                                                 const CheckpointOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) return IoError("cannot create --data-dir '" + data_dir + "': " + ec.message());
  const std::string dir = data_dir + "/checkpoints";
  ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(dir, options));
  return std::unique_ptr<ShardCheckpoints>(new ShardCheckpoints(dir, options, std::move(store)));
}

Status ShardCheckpoints::Reopen() {
  store_.reset();  // RocksDB accepts no write after a failed one: a fresh open clears that
  auto reopened = CheckpointStore::Open(dir_, options_);
  if (!reopened.ok()) {
    // No room even for the files a writable open creates: read-only keeps restores possible,
    // and the next write tries a writable open again.
    CheckpointOptions ro = options_;
    ro.read_only = true;
    auto read_only = CheckpointStore::Open(dir_, ro);
    if (read_only.ok()) {
      store_ = std::move(*read_only);
      store_->Protect(protected_);
    }
    return reopened.status().WithContext("reopening " + dir_);
  }
  store_ = std::move(*reopened);
  store_->Protect(protected_);
  return Status::Ok();
}

Status ShardCheckpoints::Ready(bool writable) {
  if (store_ && (!writable || !store_->options().read_only)) return Status::Ok();
  Status s = Reopen();
  if (!s.ok() && store_ && !writable) return Status::Ok();  // read-only serves reads
  return s;
}

Status ShardCheckpoints::Bind(const JobSpec& job, uint32_t ordinal) {
  ZPS_RETURN_IF_ERROR(Ready(/*writable=*/true));
  ZPS_RETURN_IF_ERROR(store_->SetIdentity(job.layout, ordinal)
                          .WithContext("--data-dir holds checkpoints of another job or shard "
                                       "(move it away to start a new job)"));
  // Checkpoints hold the moments packed as the job that wrote them kept them: a job of another
  // state dtype cannot resume from them (no conversion), which is better said now than when
  // the coordinator picks one to restore.
  state_dtype_ = job.optimizer.state_dtype;
  ZPS_ASSIGN_OR_RETURN(auto list, store_->ListCheckpoints(false));
  for (const CheckpointInfo& c : list) {
    if (c.verification != Verification::kCorrupt) ZPS_RETURN_IF_ERROR(CheckStateDType(c));
  }
  return store_->PutJobSpec(job);
}

Status ShardCheckpoints::CheckStateDType(const CheckpointInfo& c) const {
  if (c.state_dtype == state_dtype_) return Status::Ok();
  return FailedPrecondition(
      "checkpoint of step " + std::to_string(c.step) + " in " + dir_ + " holds " +
      std::string(StateDTypeName(c.state_dtype)) +
      " optimizer state, but this job's "
      "optimizer.state_dtype is " +
      std::string(StateDTypeName(state_dtype_)) +
      ": a checkpoint is restored only into its own state dtype (run the job with state_dtype " +
      std::string(StateDTypeName(c.state_dtype)) + " to resume, convert its moments offline with " +
      "zps-ckpt reshard --state-dtype " + std::string(StateDTypeName(state_dtype_)) +
      ", or move --data-dir away to start anew)");
}

Result<std::vector<int64_t>> ShardCheckpoints::Steps(bool verify) {
  ZPS_RETURN_IF_ERROR(Ready(/*writable=*/false));
  ZPS_ASSIGN_OR_RETURN(auto list, store_->ListCheckpoints(verify));
  std::vector<int64_t> steps;
  for (const auto& c : list) {
    if (c.verification == Verification::kCorrupt) {
      ZPS_LOG(ERROR) << "checkpoint of step " << c.step << " in " << dir_
                     << " is corrupt (DATA_LOSS: " << c.problem
                     << "); it will not be used: the job rolls back to an older checkpoint";
      MarkUnusable(c.step);
      continue;
    }
    if (std::find(unusable_.begin(), unusable_.end(), c.step) != unusable_.end()) continue;
    steps.push_back(c.step);
  }
  return steps;
}

Status ShardCheckpoints::Write(const ShardState& state, const msg::ResumeState& rs) {
  return WriteVisited([&](const ShardState::ChunkVisitor& fn) { return state.VisitChunkState(fn); },
                      rs, {});
}

Status ShardCheckpoints::WriteSnapshot(ShardState::Snapshot& snap, const msg::ResumeState& rs,
                                       const AfterChunk& after_chunk) {
  return WriteVisited([&](const ShardState::ChunkVisitor& fn) { return snap.Visit(fn); }, rs,
                      after_chunk);
}

Status ShardCheckpoints::WriteVisited(const Visit& visit, const msg::ResumeState& rs,
                                      const AfterChunk& after_chunk) {
  Status s = Ready(/*writable=*/true);
  if (!s.ok()) return s.WithContext("checkpoint store " + dir_);
  s = WriteOnce(visit, rs, after_chunk);
  if (s.ok() || s.code() == Code::kFailedPrecondition) return s;
  if (Status r = Reopen(); !r.ok()) ZPS_LOG(ERROR) << r.ToString();
  return s.WithContext("checkpoint store " + dir_);
}

Status ShardCheckpoints::WriteOnce(const Visit& visit, const msg::ResumeState& rs,
                                   const AfterChunk& after_chunk) {
  auto writer = store_->BeginCheckpoint(rs.step, state_dtype_);
  if (!writer.ok()) {
    if (writer.status().code() == Code::kAlreadyExists) return Status::Ok();
    return writer.status();
  }
  std::vector<std::byte> zeros;  // a moment the optimizer does not keep (zero bytes: zero values)
  bool first = true;
  uint64_t written = 0;  // elements of the chunks added
  Status visited = visit([&](uint32_t chunk, int64_t version, std::span<const float> master,
                             std::span<const std::byte> m, std::span<const std::byte> v) -> Status {
    if (version != rs.step) {
      return FailedPrecondition("state at version " + std::to_string(version) +
                                ", checkpoint of step " + std::to_string(rs.step));
    }
    const uint64_t moment = MomentBytes(state_dtype_, master.size());
    if (m.size() != moment || v.size() != moment) zeros.assign(moment, std::byte{0});
    ChunkTensors t{master, m.size() == moment ? m : std::span<const std::byte>(zeros),
                   v.size() == moment ? v : std::span<const std::byte>(zeros)};
    ZPS_RETURN_IF_ERROR((*writer)->AddChunk(chunk, version, t));
    if (first) MaybeCrashAt("checkpoint", rs.step);  // a write half done
    first = false;
    written += master.size();
    if (after_chunk) after_chunk(written);
    return Status::Ok();
  });
  ZPS_RETURN_IF_ERROR(visited);
  ZPS_RETURN_IF_ERROR((*writer)->SetState(EncodeResume(rs)));
  return (*writer)->Commit();
}

Result<msg::ResumeState> ShardCheckpoints::Restore(ShardState& state, int64_t step,
                                                   const Status& reason) {
  ZPS_RETURN_IF_ERROR(Ready(/*writable=*/false));
  ZPS_ASSIGN_OR_RETURN(auto reader, store_->OpenCheckpoint(step));
  ZPS_RETURN_IF_ERROR(CheckStateDType(reader->info()));
  ZPS_ASSIGN_OR_RETURN(auto blob, reader->ReadState());
  ZPS_ASSIGN_OR_RETURN(msg::ResumeState rs, DecodeResume(blob));
  if (rs.step != step) {
    return DataLoss("checkpoint " + std::to_string(step) + " holds the state of step " +
                    std::to_string(rs.step));
  }
  ZPS_RETURN_IF_ERROR(state.ResetTo(
      step,
      [&](uint32_t chunk, std::span<float> master, std::span<std::byte> m, std::span<std::byte> v) {
        return reader->ReadChunk(chunk, {master, m, v})
            .WithContext("checkpoint " + std::to_string(step) + " chunk " + std::to_string(chunk));
      },
      reason));
  return rs;
}

Status ShardCheckpoints::DropAfter(int64_t step) {
  ZPS_RETURN_IF_ERROR(Ready(/*writable=*/false));
  // A store left read-only by a full disk needs no write when there is nothing to drop.
  ZPS_ASSIGN_OR_RETURN(auto list, store_->ListCheckpoints(false));
  if (list.empty() || list.back().step <= step) return Status::Ok();
  ZPS_RETURN_IF_ERROR(Ready(/*writable=*/true));
  ZPS_RETURN_IF_ERROR(store_->DropCheckpointsAfter(step));
  // Gone from the disk: a later checkpoint of the same step is a new, usable one.
  std::erase_if(unusable_, [step](int64_t s) { return s > step; });
  return Status::Ok();
}

// ---- ShardDriver ------------------------------------------------------------------------------

ShardDriver::ShardDriver(DriverHost host, std::unique_ptr<ShardCheckpoints> checkpoints)
    : host_(std::move(host)), ckpt_(std::move(checkpoints)) {}

void ShardDriver::Interrupt() {
  MutexLock lock(&mu_);
  interrupted_ = true;
  if (coord_) coord_->Close();
}

bool ShardDriver::Connected() {
  MutexLock lock(&mu_);
  return coord_ && coord_->connected();
}

Result<std::vector<std::byte>> ShardDriver::Call(uint16_t type, std::span<const std::byte> payload,
                                                 std::chrono::milliseconds timeout) {
  rpc::Client* c = nullptr;
  {
    MutexLock lock(&mu_);
    if (coord_ && coord_->connected()) c = coord_.get();  // replaced only by this thread
  }
  if (c == nullptr) return Unavailable("lost the connection to the coordinator");
  return c->Call(type, payload, timeout);
}

Status ShardDriver::Connect() {
  const auto& o = *host_.opts;
  // The coordinator shard (0) reaches its own coordinator like any other client: over loopback
  // when it listens on every interface, else at the one address it is bound to (with
  // --bind 10.0.0.1 nothing listens on 127.0.0.1).
  const std::string coord =
      o.ordinal == 0 ? SelfAddress(o.bind_address, host_.rpc_port) : o.coordinator;
  ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(coord));
  auto backoff = 100ms;
  const auto deadline = Clock::now() + std::chrono::seconds(o.step_timeout_s);
  for (;;) {
    if (host_.stopping()) return Cancelled("stopping");
    rpc::ClientOptions co{hp.first,
                          hp.second,
                          o.token,
                          rpc::PeerRole::kShard,
                          static_cast<uint32_t>(o.ordinal),
                          "shard-" + std::to_string(o.ordinal),
                          {},
                          5000};
    auto client = rpc::Client::Connect(co);
    if (client.ok()) {
      MutexLock lock(&mu_);
      if (interrupted_) return Cancelled("stopping");
      coord_ = std::move(*client);
      break;
    }
    if (client.status().code() == Code::kUnauthenticated ||
        client.status().code() == Code::kFailedPrecondition) {
      return client.status().WithContext("coordinator " + coord);
    }
    if (Clock::now() > deadline) {
      return client.status().WithContext("coordinator " + coord + " unreachable for " +
                                         std::to_string(o.step_timeout_s) + " s");
    }
    ZPS_LOG(INFO) << "waiting for the coordinator at " << coord << ": "
                  << client.status().ToString();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  msg::RegisterShard reg{static_cast<uint32_t>(o.ordinal),
                         o.advertise_host + ":" + std::to_string(host_.rpc_port)};
  ZPS_RETURN_IF_ERROR(Call(msg::kRegisterShard, reg.Encode(), 10s).status());
  return ReportCheckpoints(std::nullopt);
}

Status ShardDriver::ReportCheckpoints(const std::optional<std::pair<int64_t, Status>>& result) {
  msg::CheckpointReport rep;
  rep.ordinal = static_cast<uint32_t>(host_.opts->ordinal);
  if (ckpt_) {
    // The first listing after a (re)start reads every value back: a corrupt newest checkpoint
    // is left out, so the job rolls back to the previous one.
    ZPS_ASSIGN_OR_RETURN(rep.steps, ckpt_->Steps(/*verify=*/!verified_));
    verified_ = true;
  }
  if (result) {
    rep.has_result = true;
    rep.result_step = result->first;
    rep.result_code = static_cast<uint32_t>(result->second.code());
    rep.result_message = result->second.message();
  }
  return Call(msg::kCheckpointReport, rep.Encode(), 10s).status();
}

Status ShardDriver::AwaitJob() {
  std::vector<std::byte> bytes;
  for (;;) {
    if (host_.stopping()) return Cancelled("stopping");
    auto r = Call(msg::kAwaitJob, {}, 60s);
    if (r.ok()) {
      bytes = std::move(*r);
      break;
    }
    if (r.status().code() != Code::kDeadlineExceeded) return r.status().WithContext("await job");
  }
  ZPS_ASSIGN_OR_RETURN(JobSpec job, JobSpec::Deserialize(bytes));
  const auto& o = *host_.opts;
  if (job_) {
    if (job.Hash() != job_->Hash()) {
      return FailedPrecondition("the coordinator now has a different job than this shard holds");
    }
    return Status::Ok();
  }
  if (job.layout.options().num_shards != static_cast<uint32_t>(o.shards)) {
    return FailedPrecondition("the job is laid out for " +
                              std::to_string(job.layout.options().num_shards) +
                              " shards but --shards is " + std::to_string(o.shards));
  }
  if (ckpt_) ZPS_RETURN_IF_ERROR(ckpt_->Bind(job, static_cast<uint32_t>(o.ordinal)));
  std::optional<ChunkStoreOptions> spill;
  if (o.memory_budget > 0 || o.serving_budget > 0) {  // a ChunkStore under <data-dir>/spill
    ChunkStoreOptions so;
    // No --memory-budget: master, m and v all stay resident (in the store's RAM).
    so.memory_budget = o.memory_budget > 0 ? o.memory_budget : UINT64_MAX;
    so.serving_records = o.serving_budget > 0;  // else serving copies stay in the RAM block
    so.serving_memory_budget = o.serving_budget;
    so.spill_dir = o.spill_dir.empty() ? o.data_dir + "/spill" : o.spill_dir;
    so.file_prefix = "shard-" + std::to_string(o.ordinal);
    std::error_code ec;
    std::filesystem::create_directories(so.spill_dir, ec);
    if (ec)
      return IoError("cannot create the spill directory '" + so.spill_dir + "': " + ec.message());
    spill = so;
  }
  // Serving copies in UCX-allocated memory (one region), so that workers on shared memory Get
  // them directly; where that fails, heap memory (fetches then go by AM).
  ZPS_ASSIGN_OR_RETURN(const ServingCopies copies, ParseServingCopies(o.serving_copies));
  auto created = ShardState::Create(job.layout, static_cast<uint32_t>(o.ordinal), job.shard,
                                    job.optimizer, host_.pool, spill, host_.serving_alloc, copies);
  // Another try without the allocator, unless the job itself was refused.
  if (!created.ok() && host_.serving_alloc &&
      created.status().code() != Code::kFailedPrecondition &&
      created.status().code() != Code::kInvalidArgument) {
    ZPS_LOG(WARNING) << "serving copies in heap memory (RMA fetch off): "
                     << created.status().ToString();
    created = ShardState::Create(job.layout, static_cast<uint32_t>(o.ordinal), job.shard,
                                 job.optimizer, host_.pool, spill, {}, copies);
  }
  ZPS_ASSIGN_OR_RETURN(auto st, std::move(created));
  st->SetTestHook([](std::string_view point, int64_t step) { MaybeCrashAt(point, step); });
  job_ = job;
  state_ = host_.publish_state(std::move(st), job);
  if (ckpt_ && o.checkpoint_mode == "background" && !spill) state_->ReserveSnapshotBuffers();
  ZPS_LOG(INFO) << "shard " << o.ordinal << " holds " << state_->chunk_ids().size() << " of "
                << job.layout.num_chunks() << " chunks";
  if (const ShardStorageStats ss = state_->storage_stats(); ss.spilled) {
    ZPS_LOG(INFO) << "shard " << o.ordinal << " memory budget " << o.memory_budget << ": "
                  << ss.store.state_resident << "/" << ss.store.chunks << " chunk states in RAM, "
                  << ss.store.chunks - ss.store.state_resident << " spilled ("
                  << ss.store.state_file_bytes << " bytes in the spill file)";
    if (ss.serving_in_store) {
      ZPS_LOG(INFO) << "shard " << o.ordinal << " serving budget " << o.serving_budget << ": "
                    << ss.store.serving_resident << "/" << ss.store.chunks
                    << " serving copies in RAM, " << ss.store.chunks - ss.store.serving_resident
                    << " spilled (" << ss.store.serving_file_bytes << " bytes in the spill file)";
    }
  }
  return Status::Ok();
}

Result<msg::ShardSyncReply> ShardDriver::Sync(bool ready) {
  msg::ShardSync s{static_cast<uint32_t>(host_.opts->ordinal), epoch_, ready, resume_};
  ZPS_ASSIGN_OR_RETURN(auto bytes, Call(msg::kShardSync, s.Encode(), 10s));
  return msg::ShardSyncReply::Decode(bytes);
}

ShardDriver::~ShardDriver() {
  if (bg_ && bg_->thread.joinable()) bg_->thread.join();
}

Result<int64_t> ShardDriver::SyncToJob() {
  FinishCheckpoint(true);  // a restore must not run beside the background writer
  const auto deadline = Clock::now() + std::chrono::seconds(host_.opts->step_timeout_s);
  for (;;) {
    if (host_.stopping()) return Cancelled("stopping");
    if (Clock::now() > deadline) {
      return DeadlineExceeded("the job did not become runnable within " +
                              std::to_string(host_.opts->step_timeout_s) + " s");
    }
    auto reply = Sync(false);
    if (!reply.ok()) {
      resync_ = true;
      return reply.status();
    }
    if (reply->phase == msg::JobPhase::kRunning) {
      if (synced_ && reply->epoch == epoch_) {
        host_.set_serving(true, Status::Ok());
        return std::max<int64_t>(state_->version(), 0);
      }
      // A new job: nothing to restore (a shard without chunks is at "version" 0 from the start).
      const bool fresh = state_->version() < 0 || state_->chunk_ids().empty();
      if (!synced_ && fresh && reply->target_step == 0) {
        epoch_ = reply->epoch;
        synced_ = true;
        resume_ = {0, job_->commit.dynamic_loss_scale ? job_->commit.initial_loss_scale : 1.0, 0,
                   0};
        host_.set_serving(true, Status::Ok());
        return 0;
      }
    } else if (reply->phase == msg::JobPhase::kRecovering) {
      const Status why = Unavailable("shard " + std::to_string(host_.opts->ordinal) +
                                     " is rolling back to a checkpoint; re-join");
      host_.set_serving(false, why);
      if (reply->target_step >= 0) {
        if (!synced_ || epoch_ != reply->epoch || resume_.step != reply->target_step) {
          synced_ = false;
          const int64_t target = reply->target_step;
          const auto t0 = Clock::now();
          if (target == 0) {
            ZPS_RETURN_IF_ERROR(state_->ResetTo(-1, {}, why));
            resume_ = {0, job_->commit.dynamic_loss_scale ? job_->commit.initial_loss_scale : 1.0,
                       0, 0};
          } else if (!ckpt_) {
            return FailedPrecondition("asked to restore step " + std::to_string(target) +
                                      " without a --data-dir");
          } else {
            auto restored = ckpt_->Restore(*state_, target, why);
            if (!restored.ok()) {
              ZPS_RETURN_IF_ERROR(OfferOlderCheckpoint(target, restored.status()));
              std::this_thread::sleep_for(50ms);
              continue;
            }
            resume_ = *restored;
          }
          if (ckpt_) ZPS_RETURN_IF_ERROR(ckpt_->DropAfter(target));
          last_checkpoint_ = target;
          epoch_ = reply->epoch;
          synced_ = true;
          ZPS_LOG(WARNING) << "shard " << host_.opts->ordinal << " restored step " << target
                           << " (epoch " << epoch_ << ") in "
                           << std::chrono::duration<double>(Clock::now() - t0).count() << " s";
        }
        auto r2 = Sync(true);
        if (!r2.ok()) {
          resync_ = true;
          return r2.status();
        }
        if (r2->phase == msg::JobPhase::kRunning && r2->epoch == epoch_) {
          host_.set_serving(true, Status::Ok());
          return resume_.step;
        }
      }
    }
    std::this_thread::sleep_for(50ms);
  }
}

Status ShardDriver::OfferOlderCheckpoint(int64_t step, const Status& failed) {
  if (failed.code() != Code::kDataLoss && failed.code() != Code::kNotFound) return failed;
  ZPS_LOG(ERROR) << "shard " << host_.opts->ordinal << " cannot load checkpoint " << step
                 << ", the coordinator's recovery target (" << failed.ToString()
                 << "); reporting it unusable so that the job rolls back to an older one";
  ckpt_->MarkUnusable(step);
  Status r = ReportCheckpoints(std::nullopt);
  if (!r.ok()) resync_ = true;
  return r;
}

Status ShardDriver::Run() {
  log::SetThreadName("shard-driver");
  for (;;) {
    if (host_.stopping()) return Cancelled("stopping");
    resync_ = false;
    if (!Connected()) {
      if (state_ != nullptr) {
        host_.set_serving(false, Unavailable("shard " + std::to_string(host_.opts->ordinal) +
                                             " lost the coordinator; re-join"));
      }
      ZPS_RETURN_IF_ERROR(Connect());
      Status j = AwaitJob();
      if (!j.ok()) {
        if (j.code() == Code::kUnavailable && !host_.stopping()) continue;
        return j;
      }
    }
    auto start = SyncToJob();
    if (!start.ok()) {
      if (resync_ && start.status().code() == Code::kUnavailable) continue;
      return start.status();
    }
    Status s = RunSteps(*start);
    if (resync_ && !host_.stopping()) {
      ZPS_LOG(WARNING) << "shard " << host_.opts->ordinal
                       << " syncs with the job again: " << s.ToString();
      continue;
    }
    return s;
  }
}

Status ShardDriver::RunSteps(int64_t start) {
  const auto& o = *host_.opts;
  const auto& job = *job_;
  const int state_arrays =
      job.optimizer.kind != OptimizerKind::kSgd ? 2 : (job.optimizer.momentum > 0.0f ? 1 : 0);
  uint64_t owned_elems = 0;
  for (uint32_t c : state_->chunk_ids()) owned_elems += job.layout.chunk_size(c);
  const uint64_t optimizer_bytes_per_step = owned_elems * 4 * 2 * (1 + state_arrays);
  auto last_commit = Clock::now();
  auto resync = [&](const Status& why) {
    resync_ = true;
    return why;
  };
  state_->ArmSpeculation(Assumed(start, resume_.loss_scale, resume_.optimizer_step));
  for (int64_t step = start;; ++step) {
    const auto deadline = Clock::now() + std::chrono::seconds(o.step_timeout_s);
    for (;;) {
      // While a checkpoint is written in the background, look at it often: its report is what
      // a worker waiting for the checkpoint's durability waits for.
      Status w = state_->WaitForGradients(step, bg_ ? 20ms : 500ms);
      if (bg_) FinishCheckpoint(false);
      if (w.ok()) break;
      if (w.code() != Code::kDeadlineExceeded) return w;
      if (host_.stopping()) return Cancelled("stopping");
      auto r = Sync(false);
      if (!r.ok()) return resync(r.status());
      if (r->epoch != epoch_ || r->phase != msg::JobPhase::kRunning) {
        FinishCheckpoint(true);  // a rollback restores through the store the writer uses
        return resync(
            Unavailable("the job is recovering (epoch " + std::to_string(r->epoch) + ")"));
      }
      if (Clock::now() > deadline) {
        // Name who is missing: a worker that died and never came back (docs/operations.md).
        std::string who;
        std::vector<uint32_t> missing = state_->MissingRanks(step);
        if (job.shard.mode == ReductionMode::kPreReduced && host_.absent_ranks) {
          missing = host_.absent_ranks(job.shard.world_size);  // no session: died, not back
        }
        for (uint32_t m : missing) who += (who.empty() ? "" : ", ") + std::to_string(m);
        return DeadlineExceeded(
            "step " + std::to_string(step) + ": gradients incomplete on shard " +
            std::to_string(o.ordinal) + " after " + std::to_string(o.step_timeout_s) + " s (" +
            (who.empty() ? std::string("some ranks") : "rank " + who) +
            " never pushed the step: a worker died and did not re-join within --step-timeout)");
      }
    }
    ZPS_ASSIGN_OR_RETURN(auto reports, state_->ReduceStep(step));
    msg::Report rep{step, static_cast<uint32_t>(o.ordinal), {}};
    for (const auto& [chunk, r] : reports)
      rep.chunks.push_back({chunk, r.sum_squares, r.non_finite});
    auto reply = Call(msg::kReport, rep.Encode(), std::chrono::seconds(o.step_timeout_s));
    if (!reply.ok()) {
      if (host_.stopping()) return Cancelled("stopping");
      FinishCheckpoint(true);
      return resync(reply.status().WithContext("report of step " + std::to_string(step)));
    }
    ZPS_ASSIGN_OR_RETURN(msg::CommitInfo ci, msg::CommitInfo::Decode(*reply));
    MaybeCrashAt("update", step);  // decided, not applied here
    if (ckpt_ && bg_) {
      pending_protect_ = ci.protect_checkpoint;  // the writer owns the store until it is done
    } else if (ckpt_) {
      ckpt_->Protect(ci.protect_checkpoint);
    }
    const auto t_apply = Clock::now();
    const Status applied =
        state_->ApplyCommit({step, ci.skip, ci.grad_scale, ci.optimizer_step},
                            Assumed(step + 1, ci.next_loss_scale, ci.optimizer_step));
    if (host_.storage_metrics) host_.storage_metrics();
    ZPS_RETURN_IF_ERROR(applied);
    if (host_.published) host_.published(state_->version());
    const auto t_done = Clock::now();
    if (bg_) {
      ZPS_LOG(DEBUG) << "step " << step << " applied in "
                     << std::chrono::duration<double>(t_done - t_apply).count()
                     << " s while the checkpoint of step " << bg_->step << " is written";
    }
    resume_ = {step + 1, ci.next_loss_scale, ci.good_steps, ci.optimizer_step};
    host_.optimizer_pass->Observe(std::chrono::duration<double>(t_done - t_apply).count());
    if (!ci.skip) host_.optimizer_bytes->Inc(optimizer_bytes_per_step);
    const double took = std::chrono::duration<double>(t_done - last_commit).count();
    host_.step_duration->Observe(took);
    step_seconds_ = step_seconds_ > 0.0 ? 0.75 * step_seconds_ + 0.25 * took : took;
    host_.current_step->Set(static_cast<double>(step + 1));
    last_commit = t_done;
    ZPS_LOG(DEBUG) << "step " << step << " published" << (ci.skip ? " (skipped)" : "");
    if (bg_) FinishCheckpoint(false);
    if (ci.checkpoint) StartCheckpoint(step + 1);
  }
}

CommitOrder ShardDriver::Assumed(int64_t step, double loss_scale, int64_t applied) const {
  return {step, false, StepCommit::UnclippedScale(loss_scale, job_->commit.grad_divisor),
          applied + 1};
}

void ShardDriver::StartCheckpoint(int64_t step) {
  if (bg_) {
    ZPS_LOG(WARNING) << "checkpoint of step " << step << " waits for the background write of "
                     << "step " << bg_->step << " to commit (a checkpoint never starts before "
                     << "the previous one committed)";
    FinishCheckpoint(true);
  }
  if (!ckpt_ || host_.opts->checkpoint_mode != "background") {
    CheckpointAndReport(step);
    return;
  }
  auto snap = state_->BeginSnapshot();
  if (!snap.ok()) {
    ZPS_LOG(DEBUG) << "checkpoint of step " << step
                   << " written synchronously: " << snap.status().ToString();
    CheckpointAndReport(step);
    return;
  }
  bg_ = std::make_unique<BackgroundWrite>();
  bg_->snap = std::move(*snap);
  bg_->step = step;
  bg_->t0 = Clock::now();
  bg_->last_chunk = bg_->t0;
  // A periodic checkpoint's write is spread over --checkpoint-pace of the period, so that less
  // of it runs beside each step. The pacer spreads the chunks; the commit after them (RocksDB
  // flushes what its memtables still hold, then syncs) is given what it took last time (a
  // quarter of the budget the first time), so the write as a whole ends within the budget.
  const int64_t every = host_.opts->checkpoint_every;
  double budget = 0.0;
  if (host_.opts->checkpoint_pace > 0.0 && every > 0 && step % every == 0) {
    budget = host_.opts->checkpoint_pace * static_cast<double>(every) * step_seconds_;
  }
  const double chunks_budget =
      std::max(0.0, budget - (commit_tail_ >= 0.0 ? commit_tail_ : 0.25 * budget));
  uint64_t total = 0;
  for (uint32_t id : state_->chunk_ids()) total += state_->layout().chunk_size(id);
  bg_->pacer = std::make_unique<Pacer>(total, chunks_budget);
  if (budget > 0.0) {
    ZPS_LOG(INFO) << "checkpoint of step " << step << ": written in the background over " << budget
                  << " s (--checkpoint-pace " << host_.opts->checkpoint_pace << " of " << every
                  << " steps of " << step_seconds_ << " s; the chunks over " << chunks_budget
                  << " s, then the commit)";
  }
  BackgroundWrite* bg = bg_.get();
  const msg::ResumeState rs = resume_;
  ShardState* state = state_;
  bg_->thread = std::thread([this, bg, rs, state] {
    log::SetThreadName("zps-ckpt-write");
    // The lowest CPU priority (Linux: per thread): the write takes what the step leaves idle.
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19) != 0) {
      ZPS_LOG(DEBUG) << "setpriority for the checkpoint writer failed; it runs at normal priority";
    }
    bool first = true;
    auto after_chunk = [bg, state, first](uint64_t written) mutable {
      bg->pacer->Wait(written);
      bg->last_chunk = Clock::now();
      if (!first) return;
      first = false;
      // Test kill point: die in the middle of the background write, once a later step has
      // been applied (so the snapshot's copy-on-write has been exercised).
      static const bool armed = [] {
        const char* e = std::getenv("ZPS_TEST_CRASH_AT");
        return e != nullptr && std::string_view(e).starts_with("checkpoint-background:");
      }();
      if (!armed) return;
      const auto until = Clock::now() + 30s;
      while (state->version() <= bg->step && Clock::now() < until) std::this_thread::sleep_for(5ms);
      MaybeCrashAt("checkpoint-background", bg->step);
    };
    bg->result = ckpt_->WriteSnapshot(*bg->snap, rs, after_chunk);
    bg->commit_seconds = std::chrono::duration<double>(Clock::now() - bg->last_chunk).count();
    bg->done.store(true, std::memory_order_release);
  });
}

bool ShardDriver::FinishCheckpoint(bool wait) {
  if (!bg_) return true;
  if (!wait && !bg_->done.load(std::memory_order_acquire)) return false;
  bg_->pacer->Hurry();  // someone waits for it now
  bg_->thread.join();
  std::unique_ptr<BackgroundWrite> bg = std::move(bg_);
  const Status& s = bg->result;
  const double secs = std::chrono::duration<double>(Clock::now() - bg->t0).count();
  if (pending_protect_) ckpt_->Protect(*pending_protect_);
  pending_protect_.reset();
  if (s.ok()) {
    last_checkpoint_ = bg->step;
    commit_tail_ = bg->commit_seconds;
    host_.checkpoint_duration->Observe(secs);
    host_.checkpoint_last_success->SetToCurrentTime();
    ZPS_LOG(INFO) << "checkpoint of step " << bg->step << " committed in " << secs
                  << " s (written in the background; " << bg->snap->copied_on_write()
                  << " chunks copied on write)";
  } else {
    ZPS_LOG(ERROR) << "checkpoint of step " << bg->step << " failed: " << s.ToString()
                   << "; training continues, the recovery point stays the last checkpoint "
                      "complete on every shard";
  }
  bg->snap.reset();
  MaybeCrashAt("after-checkpoint", bg->step);  // committed here, not yet reported
  Status r = ReportCheckpoints(std::make_pair(bg->step, s));
  if (!r.ok()) ZPS_LOG(WARNING) << "checkpoint report not delivered: " << r.ToString();
  return true;
}

void ShardDriver::CheckpointAndReport(int64_t step) {
  const auto t0 = Clock::now();
  Status s = ckpt_ ? ckpt_->Write(*state_, resume_)
                   : FailedPrecondition("shard " + std::to_string(host_.opts->ordinal) +
                                        " has no --data-dir: it cannot checkpoint");
  if (s.ok()) {
    last_checkpoint_ = step;
    host_.checkpoint_duration->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    host_.checkpoint_last_success->SetToCurrentTime();
    ZPS_LOG(INFO) << "checkpoint of step " << step << " committed in "
                  << std::chrono::duration<double>(Clock::now() - t0).count() << " s";
  } else {
    // Training goes on: the coordinator does not count this checkpoint, so the recovery point
    // stays the last one complete on every shard (which garbage collection keeps).
    ZPS_LOG(ERROR) << "checkpoint of step " << step << " failed: " << s.ToString()
                   << "; training continues, the recovery point stays the last checkpoint "
                      "complete on every shard";
  }
  if (host_.storage_metrics) host_.storage_metrics();
  MaybeCrashAt("after-checkpoint", step);  // committed here, not yet reported
  Status r = ReportCheckpoints(std::make_pair(step, s));
  if (!r.ok()) ZPS_LOG(WARNING) << "checkpoint report not delivered: " << r.ToString();
}

Status ShardDriver::ShutdownCheckpoint() {
  FinishCheckpoint(true);
  if (state_ != nullptr && job_ && job_->shard.update_mode == UpdateMode::kSpeculative) {
    const SpeculationStats ss = state_->speculation_stats();
    ZPS_LOG(INFO) << "speculation totals: " << ss.published << " chunk updates published, "
                  << ss.redone << " redone (clipped steps), " << ss.dropped
                  << " dropped (skipped steps), " << ss.sync << " updated at the commit; "
                  << ss.spares << " spare sets (" << ss.spare_bytes << " bytes)";
  }
  if (!ckpt_ || state_ == nullptr || !synced_) return Status::Ok();
  const int64_t v = state_->version();
  if (v < 1 || v == last_checkpoint_ || resume_.step != v) return Status::Ok();
  const auto t0 = Clock::now();
  Status s = ckpt_->Write(*state_, resume_);
  if (!s.ok()) {
    ZPS_LOG(ERROR) << "shutdown checkpoint of step " << v << " failed: " << s.ToString();
    return s;
  }
  last_checkpoint_ = v;
  host_.checkpoint_duration->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
  host_.checkpoint_last_success->SetToCurrentTime();
  ZPS_LOG(INFO) << "shutdown checkpoint of step " << v << " committed";
  return Status::Ok();
}

}  // namespace zps::server
