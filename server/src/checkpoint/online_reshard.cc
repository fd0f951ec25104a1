#include "zps/server/online_reshard.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "checkpoint_codec.h"
#include "shard/shard_driver.h"  // MaybeCrashAt
#include "zps/common/logging.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/common/scoped_fd.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_catalog.h"
#include "zps/server/checkpoint_reshard.h"
#include "zps/server/reshard_progress.h"

namespace zps::server {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kSideStore[] = "checkpoints.reshard";
constexpr char kSideCatalog[] = "coordinator.reshard";
constexpr size_t kPageBytes = 8u << 20;  // values per ReshardValues, under the frame bound
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kLogEvery = std::chrono::seconds(10);

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Join(const std::string& dir, const char* name) {
  return (fs::path(dir) / name).string();
}

bool HasStore(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "CURRENT", ec);
}

Status SyncDir(const std::string& dir) {
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open " + dir, errno);
  if (::fsync(fd.get()) != 0) return ErrnoError("fsync " + dir, errno);
  return Status::Ok();
}

// Puts `from` in place of `to` in one rename: exchanged with `to` when it exists (which then
// holds the old contents under `from`), renamed otherwise; then syncs the parent directory.
Status Exchange(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (fs::exists(to, ec)) {
    if (::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) !=
        0) {
      return ErrnoError("exchange " + from + " and " + to, errno);
    }
  } else if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError("rename " + from + " to " + to, errno);
  }
  return SyncDir(fs::path(to).parent_path().string());
}

void RemoveAll(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) ZPS_LOG(ERROR) << "reshard: cannot remove " << dir << ": " << ec.message();
}

// This process's store of the old job, read-only, at its newest checkpoint.
struct OldStore {
  std::unique_ptr<CheckpointStore> store;
  JobSpec job;
  uint32_t shard = 0;
  std::unique_ptr<CheckpointReader> reader;  // null: the store holds no checkpoint
  int64_t step() const { return reader ? reader->info().step : -1; }
};

Result<std::optional<OldStore>> OpenOld(const std::string& dir) {
  if (!HasStore(dir)) return std::optional<OldStore>();
  CheckpointOptions ro;
  ro.read_only = true;
  ro.create_if_missing = false;
  ro.write_threads = 1;
  OldStore old;
  ZPS_ASSIGN_OR_RETURN(old.store, CheckpointStore::Open(dir, ro));
  auto job = old.store->GetJobSpec();
  if (job.status().code() == Code::kNotFound) return std::optional<OldStore>();  // never had a job
  if (!job.ok()) return job.status().WithContext("store " + dir);
  old.job = std::move(*job);
  ZPS_ASSIGN_OR_RETURN(old.shard, old.store->GetShard());
  ZPS_ASSIGN_OR_RETURN(auto list, old.store->ListCheckpoints(false));
  if (!list.empty()) {
    ZPS_ASSIGN_OR_RETURN(old.reader, old.store->OpenCheckpoint(list.back().step));
  }
  return std::optional<OldStore>(std::move(old));
}

}  // namespace

// The reshard endpoint: serves this process's old store (ReshardInfo, ReshardFetch) and, on the
// new shard 0, collects the new shards' reports (ReshardReport).
//
// Thread-safety: the handlers run on the server's io threads; everything they touch is guarded
// by mu_. A fetch reads under mu_, so Retire() returns with no read in flight.
class ReshardEndpoint {
 public:
  static Result<std::unique_ptr<ReshardEndpoint>> Start(const ReshardSelf& self, int port,
                                                        const ReshardProgress& progress) {
    rpc::ServerOptions so;
    so.bind_address = self.bind_address.empty() ? "0.0.0.0" : self.bind_address;
    so.port = static_cast<uint16_t>(port);
    so.token = self.token;
    so.io_threads = 2;  // a report is answered while a fetch reads
    ZPS_ASSIGN_OR_RETURN(auto server, rpc::Server::Create(so));
    std::unique_ptr<ReshardEndpoint> e(new ReshardEndpoint(std::move(server), progress));
    ReshardEndpoint* p = e.get();
    e->server_->Register(msg::kReshardInfo, [p](const rpc::Peer&, auto, rpc::Responder r) {
      p->OnInfo(std::move(r));
    });
    e->server_->Register(msg::kReshardFetch,
                         [p](const rpc::Peer&, std::span<const std::byte> b, rpc::Responder r) {
                           p->OnFetch(b, std::move(r));
                         });
    e->server_->Register(msg::kReshardReport,
                         [p](const rpc::Peer&, std::span<const std::byte> b, rpc::Responder r) {
                           p->OnReport(b, std::move(r));
                         });
    ZPS_RETURN_IF_ERROR(e->server_->Start());
    ZPS_LOG(INFO) << "reshard: endpoint on port " << e->server_->port();
    return e;
  }
  ~ReshardEndpoint() { server_->Stop(); }

  // Serves `old` (its reader's checkpoint) until Retire(); null: no store (a new job).
  void Serve(OldStore* old) {
    MutexLock l(&mu_);
    ready_ = true;
    old_ = old;
    info_ = EncodeInfo(old);
  }
  // Answers ReshardInfo for `store` but serves no fetch (it may close after the call).
  void Announce(const OldStore* store) {
    MutexLock l(&mu_);
    ready_ = true;
    old_ = nullptr;
    info_ = EncodeInfo(store);
  }
  // Stops serving fetches; ReshardInfo keeps its answer. Returns with no fetch in flight.
  void Retire() {
    MutexLock l(&mu_);
    old_ = nullptr;
  }

  // Shard 0: the job being moved to `shards` shards at checkpoint `step` (switched: already).
  void Coordinate(uint32_t shards, int64_t step, bool switched) {
    MutexLock l(&mu_);
    coordinating_ = true;
    shards_ = shards;
    step_ = step;
    switched_ = switched;
    cv_.SignalAll();
  }
  // Shard 0: records its own commit.
  void CommitSelf() {
    MutexLock l(&mu_);
    committed_.insert(0);
    cv_.SignalAll();
  }
  // Shard 0: waits until every new shard reported its store committed; then no report can
  // withdraw one. Errors: DeadlineExceeded.
  Status AwaitCommits(Clock::time_point deadline) {
    MutexLock l(&mu_);
    const auto start = Clock::now();
    auto next_log = start;
    while (committed_.size() < shards_) {
      progress_.SetCommitted(committed_.size());
      progress_.SetWaitSeconds(SecondsSince(start));
      if (Clock::now() >= deadline) {
        return DeadlineExceeded("the new shards " + Missing() +
                                " did not report their stores committed in time");
      }
      if (Clock::now() >= next_log) {
        ZPS_LOG(WARNING) << "reshard: waiting for the new stores of shards " << Missing() << " ("
                         << committed_.size() << " of " << shards_ << " committed)";
        next_log = Clock::now() + kLogEvery;
      }
      cv_.WaitFor(l, kPoll);
    }
    deciding_ = true;
    progress_.SetCommitted(committed_.size());
    progress_.SetWaitSeconds(0);
    return Status::Ok();
  }
  void SetSwitched() {
    MutexLock l(&mu_);
    switched_ = true;
  }
  uint16_t port() const { return server_->port(); }

 private:
  ReshardEndpoint(std::unique_ptr<rpc::Server> server, const ReshardProgress& progress)
      : server_(std::move(server)), progress_(progress) {}

  static std::optional<std::vector<std::byte>> EncodeInfo(const OldStore* old) {
    if (old == nullptr || !old->reader) return std::nullopt;
    msg::ReshardInfo info;
    info.shard = old->shard;
    info.shards = old->job.layout.options().num_shards;
    info.layout_hash = old->job.layout.Hash();
    info.job_hash = old->job.Hash();
    info.step = old->step();
    info.job = old->job.Serialize();
    info.manifest = old->reader->EncodedManifest();
    return info.Encode();
  }

  std::string Missing() const REQUIRES(mu_) {
    std::string out;
    for (uint32_t i = 0; i < shards_; ++i) {
      if (!committed_.count(i)) out += (out.empty() ? "" : ", ") + std::to_string(i);
    }
    return out;
  }

  void OnInfo(rpc::Responder r) {
    MutexLock l(&mu_);
    if (!ready_) return r.Error(Unavailable("the endpoint has not opened its store yet"));
    if (!info_) return r.Error(NotFound("this process holds no checkpoint of a job"));
    r.Reply(*info_);
  }

  void OnFetch(std::span<const std::byte> body, rpc::Responder r) {
    auto req = msg::ReshardFetch::Decode(body);
    if (!req.ok()) return r.Error(req.status());
    MutexLock l(&mu_);
    if (old_ == nullptr || !old_->reader) {
      return r.Error(Unavailable("this process serves no store of the old job now"));
    }
    if (req->step != old_->step()) {
      return r.Error(NotFound("this store's checkpoint is of step " + std::to_string(old_->step()) +
                              ", not " + std::to_string(req->step)));
    }
    bool more = false;
    std::string after(reinterpret_cast<const char*>(req->after.data()), req->after.size());
    auto values = old_->reader->ReadStored(req->chunk, after, kPageBytes, &more);
    if (!values.ok()) return r.Error(values.status());
    msg::ReshardValues out;
    out.more = more;
    for (auto& v : *values) {
      out.keys.push_back(std::move(v.key));
      out.values.push_back(std::move(v.value));
    }
    auto reply = out.Encode();
    progress_.Served(reply.size());
    r.Reply(reply);
  }

  void OnReport(std::span<const std::byte> body, rpc::Responder r) {
    auto req = msg::ReshardReport::Decode(body);
    if (!req.ok()) return r.Error(req.status());
    MutexLock l(&mu_);
    if (!coordinating_) {
      return r.Error(Unavailable("shard 0 has not decided the reshard yet"));
    }
    if (req->shards != shards_) {
      return r.Error(InvalidArgument(
          "shard " + std::to_string(req->ordinal) + " reshards to " + std::to_string(req->shards) +
          " shards, shard 0 to " + std::to_string(shards_) + ": start every shard with --shards " +
          std::to_string(shards_)));
    }
    if (!switched_ && req->ordinal < shards_) {
      if (req->committed) {
        if (req->step != step_) {
          return r.Error(InvalidArgument("shard " + std::to_string(req->ordinal) +
                                         " resharded checkpoint " + std::to_string(req->step) +
                                         ", the job's is " + std::to_string(step_)));
        }
        committed_.insert(req->ordinal);
        cv_.SignalAll();
      } else if (committed_.count(req->ordinal)) {
        // A shard that restarted before the switch withdraws its commit and builds its store
        // again, unless shard 0 already decided to switch on it.
        if (deciding_) return r.Error(Unavailable("the job is switching; ask again"));
        committed_.erase(req->ordinal);
      }
    }
    msg::ReshardStatus st;
    st.shards = shards_;
    st.step = step_;
    st.committed = static_cast<uint32_t>(committed_.size());
    st.switched = switched_;
    r.Reply(st.Encode());
  }

  std::unique_ptr<rpc::Server> server_;
  const ReshardProgress progress_;
  Mutex mu_;
  CondVar cv_;
  bool ready_ GUARDED_BY(mu_) = false;
  OldStore* old_ GUARDED_BY(mu_) = nullptr;
  std::optional<std::vector<std::byte>> info_ GUARDED_BY(mu_);
  bool coordinating_ GUARDED_BY(mu_) = false;
  uint32_t shards_ GUARDED_BY(mu_) = 0;
  int64_t step_ GUARDED_BY(mu_) = 0;
  std::set<uint32_t> committed_ GUARDED_BY(mu_);
  bool deciding_ GUARDED_BY(mu_) = false;
  bool switched_ GUARDED_BY(mu_) = false;
};

ReshardHandle::ReshardHandle(std::unique_ptr<ReshardEndpoint> endpoint)
    : endpoint_(std::move(endpoint)) {}
ReshardHandle::~ReshardHandle() = default;

void OnlineReshardOptions::Register(Flags& f) {
  f.Add("reshard-peers",
        "host:port of every ordinal's reshard endpoint, comma-separated (i-th = ordinal i); "
        "empty: a store of another shard count is an error",
        &peers);
  f.Add("reshard-port", "port of this process's reshard endpoint", &port, 0, 65535);
  f.Add("reshard-timeout", "seconds to wait for reshard peers and reports", &timeout_s, 1,
        86400 * 7);
  f.Add("reshard-donor",
        "serve this leaving shard's store to the new shards until the job switched, then exit",
        &donor);
}

Result<std::vector<std::string>> OnlineReshardOptions::PeerList() const {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= peers.size() && !peers.empty()) {
    const size_t end = std::min(peers.find(',', start), peers.size());
    std::string p = peers.substr(start, end - start);
    auto hp = SplitHostPort(p);
    if (!hp.ok()) return hp.status().WithContext("--reshard-peers");
    out.push_back(std::move(p));
    start = end + 1;
  }
  return out;
}

namespace {

// Calls to the peers' endpoints, retried while a peer is not up (yet) until the deadline.
class PeerCalls {
 public:
  PeerCalls(std::vector<std::string> peers, const ReshardSelf& self, Clock::time_point deadline,
            int timeout_s, const ReshardProgress& progress)
      : peers_(std::move(peers)),
        self_(self),
        deadline_(deadline),
        timeout_s_(timeout_s),
        progress_(progress) {}

  // Errors: the peer's (other than Unavailable), DeadlineExceeded naming the peer.
  Result<std::vector<std::byte>> Call(uint32_t ordinal, uint16_t type,
                                      std::span<const std::byte> body) {
    if (ordinal >= peers_.size()) {
      return InvalidArgument("--reshard-peers names " + std::to_string(peers_.size()) +
                             " endpoints, ordinal " + std::to_string(ordinal) + " has none");
    }
    const auto start = Clock::now();
    auto next_log = start;  // the first failed attempt says what it waits for
    Status last = Status::Ok();
    while (true) {
      auto& client = clients_[ordinal];
      if (!client || !client->connected()) {
        ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(peers_[ordinal]));
        rpc::ClientOptions co;
        co.host = hp.first;
        co.port = hp.second;
        co.token = self_.token;
        co.role = rpc::PeerRole::kShard;
        co.rank = self_.ordinal;
        co.name = "reshard-" + std::to_string(self_.ordinal);
        co.connect_timeout_ms = 2000;
        auto c = rpc::Client::Connect(co);
        if (c.ok()) {
          client = std::move(*c);
        } else {
          last = c.status();
          client.reset();
        }
      }
      if (client) {
        auto reply = client->Call(type, body, std::chrono::seconds(60));
        if (reply.ok() || reply.status().code() != Code::kUnavailable) {
          if (reached_.insert(ordinal).second) progress_.PeerReached();
          progress_.SetWaitSeconds(0);
          return reply;
        }
        last = reply.status();
      }
      progress_.SetWaitSeconds(SecondsSince(start));
      if (last.code() == Code::kUnauthenticated || last.code() == Code::kFailedPrecondition) {
        return last.WithContext("reshard peer " + std::to_string(ordinal) + " at " +
                                peers_[ordinal]);
      }
      if (Clock::now() >= deadline_) {
        return DeadlineExceeded("reshard: ordinal " + std::to_string(ordinal) + "'s endpoint " +
                                peers_[ordinal] + " did not answer within " +
                                std::to_string(timeout_s_) + " s (last: " + last.ToString() +
                                "); a store missing (a donor that never came?)");
      }
      if (Clock::now() >= next_log) {
        ZPS_LOG(WARNING) << "reshard: waiting for ordinal " << ordinal << "'s endpoint "
                         << peers_[ordinal] << ": " << last.ToString();
        next_log = Clock::now() + kLogEvery;
      }
      std::this_thread::sleep_for(kPoll);
    }
  }

  size_t size() const { return peers_.size(); }
  const ReshardProgress& progress() const { return progress_; }

 private:
  std::vector<std::string> peers_;
  const ReshardSelf& self_;
  Clock::time_point deadline_;
  int timeout_s_;
  const ReshardProgress progress_;
  std::set<uint32_t> reached_;  // ordinals that answered once
  std::map<uint32_t, std::unique_ptr<rpc::Client>> clients_;
};

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// What the new shard builds its store from.
struct Plan {
  JobSpec old_job;  // on N shards
  JobSpec new_job;  // on M shards
  uint32_t n = 0;
  int64_t step = 0;
};

// A peer's old store, checked to be old shard `ordinal` of the job at the plan's checkpoint.
Result<msg::ReshardInfo> PeerInfo(PeerCalls& peers, uint32_t ordinal, const Plan* plan) {
  ZPS_ASSIGN_OR_RETURN(auto bytes, peers.Call(ordinal, msg::kReshardInfo, {}));
  ZPS_ASSIGN_OR_RETURN(auto info, msg::ReshardInfo::Decode(bytes));
  if (plan == nullptr) return info;
  const std::string who = "old shard " + std::to_string(ordinal) + "'s store";
  if (info.shard != ordinal) {
    return InvalidArgument(who + " says it is shard " + std::to_string(info.shard) +
                           ": check --reshard-peers");
  }
  if (info.layout_hash != plan->old_job.layout.Hash() || info.job_hash != plan->old_job.Hash()) {
    return InvalidArgument("stores of two different jobs: shard 0's has layout " +
                           Hex(plan->old_job.layout.Hash()) + " and job " +
                           Hex(plan->old_job.Hash()) + ", " + who + " layout " +
                           Hex(info.layout_hash) + " and job " + Hex(info.job_hash));
  }
  if (info.step != plan->step) {
    return InvalidArgument(who + " holds checkpoint " + std::to_string(info.step) +
                           " as its newest, shard 0's is " + std::to_string(plan->step) +
                           ": a store of another step");
  }
  return info;
}

// Every stored value of `chunk` from old shard `ordinal`.
Result<std::vector<StoredValue>> FetchChunk(PeerCalls& peers, uint32_t ordinal, int64_t step,
                                            uint32_t chunk) {
  std::vector<StoredValue> out;
  msg::ReshardFetch req;
  req.step = step;
  req.chunk = chunk;
  while (true) {
    ZPS_ASSIGN_OR_RETURN(auto bytes, peers.Call(ordinal, msg::kReshardFetch, req.Encode()));
    peers.progress().Fetched(bytes.size());
    ZPS_ASSIGN_OR_RETURN(auto page, msg::ReshardValues::Decode(bytes));
    if (page.keys.size() != page.values.size() || page.keys.empty()) {
      return DataLoss("old shard " + std::to_string(ordinal) + " sent a malformed page of chunk " +
                      std::to_string(chunk));
    }
    const std::string& last = page.keys.back();
    req.after.assign(reinterpret_cast<const std::byte*>(last.data()),
                     reinterpret_cast<const std::byte*>(last.data()) + last.size());
    for (size_t i = 0; i < page.keys.size(); ++i) {
      out.push_back({std::move(page.keys[i]), std::move(page.values[i])});
    }
    if (!page.more) return out;
  }
}

// Writes `side`: the new shard `self.ordinal`'s store of the plan's checkpoint.
Status BuildSideStore(const std::string& side, const ReshardSelf& self, const Plan& plan,
                      OldStore* own, PeerCalls& peers) {
  CheckpointOptions wo;
  wo.write_threads = 1;  // CopyChunk and PutStored write from this thread
  // As zps-ckpt reshard's outputs: a store filled once, front to back, needs fewer and smaller
  // memtables than a serving shard's, and faults fewer fresh pages in.
  wo.write_buffer_bytes = 16ull << 20;
  wo.max_write_buffers = 4;
  ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(side, wo));
  ZPS_RETURN_IF_ERROR(store->SetIdentity(plan.new_job.layout, self.ordinal));
  ZPS_RETURN_IF_ERROR(store->PutJobSpec(plan.new_job));
  std::map<uint32_t, std::vector<std::byte>> manifests;  // by old ordinal
  auto manifest = [&](uint32_t k) -> Result<const std::vector<std::byte>*> {
    auto it = manifests.find(k);
    if (it == manifests.end()) {
      ZPS_ASSIGN_OR_RETURN(auto info, PeerInfo(peers, k, &plan));
      it = manifests.emplace(k, std::move(info.manifest)).first;
    }
    return &it->second;
  };
  ZPS_ASSIGN_OR_RETURN(const std::vector<std::byte>* m0, manifest(0));
  ZPS_ASSIGN_OR_RETURN(auto m0_decoded, internal::DecodeManifest(plan.step, *m0));
  ZPS_ASSIGN_OR_RETURN(auto writer, store->BeginCheckpoint(plan.step, m0_decoded.info.state_dtype));
  const bool have_own = own != nullptr && own->reader;
  const ReshardProgress& progress = peers.progress();
  progress.SetPhase(ReshardPhase::kCopying);
  const auto chunks = plan.new_job.layout.ChunksOfShard(self.ordinal);
  progress.SetChunksTotal(chunks.size());
  for (uint32_t c : chunks) {
    const uint32_t from = plan.old_job.layout.shard_of_chunk(c);
    if (have_own && from == own->shard) {
      ZPS_RETURN_IF_ERROR(writer->CopyChunk(*own->reader, c));
      progress.ChunkCopied();
      continue;
    }
    ZPS_ASSIGN_OR_RETURN(const std::vector<std::byte>* m, manifest(from));
    ZPS_ASSIGN_OR_RETURN(auto values, FetchChunk(peers, from, plan.step, c));
    ZPS_RETURN_IF_ERROR(writer->PutStored(*m, c, values));
    progress.ChunkFetched();
  }
  if (have_own) {
    ZPS_RETURN_IF_ERROR(writer->CopyState(*own->reader));
  } else {
    ZPS_ASSIGN_OR_RETURN(auto values, FetchChunk(peers, 0, plan.step, kStoredStateChunk));
    ZPS_RETURN_IF_ERROR(writer->PutStored(*m0, kStoredStateChunk, values));
  }
  ZPS_RETURN_IF_ERROR(writer->Commit());
  ZPS_LOG(INFO) << "reshard: the store of shard " << self.ordinal << " of "
                << plan.new_job.layout.options().num_shards << " at checkpoint " << plan.step
                << " is committed (" << writer->bytes() << " bytes)";
  return Status::Ok();
}

// Shard 0: the job on M shards becomes the coordinator's (the commit point).
Status SwitchCatalog(const std::string& data_dir, const Plan& plan) {
  const std::string catalog = Join(data_dir, "coordinator");
  const std::string side = Join(data_dir, kSideCatalog);
  RemoveAll(side);
  ZPS_RETURN_IF_ERROR(WriteResumeCatalog(side, plan.new_job, plan.step,
                                         plan.new_job.layout.options().num_shards, catalog));
  ZPS_RETURN_IF_ERROR(Exchange(side, catalog));
  RemoveAll(side);  // the old catalog
  ZPS_LOG(INFO) << "reshard: the coordinator's catalog holds the job on "
                << plan.new_job.layout.options().num_shards << " shards at checkpoint " << plan.step
                << " (switched)";
  return Status::Ok();
}

// True when shard 0's coordinator catalog already holds `job`.
bool CatalogSwitched(const std::string& data_dir, const JobSpec& job) {
  const std::string dir = Join(data_dir, "coordinator");
  if (!HasStore(dir)) return false;
  CheckpointOptions ro;
  ro.read_only = true;
  ro.create_if_missing = false;
  auto catalog = CoordinatorCatalog::Open(dir, ro);
  if (!catalog.ok()) return false;
  auto spec = (*catalog)->GetJobSpec();
  return spec.ok() && spec->Hash() == job.Hash();
}

// A shard other than 0: reports to shard 0 until the job switched.
Status AwaitSwitch(PeerCalls& peers, const ReshardSelf& self, const Plan& plan, bool committed,
                   Clock::time_point deadline) {
  msg::ReshardReport rep;
  rep.ordinal = self.ordinal;
  rep.shards = self.shards;
  rep.step = plan.step;
  rep.committed = committed;
  const auto start = Clock::now();
  peers.progress().SetPhase(ReshardPhase::kAwaitingSwitch);
  while (true) {
    ZPS_ASSIGN_OR_RETURN(auto bytes, peers.Call(0, msg::kReshardReport, rep.Encode()));
    ZPS_ASSIGN_OR_RETURN(auto st, msg::ReshardStatus::Decode(bytes));
    peers.progress().SetCommitted(st.committed);
    if (st.switched) return Status::Ok();
    peers.progress().SetWaitSeconds(SecondsSince(start));
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("reshard: the job did not switch to " + std::to_string(self.shards) +
                              " shards in time (" + std::to_string(st.committed) + " of " +
                              std::to_string(st.shards) + " new stores committed)");
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// Puts the side store in place of the old one and removes the old one.
Status SwapStores(const std::string& data_dir) {
  const std::string store = Join(data_dir, "checkpoints");
  const std::string side = Join(data_dir, kSideStore);
  ZPS_RETURN_IF_ERROR(Exchange(side, store));
  RemoveAll(side);  // the old store
  return Status::Ok();
}

}  // namespace

namespace {

// Checks that `side` holds this shard's committed store of the job on M shards, then puts it in
// place of `<data-dir>/checkpoints` (the old store, if any, is removed).
Status FinishSwap(const ReshardSelf& self, const JobSpec* new_job) {
  const std::string side = Join(self.data_dir, kSideStore);
  const std::string store = Join(self.data_dir, "checkpoints");
  {
    ZPS_ASSIGN_OR_RETURN(auto done, OpenOld(side));
    const bool ok = done && done->reader && done->shard == self.ordinal &&
                    done->job.layout.options().num_shards == self.shards &&
                    (new_job == nullptr || done->job.Hash() == new_job->Hash());
    if (!ok) {
      return DataLoss("reshard: the job switched to " + std::to_string(self.shards) +
                      " shards, but " + side + " does not hold this shard's new store");
    }
  }
  if (HasStore(store)) return SwapStores(self.data_dir);
  RemoveAll(store);  // an empty directory at most
  return Exchange(side, store);
}

// Builds this shard's new store and waits for the switch; on an error before the switch the
// side store is removed again.
Status BuildAndSwitch(const ReshardSelf& self, const Plan& plan, OldStore* mine, PeerCalls& peers,
                      ReshardEndpoint* endpoint, Clock::time_point deadline) {
  const std::string side = Join(self.data_dir, kSideStore);
  RemoveAll(side);
  std::error_code ec;
  fs::create_directories(self.data_dir, ec);  // a new volume's data dir may not exist yet
  Status s = ec ? IoError("cannot create " + self.data_dir + ": " + ec.message())
                : BuildSideStore(side, self, plan, mine, peers);
  if (s.ok() && self.ordinal == 0) {
    peers.progress().SetPhase(ReshardPhase::kAwaitingSwitch);
    endpoint->CommitSelf();
    s = endpoint->AwaitCommits(deadline);
    if (s.ok()) s = SwitchCatalog(self.data_dir, plan);
    if (s.ok()) MaybeCrashAt("reshard-switched", plan.step);
  } else if (s.ok()) {
    MaybeCrashAt("reshard-committed", plan.step);
    s = AwaitSwitch(peers, self, plan, true, deadline);
  }
  if (s.ok()) return s;
  if (self.ordinal == 0 && CatalogSwitched(self.data_dir, plan.new_job)) {
    return s.WithContext("reshard (after the switch: restart to finish it)");
  }
  RemoveAll(side);
  if (self.ordinal == 0) RemoveAll(Join(self.data_dir, kSideCatalog));
  return s.WithContext("reshard (the old store is unchanged; " + side + " was removed)");
}

// Shard 0: decides what moves (its store's job and newest checkpoint) and commits the switch.
Result<std::unique_ptr<ReshardHandle>> ReshardShard0(const ReshardSelf& self,
                                                     std::optional<OldStore> own,
                                                     std::unique_ptr<ReshardEndpoint> endpoint,
                                                     PeerCalls& peers, Clock::time_point deadline) {
  OldStore* mine = own ? &*own : nullptr;
  if (mine == nullptr || !mine->reader) {
    endpoint->Serve(nullptr);  // a new job, or one without a checkpoint: nothing moves
    return std::make_unique<ReshardHandle>(std::move(endpoint));
  }
  if (mine->job.layout.options().num_shards == self.shards) {
    // On M shards already: answer the shards and donors that come late.
    endpoint->Announce(mine);
    endpoint->Coordinate(self.shards, mine->step(), true);
    RemoveAll(Join(self.data_dir, kSideStore));  // left by an interrupted exchange
    RemoveAll(Join(self.data_dir, kSideCatalog));
    return std::make_unique<ReshardHandle>(std::move(endpoint));
  }
  Plan plan;
  plan.old_job = mine->job;
  plan.n = mine->job.layout.options().num_shards;
  plan.step = mine->step();
  ZPS_ASSIGN_OR_RETURN(plan.new_job, JobOnShards(plan.old_job, self.shards));
  ZPS_LOG(INFO) << "reshard: shard 0 moves the job from " << plan.n << " to " << self.shards
                << " shards at checkpoint " << plan.step;
  peers.progress().SetPhase(ReshardPhase::kWaitingForPeers);
  endpoint->Serve(mine);
  const bool switched = CatalogSwitched(self.data_dir, plan.new_job);
  endpoint->Coordinate(self.shards, plan.step, switched);
  if (!switched) {
    RemoveAll(Join(self.data_dir, kSideCatalog));
    ZPS_RETURN_IF_ERROR(BuildAndSwitch(self, plan, mine, peers, endpoint.get(), deadline));
  }
  endpoint->Retire();
  endpoint->SetSwitched();
  own.reset();  // closes the old store before it moves
  ZPS_RETURN_IF_ERROR(FinishSwap(self, &plan.new_job));
  ZPS_ASSIGN_OR_RETURN(auto now, OpenOld(Join(self.data_dir, "checkpoints")));
  endpoint->Announce(now ? &*now : nullptr);
  ZPS_LOG(INFO) << "reshard: shard 0 resumes the job on " << self.shards << " shards at checkpoint "
                << plan.step;
  return std::make_unique<ReshardHandle>(std::move(endpoint));
}

}  // namespace

namespace {

Result<std::unique_ptr<ReshardHandle>> Reshard(const OnlineReshardOptions& o,
                                               const ReshardSelf& self,
                                               const ReshardProgress& progress) {
  ZPS_ASSIGN_OR_RETURN(auto peer_list, o.PeerList());
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  PeerCalls peers(peer_list, self, deadline, o.timeout_s, progress);
  const std::string store_dir = Join(self.data_dir, "checkpoints");
  const std::string side = Join(self.data_dir, kSideStore);
  ZPS_ASSIGN_OR_RETURN(std::optional<OldStore> own, OpenOld(store_dir));
  OldStore* mine = own ? &*own : nullptr;
  const bool current = mine != nullptr && mine->job.layout.options().num_shards == self.shards;
  if (self.ordinal == 0) {
    ZPS_ASSIGN_OR_RETURN(auto endpoint, ReshardEndpoint::Start(self, o.port, progress));
    return ReshardShard0(self, std::move(own), std::move(endpoint), peers, deadline);
  }
  if (current) {
    RemoveAll(side);  // left by an interrupted exchange
    return std::unique_ptr<ReshardHandle>();
  }
  if (mine != nullptr && mine->shard != self.ordinal) {
    return InvalidArgument("the store in " + store_dir + " is shard " +
                           std::to_string(mine->shard) + "'s, this is ordinal " +
                           std::to_string(self.ordinal));
  }
  std::unique_ptr<ReshardEndpoint> endpoint;
  if (mine != nullptr) {
    ZPS_ASSIGN_OR_RETURN(endpoint, ReshardEndpoint::Start(self, o.port, progress));
    endpoint->Announce(mine);  // peers wait (Unavailable) for the fetches until the plan is checked
  }
  progress.SetPhase(ReshardPhase::kWaitingForPeers);
  // A side store left by a crash: only the swap is left if the job switched on it.
  if (HasStore(side)) {
    msg::ReshardReport rep{self.ordinal, self.shards, 0, false};
    ZPS_ASSIGN_OR_RETURN(auto bytes, peers.Call(0, msg::kReshardReport, rep.Encode()));
    ZPS_ASSIGN_OR_RETURN(auto st, msg::ReshardStatus::Decode(bytes));
    if (st.switched) {
      if (endpoint) endpoint->Retire();
      own.reset();
      ZPS_RETURN_IF_ERROR(FinishSwap(self, nullptr));
      ZPS_LOG(INFO) << "reshard: shard " << self.ordinal << " finished an interrupted reshard";
      return std::unique_ptr<ReshardHandle>();
    }
    RemoveAll(side);
  }
  auto info = PeerInfo(peers, 0, nullptr);
  if (info.status().code() == Code::kNotFound && mine == nullptr) {
    progress.SetPhase(ReshardPhase::kNone);
    return std::unique_ptr<ReshardHandle>();  // shard 0 holds no job: a new one
  }
  if (!info.ok()) return info.status().WithContext("reshard: asking shard 0 for the job");
  Plan plan;
  ZPS_ASSIGN_OR_RETURN(plan.old_job, JobSpec::Deserialize(info->job));
  plan.n = info->shards;
  plan.step = info->step;
  if (plan.n == self.shards) {
    if (mine == nullptr) {
      progress.SetPhase(ReshardPhase::kNone);
      return std::unique_ptr<ReshardHandle>();  // a new volume, same count
    }
    return DataLoss("reshard: the job is on " + std::to_string(self.shards) +
                    " shards already, without this shard's new store (its store in " + store_dir +
                    " is of " + std::to_string(mine->job.layout.options().num_shards) + " shards)");
  }
  ZPS_ASSIGN_OR_RETURN(plan.new_job, JobOnShards(plan.old_job, self.shards));
  if (mine != nullptr && mine->job.Hash() != plan.old_job.Hash()) {
    return InvalidArgument("stores of two different jobs: " + store_dir + " holds job " +
                           Hex(mine->job.Hash()) + ", shard 0's store job " +
                           Hex(plan.old_job.Hash()));
  }
  if (mine != nullptr && mine->step() != plan.step) {
    return InvalidArgument("reshard: " + store_dir + " holds checkpoint " +
                           std::to_string(mine->step()) + " as its newest, shard 0's is " +
                           std::to_string(plan.step) + ": a store of another step");
  }
  ZPS_LOG(INFO) << "reshard: shard " << self.ordinal << " moves the job from " << plan.n << " to "
                << self.shards << " shards at checkpoint " << plan.step;
  if (endpoint) endpoint->Serve(mine);
  ZPS_RETURN_IF_ERROR(BuildAndSwitch(self, plan, mine, peers, nullptr, deadline));
  if (endpoint) endpoint->Retire();
  own.reset();  // closes the old store before it moves
  ZPS_RETURN_IF_ERROR(FinishSwap(self, &plan.new_job));
  ZPS_LOG(INFO) << "reshard: shard " << self.ordinal << " resumes the job on " << self.shards
                << " shards at checkpoint " << plan.step;
  return std::unique_ptr<ReshardHandle>();
}

Status Donate(const OnlineReshardOptions& o, const ReshardSelf& self,
              const ReshardProgress& progress) {
  ZPS_ASSIGN_OR_RETURN(auto peer_list, o.PeerList());
  if (peer_list.empty()) return InvalidArgument("a donor needs --reshard-peers");
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  PeerCalls peers(peer_list, self, deadline, o.timeout_s, progress);
  const std::string store_dir = Join(self.data_dir, "checkpoints");
  ZPS_ASSIGN_OR_RETURN(std::optional<OldStore> own, OpenOld(store_dir));
  if (!own) return NotFound("donor: no store of a job in " + store_dir);
  if (!own->reader) return FailedPrecondition("donor: " + store_dir + " holds no checkpoint");
  ZPS_ASSIGN_OR_RETURN(auto endpoint, ReshardEndpoint::Start(self, o.port, progress));
  endpoint->Serve(&*own);
  ZPS_LOG(INFO) << "reshard: donor serves the store of old shard " << own->shard << " of "
                << own->job.layout.options().num_shards << " (checkpoint " << own->step()
                << ") until the job switched to " << self.shards << " shards";
  Plan plan;
  plan.step = own->step();
  ReshardSelf as = self;
  as.ordinal = own->shard;
  Status s = AwaitSwitch(peers, as, plan, false, deadline);
  endpoint->Retire();
  if (!s.ok()) return s.WithContext("donor (its store is unchanged)");
  ZPS_LOG(INFO) << "reshard: the job switched; donor of old shard " << own->shard << " exits";
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ReshardHandle>> ReshardAtStart(const OnlineReshardOptions& o,
                                                      const ReshardSelf& self,
                                                      const ReshardProgress& progress) {
  if (o.peers.empty() || self.data_dir.empty()) return std::unique_ptr<ReshardHandle>();
  auto r = Reshard(o, self, progress);
  if (!r.ok()) {
    progress.SetPhase(ReshardPhase::kFailed);
  } else if (progress.phase() != ReshardPhase::kNone) {
    progress.SetPhase(ReshardPhase::kDone);
  }
  return r;
}

Status ServeAsDonor(const OnlineReshardOptions& o, const ReshardSelf& self,
                    const ReshardProgress& progress) {
  Status s = Donate(o, self, progress);
  progress.SetPhase(s.ok() ? ReshardPhase::kDone : ReshardPhase::kFailed);
  return s;
}

}  // namespace zps::server
