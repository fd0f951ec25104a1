// zps::metrics::Exporter — /metrics, /healthz and /readyz on one port, served by CivetWeb (Debian's
// libcivetweb-dev; its C API, which throws nothing). prometheus-cpp's own Exposer cannot serve
// the probes (it has no custom handlers), so this is CivetWeb directly with the registry's
// TextSerializer output.
//
// CivetWeb owns the sockets and its threads (a master thread accepting, `max_connections` worker
// threads each serving one connection at a time); it parses the request, bounds the head
// (max_request_size) and the time to send it (request_timeout_ms), and answers what it cannot
// parse with a 4xx itself. One handler, registered for every URI, routes the rest. Everything it
// calls into may throw (the probes, the serializer's allocations): it catches and answers 500, so
// no exception crosses into CivetWeb's C frames.
#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "zps/common/logging.h"
#include "zps/common/metrics.h"
#include "zps/common/scoped_fd.h"

namespace zps::metrics {

namespace {

struct Reply {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  bool allow_header = false;
};

Reply ProbeReply(const Probe& p) {
  Status s = p ? p() : Status::Ok();
  Reply r;
  if (s.ok()) {
    r.body = "ok\n";
  } else {
    r.code = 503;
    r.body = s.ToString() + "\n";
  }
  return r;
}

void Send(mg_connection* conn, const Reply& r, bool head) {
  mg_response_header_start(conn, r.code);
  mg_response_header_add(conn, "Content-Type", r.content_type.c_str(), -1);
  mg_response_header_add(conn, "Content-Length", std::to_string(r.body.size()).c_str(), -1);
  mg_response_header_add(conn, "Cache-Control", "no-store", -1);
  if (r.allow_header) mg_response_header_add(conn, "Allow", "GET, HEAD", -1);
  mg_response_header_send(conn);
  if (!head && !r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
}

// CivetWeb's library-wide state: initialised once, never torn down (other users may share it).
void InitCivetWebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

}  // namespace

struct Exporter::Impl {
  ExporterOptions opts;
  const Registry* registry = nullptr;
  Probe liveness, readiness;
  mg_context* ctx = nullptr;  // owned; mg_stop in Stop
  uint16_t bound_port = 0;
  std::atomic<bool> stopped{false};

  Reply Route(const mg_request_info& ri) const {
    const std::string_view method = ri.request_method ? ri.request_method : "";
    const std::string_view uri = ri.local_uri ? ri.local_uri : "";  // without the query
    if (method != "GET" && method != "HEAD") {
      Reply r;
      r.code = 405;
      r.body = "only GET and HEAD\n";
      r.allow_header = true;
      return r;
    }
    if (uri == "/metrics") {
      Reply r;
      r.content_type = std::string(kTextContentType);
      r.body = registry->Serialize();
      return r;
    }
    if (uri == "/healthz") return ProbeReply(liveness);
    if (uri == "/readyz") return ProbeReply(readiness);
    Reply r;
    r.code = 404;
    r.body = "not found: try /metrics, /healthz or /readyz\n";
    return r;
  }

  static int Handle(mg_connection* conn, void* cbdata) {
    const auto* self = static_cast<const Impl*>(cbdata);
    const mg_request_info* ri = mg_get_request_info(conn);
    if (ri == nullptr) return 0;
    const bool head = ri->request_method != nullptr && std::strcmp(ri->request_method, "HEAD") == 0;
    Reply r;
    try {
      r = self->Route(*ri);
    } catch (const std::exception& e) {
      ZPS_LOG(ERROR) << "metrics exporter: " << e.what();
      r = Reply{};
      r.code = 500;
      r.body = "internal error\n";
    }
    Send(conn, r, head);
    return r.code;
  }

  static int LogMessage(const mg_connection*, const char* message) {
    ZPS_LOG(DEBUG) << "metrics exporter (civetweb): " << message;
    return 1;  // handled: CivetWeb writes nothing itself
  }

  static void* InitThread(const mg_context* ctx, int /*thread_type*/) {
    const auto* self = static_cast<const Impl*>(mg_get_user_data(ctx));
    if (self != nullptr) log::SetThreadName(self->opts.thread_name);
    return nullptr;
  }
};

Exporter::Exporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Exporter::~Exporter() { Stop(); }

Result<std::unique_ptr<Exporter>> Exporter::Start(const ExporterOptions& options,
                                                  const Registry* registry, Probe liveness,
                                                  Probe readiness) {
  if (registry == nullptr) return InvalidArgument("metrics exporter without a registry");
  if (options.max_request_bytes < 64 || options.max_connections == 0 ||
      options.request_timeout_ms <= 0) {
    return InvalidArgument(
        "metrics exporter: max_request_bytes >= 64, max_connections >= 1 and "
        "request_timeout_ms > 0 are required");
  }
  // CivetWeb's listening_ports syntax: a.b.c.d:port or [v6]:port.
  std::string listen;
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, options.bind_address.c_str(), &v4) == 1) {
    listen = options.bind_address + ":" + std::to_string(options.port);
  } else if (inet_pton(AF_INET6, options.bind_address.c_str(), &v6) == 1) {
    listen = "[" + options.bind_address + "]:" + std::to_string(options.port);
  } else {
    return InvalidArgument("metrics bind address '" + options.bind_address +
                           "' is not an IPv4 or IPv6 address");
  }

  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->registry = registry;
  impl->liveness = std::move(liveness);
  impl->readiness = std::move(readiness);

  const std::string threads = std::to_string(options.max_connections);
  const std::string max_request = std::to_string(options.max_request_bytes);
  const std::string timeout = std::to_string(options.request_timeout_ms);
  // clang-format off
  const char* config[] = {"listening_ports",    listen.c_str(),
                          "num_threads",        threads.c_str(),
                          "max_request_size",   max_request.c_str(),
                          "request_timeout_ms", timeout.c_str(),
                          "enable_keep_alive",  "no",
                          nullptr};
  // clang-format on
  mg_callbacks callbacks{};
  callbacks.log_message = &Impl::LogMessage;
  callbacks.init_thread = &Impl::InitThread;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = impl.get();
  init.configuration_options = config;
  char error_text[256] = {0};
  mg_error_data error{};
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  InitCivetWebOnce();
  impl->ctx = mg_start2(&init, &error);
  if (impl->ctx == nullptr) {
    return IoError("metrics endpoint " + listen + ": " +
                   (error_text[0] != 0 ? std::string(error_text) : "civetweb failed to start"));
  }
  mg_set_request_handler(impl->ctx, "/", &Impl::Handle, impl.get());
  mg_server_port ports[4] = {};
  const int n = mg_get_server_ports(impl->ctx, 4, ports);
  if (n < 1 || ports[0].port <= 0) {
    mg_stop(impl->ctx);
    return IoError("metrics endpoint " + listen + ": no listening port");
  }
  impl->bound_port = static_cast<uint16_t>(ports[0].port);
  ZPS_LOG(INFO) << "metrics on http://" << options.bind_address << ":" << impl->bound_port
                << "/metrics";
  return std::unique_ptr<Exporter>(new Exporter(std::move(impl)));
}

void Exporter::Stop() {
  Impl* d = impl_.get();
  if (d->stopped.exchange(true)) return;
  if (d->ctx == nullptr) return;
  // mg_stop raises CivetWeb's stop flag and joins its threads, but its accept loop polls the
  // listener in 2 s quanta and checks the flag only between polls. A connection of our own wakes
  // that poll, so Stop takes milliseconds, not up to 2 s. (A worker thread idling on a client's
  // connection still sees the flag only at its next quantum.)
  std::atomic<bool> done{false};
  std::thread stopper([d, &done] {
    mg_stop(d->ctx);  // closes the listener and connections, joins the threads
    done = true;
  });
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (d->opts.bind_address.find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(d->bound_port);
    if (inet_pton(AF_INET6, d->opts.bind_address.c_str(), &a->sin6_addr) != 1 ||
        IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr)) {
      a->sin6_addr = in6addr_loopback;
    }
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(d->bound_port);
    if (inet_pton(AF_INET, d->opts.bind_address.c_str(), &a->sin_addr) != 1 ||
        a->sin_addr.s_addr == htonl(INADDR_ANY)) {
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    len = sizeof(*a);
  }
  for (int i = 0; i < 200 && !done; ++i) {  // at most ~2 s, as without the wake-up
    ScopedFd fd(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.valid()) (void)::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stopper.join();
  d->ctx = nullptr;
}

uint16_t Exporter::port() const { return impl_->bound_port; }

}  // namespace zps::metrics
