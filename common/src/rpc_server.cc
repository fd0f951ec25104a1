// zps::rpc::Server — Asio adapter. Each Connection runs its reads, writes, timer and dispatch on
// its own strand; Responders reach it from any thread through PostSend.
//
// Lifetime: a Connection holds shared_ptr<Server::Impl>, so the io_context outlives every
// Connection (a socket must not outlive its io_context). Outstanding async operations hold the
// Connection; Responders hold only a weak_ptr. Stop() closes everything and lets the io threads
// run out of work, so after the join no handler (and no reference cycle) is left in the queue.
//
// Lock order: Server::Impl::mu_ before Connection::mu_ (never taken the other way round).

// clang-format off
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp needs std::exchange
// clang-format on
#include <array>
#include <atomic>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
// Asio uses std::atomic_thread_fence, which GCC warns about under -fsanitize=thread.
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include <boost/asio.hpp>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "asio_status.h"
#include "rpc_internal.h"
#include "zps/common/frame.h"
#include "zps/common/log_rate_limit.h"
#include "zps/common/logging.h"
#include "zps/common/rpc.h"
#include "zps/common/thread_annotations.h"

namespace zps::rpc {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

/// How long a connection being closed for an error keeps draining input so the peer can read
/// the Error frame (closing with unread input would send a RST that may discard it).
constexpr auto kLinger = std::chrono::milliseconds(500);

struct Responder::State {
  std::weak_ptr<Connection> conn;
  uint16_t type = 0;
  uint64_t id = 0;
  std::atomic<bool> answered{false};
};

struct Server::Impl {
  explicit Impl(ServerOptions o) : opts(std::move(o)), acceptor(io) {}

  void Accept();
  void ProtocolError(std::string_view kind) {
    if (on_protocol_error) on_protocol_error(kind);
  }
  void Remove(Connection* c) {
    MutexLock l(&mu);
    conns.erase(c);
  }

  const ServerOptions opts;
  std::weak_ptr<Impl> self;  // for handing shared ownership to new Connections
  asio::io_context io;
  tcp::acceptor acceptor;  // io threads only (after Start)
  uint16_t port = 0;
  // Set before Start, read-only afterwards.
  std::unordered_map<uint16_t, Handler> handlers;
  HelloHook hello_hook;
  AsyncHelloHook async_hello_hook;
  std::function<void(const Peer&)> on_disconnect;
  std::function<void(std::string_view)> on_protocol_error;
  // At most 10 "closing connection" lines for protocol errors a second (any thread).
  log::LogRateLimit protocol_error_log{10, std::chrono::seconds(1)};

  std::atomic<size_t> nconn{0};
  Mutex mu;
  bool started GUARDED_BY(mu) = false;
  bool stopped GUARDED_BY(mu) = false;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns GUARDED_BY(mu);
  std::vector<std::thread> threads;  // Start/Stop only
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Server::Impl> srv, tcp::socket sock)
      : srv_(std::move(srv)),
        sock_(std::move(sock)),
        strand_(sock_.get_executor()),
        timer_(strand_) {
    error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    remote_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void Start() {
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->ArmTimer(self->srv_->opts.hello_timeout_ms);
      self->ReadHeader();
    });
  }

  /// From any thread: close now (Stop).
  void Close() {
    asio::post(strand_, [self = shared_from_this()] { self->DoClose(); });
  }

  /// From any thread: queue a frame. A no-op once the connection is closed.
  void PostSend(uint16_t type, uint64_t id, std::vector<std::byte> payload) {
    Out out{EncodeFrameHeader(type, id, payload), std::move(payload)};
    MutexLock l(&mu_);
    if (!open_) return;
    asio::post(strand_, [self = shared_from_this(), o = std::move(out)]() mutable {
      self->Enqueue(std::move(o));
    });
  }

 private:
  struct Out {
    std::array<std::byte, kFrameHeaderBytes> hdr;
    std::vector<std::byte> payload;
  };

  // ---- everything below runs on strand_ ----

  void ArmTimer(int ms) {
    if (ms <= 0) {
      timer_.cancel();
      return;
    }
    timer_.expires_after(std::chrono::milliseconds(ms));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec || self->closed_ || self->closing_) return;
      if (self->timer_.expiry() > asio::steady_timer::clock_type::now()) return;  // re-armed
      const bool authed = self->authed_;
      self->Fail(
          "timeout", 0,
          DeadlineExceeded(authed ? "idle timeout: no frame for " +
                                        std::to_string(self->srv_->opts.idle_timeout_ms) + " ms"
                                  : "no hello within " +
                                        std::to_string(self->srv_->opts.hello_timeout_ms) + " ms"));
    });
  }

  void ReadHeader() {
    if (closed_ || closing_) return;
    reading_ = true;
    asio::async_read(
        sock_, asio::buffer(hdr_),
        [self = shared_from_this()](const error_code& ec, size_t n) { self->OnHeader(ec, n); });
  }

  void OnHeader(const error_code& ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (closing_) {
      ContinueDrain(ec);
      return;
    }
    if (ec) {
      if (ec == asio::error::eof && n > 0) {
        Fail(FrameErrorName(FrameError::kTruncated), 0,
             FrameErrorStatus(FrameError::kTruncated, "stream ended inside a frame header"));
      } else {
        DoClose();
      }
      return;
    }
    uint32_t bound = authed_ ? kMaxPayloadBytes : kMaxHelloPayloadBytes;
    auto h = DecodeFrameHeader(hdr_, bound);
    if (!h.ok()) {
      FrameError kind = FrameErrorOf(h.status()).value_or(FrameError::kBadMagic);
      uint64_t id = 0;
      if (kind != FrameError::kBadMagic) std::memcpy(&id, hdr_.data() + 8, sizeof(id));
      Fail(FrameErrorName(kind), id, h.status());
      return;
    }
    cur_ = *h;
    payload_.clear();
    payload_.resize(cur_.payload_len);  // bounded above: <= 16 MiB (64 KiB before the hello)
    if (cur_.payload_len == 0) {
      OnFrame();
      return;
    }
    reading_ = true;
    asio::async_read(
        sock_, asio::buffer(payload_),
        [self = shared_from_this()](const error_code& e, size_t) { self->OnPayload(e); });
  }

  void OnPayload(const error_code& ec) {
    reading_ = false;
    if (closed_) return;
    if (closing_) {
      ContinueDrain(ec);
      return;
    }
    if (ec) {
      if (ec == asio::error::eof) {
        Fail(FrameErrorName(FrameError::kTruncated), cur_.request_id,
             FrameErrorStatus(FrameError::kTruncated, "stream ended inside a frame payload"));
      } else {
        DoClose();
      }
      return;
    }
    OnFrame();
  }

  void OnFrame() {
    Status crc = VerifyFrameCrc(hdr_, payload_);
    if (!crc.ok()) {
      Fail(FrameErrorName(FrameError::kBadCrc), cur_.request_id, crc);
      return;
    }
    if (!authed_) {
      if (cur_.type != kTypeHello) {
        Fail("unauthenticated", cur_.request_id,
             Unauthenticated("the first frame must be a hello (got type " +
                             std::to_string(cur_.type) + ")"));
        return;
      }
      HandleHello();
      if (hello_pending_) return;  // FinishHello reads on
    } else {
      if (srv_->opts.idle_timeout_ms > 0) ArmTimer(srv_->opts.idle_timeout_ms);
      Dispatch();
    }
    ReadHeader();
  }

  void HandleHello() {
    auto hello = internal::DecodeHello(payload_);
    if (!hello.ok()) {
      Fail("invalid_argument", cur_.request_id, hello.status().WithContext("malformed hello"));
      return;
    }
    if (hello->version != kProtocolVersion) {
      Fail(FrameErrorName(FrameError::kBadVersion), cur_.request_id,
           FailedPrecondition("client speaks protocol version " + std::to_string(hello->version) +
                              ", server speaks " + std::to_string(kProtocolVersion)));
      return;
    }
    if (!internal::ConstantTimeEquals(hello->token, srv_->opts.token)) {
      Fail("unauthenticated", cur_.request_id, Unauthenticated("wrong token"));
      return;
    }
    peer_.session_id = internal::RandomU64();
    peer_.session_token = internal::RandomU64();
    peer_.role = hello->role;
    peer_.rank = hello->rank;
    peer_.name = std::move(hello->name);
    peer_.remote = remote_;
    std::vector<std::byte> extra;
    if (srv_->async_hello_hook) {
      hello_pending_ = true;
      const uint64_t request_id = cur_.request_id;
      std::weak_ptr<Connection> weak = weak_from_this();
      HelloDone done = [weak, request_id](Result<std::vector<std::byte>> r) {
        auto self = weak.lock();
        if (!self) return;
        asio::post(self->strand_, [self, request_id, r = std::move(r)]() mutable {
          self->FinishHello(request_id, std::move(r));
        });
      };
      try {
        srv_->async_hello_hook(peer_, hello->extra, std::move(done));
      } catch (const std::exception& e) {
        hello_pending_ = false;
        Fail("", cur_.request_id, Internal(std::string("hello hook threw: ") + e.what()));
      }
      return;
    }
    if (srv_->hello_hook) {
      Result<std::vector<std::byte>> r = Internal("hello hook threw");
      try {
        r = srv_->hello_hook(peer_, hello->extra);
      } catch (const std::exception& e) {
        r = Internal(std::string("hello hook threw: ") + e.what());
      }
      if (!r.ok()) {
        Fail("", cur_.request_id, r.status());  // a refusal, not a protocol error
        return;
      }
      extra = std::move(*r);
    }
    AcceptHello(cur_.request_id, extra);
  }

  // The asynchronous hook answered (on strand_): reply and read on, unless the connection closed
  // meanwhile (e.g. the hello timeout).
  void FinishHello(uint64_t request_id, Result<std::vector<std::byte>> r) {
    if (!hello_pending_) return;
    hello_pending_ = false;
    if (closed_ || closing_) return;
    if (!r.ok()) {
      Fail("", request_id, r.status());  // a refusal, not a protocol error
      return;
    }
    if (!AcceptHello(request_id, *r)) return;
    ReadHeader();
  }

  // Sends the hello reply and marks the peer authenticated; false (after failing the
  // connection) when the reply does not fit a frame.
  bool AcceptHello(uint64_t request_id, std::span<const std::byte> extra) {
    auto reply = internal::EncodeHelloReply(peer_.session_id, peer_.session_token, extra);
    if (reply.size() > kMaxPayloadBytes) {
      Fail("", request_id, Internal("hello reply extra exceeds the frame bound"));
      return false;
    }
    authed_ = true;
    ArmTimer(srv_->opts.idle_timeout_ms);  // cancels the hello timer when 0
    ZPS_LOG(DEBUG) << "rpc: peer " << peer_.name << " (role " << PeerRoleName(peer_.role)
                   << ", rank " << peer_.rank << ") from " << remote_ << " authenticated";
    Enqueue(Out{EncodeFrameHeader(kTypeHelloReply, request_id, reply), std::move(reply)});
    return true;
  }

  void Dispatch() {
    const uint16_t type = cur_.type;
    auto it = srv_->handlers.find(type);
    if (type == kTypeHello) {
      SendError(cur_.request_id, FailedPrecondition("already authenticated"));
      return;
    }
    if (!IsRequestType(type) || it == srv_->handlers.end()) {
      srv_->ProtocolError(FrameErrorName(FrameError::kUnknownType));
      SendError(cur_.request_id,
                FrameErrorStatus(FrameError::kUnknownType,
                                 "no handler for message type " + std::to_string(type)));
      return;
    }
    auto st = std::make_shared<Responder::State>();
    st->conn = weak_from_this();
    st->type = type;
    st->id = cur_.request_id;
    Responder resp(st);
    try {
      it->second(peer_, payload_, resp);
    } catch (const std::exception& e) {
      resp.Error(Internal(std::string("handler threw: ") + e.what()));
    } catch (...) {
      resp.Error(Internal("handler threw a non-standard exception"));
    }
  }

  void SendError(uint64_t id, const Status& s) {
    auto p = EncodeErrorPayload(s);
    Enqueue(Out{EncodeFrameHeader(kTypeError, id, p), std::move(p)});
  }

  /// Protocol error: count it (unless kind is empty), send a best-effort Error frame, then close.
  void Fail(std::string_view kind, uint64_t id, const Status& s) {
    if (closed_ || closing_) return;
    if (!kind.empty()) srv_->ProtocolError(kind);
    // A protocol error is the peer's doing: a flood of bad frames must not become a flood of log
    // lines (the metric counts every one). Refusals (no kind) are always logged.
    uint64_t held_back = 0;
    if (kind.empty() || srv_->protocol_error_log.Allow(&held_back)) {
      const std::string line =
          "rpc: closing connection from " + remote_ +
          (authed_ ? " (" + peer_.name + ")" : std::string()) + ": " + s.ToString() +
          (held_back == 0 ? std::string()
                          : " (" + std::to_string(held_back) +
                                " more connections closed for protocol errors not logged; "
                                "zps_protocol_errors_total counts them)");
      // A refusal with UNAVAILABLE is transient (the shard has no job yet, or is restoring):
      // the peer retries, so each attempt is not a warning.
      if (kind.empty() && s.code() == Code::kUnavailable) {
        ZPS_LOG(INFO) << line;
      } else {
        ZPS_LOG(WARNING) << line;
      }
    }
    SendError(id, s);
    closing_ = true;
    // Whatever happens to the peer, the connection is gone after the linger period.
    timer_.expires_after(kLinger + std::chrono::milliseconds(500));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->DoClose();
    });
    MaybeFinishClosing();
  }

  void MaybeFinishClosing() {
    if (!closing_ || writing_ || closed_) return;
    // All output is flushed: half-close, then drain input until EOF (or the timer) so the
    // peer reads the Error frame instead of a reset.
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (!reading_) Drain();  // else the outstanding read's handler continues with ContinueDrain
  }

  void Drain() {
    if (closed_) return;
    reading_ = true;
    sock_.async_read_some(asio::buffer(drain_),
                          [self = shared_from_this()](const error_code& ec, size_t) {
                            self->reading_ = false;
                            self->ContinueDrain(ec);
                          });
  }

  void ContinueDrain(const error_code& ec) {
    if (closed_) return;
    if (ec) {
      DoClose();
    } else if (!writing_) {
      Drain();
    }  // else MaybeFinishClosing starts the drain once the Error frame is out
  }

  void Enqueue(Out o) {
    if (closed_) return;
    outq_.push_back(std::move(o));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (outq_.empty() || closed_) {
      writing_ = false;
      MaybeFinishClosing();
      return;
    }
    writing_ = true;
    Out& o = outq_.front();
    std::array<asio::const_buffer, 2> bufs{asio::buffer(o.hdr), asio::buffer(o.payload)};
    asio::async_write(sock_, bufs, [self = shared_from_this()](const error_code& ec, size_t) {
      if (self->closed_) return;
      if (ec) {
        self->DoClose();
        return;
      }
      self->outq_.pop_front();
      self->WriteNext();
    });
  }

  void DoClose() {
    if (closed_) return;
    closed_ = true;
    {
      MutexLock l(&mu_);
      open_ = false;
    }
    error_code ec;
    timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    outq_.clear();
    srv_->Remove(this);
    srv_->nconn.fetch_sub(1);
    if (authed_ && srv_->on_disconnect) {
      try {
        srv_->on_disconnect(peer_);
      } catch (const std::exception& e) {
        ZPS_LOG(ERROR) << "rpc: OnDisconnect threw: " << e.what();
      }
    }
  }

  std::shared_ptr<Server::Impl> srv_;  // first: destroyed last, after the socket and timer
  tcp::socket sock_;                   // its executor is this connection's strand (made at accept)
  asio::any_io_executor strand_;
  asio::steady_timer timer_;
  std::string remote_;

  Mutex mu_;
  bool open_ GUARDED_BY(mu_) = true;  // false once DoClose ran: PostSend stops posting

  // strand_ only:
  std::array<std::byte, kFrameHeaderBytes> hdr_{};
  FrameHeader cur_;
  std::vector<std::byte> payload_;
  std::array<std::byte, 4096> drain_{};
  std::deque<Out> outq_;
  bool writing_ = false;
  bool reading_ = false;  // a read (frame or drain) is outstanding on sock_
  bool authed_ = false;
  bool hello_pending_ = false;  // an asynchronous hello hook has not answered yet
  bool closing_ = false;        // an error was sent; no more reads or dispatch
  bool closed_ = false;
  Peer peer_;
};

// ---- Responder ----

void Responder::Reply(std::vector<std::byte> payload) {
  if (!state_ || state_->answered.exchange(true)) return;
  auto conn = state_->conn.lock();
  if (!conn) return;
  if (payload.size() > kMaxPayloadBytes) {
    ZPS_LOG(ERROR) << "rpc: reply to type " << state_->type << " has " << payload.size()
                   << " bytes, over the frame bound";
    conn->PostSend(kTypeError, state_->id,
                   EncodeErrorPayload(ResourceExhausted(
                       "reply of " + std::to_string(payload.size()) +
                       " bytes exceeds the frame bound " + std::to_string(kMaxPayloadBytes))));
    return;
  }
  conn->PostSend(ReplyTypeOf(state_->type), state_->id, std::move(payload));
}

void Responder::Error(const Status& s) {
  if (!state_ || state_->answered.exchange(true)) return;
  auto conn = state_->conn.lock();
  if (!conn) return;
  conn->PostSend(kTypeError, state_->id, EncodeErrorPayload(s));
}

bool Responder::answered() const { return state_ && state_->answered.load(); }
uint16_t Responder::request_type() const { return state_ ? state_->type : 0; }
uint64_t Responder::request_id() const { return state_ ? state_->id : 0; }

// ---- Server ----

void Server::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(io), [this](const error_code& ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted) return;
    std::shared_ptr<Connection> conn;
    {
      MutexLock l(&mu);
      if (stopped) return;
      if (ec) {
        ZPS_LOG(WARNING) << "rpc: accept failed: " << ec.message();
      } else if (nconn.load() >= opts.max_connections) {
        error_code ignored;
        sock.close(ignored);
      } else {
        conn = std::make_shared<Connection>(self.lock(), std::move(sock));
        conns.emplace(conn.get(), conn);
        nconn.fetch_add(1);
      }
    }
    if (!ec && !conn) {
      ProtocolError("too_many_connections");
      ZPS_LOG(WARNING) << "rpc: connection refused: " << opts.max_connections
                       << " connections open";
    }
    if (conn) conn->Start();
    Accept();
  });
}

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Server>> Server::Create(ServerOptions opts) {
  if (opts.io_threads < 1) return InvalidArgument("rpc server: io_threads must be >= 1");
  if (opts.max_connections == 0) return InvalidArgument("rpc server: max_connections must be > 0");
  if (opts.hello_timeout_ms <= 0)
    return InvalidArgument("rpc server: hello_timeout_ms must be > 0");
  if (opts.idle_timeout_ms < 0) return InvalidArgument("rpc server: idle_timeout_ms must be >= 0");
  error_code ec;
  auto addr = asio::ip::make_address(opts.bind_address, ec);
  if (ec) {
    return internal::FromAsio("rpc server: bad bind address '" + opts.bind_address + "'", ec);
  }
  auto impl = std::make_shared<Impl>(opts);
  impl->self = impl;
  tcp::endpoint ep(addr, opts.port);
  std::string where = opts.bind_address + ":" + std::to_string(opts.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (ec) return internal::FromAsio("rpc server: open socket for " + where, ec);
  impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return internal::FromAsio("rpc server: SO_REUSEADDR on " + where, ec);
  impl->acceptor.bind(ep, ec);
  if (ec) return internal::FromAsio("rpc server: bind " + where, ec);
  impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return internal::FromAsio("rpc server: listen on " + where, ec);
  impl->port = impl->acceptor.local_endpoint(ec).port();
  if (ec) return internal::FromAsio("rpc server: local_endpoint", ec);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::~Server() { Stop(); }

void Server::Register(uint16_t type, Handler h) {
  ZPS_CHECK(IsRequestType(type) && type != kTypeHello);
  MutexLock l(&impl_->mu);
  ZPS_CHECK(!impl_->started);
  impl_->handlers[type] = std::move(h);
}

void Server::OnHello(HelloHook f) {
  MutexLock l(&impl_->mu);
  ZPS_CHECK(!impl_->started);
  impl_->hello_hook = std::move(f);
  impl_->async_hello_hook = nullptr;
}

void Server::OnHelloAsync(AsyncHelloHook f) {
  MutexLock l(&impl_->mu);
  ZPS_CHECK(!impl_->started);
  impl_->async_hello_hook = std::move(f);
  impl_->hello_hook = nullptr;
}

void Server::OnDisconnect(std::function<void(const Peer&)> f) {
  MutexLock l(&impl_->mu);
  ZPS_CHECK(!impl_->started);
  impl_->on_disconnect = std::move(f);
}

void Server::OnProtocolError(std::function<void(std::string_view)> f) {
  MutexLock l(&impl_->mu);
  ZPS_CHECK(!impl_->started);
  impl_->on_protocol_error = std::move(f);
}

Status Server::Start() {
  MutexLock l(&impl_->mu);
  if (impl_->started || impl_->stopped) {
    return FailedPrecondition("rpc server: Start called twice or after Stop");
  }
  impl_->started = true;
  if (impl_->opts.token.empty()) {
    ZPS_LOG(WARNING) << "rpc server: no token configured; any client that connects is accepted";
  }
  impl_->Accept();
  try {
    for (int i = 0; i < impl_->opts.io_threads; ++i) {
      impl_->threads.emplace_back([impl = impl_.get(), i] {
        log::SetThreadName("rpc-io-" + std::to_string(i));
        for (;;) {
          try {
            impl->io.run();
            return;
          } catch (const std::exception& e) {
            // Handlers catch their own; this is a last line so a thread never dies silently.
            ZPS_LOG(ERROR) << "rpc: exception escaped an io handler: " << e.what();
          }
        }
      });
    }
  } catch (const std::system_error& e) {
    return Internal(std::string("rpc server: cannot start io threads: ") + e.what());
  }
  ZPS_LOG(INFO) << "rpc server listening on " << impl_->opts.bind_address << ":" << impl_->port
                << " (" << impl_->opts.io_threads << " io threads)";
  return Status::Ok();
}

void Server::Stop() {
  std::vector<std::shared_ptr<Connection>> live;
  bool was_started;
  {
    MutexLock l(&impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    was_started = impl_->started;
    for (auto& [p, w] : impl_->conns) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  if (was_started) {
    asio::post(impl_->io, [impl = impl_.get()] {
      error_code ec;
      impl->acceptor.close(ec);
    });
  } else {
    error_code ec;
    impl_->acceptor.close(ec);
  }
  for (auto& c : live) c->Close();
  live.clear();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

uint16_t Server::port() const { return impl_->port; }
size_t Server::connections() const { return impl_->nconn.load(); }

}  // namespace zps::rpc
