// zps::rpc::Client — one TCP connection driven by one io thread. Calls from any thread register a
// Pending under mu_ and post their frame to the io thread; the read loop completes them by id.
//
// Lock order: Impl::mu_ before Pending::m.

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
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "asio_status.h"
#include "rpc_internal.h"
#include "zps/common/frame.h"
#include "zps/common/logging.h"
#include "zps/common/rpc.h"
#include "zps/common/thread_annotations.h"

namespace zps::rpc {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

struct Pending {
  uint16_t type = 0;
  Mutex m;
  CondVar cv;
  std::optional<Result<std::vector<std::byte>>> result GUARDED_BY(m);

  void Complete(Result<std::vector<std::byte>> r) {
    {
      MutexLock l(&m);
      if (result) return;
      result.emplace(std::move(r));
    }
    cv.SignalAll();
  }
};

}  // namespace

struct Client::Impl {
  Impl() : work(asio::make_work_guard(io)), sock(io), resolver(io), timer(io) {}

  Status ConnectSocket(const ClientOptions& o);
  Result<std::vector<std::byte>> Call(uint16_t type, std::span<const std::byte> payload,
                                      std::chrono::milliseconds timeout);
  void Close();

  // ---- io thread only ----
  void Enqueue(std::vector<std::byte> frame);
  void WriteNext();
  void ReadHeader();
  void OnHeader(const error_code& ec, size_t n);
  void OnFrame();
  void DoClose(const Status& why);

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  tcp::socket sock;
  tcp::resolver resolver;
  asio::steady_timer timer;
  std::thread thread;
  std::string where;  // "host:port", for messages

  Mutex mu_;
  bool open_ GUARDED_BY(mu_) = false;
  Status close_reason_ GUARDED_BY(mu_) = Unavailable("not connected");
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_ GUARDED_BY(mu_);
  std::atomic<uint64_t> next_id{1};
  std::once_flag close_once;

  internal::HelloReply hello;

  // io thread only:
  std::deque<std::vector<std::byte>> outq;
  bool writing = false;
  bool closed = false;
  std::array<std::byte, kFrameHeaderBytes> rx_hdr{};
  FrameHeader rx_cur;
  std::vector<std::byte> rx_payload;
};

Status Client::Impl::ConnectSocket(const ClientOptions& o) {
  // Handlers may outlive this call (a resolve cannot be interrupted), so they share `st` and
  // capture no locals by reference. Impl outlives the io thread, so `this` is safe.
  struct ConnectState {
    std::promise<Status> done;
    std::atomic<bool> finished{false};
    void Finish(Status s) {
      if (!finished.exchange(true)) done.set_value(std::move(s));
    }
  };
  auto st = std::make_shared<ConnectState>();
  auto fut = st->done.get_future();
  const int timeout_ms = o.connect_timeout_ms;
  asio::post(io, [this, st, timeout_ms, host = o.host, port = std::to_string(o.port)] {
    timer.expires_after(std::chrono::milliseconds(timeout_ms));
    timer.async_wait([this, st, timeout_ms](const error_code& ec) {
      if (ec || st->finished) return;
      resolver.cancel();
      error_code ignored;
      sock.close(ignored);
      st->Finish(Unavailable("connect to " + where + ": timed out after " +
                             std::to_string(timeout_ms) + " ms"));
    });
    resolver.async_resolve(
        host, port, [this, st](const error_code& ec, const tcp::resolver::results_type& results) {
          if (st->finished) return;
          if (ec) {
            timer.cancel();
            st->Finish(internal::FromAsio("resolve " + where, ec));
            return;
          }
          asio::async_connect(sock, results, [this, st](const error_code& e, const tcp::endpoint&) {
            if (st->finished) return;
            timer.cancel();
            if (e) {
              st->Finish(internal::FromAsio("connect to " + where, e));
              return;
            }
            error_code ignored;
            sock.set_option(tcp::no_delay(true), ignored);
            st->Finish(Status::Ok());
          });
        });
  });
  return fut.get();  // the timer guarantees an answer
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
  if (o.host.empty()) return InvalidArgument("rpc client: empty host");
  if (o.token.size() > kMaxTokenBytes) return InvalidArgument("rpc client: token too long");
  if (o.name.size() > kMaxNameBytes) return InvalidArgument("rpc client: name too long");
  if (o.connect_timeout_ms <= 0) return InvalidArgument("rpc client: connect_timeout_ms <= 0");
  auto impl = std::make_unique<Impl>();
  impl->where = o.host + ":" + std::to_string(o.port);
  auto hello =
      internal::EncodeHello(kProtocolVersion, o.role, o.rank, o.name, o.token, o.hello_extra);
  if (hello.size() > kMaxHelloPayloadBytes) {
    return InvalidArgument("rpc client: hello of " + std::to_string(hello.size()) +
                           " bytes exceeds the bound " + std::to_string(kMaxHelloPayloadBytes));
  }
  try {
    impl->thread = std::thread([io = &impl->io] {
      log::SetThreadName("rpc-client");
      for (;;) {
        try {
          io->run();
          return;
        } catch (const std::exception& e) {
          ZPS_LOG(ERROR) << "rpc client: exception escaped an io handler: " << e.what();
        }
      }
    });
  } catch (const std::system_error& e) {
    return Internal(std::string("rpc client: cannot start io thread: ") + e.what());
  }
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  Impl* im = client->impl_.get();
  ZPS_RETURN_IF_ERROR(im->ConnectSocket(o));
  {
    MutexLock l(&im->mu_);
    im->open_ = true;
  }
  asio::post(im->io, [im] { im->ReadHeader(); });
  auto reply = im->Call(kTypeHello, hello, std::chrono::milliseconds(o.connect_timeout_ms));
  if (!reply.ok()) {
    Status s = reply.status();
    if (s.code() == Code::kDeadlineExceeded) {
      s = DeadlineExceeded("hello to " + im->where + ": no reply within " +
                           std::to_string(o.connect_timeout_ms) + " ms");
    } else {
      s = s.WithContext("hello to " + im->where);
    }
    // A refusal the caller is expected to retry (a shard still loading the job) is not news.
    if (s.code() == Code::kUnavailable) {
      ZPS_LOG(DEBUG) << "rpc client: " << s.ToString();
    } else {
      ZPS_LOG(WARNING) << "rpc client: " << s.ToString();
    }
    return s;
  }
  auto h = internal::DecodeHelloReply(*reply);
  if (!h.ok()) return h.status().WithContext("hello reply from " + im->where);
  im->hello = std::move(*h);
  return client;
}

Result<std::vector<std::byte>> Client::Impl::Call(uint16_t type, std::span<const std::byte> payload,
                                                  std::chrono::milliseconds timeout) {
  if (!IsRequestType(type)) {
    return InvalidArgument("rpc call: type " + std::to_string(type) + " is not a request type");
  }
  if (payload.size() > kMaxPayloadBytes) {
    return InvalidArgument("rpc call: payload of " + std::to_string(payload.size()) +
                           " bytes exceeds the frame bound " + std::to_string(kMaxPayloadBytes));
  }
  const uint64_t id = next_id.fetch_add(1);
  auto p = std::make_shared<Pending>();
  p->type = type;
  auto frame = EncodeFrame(type, id, payload);  // CRC and copy on the caller's thread
  {
    MutexLock l(&mu_);
    if (!open_) return close_reason_;
    pending_.emplace(id, p);
    asio::post(io, [this, f = std::move(frame)]() mutable { Enqueue(std::move(f)); });
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  {
    MutexLock l(&p->m);
    if (p->cv.WaitUntil(l, deadline, [&]() REQUIRES(p->m) { return p->result.has_value(); })) {
      return std::move(*p->result);
    }
  }
  {
    MutexLock l(&mu_);
    pending_.erase(id);
  }
  // The reply may have landed between the wait and the erase.
  MutexLock l(&p->m);
  if (p->result) return std::move(*p->result);
  return DeadlineExceeded("rpc call type " + std::to_string(type) + " to " + where +
                          ": no reply within " + std::to_string(timeout.count()) + " ms");
}

void Client::Impl::Enqueue(std::vector<std::byte> frame) {
  if (closed) return;
  outq.push_back(std::move(frame));
  if (!writing) WriteNext();
}

void Client::Impl::WriteNext() {
  if (outq.empty() || closed) {
    writing = false;
    return;
  }
  writing = true;
  asio::async_write(sock, asio::buffer(outq.front()), [this](const error_code& ec, size_t) {
    if (closed) return;
    if (ec) {
      DoClose(internal::FromAsio("connection to " + where + " lost while writing", ec));
      return;
    }
    outq.pop_front();
    WriteNext();
  });
}

void Client::Impl::ReadHeader() {
  if (closed) return;
  asio::async_read(sock, asio::buffer(rx_hdr),
                   [this](const error_code& ec, size_t n) { OnHeader(ec, n); });
}

void Client::Impl::OnHeader(const error_code& ec, size_t n) {
  if (closed) return;
  if (ec) {
    DoClose(Unavailable("connection to " + where + " closed" +
                        (ec == asio::error::eof && n == 0 ? std::string() : ": " + ec.message())));
    return;
  }
  auto h = DecodeFrameHeader(rx_hdr);
  if (!h.ok()) {
    Status s = h.status();
    if (FrameErrorOf(s) == FrameError::kBadVersion) {
      // The server speaks another version: surface that, not a generic Unavailable.
      DoClose(s.WithContext("server " + where));
    } else {
      DoClose(Unavailable("bad frame from " + where + ": " + s.ToString()));
    }
    return;
  }
  rx_cur = *h;
  rx_payload.clear();
  rx_payload.resize(rx_cur.payload_len);  // <= kMaxPayloadBytes, checked by DecodeFrameHeader
  if (rx_cur.payload_len == 0) {
    OnFrame();
    return;
  }
  asio::async_read(sock, asio::buffer(rx_payload), [this](const error_code& e, size_t) {
    if (closed) return;
    if (e) {
      DoClose(Unavailable("connection to " + where + " closed inside a frame: " + e.message()));
      return;
    }
    OnFrame();
  });
}

void Client::Impl::OnFrame() {
  Status crc = VerifyFrameCrc(rx_hdr, rx_payload);
  if (!crc.ok()) {
    DoClose(Unavailable("bad frame from " + where + ": " + crc.ToString()));
    return;
  }
  std::shared_ptr<Pending> p;
  {
    MutexLock l(&mu_);
    auto it = pending_.find(rx_cur.request_id);
    if (it != pending_.end()) {
      p = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (!p) {
    if (rx_cur.type == kTypeError) {
      ZPS_LOG(WARNING) << "rpc client: error from " << where << " (request " << rx_cur.request_id
                       << "): " << DecodeErrorPayload(rx_payload).ToString();
    }
    // Otherwise a reply to a call that already timed out: dropped.
    ReadHeader();
    return;
  }
  if (rx_cur.type == kTypeError) {
    p->Complete(DecodeErrorPayload(rx_payload));
  } else if (rx_cur.type == ReplyTypeOf(p->type)) {
    p->Complete(std::move(rx_payload));
    rx_payload = {};
  } else {
    p->Complete(Internal("reply of type " + std::to_string(rx_cur.type) + " to a request of type " +
                         std::to_string(p->type)));
  }
  ReadHeader();
}

void Client::Impl::DoClose(const Status& why) {
  if (closed) return;
  closed = true;
  error_code ec;
  timer.cancel();
  resolver.cancel();
  sock.shutdown(tcp::socket::shutdown_both, ec);
  sock.close(ec);
  outq.clear();
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> failed;
  {
    MutexLock l(&mu_);
    open_ = false;
    close_reason_ = why;
    failed.swap(pending_);
  }
  for (auto& [id, p] : failed) p->Complete(why);
}

void Client::Impl::Close() {
  std::call_once(close_once, [this] {
    asio::post(io,
               [this] { DoClose(Unavailable("connection to " + where + " closed by Close()")); });
    work.reset();
    if (thread.joinable()) thread.join();
    // Anything posted after the join never runs; make sure no Call waits on it.
    MutexLock l(&mu_);
    open_ = false;
  });
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

std::span<const std::byte> Client::hello_reply_extra() const { return impl_->hello.extra; }
uint64_t Client::session_id() const { return impl_->hello.session_id; }
uint64_t Client::session_token() const { return impl_->hello.session_token; }

Result<std::vector<std::byte>> Client::Call(uint16_t type, std::span<const std::byte> payload,
                                            std::chrono::milliseconds timeout) {
  return impl_->Call(type, payload, timeout);
}

bool Client::connected() const {
  MutexLock l(&impl_->mu_);
  return impl_->open_;
}

void Client::Close() { impl_->Close(); }

}  // namespace zps::rpc
