#include "zps/server/shard_server.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "coordinator/coordinator_service.h"
#include "coordinator/kv_service.h"
#include "shard/rpc_service.h"
#include "shard/session_table.h"
#include "shard/shard_driver.h"
#include "zps/common/grad_quant.h"
#include "zps/common/log_rate_limit.h"
#include "zps/common/logging.h"
#include "zps/common/messages.h"
#include "zps/common/metrics.h"
#include "zps/common/process_metrics.h"
#include "zps/common/rpc.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/thread_pool.h"
#include "zps/common/ucx.h"
#include "zps/server/checkpoint_catalog.h"
#include "zps/server/coordinator.h"
#include "zps/server/job.h"
#include "zps/server/kv_store.h"
#include "zps/server/shard_state.h"

namespace zps::server {

using namespace std::chrono_literals;

void ShardServerOptions::Register(Flags& f) {
  f.Add("ordinal", "this shard's ordinal (0 also runs the coordinator)", &ordinal, 0, 4095);
  f.Add("shards", "number of shards in the job", &shards, 1, 4096);
  f.Add("coordinator",
        "host:port of the coordinator, i.e. of shard 0 (shard 0 hosts it and ignores this)",
        &coordinator);
  f.Add("bind", "address the control plane listens on", &bind_address);
  f.Add("advertise-host", "host name or address peers use to reach this shard", &advertise_host);
  f.Add("port", "control-plane TCP port (0 = ephemeral)", &port, 0, 65535);
  f.Add("token", "shared auth secret (prefer token-file)", &token);
  f.Add("token-file", "file holding the shared auth secret", &token_file);
  f.Add("ucx-tls", "UCX transports, e.g. tcp or posix,cma,self (empty: UCX_TLS or UCX default)",
        &ucx_tls);
  f.Add("ucx-spin-us", "microseconds the UCX progress thread polls after activity before it sleeps",
        &ucx_spin_us, 0, 1000000);
  f.Add("threads", "optimizer threads (0 = one per CPU)", &optimizer_threads, 0, 1024);
  f.Add("pin-threads", "pin optimizer threads to CPUs", &pin_threads);
  f.Add("step-timeout", "seconds to wait for one step's gradients", &step_timeout_s, 1, 86400 * 7);
  f.Add("log-level", "debug, info, warning or error", &log_level);
  f.Add("metrics-port", "HTTP port for /metrics, /healthz, /readyz (0 = off)", &metrics_port, 0,
        65535);
  f.Add("data-dir", "directory for durable state (checkpoints, spill)", &data_dir);
  f.AddBytes("memory-budget",
             "RAM budget for fp32 master + optimizer state; the rest spills to <data-dir>/spill "
             "(0 = unlimited, all in RAM; needs --data-dir or --spill-dir)",
             &memory_budget);
  f.AddBytes("serving-budget",
             "RAM budget for the 16-bit serving copies; the rest spills to <data-dir>/spill and "
             "is read back per fetch (0 = unlimited, all in RAM; needs --data-dir or --spill-dir)",
             &serving_budget);
  f.Add("spill-dir", "directory of the spill files (default <data-dir>/spill)", &spill_dir);
  f.Add("serving-copies",
        "stored (each update writes the 16-bit copies workers fetch) or on-fetch (none kept: 2 "
        "bytes a parameter fewer; each fetch converts the master, read back from the spill files "
        "if it spilled; no --serving-budget)",
        &serving_copies);
  f.Add("checkpoint-every", "checkpoint every K steps (0 = never)", &checkpoint_every, 0,
        INT64_MAX);
  f.Add("checkpoint-mode",
        "background (snapshot, written while later steps run) or sync (training waits for the "
        "write)",
        &checkpoint_mode);
  f.Add("checkpoint-pace",
        "write a background checkpoint over about this fraction of the --checkpoint-every "
        "period (its steps x the recent step time), so less of it runs beside each step and "
        "the recovery point advances later; 0 = as fast as it goes (e.g. 0.75)",
        &checkpoint_pace);
  f.Add("checkpoint-direct-io",
        "O_DIRECT checkpoint writes and reads (the data dir's filesystem must support it)",
        &checkpoint_direct_io);
}

Status ShardServerOptions::Finalize() {
  if (checkpoint_mode != "background" && checkpoint_mode != "sync") {
    return InvalidArgument("--checkpoint-mode must be background or sync; got '" + checkpoint_mode +
                           "'");
  }
  if (!(checkpoint_pace >= 0.0 && checkpoint_pace <= 1.0)) {
    return InvalidArgument("--checkpoint-pace must be in [0, 1]; got " +
                           std::to_string(checkpoint_pace));
  }
  if (!token_file.empty()) {
    ZPS_ASSIGN_OR_RETURN(token, ReadTokenFile(token_file));
  }
  if (token.empty()) {
    return InvalidArgument("no auth token: set --token-file (or ZPS_TOKEN_FILE / ZPS_TOKEN)");
  }
  if (ordinal >= shards) {
    return InvalidArgument("--ordinal " + std::to_string(ordinal) + " must be < --shards " +
                           std::to_string(shards));
  }
  if (memory_budget > 0 && data_dir.empty() && spill_dir.empty()) {
    return InvalidArgument(
        "--memory-budget needs --data-dir (spill files go to <data-dir>/spill) or --spill-dir");
  }
  if (serving_budget > 0 && data_dir.empty() && spill_dir.empty()) {
    return InvalidArgument(
        "--serving-budget needs --data-dir (spill files go to <data-dir>/spill) or --spill-dir");
  }
  ZPS_ASSIGN_OR_RETURN(const ServingCopies copies, ParseServingCopies(serving_copies));
  if (copies == ServingCopies::kOnFetch && serving_budget > 0) {
    return InvalidArgument(
        "--serving-copies on-fetch keeps no serving copies, so there is nothing for "
        "--serving-budget to hold: drop one of them");
  }
  if (ordinal != 0 && coordinator.empty()) {
    return InvalidArgument("shard " + std::to_string(ordinal) + " needs --coordinator host:port");
  }
  if (!coordinator.empty()) ZPS_RETURN_IF_ERROR(SplitHostPort(coordinator).status());
  return Status::Ok();
}

// The shard's metrics (docs/metrics.md), resolved at Create. Hot paths touch only these handles.
struct ShardMetrics {
  metrics::ProcessMetrics pm;
  metrics::Histogram optimizer_pass;                       // zps_optimizer_pass_seconds
  metrics::Counter optimizer_bytes;                        // zps_optimizer_bytes_total
  metrics::Counter nvme_read, nvme_write, nvme_errors;     // zps_nvme_*: 0 without --memory-budget
  metrics::Counter nvme_serving_read, nvme_serving_write;  // 0 without --serving-budget
  std::array<metrics::Counter, 2> spilled_fetches;         // zps_spilled_fetches_total{nvme, cache}
  std::array<metrics::Counter, 2> made_fetches;  // zps_serving_made_fetches_total{master, cache}
  std::array<metrics::Gauge, 4> memory;          // zps_memory_bytes{tier}
  std::array<metrics::Gauge, 6> state_bytes;     // zps_shard_state_bytes{kind}
  metrics::Histogram checkpoint_duration;        // 0 until checkpoints land
  metrics::Gauge checkpoint_last_success;        // 0 until checkpoints land
  metrics::Gauge connected_workers;
  // zps_speculative_chunks_total{outcome}: chunk updates of --update speculative by what the
  // commit did with them (kPublished, kRedone, kDropped, kSync); 0 in sync mode.
  std::array<metrics::Counter, 4> speculative_chunks;
  enum Outcome { kPublished = 0, kRedone = 1, kDropped = 2, kSync = 3 };

  enum Tier { kMaster = 0, kOptimizerState = 1, kServing = 2, kNvme = 3 };

  static Result<ShardMetrics> Create(metrics::Registry& r) {
    using metrics::ExponentialBuckets;
    ShardMetrics m;
    ZPS_ASSIGN_OR_RETURN(m.pm, metrics::ProcessMetrics::Create(r, "shard"));
    ZPS_ASSIGN_OR_RETURN(auto* op, r.AddHistogram("zps_optimizer_pass_seconds",
                                                  "Time of one optimizer pass (update and "
                                                  "publish) over this shard's chunks.",
                                                  {}, ExponentialBuckets(1e-4, 2.0, 20)));
    ZPS_ASSIGN_OR_RETURN(m.optimizer_pass, op->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* ob, r.AddCounter("zps_optimizer_bytes_total",
                                                "Bytes of fp32 master and Adam state the "
                                                "optimizer read and wrote."));
    ZPS_ASSIGN_OR_RETURN(m.optimizer_bytes, ob->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* nr, r.AddCounter("zps_nvme_read_bytes_total",
                                                "Bytes read from the NVMe spill tier."));
    ZPS_ASSIGN_OR_RETURN(m.nvme_read, nr->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* nw, r.AddCounter("zps_nvme_write_bytes_total",
                                                "Bytes written to the NVMe spill tier."));
    ZPS_ASSIGN_OR_RETURN(m.nvme_write, nw->Add({}));
    ZPS_ASSIGN_OR_RETURN(
        auto* ne, r.AddCounter("zps_nvme_io_errors_total", "NVMe reads and writes that failed."));
    ZPS_ASSIGN_OR_RETURN(m.nvme_errors, ne->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* nsr,
                         r.AddCounter("zps_nvme_serving_read_bytes_total",
                                      "Bytes of spilled 16-bit serving copies read from NVMe "
                                      "(part of zps_nvme_read_bytes_total)."));
    ZPS_ASSIGN_OR_RETURN(m.nvme_serving_read, nsr->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* nsw,
                         r.AddCounter("zps_nvme_serving_write_bytes_total",
                                      "Bytes of spilled 16-bit serving copies written to NVMe "
                                      "(part of zps_nvme_write_bytes_total)."));
    ZPS_ASSIGN_OR_RETURN(m.nvme_serving_write, nsw->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* sf, r.AddCounter("zps_spilled_fetches_total",
                                                "Fetches answered from a spilled serving copy, "
                                                "by where it came from.",
                                                {"source"}));
    ZPS_ASSIGN_OR_RETURN(m.spilled_fetches[0], sf->Add({"nvme"}));
    ZPS_ASSIGN_OR_RETURN(m.spilled_fetches[1], sf->Add({"cache"}));
    ZPS_ASSIGN_OR_RETURN(auto* mf,
                         r.AddCounter("zps_serving_made_fetches_total",
                                      "Fetches answered with a serving copy made on fetch "
                                      "(--serving-copies on-fetch), by where it came from.",
                                      {"source"}));
    ZPS_ASSIGN_OR_RETURN(m.made_fetches[0], mf->Add({"master"}));
    ZPS_ASSIGN_OR_RETURN(m.made_fetches[1], mf->Add({"cache"}));
    ZPS_ASSIGN_OR_RETURN(auto* mem,
                         r.AddGauge("zps_memory_bytes", "Bytes held per tier.", {"tier"}));
    const char* tiers[] = {"master", "optimizer_state", "serving", "nvme"};
    for (int i = 0; i < 4; ++i) {
      ZPS_ASSIGN_OR_RETURN(m.memory[i], mem->Add({tiers[i]}));
    }
    ZPS_ASSIGN_OR_RETURN(auto* sb, r.AddGauge("zps_shard_state_bytes",
                                              "Bytes of each kind of state this shard keeps, in "
                                              "RAM or spilled: what it costs per parameter.",
                                              {"kind"}));
    const char* kinds[] = {"master", "m", "v", "serving", "grad", "scales"};
    for (int i = 0; i < 6; ++i) {
      ZPS_ASSIGN_OR_RETURN(m.state_bytes[i], sb->Add({kinds[i]}));
    }
    ZPS_ASSIGN_OR_RETURN(auto* cd, r.AddHistogram("zps_checkpoint_duration_seconds",
                                                  "Time to write this shard's part of a "
                                                  "checkpoint.",
                                                  {}, ExponentialBuckets(0.1, 2.0, 16)));
    ZPS_ASSIGN_OR_RETURN(m.checkpoint_duration, cd->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* cl, r.AddGauge("zps_checkpoint_last_success_timestamp_seconds",
                                              "Unix time of the last checkpoint this shard "
                                              "completed; 0 before the first."));
    ZPS_ASSIGN_OR_RETURN(m.checkpoint_last_success, cl->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* cw, r.AddGauge("zps_connected_workers",
                                              "Workers with an authenticated control-plane "
                                              "session to this shard."));
    ZPS_ASSIGN_OR_RETURN(m.connected_workers, cw->Add({}));
    ZPS_ASSIGN_OR_RETURN(auto* sc, r.AddCounter("zps_speculative_chunks_total",
                                                "Chunk updates of --update speculative, by what "
                                                "the commit did: published (the speculation), "
                                                "redone (the step clipped), dropped (skipped), "
                                                "sync (not speculated: updated at the commit).",
                                                {"outcome"}));
    const char* outcomes[] = {"published", "redone", "dropped", "sync"};
    for (int i = 0; i < 4; ++i) {
      ZPS_ASSIGN_OR_RETURN(m.speculative_chunks[i], sc->Add({outcomes[i]}));
    }
    return m;
  }
};

struct ShardServer::Impl {
  using Sessions = SessionTable<ucx::Endpoint>;
  using Session = Sessions::Session;
  using Clock = std::chrono::steady_clock;

  ShardServerOptions opts;
  metrics::Registry registry;  // outlives every other member that holds a handle (declared first)
  ShardMetrics sm;
  std::unique_ptr<metrics::Exporter> exporter;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ucx::Context> ucx_context;
  // Every serving copy of this shard (ShardState's ServingAllocator), from Context::Allocate so
  // that workers can Get it (shared memory) and AM replies need no registration (tcp). Set once
  // by the driver (DriverHost::serving_alloc) before state_ptr; destroyed after the worker
  // stopped and before the context.
  std::unique_ptr<ucx::MemoryRegion> serving_region;
  std::unique_ptr<ucx::Worker> ucx;
  std::unique_ptr<rpc::Server> rpc;
  std::unique_ptr<CoordinatorCatalog> catalog;  // coordinator with --data-dir; before coordinator
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<KvStore> kv;  // the coordinator's rendezvous store (KvSet/KvGet)
  std::unique_ptr<CoordinatorService> coordinator_service;  // with the coordinator
  std::unique_ptr<KvService> kv_service;                    // with the coordinator
  std::unique_ptr<ShardState> state;  // set once by the driver, before state_ptr
  std::atomic<ShardState*> state_ptr{nullptr};
  std::unique_ptr<ShardDriver> drv;  // the step driver's logic (shard_driver.cc)
  std::thread driver;
  std::once_flag stop_once;

  Mutex mu;
  CondVar cv;
  // Worker sessions and their admission and fence policy (session_table.h).
  Sessions sessions{[this](size_t n) { sm.connected_workers.Set(static_cast<double>(n)); }};
  bool stopping GUARDED_BY(mu) = false;
  bool finished GUARDED_BY(mu) = false;
  Status fatal GUARDED_BY(mu);

  bool Stopping() {
    MutexLock lock(&mu);
    return stopping;
  }
  void Fail(const Status& s) {
    {
      MutexLock lock(&mu);
      if (fatal.ok() && !stopping) fatal = s;
      finished = true;
    }
    cv.SignalAll();
  }
  // Request accounting: Begin at receipt, End at reply (in-flight gauge and duration histogram).
  Clock::time_point BeginRequest(metrics::Op op) {
    sm.pm.inflight[op].Inc();
    return Clock::now();
  }
  void EndRequest(metrics::Op op, Clock::time_point t0) {
    sm.pm.inflight[op].Dec();
    sm.pm.request_duration[op].ObserveSince(t0);
  }
  // A synchronous control handler, timed from receipt to return (it answers before returning).
  rpc::Handler Timed(rpc::Handler h) {
    return [this, h = std::move(h)](const rpc::Peer& p, std::span<const std::byte> payload,
                                    rpc::Responder r) {
      auto t0 = BeginRequest(metrics::kControl);
      h(p, payload, r);
      EndRequest(metrics::kControl, t0);
    };
  }
  // A long-poll control handler: counted in flight until the last copy of the returned token
  // (captured by the reply callback) is gone. Not timed: its wait is the step's, not the shard's.
  std::shared_ptr<void> LongPoll() {
    sm.pm.inflight[metrics::kControl].Inc();
    return std::shared_ptr<void>(static_cast<void*>(this),
                                 [this](void*) { sm.pm.inflight[metrics::kControl].Dec(); });
  }
  static std::string_view PushErrorKind(Code c) {
    switch (c) {
      case Code::kFailedPrecondition:
        return "stale_step";
      case Code::kAlreadyExists:
        return "duplicate_push";
      default:
        return "invalid_argument";
    }
  }
  Status Liveness() {
    MutexLock lock(&mu);
    if (finished && !fatal.ok()) return Internal("the shard failed: " + fatal.ToString());
    return Status::Ok();
  }
  Status Readiness() {
    // Later also: the checkpoint restored.
    if (state_ptr.load() == nullptr) return Unavailable("waiting for the job layout");
    return Status::Ok();
  }
  void SetMemoryGauges(const JobSpec& job);
  void UpdateStorageMetrics();  // driver thread: spill I/O and speculation counters, memory gauges
  ShardStorageStats last_storage;  // driver thread only: the figures last exported
  SpeculationStats last_spec;      // driver thread only: the figures last exported
  ShardStateBytes state_bytes;     // driver thread only: the job's, set with the memory gauges

  // Driver callback (shard_driver.h): let workers in, or fence them out.
  void SetServing(bool accept, const Status& reason);

  Status SetupDataPlane();   // every AM handler, or the error of the first that failed
  void SetupControlPlane();  // every RPC handler and the hello/disconnect hooks
  RpcMetering Metering();
  // The hello of a worker (its UCX address in `extra`): admits its session (session_table.h).
  void AdmitWorker(const rpc::Peer& peer, std::span<const std::byte> extra, rpc::HelloDone done);
  void WorkerDisconnected(const rpc::Peer& peer);
  void DriverLoop();
  // `bank_bytes`: ShardState::serving_bank_bytes() (0: one bank).
  void ReplyFetch(const ucx::Endpoint& ep, uint64_t request, const Status& s, int64_t version,
                  std::span<const std::byte> data, bool rma,
                  std::shared_ptr<const void> owner = nullptr, uint64_t bank_bytes = 0);
  void HandleFetch(ucx::AmMessage& m, bool rma);
  void ReplyPush(const ucx::Endpoint& ep, uint64_t request, const Status& s);
  // A data-plane message whose header does not decode: counted (invalid_argument), and logged
  // at most 10 times a second with how many were held back (a flood of them would otherwise
  // write a line each).
  void DropMalformed(std::string_view what, const Status& why);
  log::LogRateLimit malformed_log{10, std::chrono::seconds(1)};
  void HandlePush(ucx::AmMessage& m, bool rma);
  // Tells every worker session that `version` is published (kAmServingNotice; nothing when the
  // serving copies are not in a UCX region: no worker learned an address then).
  void NoticeServing(int64_t version);
  void SendNotice(const ucx::Endpoint& ep, uint64_t token, int64_t version);
  std::string StatusJson();
};

// ---- data plane -----------------------------------------------------------------------------

// True while the UCX fetch handler runs ShardState::Fetch: a callback seeing it answers inline.
namespace {
thread_local bool in_fetch_handler = false;
}  // namespace

// Payloads from this size up go by rendezvous (the receiver pulls them zero-copy where the
// transport can) whatever UCX_RNDV_THRESH says; below it eager is cheaper.
constexpr size_t kRendezvousMin = 64 * 1024;

// `owner` (may be null) keeps `data` alive: a spilled serving copy read back into a staging
// buffer. Such data is never in the serving region, so it goes by AM in both fetch modes, and the
// send holds the owner until it completes (the staging buffer is then free again).
void ShardServer::Impl::ReplyFetch(const ucx::Endpoint& ep, uint64_t request, const Status& s,
                                   int64_t version, std::span<const std::byte> data, bool rma,
                                   std::shared_ptr<const void> owner, uint64_t bank_bytes) {
  auto log_failure = [](Status st) {
    if (!st.ok()) ZPS_LOG(DEBUG) << "fetch reply not delivered: " << st.ToString();
  };
  const ucx::MemoryRegion* region = serving_region.get();
  const bool in_region = region != nullptr && region->Contains(data.data(), data.size());
  if (rma && (!s.ok() || in_region)) {
    // No data: the worker Gets the range from the serving region (docs/data-plane.md).
    msg::FetchRmaReplyHeader h{request, static_cast<uint32_t>(s.code()), version, s.message(), 0,
                               {}};
    if (s.ok()) {
      h.remote_address = reinterpret_cast<uintptr_t>(data.data());
      h.rkey.assign(region->rkey().begin(), region->rkey().end());
      if (bank_bytes > 0) {  // bank 0 is the region's first half, bank 1 its second
        const bool first = h.remote_address < region->remote_address() + bank_bytes;
        h.bank_delta = first ? static_cast<int64_t>(bank_bytes) : -static_cast<int64_t>(bank_bytes);
      }
    }
    ucx->SendAm(ep, msg::kAmFetchRmaReply, h.Encode(), {}, nullptr, log_failure);
    return;
  }
  msg::FetchReplyHeader h{request, static_cast<uint32_t>(s.code()), version, s.message()};
  ucx::SendOptions so;
  if (s.ok()) {
    so.force_rendezvous = data.size() >= kRendezvousMin;
    so.region = in_region ? region : nullptr;
  } else {
    data = {};
  }
  ucx->SendAm(ep, msg::kAmFetchReply, h.Encode(), data, std::move(owner), log_failure, so);
}

void ShardServer::Impl::ReplyPush(const ucx::Endpoint& ep, uint64_t request, const Status& s) {
  msg::PushReplyHeader h{request, static_cast<uint32_t>(s.code()), s.message()};
  ucx->SendAm(ep, msg::kAmPushReply, h.Encode(), {}, nullptr, [](Status st) {
    if (!st.ok()) ZPS_LOG(DEBUG) << "push reply not delivered: " << st.ToString();
  });
}

void ShardServer::Impl::DropMalformed(std::string_view what, const Status& why) {
  sm.pm.ProtocolError("invalid_argument");
  uint64_t held_back = 0;
  if (!malformed_log.Allow(&held_back)) return;
  ZPS_LOG(WARNING) << "dropping malformed " << what << ": " << why.ToString()
                   << (held_back == 0 ? std::string()
                                      : " (" + std::to_string(held_back) +
                                            " more malformed messages not logged; "
                                            "zps_protocol_errors_total counts them)");
}

void ShardServer::Impl::HandleFetch(ucx::AmMessage& m, bool rma) {
  auto h = msg::FetchHeader::Decode(m.header());
  if (!h.ok()) {
    DropMalformed("fetch", h.status());
    return;
  }
  const auto t0 = BeginRequest(metrics::kFetch);
  const std::optional<Session> found = sessions.Find(h->session);
  if (!found) {
    sm.pm.ProtocolError("unauthenticated");
    if (m.reply_endpoint().valid()) {
      ReplyFetch(m.reply_endpoint(), h->request, sessions.SessionError(h->session), -1, {}, rma);
    }
    EndRequest(metrics::kFetch, t0);
    return;
  }
  const Session& session = *found;
  ShardState* st = state_ptr.load();
  if (st == nullptr) {
    ReplyFetch(session.ep, h->request, Unavailable("the shard has no job yet"), -1, {}, rma);
    EndRequest(metrics::kFetch, t0);
    return;
  }
  // A fetch for a version not yet published is answered later, from the publish: time it
  // from then (serving latency, not the step's wait). It stays in flight all along.
  in_fetch_handler = true;
  st->Fetch({h->chunk, h->offset, h->length, h->min_version},
            [this, ep = session.ep, req = h->request, t0, rma, banks = st->serving_bank_bytes()](
                const Status& fs, int64_t v, std::span<const std::byte> data,
                std::shared_ptr<const void> owner) {
              const auto start = in_fetch_handler ? t0 : Clock::now();
              ReplyFetch(ep, req, fs, v, data, rma, std::move(owner), banks);
              if (fs.ok()) sm.pm.fetch_bytes.Inc(data.size());
              EndRequest(metrics::kFetch, start);
            });
  in_fetch_handler = false;
  // SetServing(false) (another thread) may have fenced the worker's session and answered the
  // waiting fetches between the lookup above and the Fetch: one parked after that would wait for a
  // publish that the rollback never makes, and its answer from ResetTo would go to a closed
  // endpoint (the worker then waits for its --op-timeout). While not serving, every waiting
  // fetch belongs to a fenced session: answer them now. The endpoint closes SetServing queued
  // run on this thread after this handler, so the reply goes out first.
  if (Status parked = sessions.ParkedFetchError(); !parked.ok()) st->FailWaiters(parked);
}

Status ShardServer::Impl::SetupDataPlane() {
  // A shard missing a handler would drop that kind of message on the floor (the worker waits
  // for a reply that never comes): refuse to start instead.
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmFetch, [this](ucx::AmMessage& m) { HandleFetch(m, false); })
          .WithContext("data plane: Fetch handler"));
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmFetchRma, [this](ucx::AmMessage& m) { HandleFetch(m, true); })
          .WithContext("data plane: FetchRma handler"));
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmPush, [this](ucx::AmMessage& m) { HandlePush(m, false); })
          .WithContext("data plane: Push handler"));
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmPushRma, [this](ucx::AmMessage& m) { HandlePush(m, true); })
          .WithContext("data plane: PushRma handler"));
  return Status::Ok();
}

// kAmPush carries the gradient (rendezvous from 64 KiB); kAmPushRma carries where it is in the
// worker's UCX region, and the shard reads it with RMA get (shared memory: a plain copy).
// Both are validated the same way before any byte is taken.
void ShardServer::Impl::HandlePush(ucx::AmMessage& m, bool rma) {
  msg::PushRmaHeader rh;
  if (rma) {
    auto d = msg::PushRmaHeader::Decode(m.header());
    if (!d.ok()) {
      DropMalformed("push", d.status());
      return;
    }
    rh = std::move(*d);
  } else {
    auto d = msg::PushHeader::Decode(m.header());
    if (!d.ok()) {
      DropMalformed("push", d.status());
      return;
    }
    rh.push = *d;
  }
  const msg::PushHeader* h = &rh.push;
  const auto t0 = BeginRequest(metrics::kPush);
  const std::optional<Session> found = sessions.Find(h->session);
  if (!found) {
    sm.pm.ProtocolError("unauthenticated");
    if (m.reply_endpoint().valid()) {
      ReplyPush(m.reply_endpoint(), h->request, sessions.SessionError(h->session));
    }
    EndRequest(metrics::kPush, t0);
    return;
  }
  const Session& session = *found;
  ShardState* st = state_ptr.load();
  if (st == nullptr) {
    ReplyPush(session.ep, h->request, Unavailable("the shard has no job yet"));
    EndRequest(metrics::kPush, t0);
    return;
  }
  const size_t carried = rma ? 0 : m.data_length();
  const size_t expected = PushBytes(h->dtype, h->length);
  if (h->length > (1ull << 40) || (rma ? m.data_length() != 0 : carried != expected)) {
    sm.pm.ProtocolError("invalid_argument");
    ReplyPush(session.ep, h->request,
              InvalidArgument("push carries " + std::to_string(m.data_length()) + " bytes for " +
                              std::to_string(h->length) + " elements of " +
                              std::string(DTypeName(h->dtype)) +
                              (rma ? " (a push by RMA carries none)" : "")));
    EndRequest(metrics::kPush, t0);
    return;
  }
  MaybeCrashAt("push", h->step);
  auto ticket = st->BeginPush(
      {h->step, h->chunk, h->offset, h->length, h->rank, h->dtype, session.epoch, session.rank});
  if (!ticket.ok()) {
    sm.pm.ProtocolError(PushErrorKind(ticket.status().code()));
    ReplyPush(session.ep, h->request, ticket.status());
    EndRequest(metrics::kPush, t0);
    return;
  }
  auto held = std::make_shared<PushTicket>(std::move(*ticket));
  std::span<std::byte> dest = held->destination();
  auto done = [this, st, held, ep = session.ep, req = h->request, t0,
               bytes = expected](Status transfer) {
    Status fin = st->FinishPush(std::move(*held), transfer);
    if (transfer.ok()) {
      ReplyPush(ep, req, fin);
      if (fin.ok()) sm.pm.push_bytes.Inc(bytes);
    } else if (transfer.code() == Code::kInvalidArgument) {
      ReplyPush(ep, req, transfer);  // e.g. an rkey UCX cannot unpack: the worker hears why
    }
    EndRequest(metrics::kPush, t0);
  };
  if (rma) {
    ucx->Get(session.ep, dest, rh.remote_address, rh.rkey, held, std::move(done));
  } else {
    Status rs = m.Receive(dest, std::move(done));
    (void)rs;  // errors reach the callback too
  }
}

std::string ShardServer::Impl::StatusJson() {
  nlohmann::json j;
  j["ordinal"] = opts.ordinal;
  j["shards"] = opts.shards;
  ShardState* st = state_ptr.load();
  j["job_loaded"] = st != nullptr;
  j["version"] = st ? st->version() : -1;
  j["chunks"] = st ? st->chunk_ids().size() : 0;
  // The step in progress's gradient slots (bad-input tests: a rejected push changes nothing).
  if (st) j["gradient_crc"] = st->GradientCrc();
  if (st) {  // what zps-train's "state bytes per parameter" line sums over the shards
    const ShardStateBytes b = st->state_bytes();
    j["state_bytes"] = {{"master", b.master},   {"m", b.m},      {"v", b.v}, {"scales", b.scales},
                        {"serving", b.serving}, {"grad", b.grad}};
  }
  if (coordinator) {
    j["coordinator_step"] = coordinator->step();
    j["coordinator_epoch"] = coordinator->epoch();
    j["coordinator_phase"] = static_cast<int>(coordinator->phase());
    j["checkpoint_waiters"] = coordinator->checkpoint_waiters();
    j["awaiting_reports"] = coordinator->awaiting_reports();
  }
  j["worker_sessions"] = sessions.size();
  return j.dump();
}

void ShardServer::Impl::SetMemoryGauges(const JobSpec&) {
  state_bytes = state->state_bytes();
  const ShardStateBytes& b = state_bytes;
  sm.memory[ShardMetrics::kMaster].Set(static_cast<double>(b.master));
  sm.memory[ShardMetrics::kOptimizerState].Set(static_cast<double>(b.m + b.v + b.scales));
  sm.memory[ShardMetrics::kServing].Set(static_cast<double>(b.serving));
  sm.memory[ShardMetrics::kNvme].Set(0);
  const uint64_t kinds[] = {b.master, b.m, b.v, b.serving, b.grad, b.scales};
  for (size_t k = 0; k < sm.state_bytes.size(); ++k) {
    sm.state_bytes[k].Set(static_cast<double>(kinds[k]));
  }
  last_spec = {};          // a new state
  UpdateStorageMetrics();  // with a memory budget: the store's RAM and spill figures instead
}

void ShardServer::Impl::UpdateStorageMetrics() {
  if (state == nullptr) return;
  const SpeculationStats spec = state->speculation_stats();
  // A new job's state counts from 0 again.
  auto delta = [](uint64_t now, uint64_t last) { return now >= last ? now - last : now; };
  sm.speculative_chunks[ShardMetrics::kPublished].Inc(delta(spec.published, last_spec.published));
  sm.speculative_chunks[ShardMetrics::kRedone].Inc(delta(spec.redone, last_spec.redone));
  sm.speculative_chunks[ShardMetrics::kDropped].Inc(delta(spec.dropped, last_spec.dropped));
  sm.speculative_chunks[ShardMetrics::kSync].Inc(delta(spec.sync, last_spec.sync));
  last_spec = spec;
  const ShardStorageStats now = state->storage_stats();
  if (now.serving_on_fetch) {  // no copies kept: the tier's RAM is its fetch staging buffers
    sm.memory[ShardMetrics::kServing].Set(static_cast<double>(now.serving_staging_bytes));
    const uint64_t made = delta(now.made_fetch_conversions, last_storage.made_fetch_conversions);
    const uint64_t fetches = delta(now.made_fetches, last_storage.made_fetches);
    sm.made_fetches[0].Inc(made);
    sm.made_fetches[1].Inc(fetches >= made ? fetches - made : 0);
  }
  if (!now.spilled) {
    last_storage = now;
    return;
  }
  const ChunkStoreStats& st = now.store;
  // RAM: resident records split master : moments (and their scales) as their bytes are; the
  // pipeline buffers are counted with the optimizer state. NVMe: the spill file's bytes.
  const ShardStateBytes& b = state_bytes;
  const double master = static_cast<double>(st.state_ram_bytes) * static_cast<double>(b.master) /
                        static_cast<double>(b.master + b.m + b.v + b.scales);
  sm.memory[ShardMetrics::kMaster].Set(master);
  sm.memory[ShardMetrics::kOptimizerState].Set(
      static_cast<double>(st.state_ram_bytes) - master +
      static_cast<double>(st.buffer_bytes - st.serving_buffer_bytes));
  if (now.serving_in_store) {  // resident copies + pipeline and fetch staging buffers
    sm.memory[ShardMetrics::kServing].Set(static_cast<double>(
        st.serving_ram_bytes + st.serving_buffer_bytes + now.serving_staging_bytes));
  }
  sm.memory[ShardMetrics::kNvme].Set(
      static_cast<double>(st.state_file_bytes + st.serving_file_bytes));
  sm.nvme_read.Inc(st.bytes_read - last_storage.store.bytes_read);
  sm.nvme_write.Inc(st.bytes_written - last_storage.store.bytes_written);
  sm.nvme_errors.Inc(now.io_errors - last_storage.io_errors);
  sm.nvme_serving_read.Inc(st.serving_bytes_read - last_storage.store.serving_bytes_read);
  sm.nvme_serving_write.Inc(st.serving_bytes_written - last_storage.store.serving_bytes_written);
  const uint64_t reads = now.spilled_fetch_reads - last_storage.spilled_fetch_reads;
  const uint64_t fetches = now.spilled_fetches - last_storage.spilled_fetches;
  sm.spilled_fetches[0].Inc(reads);
  sm.spilled_fetches[1].Inc(fetches >= reads ? fetches - reads : 0);
  last_storage = now;
}

// ---- step driver: shard_driver.cc -------------------------------------------------------------

void ShardServer::Impl::SetServing(bool accept, const Status& reason) {
  if (accept) {
    sessions.SetAccepting(true);
    return;
  }
  const std::vector<std::pair<uint64_t, ucx::Endpoint>> eps = sessions.FenceAll();
  // Waiting fetches are answered (`reason`: the worker re-joins at once) before their
  // endpoints close: a reply sent after the close is lost, and the worker would wait for its
  // --op-timeout instead.
  if (ShardState* st = state_ptr.load()) st->FailWaiters(reason);
  // Before the close (which flushes it): the worker learns that its session is over. It fails
  // its endpoint to this shard, so that what it has in flight here, and what it would send next
  // (the close drops it unanswered), ends at once and it re-joins instead of waiting for its
  // --op-timeout; and it forgets the serving addresses it learned, so it does not read the
  // region one-sided while a restore rewrites it.
  for (auto& [token, ep] : eps) {
    SendNotice(ep, token, msg::ServingNoticeHeader::kNoticeForget);
    ucx->Close(ep);
  }
}

void ShardServer::Impl::SendNotice(const ucx::Endpoint& ep, uint64_t token, int64_t version) {
  msg::ServingNoticeHeader h{token, version};
  ucx->SendAm(ep, msg::kAmServingNotice, h.Encode(), {}, nullptr, [](Status st) {
    if (!st.ok()) ZPS_LOG(DEBUG) << "serving notice not delivered: " << st.ToString();
  });
}

void ShardServer::Impl::NoticeServing(int64_t version) {
  if (!serving_region || version < 0) return;
  for (auto& [token, ep] : sessions.Endpoints()) SendNotice(ep, token, version);
}

void ShardServer::Impl::DriverLoop() {
  Status s = drv->Run();
  if (!s.ok() && s.code() != Code::kCancelled) {
    ZPS_LOG(ERROR) << "shard " << opts.ordinal << " stops: " << s.ToString();
    if (coordinator) {
      // The job stops with this reason: waiting workers get it, and so does a worker's re-join
      // in the next moments (Join answers the shutdown reason), before the port closes.
      coordinator->Shutdown(s.WithContext("the job stopped"));
      kv->Fail(s.WithContext("the job stopped"));  // a rank waiting in a rendezvous learns why
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
  }
  Fail(s.code() == Code::kCancelled ? Status::Ok() : s);
}

// ---- control plane: rpc_service.h (the handlers), session_table.h (the sessions) ------------

RpcMetering ShardServer::Impl::Metering() {
  return {[this](rpc::Handler h) { return Timed(std::move(h)); }, [this] { return LongPoll(); }};
}

void ShardServer::Impl::SetupControlPlane() {
  const RpcMetering metering = Metering();
  if (coordinator) {
    RegisterCoordinatorRpcs(*rpc, metering, coordinator_service.get());
    RegisterKvRpcs(*rpc, metering, kv_service.get());
  }
  RegisterShardRpcs(*rpc, metering,
                    {[this] { return state_ptr.load(); }, [this] { return StatusJson(); }});
  rpc->OnProtocolError([this](std::string_view kind) { sm.pm.ProtocolError(kind); });
  // The endpoint is made on the UCX progress thread, and the hello answered from there: no RPC
  // io thread waits for the progress thread (which may be busy with transfers).
  rpc->OnHelloAsync([this](const rpc::Peer& peer, std::span<const std::byte> extra,
                           rpc::HelloDone done) { AdmitWorker(peer, extra, std::move(done)); });
  rpc->OnDisconnect([this](const rpc::Peer& peer) { WorkerDisconnected(peer); });
}

void ShardServer::Impl::AdmitWorker(const rpc::Peer& peer, std::span<const std::byte> extra,
                                    rpc::HelloDone done) {
  if (peer.role != rpc::PeerRole::kWorker) return done(std::vector<std::byte>{});
  if (extra.empty()) return done(InvalidArgument("a worker's hello must carry its UCX address"));
  // Workers learn of the job from the coordinator, possibly before this shard has loaded it;
  // they retry until it has, so no data-plane message ever meets a shard without a job.
  ShardState* st = state_ptr.load();
  if (st == nullptr) return done(Unavailable("this shard has not loaded the job yet"));
  // A shard in its clean stop (writing its shutdown checkpoint) refuses with Unavailable, which
  // a worker retries: it comes back on the same port, and the worker's re-join must outlast it.
  if (Stopping()) return done(Unavailable("this shard is stopping"));
  // The generation is read before the admission check: the driver fences (FenceAll) before it
  // rolls back, so a session admitted across a rollback carries the old one and is refused.
  const uint64_t epoch = st->epoch();
  if (Status admit = sessions.CheckAdmission(); !admit.ok()) return done(admit);
  std::vector<std::byte> address(extra.begin(), extra.end());
  const bool posted = ucx->Post([this, st, peer, epoch, address = std::move(address), done]() {
    // On the progress thread Connect makes the endpoint at once (no wait).
    // The failure itself is logged where it is decided (ucx::Worker: WARNING when UCX or
    // the pid check found it, INFO when we declared it because the worker's control
    // connection closed, as at the end of every job); this line names the rank.
    auto ep = ucx->Connect(address, [rank = peer.rank](const ucx::Endpoint&, const Status& s) {
      ZPS_LOG(INFO) << "data-plane peer (rank " << rank << ") failed: " << s.ToString();
    });
    if (!ep.ok()) return done(ep.status());
    // A rank's new session replaces any old one (its process restarted, or it re-joined after
    // an error; the old connection may not have closed yet): the old sessions are dropped and
    // what the rank pushed for the step in progress is forgotten, so it pushes the step again.
    // On the progress thread, where every push begins: no push of an old session can begin
    // after the forget (its token is gone by then).
    const std::vector<ucx::Endpoint> old_eps = sessions.TakeRank(peer.rank);
    Result<uint64_t> dropped = st->ForgetRank(peer.rank);
    if (!dropped.ok()) {
      ucx->Close(*ep);
      // Cancelled: the state shut down since the check above (the shard is stopping).
      if (dropped.status().code() == Code::kCancelled) {
        return done(Unavailable("this shard is stopping"));
      }
      return done(dropped.status().WithContext("forgetting rank " + std::to_string(peer.rank) +
                                               "'s old session"));
    }
    if (st->job().mode == ReductionMode::kPreReduced && *dropped > 0) {
      ZPS_LOG(WARNING) << "worker rank " << peer.rank << " connected again (" << old_eps.size()
                       << " old session(s) closed): " << *dropped
                       << " elements pushed of the step in progress dropped (pre-reduced: every "
                          "rank restarts the step and pushes it again)";
    } else if (*dropped > 0 || !old_eps.empty()) {
      ZPS_LOG(WARNING) << "worker rank " << peer.rank << " connected again (" << old_eps.size()
                       << " old session(s) closed): " << *dropped
                       << " elements it pushed of the step in progress dropped; it pushes them "
                          "again";
    }
    for (const auto& old : old_eps) {
      if (!old.peer_error_handling()) {
        ucx->Fail(old, Unavailable("worker rank " + std::to_string(peer.rank) + " replaced"));
      }
      ucx->Close(old);
    }
    sessions.Add(peer.session_token, {peer.rank, *ep, epoch});
    ZPS_LOG(INFO) << "worker rank " << peer.rank << " connected from " << peer.remote;
    done(ucx->Address());
  });
  if (!posted) done(Unavailable("this shard is stopping"));
}

void ShardServer::Impl::WorkerDisconnected(const rpc::Peer& peer) {
  if (peer.role == rpc::PeerRole::kShard && coordinator) {
    coordinator->ShardLost(peer.rank, peer.session_id);
    return;
  }
  const std::optional<ucx::Endpoint> found = sessions.Disconnect(peer.session_token);
  if (!found) return;
  const ucx::Endpoint& ep = *found;
  ZPS_LOG(INFO) << "worker rank " << peer.rank << " disconnected";
  // Without UCX peer-failure handling (shared memory) the control-plane connection is how we
  // learn that the worker is gone: fail the endpoint, so nothing waits on it, then close it.
  if (!ep.peer_error_handling())
    ucx->Fail(ep, Unavailable("worker rank " + std::to_string(peer.rank) + " disconnected"));
  ucx->Close(ep);
}

// ---- lifecycle --------------------------------------------------------------------------------

ShardServer::ShardServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShardServer::~ShardServer() { Stop(); }

Result<std::unique_ptr<ShardServer>> ShardServer::Create(const ShardServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  ZPS_ASSIGN_OR_RETURN(impl->pool, ThreadPool::Create({.name = "optimizer",
                                                       .threads = options.optimizer_threads,
                                                       .pin = options.pin_threads}));
  ZPS_ASSIGN_OR_RETURN(impl->sm, ShardMetrics::Create(impl->registry));
  ZPS_ASSIGN_OR_RETURN(impl->ucx_context, ucx::Context::Create({.transports = options.ucx_tls}));
  ZPS_RETURN_IF_ERROR(impl->sm.pm.SetUcxTransports(*impl->ucx_context));
  ZPS_ASSIGN_OR_RETURN(
      impl->ucx, ucx::Worker::Create(*impl->ucx_context,
                                     {.thread_name = "shard-ucx",
                                      .spin = std::chrono::microseconds(options.ucx_spin_us)}));
  rpc::ServerOptions ro;
  ro.bind_address = options.bind_address;
  ro.port = static_cast<uint16_t>(options.port);
  ro.token = options.token;
  ro.io_threads = 2;
  ZPS_ASSIGN_OR_RETURN(impl->rpc, rpc::Server::Create(ro));
  std::unique_ptr<ShardCheckpoints> checkpoints;
  if (!options.data_dir.empty()) {
    ZPS_ASSIGN_OR_RETURN(
        checkpoints,
        ShardCheckpoints::Open(options.data_dir,
                               {.direct_writes = options.checkpoint_direct_io,
                                .direct_reads = options.checkpoint_direct_io,
                                // A background write frames on its own (niced) thread alone.
                                .write_threads = options.checkpoint_mode == "background" ? 1 : 2,
                                .low_priority = options.checkpoint_mode == "background"}));
  }
  if (options.ordinal == 0) {  // shard 0 hosts the coordinator; --coordinator is for the others
    CoordinatorOptions co;
    co.checkpoint_every = options.checkpoint_every;
    if (!options.data_dir.empty()) {
      ZPS_ASSIGN_OR_RETURN(impl->catalog,
                           CoordinatorCatalog::Open(options.data_dir + "/coordinator", {}));
      co.catalog = impl->catalog.get();
    }
    impl->coordinator = std::make_unique<Coordinator>(static_cast<uint32_t>(options.shards), co);
    impl->kv = std::make_unique<KvStore>();
    impl->coordinator_service = std::make_unique<CoordinatorService>(
        impl->coordinator.get(), impl->kv.get(),
        [](std::string_view point, int64_t step) { MaybeCrashAt(point, step); });
    impl->kv_service = std::make_unique<KvService>(impl->coordinator.get(), impl->kv.get());
    ZPS_RETURN_IF_ERROR(impl->coordinator->LoadCatalog());
  }
  Impl* d = impl.get();
  DriverHost host;
  host.opts = &d->opts;
  host.rpc_port = d->rpc->port();
  host.pool = d->pool.get();
  host.stopping = [d] { return d->Stopping(); };
  host.publish_state = [d](std::unique_ptr<ShardState> st, const JobSpec& job) {
    d->state = std::move(st);
    d->SetMemoryGauges(job);
    d->state_ptr.store(d->state.get());  // now ready (/readyz)
    return d->state.get();
  };
  host.set_serving = [d](bool accept, const Status& reason) { d->SetServing(accept, reason); };
  host.absent_ranks = [d](uint32_t world) { return d->sessions.AbsentRanks(world); };
  host.serving_alloc = [d](size_t bytes) -> Result<std::span<std::byte>> {
    if (d->serving_region) return FailedPrecondition("the serving region is allocated already");
    ZPS_ASSIGN_OR_RETURN(d->serving_region, d->ucx_context->Allocate(bytes));
    return d->serving_region->memory();
  };
  host.storage_metrics = [d] { d->UpdateStorageMetrics(); };
  host.published = [d](int64_t version) { d->NoticeServing(version); };
  host.optimizer_pass = &d->sm.optimizer_pass;
  host.optimizer_bytes = &d->sm.optimizer_bytes;
  host.step_duration = &d->sm.pm.step_duration;
  host.current_step = &d->sm.pm.current_step;
  host.checkpoint_duration = &d->sm.checkpoint_duration;
  host.checkpoint_last_success = &d->sm.checkpoint_last_success;
  d->drv = std::make_unique<ShardDriver>(std::move(host), std::move(checkpoints));
  return std::unique_ptr<ShardServer>(new ShardServer(std::move(impl)));
}

Status ShardServer::Start() {
  Impl* d = impl_.get();
  ZPS_RETURN_IF_ERROR(d->SetupDataPlane());
  d->SetupControlPlane();
  if (d->opts.metrics_port != 0) {
    metrics::ExporterOptions eo;
    eo.bind_address = d->opts.bind_address;
    eo.port = static_cast<uint16_t>(d->opts.metrics_port);
    ZPS_ASSIGN_OR_RETURN(d->exporter, metrics::Exporter::Start(
                                          eo, &d->registry, [d] { return d->Liveness(); },
                                          [d] { return d->Readiness(); }));
  }
  ZPS_RETURN_IF_ERROR(d->ucx->Start());
  ZPS_RETURN_IF_ERROR(d->rpc->Start());
  ZPS_LOG(INFO) << "shard " << d->opts.ordinal << "/" << d->opts.shards << " listening on "
                << d->opts.bind_address << ":" << d->rpc->port()
                << (d->coordinator ? " (coordinator)" : "");
  d->driver = std::thread([d] { d->DriverLoop(); });
  return Status::Ok();
}

Status ShardServer::Wait() {
  MutexLock lock(&impl_->mu);
  impl_->cv.Wait(lock, [&]() REQUIRES(impl_->mu) { return impl_->finished || impl_->stopping; });
  return impl_->fatal;
}

void ShardServer::Stop() {
  // Concurrent callers (main and the signal watcher) all return after one complete shutdown.
  std::call_once(impl_->stop_once, [this] { StopOnce(); });
}

void ShardServer::StopOnce() {
  Impl* d = impl_.get();
  {
    MutexLock lock(&d->mu);
    d->stopping = true;
  }
  d->cv.SignalAll();
  if (d->coordinator)
    d->coordinator->Shutdown(Unavailable("the coordinator is shutting down; retry"));
  if (ShardState* st = d->state_ptr.load()) st->Shutdown(Cancelled("shard shutting down"));
  d->drv->Interrupt();
  if (d->driver.joinable()) d->driver.join();
  (void)d->drv->ShutdownCheckpoint();  // clean shutdown: keep the last step (errors are logged)
  d->rpc->Stop();
  d->ucx->Stop();
  if (d->exporter) d->exporter->Stop();
}

uint16_t ShardServer::port() const { return impl_->rpc->port(); }

uint16_t ShardServer::metrics_port() const { return impl_->exporter ? impl_->exporter->port() : 0; }

}  // namespace zps::server
