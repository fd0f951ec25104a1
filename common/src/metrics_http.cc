// zps::metrics::Exporter — a minimal HTTP/1.1 server (Boost.Asio, one io thread) for /metrics,
// /healthz and /readyz. One request per connection: read the head (bounded), answer, close.
//
// Lifetime: Sessions are shared_ptrs held by their outstanding async operations; Stop() closes the
// acceptor and every open socket, then the io thread runs out of work and is joined. All session
// state lives on the one io thread, so nothing here needs a lock except the sessions set, which
// Stop reaches from outside through a post.
#include <atomic>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
// Asio uses std::atomic_thread_fence, which GCC warns about under -fsanitize=thread.
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp needs std::exchange

#include <boost/asio.hpp>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>

#include "zps/common/logging.h"
#include "zps/common/metrics.h"

namespace zps::metrics {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

struct Reply {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  bool head = false;
  bool allow_header = false;
};

const char* Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Render(const Reply& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.code) + " " + Reason(r.code) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (r.allow_header) out += "Allow: GET, HEAD\r\n";
  out += "Cache-Control: no-store\r\nConnection: close\r\n\r\n";
  if (!r.head) out += r.body;
  return out;
}

Reply ProbeReply(const Probe& p, bool head) {
  Status s = p ? p() : Status::Ok();
  Reply r;
  r.head = head;
  if (s.ok()) {
    r.body = "ok\n";
  } else {
    r.code = 503;
    r.body = s.ToString() + "\n";
  }
  return r;
}

}  // namespace

struct Exporter::Impl {
  Impl(ExporterOptions o, const Registry* reg, Probe live, Probe ready)
      : opts(std::move(o)), registry(reg), liveness(std::move(live)),
        readiness(std::move(ready)), acceptor(io) {}

  class Session;
  void Accept();
  Reply Handle(std::string_view head);

  const ExporterOptions opts;
  const Registry* registry;
  const Probe liveness, readiness;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::thread thread;
  uint16_t bound_port = 0;
  std::atomic<bool> stopped{false};
  std::unordered_set<std::shared_ptr<Session>> sessions;  // io thread only
};

class Exporter::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl* impl, tcp::socket sock)
      : impl_(impl), sock_(std::move(sock)), timer_(sock_.get_executor()),
        buf_(impl->opts.max_request_bytes) {}

  void Start() {
    timer_.expires_after(std::chrono::milliseconds(impl_->opts.request_timeout_ms));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->Close();  // too slow: drop it
    });
    asio::async_read_until(sock_, buf_, "\r\n\r\n",
                           [self = shared_from_this()](const error_code& ec, size_t n) {
                             self->OnHead(ec, n);
                           });
  }

  void Close() {
    error_code ignored;
    timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
    impl_->sessions.erase(shared_from_this());
  }

 private:
  void OnHead(const error_code& ec, size_t n) {
    if (ec == asio::error::not_found) {  // the head outgrew max_request_bytes
      Reply r;
      r.code = 431;
      r.body = "request head over " + std::to_string(impl_->opts.max_request_bytes) + " bytes\n";
      return Send(Render(r));
    }
    if (ec) return Close();  // eof, reset, or closed by the timer or Stop
    std::string head(asio::buffers_begin(buf_.data()), asio::buffers_begin(buf_.data()) + n);
    Send(Render(impl_->Handle(head)));
  }

  void Send(std::string bytes) {
    out_ = std::move(bytes);
    asio::async_write(sock_, asio::buffer(out_),
                      [self = shared_from_this()](const error_code&, size_t) { self->Close(); });
  }

  Impl* impl_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  asio::streambuf buf_;
  std::string out_;
};

Reply Exporter::Impl::Handle(std::string_view head) {
  Reply bad;
  bad.code = 400;
  bad.body = "malformed request\n";
  // Request line: METHOD SP TARGET SP HTTP/1.x CRLF
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return bad;
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return bad;
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return bad;
  if (target.empty() || target[0] != '/') return bad;
  if (size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    Reply r;
    r.code = 405;
    r.body = "only GET and HEAD\n";
    r.allow_header = true;
    return r;
  }
  if (target == "/metrics") {
    Reply r;
    r.content_type = std::string(kTextContentType);
    r.body = registry->Serialize();
    r.head = head_only;
    return r;
  }
  if (target == "/healthz") return ProbeReply(liveness, head_only);
  if (target == "/readyz") return ProbeReply(readiness, head_only);
  Reply r;
  r.code = 404;
  r.body = "not found: try /metrics, /healthz or /readyz\n";
  r.head = head_only;
  return r;
}

void Exporter::Impl::Accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      if (sessions.size() >= opts.max_connections) {
        error_code ignored;
        sock.close(ignored);
      } else {
        auto s = std::make_shared<Session>(this, std::move(sock));
        sessions.insert(s);
        s->Start();
      }
    }
    Accept();
  });
}

Exporter::Exporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Exporter::~Exporter() { Stop(); }

Result<std::unique_ptr<Exporter>> Exporter::Start(const ExporterOptions& options,
                                                  const Registry* registry, Probe liveness,
                                                  Probe readiness) {
  if (registry == nullptr) return InvalidArgument("metrics exporter without a registry");
  if (options.max_request_bytes < 64 || options.max_connections == 0 ||
      options.request_timeout_ms <= 0) {
    return InvalidArgument("metrics exporter: max_request_bytes >= 64, max_connections >= 1 and "
                           "request_timeout_ms > 0 are required");
  }
  auto impl = std::make_unique<Impl>(options, registry, std::move(liveness), std::move(readiness));
  error_code ec;
  auto addr = asio::ip::make_address(options.bind_address, ec);
  if (ec) return InvalidArgument("metrics bind address '" + options.bind_address + "': " + ec.message());
  tcp::endpoint ep(addr, options.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return IoError("metrics endpoint " + options.bind_address + ":" +
                   std::to_string(options.port) + ": " + ec.message());
  }
  impl->bound_port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    log::SetThreadName(raw->opts.thread_name);
    for (;;) {
      try {
        raw->io.run();
        break;
      } catch (const std::exception& e) {  // a bug in a handler; keep serving
        ZPS_LOG(ERROR) << "metrics exporter: " << e.what();
      }
    }
  });
  ZPS_LOG(INFO) << "metrics on http://" << options.bind_address << ":" << impl->bound_port
                << "/metrics";
  return std::unique_ptr<Exporter>(new Exporter(std::move(impl)));
}

void Exporter::Stop() {
  Impl* d = impl_.get();
  if (d->stopped.exchange(true)) return;
  asio::post(d->io, [d] {
    error_code ignored;
    d->acceptor.close(ignored);
    auto open = d->sessions;  // Close() erases from the set
    for (auto& s : open) s->Close();
  });
  if (d->thread.joinable()) d->thread.join();
}

uint16_t Exporter::port() const { return impl_->bound_port; }

}  // namespace zps::metrics
