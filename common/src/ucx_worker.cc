// ucx::Worker: one ucp_worker driven by one progress thread. See zps/common/ucx.h.
//
// Every UCX call for a worker happens on its progress thread (UCS_THREAD_MODE_SINGLE), except
// ucp_worker_create/destroy and ucp_worker_set_am_recv_handler, which run before the thread
// starts or after it has been joined. Other threads talk to the progress thread only through the
// submission queue.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>

#include "zps/common/logging.h"
#include "zps/common/ucx.h"

namespace zps::ucx {

// One operation UCX may hold a request for. Owned by a unique_ptr while the progress thread
// handles it; owned by UCX (user_data) while a request is outstanding.
struct Worker::Op {
  Worker* worker = nullptr;
  DoneCallback done;
  std::shared_ptr<const void> keep_alive;
  std::vector<std::byte> header;  // ucp_am_send_nbx needs the header until completion
  uint64_t ep_id = 0;             // connected endpoint, so a failure reports its reason
  void* request = nullptr;
  bool abandoned = false;
};

struct Worker::EpState {
  Worker* worker = nullptr;
  uint64_t id = 0;
  ucp_ep_h ep = nullptr;  // nullptr once closed
  ErrorCallback on_error;
  bool peer_mode = false;  // UCP_ERR_HANDLING_MODE_PEER
  int peer_pid = 0;
  bool failed = false;
  Status error;
  bool closing = false;
  bool flush_pending = false;  // a ucp_ep_flush_nbx request holds a pointer to this state
  bool close_issued = false;   // ucp_ep_close_nbx was called (at most once per endpoint)
  bool erase_when_closed = false;
  std::vector<DoneCallback> close_waiters;
  std::unordered_map<std::string, RkeyPtr> rkeys;  // packed bytes → unpacked rkey
};

namespace {
using Clock = std::chrono::steady_clock;

/// False once `pid` is gone or a zombie (a killed child that is not reaped yet).
bool ProcessAlive(int pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return false;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* paren = std::strrchr(buf, ')');
  if (paren == nullptr || paren[1] == 0) return true;
  char state = paren[2];
  return state != 'Z' && state != 'X';
}

Status NotRunning() { return Cancelled("ucx worker is not running"); }

// ucp_ep_rkey_unpack takes no length and trusts the buffer: a peer's garbage or truncated rkey
// makes it read past the bytes it was given, and one with an out-of-range memory type or a
// transport key cut short makes UCX 1.13 abort the process (posix: "Assertion `length > 0'
// failed", found by tests/integration/server/bad_input_test.cc). So check the packed layout
// first (ucp_rkey.c: u64 md_map, u8 memory type, then per md bit a u8 size and that many bytes,
// then optional system-device bytes). This rejects malformed keys; a
// well-formed key with forged transport fields is still the trust limit in docs/protocol.md.
Status CheckPackedRkey(std::span<const std::byte> rkey) {
  constexpr size_t kHead = sizeof(uint64_t) + 1;
  if (rkey.size() < kHead) {
    return InvalidArgument("ucx: malformed rkey: " + std::to_string(rkey.size()) + " bytes");
  }
  uint64_t md_map;
  std::memcpy(&md_map, rkey.data(), sizeof(md_map));
  const auto mem_type = static_cast<uint8_t>(rkey[sizeof(md_map)]);
  if (mem_type >= UCS_MEMORY_TYPE_LAST) {
    return InvalidArgument("ucx: malformed rkey: memory type " + std::to_string(mem_type));
  }
  size_t pos = kHead;
  for (; md_map != 0; md_map &= md_map - 1) {
    if (pos >= rkey.size()) return InvalidArgument("ucx: malformed rkey: truncated md list");
    const size_t n = static_cast<uint8_t>(rkey[pos]);
    pos += 1 + n;
    if (pos > rkey.size()) return InvalidArgument("ucx: malformed rkey: truncated md key");
  }
  // Bytes after the md keys (system device and distances) are not checked: their layout
  // differs between UCX versions, and a short tail cannot make the walk above overrun.
  return Status::Ok();
}

// UCX 1.13's ucp_ep_rkey_unpack crashes the process when a transport key fails to unpack: its
// error path (ucp_rkey_destroy) releases the failed entry too, and uct_posix_rkey_release
// dereferences the handle the failed unpack never set (SIGSEGV at address 0x8). A posix key
// fails to unpack when its segment is gone: the owner freed the region, or exited (the key names
// /proc/<pid>/fd/<fd>, which vanishes with the owner). So before UCP sees a key, each posix
// entry in it is unpacked once directly with UCT, whose own failure is a plain status, and
// released again. A key that fails is refused; the race that remains is the owner freeing the
// segment, or dying, between this probe and ucp_ep_rkey_unpack (microseconds, once per key per
// endpoint: unpacked keys are cached).
struct PosixProbe {
  uct_component_h component = nullptr;  // nullptr: no posix component, nothing to probe
  size_t key_size = 0;                  // the posix md's packed rkey size
};

// The posix UCT component and its packed rkey size, looked up once per process (UCT components
// are process-wide). Thread-safe (static initialisation).
const PosixProbe& Posix() {
  static const PosixProbe probe = [] {
    PosixProbe p;
    uct_component_h* components = nullptr;
    unsigned count = 0;
    if (uct_query_components(&components, &count) != UCS_OK) return p;
    for (unsigned i = 0; i < count && p.component == nullptr; ++i) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
      if (uct_component_query(components[i], &attr) != UCS_OK) continue;
      if (std::strcmp(attr.name, "posix") != 0) continue;
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[i], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t st = uct_md_open(components[i], "posix", config, &md);
      uct_config_release(config);
      if (st != UCS_OK) continue;
      uct_md_attr_t md_attr{};
      if (uct_md_query(md, &md_attr) == UCS_OK && md_attr.rkey_packed_size > 0) {
        p.component = components[i];
        p.key_size = md_attr.rkey_packed_size;
      }
      uct_md_close(md);
    }
    uct_release_component_list(components);
    if (p.component == nullptr) ZPS_LOG(WARNING) << "ucx: no posix component; rkeys are not probed";
    return p;
  }();
  return probe;
}

// Whether the context's transports may include posix shared memory (UCX's default when none
// are named).
bool MayUsePosix(const std::string& transports) {
  if (transports.empty()) return true;
  std::string_view rest = transports;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view tl = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (tl == "posix" || tl == "shm" || tl == "sm" || tl == "mm" || tl == "all") return true;
  }
  return false;
}

// Unpacks and releases, with UCT, every entry of a layout-checked packed rkey that has the posix
// key size (an entry of another md with that size fails the probe and the key is refused; in
// UCX 1.13 only posix packs 24 bytes). An entry whose segment length is 0 is refused first:
// uct_posix_rkey_unpack asserts on it.
Status ProbePosixEntries(std::span<const std::byte> rkey) {
  const PosixProbe& posix = Posix();
  if (posix.component == nullptr) return Status::Ok();
  uint64_t md_map;
  std::memcpy(&md_map, rkey.data(), sizeof(md_map));
  size_t pos = sizeof(uint64_t) + 1;
  for (; md_map != 0; md_map &= md_map - 1) {
    const size_t n = static_cast<uint8_t>(rkey[pos]);
    const std::byte* entry = rkey.data() + pos + 1;
    pos += 1 + n;
    if (n != posix.key_size) continue;
    if (n >= 3 * sizeof(uint64_t)) {  // seg_id, address, length in UCX 1.13
      uint64_t length;
      std::memcpy(&length, entry + 2 * sizeof(uint64_t), sizeof(length));
      if (length == 0) return InvalidArgument("ucx: malformed rkey: posix segment of 0 bytes");
    }
    uct_rkey_bundle_t bundle{};
    ucs_status_t st = uct_rkey_unpack(posix.component, entry, &bundle);
    if (st != UCS_OK) {
      return InvalidArgument(
          std::string("ucx: rkey names a shared-memory segment that cannot be attached (freed, "
                      "or its owner exited): ") +
          ucs_status_string(st));
    }
    (void)uct_rkey_release(posix.component, &bundle);
  }
  return Status::Ok();
}
}  // namespace

Worker::Worker(Context& context, WorkerOptions options)
    : context_(context), options_(std::move(options)) {}

Result<std::unique_ptr<Worker>> Worker::Create(Context& context, WorkerOptions options) {
  std::unique_ptr<Worker> worker(new Worker(context, std::move(options)));
  ZPS_RETURN_IF_ERROR(worker->Init());
  return worker;
}

Status Worker::Init() {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h raw = nullptr;
  ucs_status_t st = ucp_worker_create(context_.raw(), &params, &raw);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
  worker_.reset(raw);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(raw, &addr, &addr_len);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
  WorkerAddressPtr addr_owner(addr, WorkerAddressDeleter{raw});
  const auto* bytes = reinterpret_cast<const std::byte*>(addr);
  address_.assign(bytes, bytes + addr_len);

  st = ucp_worker_get_efd(raw, &worker_fd_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd");
  epoll_fd_ = ScopedFd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return ErrnoError("epoll_create1", errno);
  event_fd_ = ScopedFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event_fd_.valid()) return ErrnoError("eventfd", errno);
  for (int fd : {worker_fd_, event_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return ErrnoError("epoll_ctl", errno);
  }
  return Status::Ok();
}

Worker::~Worker() {
  Stop();
  if (!abandoned_.empty()) {
    // UCX still holds requests of ours (a rendezvous waiting on a peer that never answered and
    // that no close could purge): UCX 1.13 asserts, and aborts the process, when it destroys
    // an endpoint that still has such requests. The worker is left undestroyed instead; nothing
    // progresses it any more, so none of its callbacks can run. Only a stop with a stalled
    // peer gets here.
    ZPS_LOG(WARNING) << "ucx: " << abandoned_.size()
                     << " request(s) still held by UCX at stop; leaving the UCX worker undestroyed";
    (void)worker_.release();
    context_.LeakOnDestruction();  // its cleanup would assert on the regions still in use
  }
  // Requests that UCX still holds may call back while the worker is destroyed: their Op and
  // EpState objects stay alive until after ucp_worker_destroy.
  worker_.reset();
  eps_.clear();
  abandoned_.clear();
  handlers_.clear();
  epoll_fd_ = ScopedFd();
  event_fd_ = ScopedFd();
}

Status Worker::SetAmHandler(uint16_t id, AmHandler handler) {
  if (state_.load() != State::kCreated) {
    return FailedPrecondition("ucx: SetAmHandler must be called before Start");
  }
  auto slot = std::make_unique<HandlerSlot>(HandlerSlot{this, id, std::move(handler)});
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = &Worker::AmCallback;
  p.arg = slot.get();
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t st = ucp_worker_set_am_recv_handler(worker_.get(), &p);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
  handlers_.push_back(std::move(slot));
  return Status::Ok();
}

Status Worker::Start() {
  State expected = State::kCreated;
  if (!state_.compare_exchange_strong(expected, State::kRunning)) {
    return FailedPrecondition("ucx: worker already started or stopped");
  }
  thread_ = std::thread([this] { Loop(); });
  thread_id_.store(thread_.get_id());
  return Status::Ok();
}

void Worker::Stop() {
  if (OnProgressThread()) {
    ZPS_LOG(ERROR) << "ucx: Worker::Stop called on its own progress thread; ignored";
    return;
  }
  {
    MutexLock lock(&queue_mu_);
    State s = state_.load();
    if (s == State::kCreated) {
      state_.store(State::kStopped);
      return;
    }
    if (s == State::kRunning) state_.store(State::kStopping);
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  state_.store(State::kStopped);
}

Worker::Stats Worker::GetStats() const {
  return Stats{ops_started_.load(), ops_completed_.load(), ops_failed_.load(), wakeups_.load()};
}

// ---------------------------------------------------------------------------------------------
// Progress loop

void Worker::Loop() {
  thread_id_.store(std::this_thread::get_id());
  log::SetThreadName(options_.thread_name);
  auto last_activity = Clock::now();
  while (true) {
    RunQueued();
    if (state_.load() != State::kRunning) break;
    unsigned events = 0;
    // Progress until idle, but let newly queued submissions go out between progress calls: a
    // long transfer (a multi-MiB get is many fragments) must not hold back the next request.
    while (ucp_worker_progress(worker_.get()) != 0) {
      ++events;
      if (queued_.load(std::memory_order_relaxed)) break;
    }
    if (any_peer_pid_.load(std::memory_order_relaxed)) CheckPeers();
    if (!close_steps_.empty()) ProcessCloses();
    auto now = Clock::now();
    if (events > 0) {
      last_activity = now;
      continue;
    }
    if (!QueueEmpty()) continue;
    if (now - last_activity < options_.spin) {
      // Polling, but give the core to any other runnable thread first: on a machine with
      // fewer cores than busy threads (the shard's and worker's progress threads, the thread
      // copying the data) a plain spin steals the time the copy needs.
      std::this_thread::yield();
      continue;
    }
    SleepOnEvents();
    last_activity = Clock::now();
  }
  ShutdownOnThread();
}

void Worker::RunQueued() {
  std::vector<std::function<void()>> tasks;
  {
    MutexLock lock(&queue_mu_);
    tasks.swap(queue_);
    queued_.store(false, std::memory_order_relaxed);
  }
  for (auto& task : tasks) task();
}

bool Worker::QueueEmpty() {
  MutexLock lock(&queue_mu_);
  return queue_.empty();
}

void Worker::SleepOnEvents() {
  ucs_status_t st = ucp_worker_arm(worker_.get());
  if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  if (st != UCS_OK) {
    ZPS_LOG(WARNING) << FromUcs(st, "ucp_worker_arm").ToString() << "; polling";
    return;
  }
  {
    MutexLock lock(&queue_mu_);
    if (!queue_.empty() || state_.load() != State::kRunning) return;
    sleeping_ = true;
  }
  epoll_event events[2];
  // The timeout is a safety net only; every wake-up source is in the epoll set.
  int timeout_ms = 1000;
  if (any_peer_pid_.load(std::memory_order_relaxed)) {
    timeout_ms = static_cast<int>(std::max<int64_t>(1, options_.peer_check_interval.count()));
  }
  int n = epoll_wait(epoll_fd_.get(), events, 2, timeout_ms);
  if (n < 0 && errno != EINTR) {
    ZPS_LOG(WARNING) << ErrnoError("epoll_wait", errno).ToString();
  }
  {
    MutexLock lock(&queue_mu_);
    sleeping_ = false;
    wake_pending_ = false;
  }
  uint64_t value = 0;
  while (read(event_fd_.get(), &value, sizeof(value)) > 0) {
  }
  wakeups_.fetch_add(1, std::memory_order_relaxed);
}

void Worker::Wake() {
  uint64_t one = 1;
  ssize_t n = write(event_fd_.get(), &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the loop wakes anyway
}

bool Worker::Post(std::function<void()> task) {
  if (OnProgressThread()) {
    task();
    return true;
  }
  bool wake = false;
  {
    MutexLock lock(&queue_mu_);
    if (state_.load() != State::kRunning) return false;
    queue_.push_back(std::move(task));
    queued_.store(true, std::memory_order_relaxed);
    if (sleeping_ && !wake_pending_) wake = wake_pending_ = true;
  }
  if (wake) Wake();
  return true;
}

void Worker::ShutdownOnThread() {
  RunQueued();  // state is kStopping: nothing can be queued after this
  std::vector<uint64_t> ids;
  for (auto& [id, state] : eps_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = eps_.find(id);
    if (it == eps_.end()) continue;
    EpState& state = *it->second;
    if (state.ep != nullptr && !state.closing) RequestClose(state, state.failed, false);
  }
  auto any_open = [this] {
    for (auto& [id, state] : eps_) {
      if (state->ep != nullptr) return true;
    }
    return false;
  };
  auto deadline = Clock::now() + options_.close_timeout;
  while (any_open() && Clock::now() < deadline) {
    if (!close_steps_.empty()) ProcessCloses();
    ucp_worker_progress(worker_.get());
  }
  // A peer that does not answer (stalled, or gone without an error yet) keeps a graceful close
  // waiting on its flush: force-close what is left, so that no endpoint (nor any of its
  // requests) is alive at ucp_worker_destroy, where UCX 1.13 asserts on them.
  ids.clear();
  for (auto& [id, state] : eps_) {
    if (state->ep != nullptr && !state->close_issued) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    auto it = eps_.find(id);  // an earlier force close's completions may have erased it
    if (it != eps_.end() && it->second->ep != nullptr) IssueClose(*it->second, true);
  }
  deadline = Clock::now() + std::chrono::milliseconds(200);
  while (any_open() && Clock::now() < deadline) ucp_worker_progress(worker_.get());
  // Cancel what is still in flight and give UCX a moment to complete it.
  for (Op* op : std::vector<Op*>(inflight_.begin(), inflight_.end())) {
    ucp_request_cancel(worker_.get(), op->request);
  }
  deadline = Clock::now() + std::chrono::milliseconds(200);
  while (!inflight_.empty() && Clock::now() < deadline) ucp_worker_progress(worker_.get());
  for (Op* op : std::vector<Op*>(inflight_.begin(), inflight_.end())) {
    Abandon(op, Cancelled("ucx worker stopped"));
  }
  for (auto& [id, state] : eps_) {
    state->rkeys.clear();  // before ucp_worker_destroy, which destroys leftover endpoints
    if (state->ep != nullptr) {
      ZPS_LOG(WARNING) << "ucx: endpoint " << id << " did not close within the timeout";
      auto waiters = std::move(state->close_waiters);
      for (auto& w : waiters) w(Cancelled("ucx worker stopped"));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Completion

void Worker::Finish(std::unique_ptr<Op> op, Status status) {
  if (status.ok()) {
    ops_completed_.fetch_add(1, std::memory_order_relaxed);
  } else {
    ops_failed_.fetch_add(1, std::memory_order_relaxed);
  }
  DoneCallback done = std::move(op->done);
  op.reset();  // release keep_alive before the callback, so `done` may reuse the buffer
  if (done) done(std::move(status));
}

void Worker::Abandon(Op* op, const Status& status) {
  inflight_.erase(op);
  op->abandoned = true;
  std::unique_ptr<Op> owned(op);
  ops_failed_.fetch_add(1, std::memory_order_relaxed);
  DoneCallback done = std::move(owned->done);
  owned->done = nullptr;
  abandoned_.emplace(op, std::move(owned));  // keep_alive stays held until UCX lets go
  if (done) done(status);
}

void Worker::Track(ucs_status_ptr_t request, std::unique_ptr<Op> op, std::string_view what) {
  if (request == nullptr) {
    Finish(std::move(op), Status::Ok());
  } else if (UCS_PTR_IS_ERR(request)) {
    Finish(std::move(op), FromUcs(UCS_PTR_STATUS(request), what));
  } else {
    op->request = request;
    inflight_.insert(op.get());
    op.release();  // owned by the request until its callback
  }
}

void Worker::SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  Worker* self = op->worker;
  if (op->abandoned) {  // already completed by Abandon()
    self->abandoned_.erase(op);
    return;
  }
  self->inflight_.erase(op);
  Status result = FromUcs(status, "ucx operation");
  if (!result.ok() && op->ep_id != 0) {
    // Report why the endpoint failed rather than UCX's purge status (often "canceled").
    auto it = self->eps_.find(op->ep_id);
    if (it != self->eps_.end() && it->second->failed) result = it->second->error;
  }
  self->Finish(std::unique_ptr<Op>(op), std::move(result));
}

void Worker::RecvCallback(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  SendCallback(request, status, user_data);
}

// ---------------------------------------------------------------------------------------------
// Endpoints

Result<Endpoint> Worker::Connect(std::span<const std::byte> remote_address, ErrorCallback on_error,
                                 int peer_pid) {
  if (remote_address.empty()) return InvalidArgument("ucx: empty worker address");
  std::vector<std::byte> address(remote_address.begin(), remote_address.end());
  if (OnProgressThread()) return ConnectNow(std::move(address), std::move(on_error), peer_pid);
  auto promise = std::make_shared<std::promise<Result<Endpoint>>>();
  auto future = promise->get_future();
  bool posted = Post([this, promise, address = std::move(address), on_error = std::move(on_error),
                      peer_pid]() mutable {
    promise->set_value(ConnectNow(std::move(address), std::move(on_error), peer_pid));
  });
  if (!posted) return FailedPrecondition("ucx: Connect on a worker that is not running");
  return future.get();
}

Result<Endpoint> Worker::ConnectNow(std::vector<std::byte> address, ErrorCallback on_error,
                                    int peer_pid) {
  if (state_.load() != State::kRunning) return FailedPrecondition("ucx: worker is stopping");
  auto state = std::make_unique<EpState>();
  state->worker = this;
  state->id = next_ep_id_++;
  state->on_error = std::move(on_error);
  state->peer_pid = peer_pid;
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &Worker::EpErrorCallback;
  p.err_handler.arg = state.get();
  ucp_ep_h ep = nullptr;
  ucs_status_t st = UCS_ERR_UNREACHABLE;
  if (context_.peer_failure_capable()) st = ucp_ep_create(worker_.get(), &p, &ep);
  state->peer_mode = st == UCS_OK;
  if (st == UCS_ERR_UNREACHABLE) {
    // UCX 1.13 shared-memory transports lack peer-failure support; see Connect().
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_.get(), &p, &ep);
    if (st == UCS_OK) {
      ZPS_LOG(DEBUG) << "ucx: endpoint " << state->id
                     << " without UCX peer-failure handling (transport lacks it); peer pid "
                     << peer_pid;
    }
  }
  if (st != UCS_OK) {
    Status s = FromUcs(st, "ucp_ep_create");
    ZPS_LOG(WARNING) << s.ToString();
    return s;
  }
  state->ep = ep;
  if (peer_pid > 0) any_peer_pid_.store(true, std::memory_order_relaxed);
  Endpoint handle;
  handle.id_ = state->id;
  handle.peer_mode_ = state->peer_mode;
  eps_.emplace(state->id, std::move(state));
  return handle;
}

void Worker::EpErrorCallback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* state = static_cast<EpState*>(arg);
  state->worker->MarkFailed(state->id, Unavailable("ucx endpoint " + std::to_string(state->id) +
                                                   " failed: " + ucs_status_string(status)));
}

void Worker::MarkFailed(uint64_t id, Status reason, bool declared) {
  auto it = eps_.find(id);
  if (it == eps_.end() || it->second->failed) return;
  EpState& state = *it->second;
  state.failed = true;
  state.error = std::move(reason);
  if (declared) {
    ZPS_LOG(INFO) << "ucx endpoint " << id << " closed by its owner: " << state.error.ToString();
  } else {
    ZPS_LOG(WARNING) << state.error.ToString();
  }
  Endpoint handle;
  handle.id_ = id;
  if (state.on_error) state.on_error(handle, state.error);
  // A failed endpoint must be closed in force mode (which completes what is pending). That
  // includes one whose graceful close still waits for its flush: a dead peer without UCX
  // error handling would never complete the flush.
  if (state.ep != nullptr && !state.close_issued) RequestClose(state, true, false);
}

void Worker::Fail(const Endpoint& ep, Status reason) {
  if (!ep.valid() || ep.is_reply()) return;
  if (reason.ok()) reason = Unavailable("ucx endpoint failed");
  uint64_t id = ep.id();
  auto* owned = new Status(std::move(reason));
  bool posted = Post([this, id, owned] {
    std::unique_ptr<Status> r(owned);
    MarkFailed(id, std::move(*r), /*declared=*/true);
  });
  if (!posted) delete owned;
}

void Worker::CheckPeers() {
  auto now = Clock::now();
  if (now < next_peer_check_) return;
  next_peer_check_ = now + options_.peer_check_interval;
  std::vector<uint64_t> dead;
  for (auto& [id, state] : eps_) {
    if (state->peer_pid > 0 && !state->failed && !ProcessAlive(state->peer_pid)) {
      dead.push_back(id);
    }
  }
  for (uint64_t id : dead) {
    MarkFailed(id, Unavailable("ucx endpoint " + std::to_string(id) + ": peer process " +
                               std::to_string(eps_.at(id)->peer_pid) + " is gone"));
  }
}

void Worker::RequestClose(EpState& state, bool force, bool flushed) {
  state.closing = true;
  close_steps_.push_back(CloseStep{state.id, force, flushed});
}

void Worker::ProcessCloses() {
  std::vector<CloseStep> steps;
  steps.swap(close_steps_);
  for (const CloseStep& step : steps) {
    auto it = eps_.find(step.id);
    if (it == eps_.end() || it->second->ep == nullptr) continue;
    EpState& state = *it->second;
    if (step.force || step.flushed) {
      IssueClose(state, step.force || state.failed);
      continue;
    }
    // Flush first so outstanding gets finish with their rkeys alive; then release the rkeys
    // and close (rkeys must be destroyed before their endpoint).
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Worker::FlushCallback;
    p.user_data = &state;
    ucs_status_ptr_t req = ucp_ep_flush_nbx(state.ep, &p);
    if (req == nullptr) {
      IssueClose(state, state.failed);
    } else if (UCS_PTR_IS_ERR(req)) {
      IssueClose(state, true);
    } else {
      state.flush_pending = true;
    }
  }
}

void Worker::Close(const Endpoint& ep, DoneCallback done) {
  if (!ep.valid() || ep.is_reply()) {
    if (done) done(InvalidArgument("ucx: Close needs a connected endpoint"));
    return;
  }
  uint64_t id = ep.id();
  auto* done_raw = new DoneCallback(std::move(done));
  bool posted = Post([this, id, done_raw] {
    std::unique_ptr<DoneCallback> owned(done_raw);
    CloseNow(id, std::move(*owned));
  });
  if (!posted) {
    std::unique_ptr<DoneCallback> owned(done_raw);
    if (*owned) (*owned)(NotRunning());
  }
}

void Worker::CloseNow(uint64_t id, DoneCallback done) {
  auto it = eps_.find(id);
  if (it == eps_.end()) {
    if (done) done(NotFound("ucx: endpoint " + std::to_string(id) + " is unknown or closed"));
    return;
  }
  EpState& state = *it->second;
  state.erase_when_closed = true;
  if (done) state.close_waiters.push_back(std::move(done));
  if (state.ep == nullptr) {
    OnClosed(state);
  } else if (!state.closing) {
    RequestClose(state, state.failed, false);
  }
}

void Worker::FlushCallback(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  auto* state = static_cast<EpState*>(user_data);
  state->flush_pending = false;
  Worker* self = state->worker;
  if (state->ep == nullptr) {  // force-closed meanwhile; OnClosed left the erase to us
    if (state->erase_when_closed) self->eps_.erase(state->id);
    return;
  }
  self->close_steps_.push_back(CloseStep{state->id, status != UCS_OK || state->failed, true});
}

void Worker::IssueClose(EpState& state, bool force) {
  if (state.close_issued) return;
  state.close_issued = true;
  state.rkeys.clear();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &Worker::CloseCallback;
  p.user_data = &state;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucp_ep_h ep = state.ep;
  uint64_t id = state.id;
  Status reason = state.failed ? state.error : Unavailable("ucx endpoint closed");
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &p);
  if (force) {
    // With UCP_ERR_HANDLING_MODE_PEER the force close purged this endpoint's requests. Without
    // it (shared memory in UCX 1.13) requests waiting on the peer, such as a rendezvous send,
    // are never completed by UCX: complete them here.
    for (Op* op : std::vector<Op*>(inflight_.begin(), inflight_.end())) {
      if (op->ep_id == id) Abandon(op, reason);
    }
  }
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    auto it = eps_.find(id);  // completions above may have closed and erased it
    if (it != eps_.end() && it->second->ep == ep) OnClosed(*it->second);
  }
}

void Worker::CloseCallback(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  auto* state = static_cast<EpState*>(user_data);
  state->worker->OnClosed(*state);
}

void Worker::OnClosed(EpState& state) {
  state.ep = nullptr;
  state.closing = false;
  if (!state.failed) {
    state.failed = true;  // later operations fail fast
    state.error = Unavailable("ucx endpoint " + std::to_string(state.id) + " is closed");
  }
  auto waiters = std::move(state.close_waiters);
  state.close_waiters.clear();
  uint64_t id = state.id;
  // `state` is gone after this line, unless a flush request still points at it.
  if (state.erase_when_closed && !state.flush_pending) eps_.erase(id);
  for (auto& w : waiters) w(Status::Ok());
}

Result<ucp_ep_h> Worker::ResolveEp(const Endpoint& ep) {
  if (ep.is_reply()) {
    if (!OnProgressThread()) {
      return FailedPrecondition("ucx: a reply endpoint is usable only on the progress thread");
    }
    return ep.reply_;
  }
  auto it = eps_.find(ep.id());
  if (it == eps_.end()) {
    return Unavailable("ucx endpoint " + std::to_string(ep.id()) + " is closed or unknown");
  }
  EpState& state = *it->second;
  if (state.failed) return state.error;
  if (state.closing || state.ep == nullptr) {
    return Unavailable("ucx endpoint " + std::to_string(ep.id()) + " is closing");
  }
  return state.ep;
}

// ---------------------------------------------------------------------------------------------
// Active messages

void Worker::SendAm(const Endpoint& ep, uint16_t id, std::span<const std::byte> header,
                    std::span<const std::byte> data, std::shared_ptr<const void> keep_alive,
                    DoneCallback done, const SendOptions& options) {
  auto op = std::make_unique<Op>();
  op->worker = this;
  op->done = std::move(done);
  op->keep_alive = std::move(keep_alive);
  op->header.assign(header.begin(), header.end());
  if (!ep.valid() || (options.force_eager && options.force_rendezvous)) {
    Finish(std::move(op), InvalidArgument("ucx: SendAm with an invalid endpoint or options"));
    return;
  }
  if (OnProgressThread()) {
    SendAmNow(ep, std::move(op), id, data, options);
    return;
  }
  if (ep.is_reply()) {
    Finish(std::move(op), FailedPrecondition("ucx: reply endpoint used off the progress thread"));
    return;
  }
  Op* raw = op.release();
  bool posted = Post([this, ep, raw, id, data, options] {
    SendAmNow(ep, std::unique_ptr<Op>(raw), id, data, options);
  });
  if (!posted) Finish(std::unique_ptr<Op>(raw), NotRunning());
}

void Worker::SendAmNow(const Endpoint& ep, std::unique_ptr<Op> op, uint16_t id,
                       std::span<const std::byte> data, const SendOptions& options) {
  auto resolved = ResolveEp(ep);
  if (!resolved.ok()) {
    Finish(std::move(op), resolved.status());
    return;
  }
  op->ep_id = ep.id();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &Worker::SendCallback;
  p.user_data = op.get();
  p.flags = 0;
  if (options.reply) p.flags |= UCP_AM_SEND_FLAG_REPLY;
  if (options.force_rendezvous) p.flags |= UCP_AM_SEND_FLAG_RNDV;
  if (options.force_eager) p.flags |= UCP_AM_SEND_FLAG_EAGER;
  if (options.region != nullptr && options.region->Contains(data.data(), data.size())) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = options.region->raw();
  }
  ops_started_.fetch_add(1, std::memory_order_relaxed);
  Op* raw = op.get();
  ucs_status_ptr_t req = ucp_am_send_nbx(*resolved, id, raw->header.data(), raw->header.size(),
                                         data.data(), data.size(), &p);
  Track(req, std::move(op), "ucp_am_send_nbx");
}

ucs_status_t Worker::AmCallback(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* slot = static_cast<HandlerSlot*>(arg);
  AmMessage message;
  message.worker_ = slot->worker;
  message.id_ = slot->id;
  if (header_length > 0) {
    message.header_ = {static_cast<const std::byte*>(header), header_length};
  }
  message.data_ = data;
  message.length_ = length;
  message.rendezvous_ = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 && param->reply_ep != nullptr) {
    message.reply_.reply_ = param->reply_ep;
  }
  slot->handler(message);
  // A started rendezvous receive keeps the descriptor (UCX then owns it); otherwise it is
  // dropped and the sender completes OK.
  return message.rendezvous_ && message.received_ ? UCS_INPROGRESS : UCS_OK;
}

std::span<const std::byte> AmMessage::eager_data() const {
  if (rendezvous_ || length_ == 0) return {};
  return {static_cast<const std::byte*>(data_), length_};
}

Status AmMessage::Receive(std::span<std::byte> dest, DoneCallback done) {
  Status error;
  if (received_) {
    error = FailedPrecondition("ucx: AmMessage::Receive called twice");
  } else if (dest.size() < length_) {
    error = InvalidArgument("ucx: receive buffer of " + std::to_string(dest.size()) +
                            " bytes for a message of " + std::to_string(length_));
  }
  if (!error.ok()) {
    if (done) done(error);
    return error;
  }
  received_ = true;
  if (!rendezvous_) {
    if (length_ > 0) std::memcpy(dest.data(), data_, length_);
    if (done) done(Status::Ok());
    return Status::Ok();
  }
  auto op = std::make_unique<Worker::Op>();
  op->worker = worker_;
  op->done = std::move(done);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &Worker::RecvCallback;
  p.user_data = op.get();
  worker_->ops_started_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_->raw(), data_, dest.data(), length_, &p);
  worker_->Track(req, std::move(op), "ucp_am_recv_data_nbx");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RMA

void Worker::Get(const Endpoint& ep, std::span<std::byte> local, uint64_t remote_address,
                 std::span<const std::byte> rkey, std::shared_ptr<const void> keep_alive,
                 DoneCallback done, const MemoryRegion* local_region) {
  auto op = std::make_unique<Op>();
  op->worker = this;
  op->done = std::move(done);
  op->keep_alive = std::move(keep_alive);
  if (!ep.valid() || ep.is_reply() || rkey.empty()) {
    Finish(std::move(op), InvalidArgument("ucx: Get needs a connected endpoint and an rkey"));
    return;
  }
  std::vector<std::byte> key(rkey.begin(), rkey.end());
  if (OnProgressThread()) {
    GetNow(ep, std::move(op), local, remote_address, std::move(key), local_region);
    return;
  }
  Op* raw = op.release();
  bool posted =
      Post([this, ep, raw, local, remote_address, key = std::move(key), local_region]() mutable {
        GetNow(ep, std::unique_ptr<Op>(raw), local, remote_address, std::move(key), local_region);
      });
  if (!posted) Finish(std::unique_ptr<Op>(raw), NotRunning());
}

void Worker::GetNow(const Endpoint& ep, std::unique_ptr<Op> op, std::span<std::byte> local,
                    uint64_t remote_address, std::vector<std::byte> rkey,
                    const MemoryRegion* local_region) {
  auto resolved = ResolveEp(ep);
  if (!resolved.ok()) {
    Finish(std::move(op), resolved.status());
    return;
  }
  EpState& state = *eps_.at(ep.id());
  std::string key(reinterpret_cast<const char*>(rkey.data()), rkey.size());
  auto it = state.rkeys.find(key);
  if (it == state.rkeys.end()) {
    if (Status bad = CheckPackedRkey(rkey); !bad.ok()) {
      Finish(std::move(op), std::move(bad));
      return;
    }
    if (MayUsePosix(context_.transports())) {
      if (Status gone = ProbePosixEntries(rkey); !gone.ok()) {
        ZPS_LOG(WARNING) << "ucx endpoint " << ep.id() << ": " << gone.message();
        Finish(std::move(op), std::move(gone));
        return;
      }
    }
    ucp_rkey_h unpacked = nullptr;
    ucs_status_t st = ucp_ep_rkey_unpack(*resolved, rkey.data(), &unpacked);
    if (st != UCS_OK) {
      Finish(std::move(op), InvalidArgument(FromUcs(st, "ucp_ep_rkey_unpack").message()));
      return;
    }
    it = state.rkeys.emplace(std::move(key), RkeyPtr(unpacked)).first;
  }
  op->ep_id = ep.id();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Worker::SendCallback;
  p.user_data = op.get();
  if (local_region != nullptr && local_region->Contains(local.data(), local.size())) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = local_region->raw();
  }
  ops_started_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t req =
      ucp_get_nbx(*resolved, local.data(), local.size(), remote_address, it->second.get(), &p);
  Track(req, std::move(op), "ucp_get_nbx");
}

}  // namespace zps::ucx
