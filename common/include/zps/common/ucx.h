// zps/common/ucx.h — the UCX (ucp) data plane: context, worker with one progress thread,
// endpoints, active messages and RMA get.
//
//   auto ctx = ucx::Context::Create({.transports = "tcp"});            // or "shm",
//   "posix,cma,self" auto worker = ucx::Worker::Create(**ctx, {.thread_name = "shard-ucx"});
//   (*worker)->SetAmHandler(kFetch, [&](ucx::AmMessage& m) { ... });   // before Start()
//   (*worker)->Start();
//   auto ep = (*worker)->Connect(peer_address_bytes, on_error);        // address from control
//   plane
//   (*worker)->SendAm(*ep, kFetch, header, data, keep_alive, [](Status s) { ... });
//
// Threading model. A Worker owns one ucp_worker and ONE progress thread, the only thread that
// ever calls into UCX for that worker (UCS_THREAD_MODE_SINGLE). Every public Worker method may be
// called from any thread: the operation is queued and the progress thread issues it. Called on
// the progress thread itself (from a handler or a completion callback) it runs inline. When idle
// the progress thread polls (yielding the core) for WorkerOptions::spin, then sleeps in epoll on
// the worker's event fd (ucp_worker_arm) and an eventfd that the submission queue signals.
//
// Callbacks (AmHandler, DoneCallback, ErrorCallback) all run on the progress thread. They must
// not block; they may call any Worker method (which then runs inline).
//
// Completion guarantee. Every DoneCallback passed to a Worker method is called exactly once:
// OK on success; Unavailable when the peer failed or the endpoint was closed; Cancelled when the
// worker stopped first; InvalidArgument/FailedPrecondition for a bad call. It runs on the
// progress thread, except for a call rejected before it is queued (worker not running, invalid
// endpoint or options, reply endpoint off the progress thread): then on the caller's thread
// before the call returns. Peer failure is detected through UCP_ERR_HANDLING_MODE_PEER on tcp (a
// broken socket, or keepalive: ContextOptions::keepalive_interval), and on shared memory, which
// UCX 1.13 cannot watch, through the peer pid given to Connect() and Worker::Fail() (see Connect).
// So no operation hangs on a dead peer.
//
// Which mechanism to fetch with: AM rendezvous over tcp, RMA Get from a Context::Allocate()d
// region over shared memory (docs/data-plane.md has the measurements).
//
// Security note (docs/architecture.md): there is no UCX listener. Endpoints are created only from
// worker addresses that the caller got over the authenticated control plane; the session token
// travels in the AM header, which this layer does not interpret.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zps/common/scoped_fd.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/ucx/handles.h"

namespace zps::ucx {

class Worker;

/// Called exactly once per operation, on the progress thread.
using DoneCallback = std::function<void(Status)>;

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------

struct ContextOptions {
  /// UCX transports (UCX_TLS syntax), e.g. "tcp" or "posix,cma,self". The alias "shm" means
  /// "posix,cma,self". Default: "" = UCX's default, or the UCX_TLS environment variable.
  std::string transports;
  /// Peer liveness probe interval for transports without a connection to break (shared memory).
  /// Default: 0 = UCX's default (UCX_KEEPALIVE_INTERVAL, 20 s in UCX 1.13).
  std::chrono::milliseconds keepalive_interval{0};
  /// Extra UCX settings, name without the "UCX_" prefix (e.g. {"RNDV_THRESH", "65536"}), applied
  /// with ucp_config_modify after the fields above. Default: none.
  std::vector<std::pair<std::string, std::string>> config;
};

class MemoryRegion;

/// One ucp_context with the AM, RMA and WAKEUP features.
/// Thread-safety: Register() and the accessors may be called from any thread.
/// Ownership: every Worker and MemoryRegion created from a Context must be destroyed before it.
class Context {
 public:
  /// Errors: InvalidArgument for an unknown transport or config name/value (as UCX reports it);
  /// Unavailable/Internal when UCX cannot initialise.
  static Result<std::unique_ptr<Context>> Create(const ContextOptions& options);
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// Registers `memory` (which the caller keeps alive for the region's lifetime) for RMA access
  /// by peers and for zero-copy local use. Errors: InvalidArgument for an empty span;
  /// ResourceExhausted/Internal from ucp_mem_map or ucp_rkey_pack.
  Result<std::unique_ptr<MemoryRegion>> Register(std::span<std::byte> memory);

  /// Allocates `size` bytes through UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE) and registers
  /// them; the region owns the memory. On shared memory a peer's Get from such a region is a
  /// plain copy out of a mapped posix segment (UCX 1.13 cannot map ordinary user memory for
  /// RMA: a Get from a Register()ed region is emulated, ~10x slower). So allocate memory that
  /// peers Get from here. Errors: InvalidArgument for size 0; ResourceExhausted/Internal from
  /// UCX.
  Result<std::unique_ptr<MemoryRegion>> Allocate(size_t size);

  /// The transports as configured ("" when UCX decides).
  const std::string& transports() const { return transports_; }
  /// False when the configured transports are shared memory only (posix, sysv, cma, knem, xpmem,
  /// self, sm, shm), which in UCX 1.13 cannot report peer failure; see Worker::Connect.
  bool peer_failure_capable() const { return peer_failure_capable_; }
  ucp_context_h raw() const { return context_.get(); }
  /// Makes the destructor leave the UCX context alive (not ucp_cleanup'd). A Worker that must
  /// leave its UCX worker undestroyed (UCX still holds requests of a stalled peer) calls it:
  /// UCX 1.13 asserts, and aborts the process, when it cleans up a context whose registration
  /// cache still has regions in use by such requests. Any thread; idempotent.
  void LeakOnDestruction() { leak_.store(true); }
  ~Context();

 private:
  Context() = default;
  std::atomic<bool> leak_{false};
  ContextPtr context_;
  std::string transports_;
  bool peer_failure_capable_ = true;
};

/// Registered memory and its packed remote key. Send remote_address() and rkey() to a peer (over
/// the control plane or in an AM header); the peer passes them to Worker::Get.
/// Thread-safety: immutable after creation. Ownership: must not be destroyed while an operation
/// that uses it (as a local buffer or remotely through its rkey) is in flight.
class MemoryRegion {
 public:
  ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  std::span<std::byte> memory() const { return memory_; }
  uint64_t remote_address() const { return reinterpret_cast<uintptr_t>(memory_.data()); }
  /// Packed rkey bytes (opaque, a few dozen bytes).
  std::span<const std::byte> rkey() const { return rkey_; }
  ucp_mem_h raw() const { return mem_.get(); }
  /// True if [p, p+n) lies inside this region.
  bool Contains(const void* p, size_t n) const;

 private:
  friend class Context;
  MemoryRegion() = default;
  Status PackRkey(ucp_context_h context);
  std::span<std::byte> memory_;
  MemPtr mem_;
  std::vector<std::byte> rkey_;
};

// ---------------------------------------------------------------------------------------------
// Endpoint handle
// ---------------------------------------------------------------------------------------------

/// A handle to a connection of a Worker. A small copyable value, safe to pass between threads;
/// the ucp_ep itself belongs to the Worker (closed by Worker::Close or at Worker shutdown).
/// Two kinds: connected endpoints (from Connect; usable from any thread until closed), and
/// reply endpoints (AmMessage::reply_endpoint; see there for their restricted lifetime).
class Endpoint {
 public:
  Endpoint() = default;
  bool valid() const { return id_ != 0 || reply_ != nullptr; }
  /// Unique within its Worker (never reused); 0 for reply endpoints.
  uint64_t id() const { return id_; }
  bool is_reply() const { return reply_ != nullptr; }
  /// True if UCX itself reports this endpoint's peer failures (UCP_ERR_HANDLING_MODE_PEER);
  /// false on UCX 1.13 shared memory, where failure comes from the pid check or Fail() (see
  /// Worker::Connect), and for reply endpoints.
  bool peer_error_handling() const { return peer_mode_; }

 private:
  friend class Worker;
  uint64_t id_ = 0;
  ucp_ep_h reply_ = nullptr;
  bool peer_mode_ = false;
};

/// Called once, on the progress thread, when a connected endpoint fails (peer died, network
/// error). All operations pending on it complete with Unavailable (before or after this call);
/// later operations on it fail at once with Unavailable. The endpoint stays known to the Worker
/// until Close(ep).
using ErrorCallback = std::function<void(const Endpoint& ep, const Status& status)>;

// ---------------------------------------------------------------------------------------------
// Active messages
// ---------------------------------------------------------------------------------------------

/// An incoming active message, valid only during the AmHandler call.
class AmMessage {
 public:
  uint16_t id() const { return id_; }
  /// The sender's header bytes (valid during the handler only).
  std::span<const std::byte> header() const { return header_; }
  /// Payload length in bytes.
  size_t data_length() const { return length_; }
  /// True if the payload has not arrived yet (rendezvous); Receive() fetches it.
  bool rendezvous() const { return rendezvous_; }
  /// The payload of an eager message (valid during the handler only); empty when rendezvous().
  std::span<const std::byte> eager_data() const;
  /// Endpoint back to the sender, valid for operations issued ON THE PROGRESS THREAD during this
  /// handler or during the DoneCallback of this message's Receive() when its status is OK. It
  /// must not be stored: UCX may free it when the sender fails. Long-lived peers should Connect()
  /// to the sender's worker address (from the control plane) instead. Invalid (valid() == false)
  /// when the sender did not ask for a reply endpoint (SendOptions::reply).
  const Endpoint& reply_endpoint() const { return reply_; }

  /// Receives the payload into `dest`, which must hold at least data_length() bytes and stay
  /// alive until `done` runs. Eager: copies now and calls done(OK) before returning. Rendezvous:
  /// starts ucp_am_recv_data_nbx; `done` runs later (OK, or Unavailable if the sender failed).
  /// Call at most once, only inside the handler. A message not received is dropped (the
  /// sender's operation completes OK). Errors (also passed to `done`): InvalidArgument if dest
  /// is too small; FailedPrecondition on a second call.
  Status Receive(std::span<std::byte> dest, DoneCallback done);

 private:
  friend class Worker;
  AmMessage() = default;
  Worker* worker_ = nullptr;
  uint16_t id_ = 0;
  std::span<const std::byte> header_;
  void* data_ = nullptr;
  size_t length_ = 0;
  bool rendezvous_ = false;
  bool received_ = false;
  Endpoint reply_;
};

/// Handles every message of one AM id. Runs on the progress thread; must not block.
using AmHandler = std::function<void(AmMessage& message)>;

/// Options for one SendAm.
struct SendOptions {
  /// Force the rendezvous protocol (receiver pulls the payload; zero-copy where the transport
  /// can). Default: false (UCX picks by size and UCX_RNDV_THRESH).
  bool force_rendezvous = false;
  /// Force eager (payload pushed with the header). Default: false. Exclusive with the above.
  bool force_eager = false;
  /// Give the receiver a reply endpoint (UCP_AM_SEND_FLAG_REPLY). Default: true.
  bool reply = true;
  /// The payload's registered region, if it has one (saves a registration). Default: none.
  const MemoryRegion* region = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Worker
// ---------------------------------------------------------------------------------------------

struct WorkerOptions {
  /// Name of the progress thread (logs, /proc; 15 bytes shown). Default: "ucx-progress".
  std::string thread_name = "ucx-progress";
  /// How long the progress thread keeps polling after the last activity before it sleeps on
  /// the event fd. Higher = lower latency, more CPU; a request/response fetch over tcp gains
  /// ~1.5x from 0 to 1 ms (docs/data-plane.md). Each idle poll yields the core first
  /// (sched_yield), so that on a machine with fewer cores than busy threads the poll does not
  /// steal the time of the thread that copies the data. Default: 200 µs.
  std::chrono::microseconds spin{200};
  /// How long shutdown waits for endpoints to flush before destroying the worker anyway.
  /// Default: 2 s.
  std::chrono::milliseconds close_timeout{2000};
  /// How often endpoints with a `peer_pid` check that the peer process lives. Default: 200 ms.
  std::chrono::milliseconds peer_check_interval{200};
};

/// One ucp_worker plus its progress thread. See the file comment for the threading model.
///
/// Lock order: queue_mu_ is a leaf lock (never held while calling UCX or user code).
/// State touched only by the progress thread is marked "progress thread only".
class Worker {
 public:
  /// Creates the ucp_worker (not the thread). Errors: from UCX (FromUcs), IoError for epoll.
  static Result<std::unique_ptr<Worker>> Create(Context& context, WorkerOptions options = {});
  /// Stops the progress thread (see Stop) and destroys the ucp_worker.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// This worker's address, to be sent to peers over the control plane. Any thread.
  const std::vector<std::byte>& Address() const { return address_; }

  /// Installs the handler for AM `id`. Only before Start(). Errors: FailedPrecondition after
  /// Start(); from UCX.
  Status SetAmHandler(uint16_t id, AmHandler handler);

  /// Starts the progress thread. Errors: FailedPrecondition if already started or stopped.
  Status Start();

  /// Closes every endpoint (flush, bounded by close_timeout), completes what is still pending
  /// (Unavailable/Cancelled), fails queued submissions with Cancelled, and joins the thread.
  /// Idempotent. Must not be called from the progress thread (it logs an error and returns).
  void Stop();

  /// Creates an endpoint to the worker whose Address() is `remote_address`. `on_error` (may be
  /// empty) runs once if the endpoint fails. Blocks until the progress thread has created it
  /// (unless called on the progress thread).
  ///
  /// Failure detection: UCP_ERR_HANDLING_MODE_PEER where the transports support it (tcp: a
  /// broken connection or keepalive). UCX 1.13's shared-memory transports (posix, cma) do not,
  /// so there the endpoint is created without UCX error handling and failure comes from
  /// (a) `peer_pid` > 0: the progress thread checks every WorkerOptions::peer_check_interval
  /// that this local process still lives (shared memory implies the same host; the pid comes
  /// over the control plane), and (b) Fail(), which the owner calls when the control-plane
  /// connection to that peer breaks. Errors: FailedPrecondition if not running;
  /// InvalidArgument for an empty address; Unavailable/Internal from ucp_ep_create.
  Result<Endpoint> Connect(std::span<const std::byte> remote_address, ErrorCallback on_error = {},
                           int peer_pid = 0);

  /// Declares a connected endpoint failed (e.g. its control-plane connection broke): on_error
  /// runs with `reason` (which should be Unavailable), the endpoint is force-closed, and every
  /// operation pending on it completes with `reason`. No-op if it already failed or is unknown.
  void Fail(const Endpoint& ep, Status reason);

  /// Flushes and closes a connected endpoint; its rkeys are released. Operations pending on it
  /// complete (OK if they flushed, else Unavailable). `done` (may be empty) runs when closed.
  void Close(const Endpoint& ep, DoneCallback done = {});

  /// Sends an active message. `header` is copied at once. `data` must stay valid and unchanged
  /// until `done` runs; `keep_alive` (may be null) is held until then, so passing the owner of
  /// `data` there is enough. Errors via done: Unavailable (peer failed / closed), Cancelled
  /// (stopped), InvalidArgument (bad endpoint/options), FailedPrecondition (not running, or a
  /// reply endpoint used off the progress thread).
  void SendAm(const Endpoint& ep, uint16_t id, std::span<const std::byte> header,
              std::span<const std::byte> data, std::shared_ptr<const void> keep_alive,
              DoneCallback done, const SendOptions& options = {});

  /// RMA get: reads local.size() bytes at `remote_address` of the peer into `local`, using the
  /// packed `rkey` from the peer's MemoryRegion (unpacked once per endpoint and cached until the
  /// endpoint closes). `local` must stay valid until `done`; `keep_alive` is held until then;
  /// `local_region` (may be null) is `local`'s registration. Errors via done as for SendAm,
  /// plus InvalidArgument for an rkey UCX cannot unpack, one whose packed layout is malformed,
  /// and one naming a posix segment that is gone (freed, or its owner exited: probed with UCT
  /// before UCP unpacks it, because UCX 1.13 crashes on that failure; a segment freed in the
  /// microseconds between the probe and the unpack is not covered). Connected endpoints only.
  void Get(const Endpoint& ep, std::span<std::byte> local, uint64_t remote_address,
           std::span<const std::byte> rkey, std::shared_ptr<const void> keep_alive,
           DoneCallback done, const MemoryRegion* local_region = nullptr);

  /// Runs `task` on the progress thread (inline if already there). Returns false (and drops the
  /// task) if the worker is not running.
  bool Post(std::function<void()> task);

  /// True on this worker's progress thread.
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  Context& context() { return context_; }
  ucp_worker_h raw() const { return worker_.get(); }

  /// Counters for tests and metrics (approximate; any thread).
  struct Stats {
    uint64_t ops_started = 0;
    uint64_t ops_completed = 0;
    uint64_t ops_failed = 0;
    uint64_t wakeups = 0;  // times the progress thread slept on epoll and woke
  };
  Stats GetStats() const;

 private:
  struct EpState;
  struct Op;
  enum class State { kCreated, kRunning, kStopping, kStopped };
  using Clock = std::chrono::steady_clock;

  Worker(Context& context, WorkerOptions options);
  Status Init();
  void Loop();
  void RunQueued();
  bool QueueEmpty();
  void SleepOnEvents();
  void Wake();
  void ShutdownOnThread();

  // Progress thread only:
  Result<Endpoint> ConnectNow(std::vector<std::byte> address, ErrorCallback on_error, int peer_pid);
  // `declared`: by the owner (Fail), who knows why and logs it: logged at INFO; otherwise (UCX
  // or the peer-liveness check found it) at WARNING.
  void MarkFailed(uint64_t id, Status reason, bool declared = false);
  void CheckPeers();
  void CloseNow(uint64_t id, DoneCallback done);
  void SendAmNow(const Endpoint& ep, std::unique_ptr<Op> op, uint16_t id,
                 std::span<const std::byte> data, const SendOptions& options);
  void GetNow(const Endpoint& ep, std::unique_ptr<Op> op, std::span<std::byte> local,
              uint64_t remote_address, std::vector<std::byte> rkey,
              const MemoryRegion* local_region);
  Result<ucp_ep_h> ResolveEp(const Endpoint& ep);
  void Finish(std::unique_ptr<Op> op, Status status);
  void Track(ucs_status_ptr_t request, std::unique_ptr<Op> op, std::string_view what);
  void Abandon(Op* op, const Status& status);
  void RequestClose(EpState& state, bool force, bool flushed);
  void ProcessCloses();
  void IssueClose(EpState& state, bool force);
  void OnClosed(EpState& state);
  static void FlushCallback(void* request, ucs_status_t status, void* user_data);
  static void CloseCallback(void* request, ucs_status_t status, void* user_data);

  static void SendCallback(void* request, ucs_status_t status, void* user_data);
  static void RecvCallback(void* request, ucs_status_t status, size_t length, void* user_data);
  static void EpErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t AmCallback(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);

  friend class AmMessage;

  Context& context_;
  WorkerOptions options_;
  WorkerPtr worker_;
  std::vector<std::byte> address_;
  ScopedFd epoll_fd_;
  ScopedFd event_fd_;
  int worker_fd_ = -1;

  std::atomic<State> state_{State::kCreated};
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  Mutex queue_mu_;
  std::vector<std::function<void()>> queue_ GUARDED_BY(queue_mu_);
  bool sleeping_ GUARDED_BY(queue_mu_) = false;
  bool wake_pending_ GUARDED_BY(queue_mu_) = false;
  std::atomic<bool> queued_{false};  // queue_ is non-empty (a hint read without queue_mu_)

  // Progress thread only (handlers: written before Start, read-only after).
  struct HandlerSlot {
    Worker* worker;
    uint16_t id;
    AmHandler handler;
  };
  std::vector<std::unique_ptr<HandlerSlot>> handlers_;
  std::unordered_map<uint64_t, std::unique_ptr<EpState>> eps_;
  uint64_t next_ep_id_ = 1;
  // Close steps run after ucp_worker_progress returns: destroying an endpoint from inside a UCX
  // callback would free transport state that the progress call is still using.
  struct CloseStep {
    uint64_t id;
    bool force;    // UCP_EP_CLOSE_FLAG_FORCE (failed endpoints)
    bool flushed;  // the flush is done: close now
  };
  std::vector<CloseStep> close_steps_;
  std::unordered_set<Op*> inflight_;  // operations UCX holds a request for
  // Completed by this layer (endpoint failed without UCX purging it, or shutdown) while UCX still
  // holds the request: freed when UCX calls back, or after the ucp_worker is destroyed.
  std::unordered_map<Op*, std::unique_ptr<Op>> abandoned_;

  Clock::time_point next_peer_check_{};
  std::atomic<bool> any_peer_pid_{false};

  std::atomic<uint64_t> ops_started_{0};
  std::atomic<uint64_t> ops_completed_{0};
  std::atomic<uint64_t> ops_failed_{0};
  std::atomic<uint64_t> wakeups_{0};
};

}  // namespace zps::ucx
