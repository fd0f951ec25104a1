// The HTTP exporter (CivetWeb) over real loopback sockets: routes, probes, bad and slow clients.
// CivetWeb answers in the request's HTTP version and writes its own error replies (400 for what
// it cannot parse or a head over the bound, 505 for an HTTP version it does not speak), so the
// checks on those compare status codes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/metrics.h"
#include "zps/common/process_metrics.h"
#include "zps/common/ucx.h"
#include "zps/testing/status_matchers.h"

namespace zps::metrics {
namespace {

using namespace std::chrono_literals;

// A connected loopback socket, closed on destruction.
class Sock {
 public:
  explicit Sock(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Sock() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool Send(std::string_view s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Reads until EOF or `timeout`; returns what came.
  std::string ReadAll(std::chrono::milliseconds timeout = 3000ms, bool* eof = nullptr) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        if (eof) *eof = true;
        break;
      }
      out.append(buf, n);
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string Get(uint16_t port, std::string_view request) {
  Sock s(port);
  EXPECT_TRUE(s.connected());
  EXPECT_TRUE(s.Send(request));
  return s.ReadAll();
}

std::string StatusLine(const std::string& reply) { return reply.substr(0, reply.find("\r\n")); }
// The status code of "HTTP/x.y NNN ...", or 0.
int Code(const std::string& reply) {
  std::string line = StatusLine(reply);
  if (line.rfind("HTTP/", 0) != 0 || line.size() < 12) return 0;
  return std::atoi(line.substr(9, 3).c_str());
}
std::string Body(const std::string& reply) {
  size_t p = reply.find("\r\n\r\n");
  return p == std::string::npos ? "" : reply.substr(p + 4);
}

class ExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fam = registry_.AddCounter("zps_test_total", "A test counter.");
    ASSERT_THAT(fam, IsOk());
    counter_ = *(*fam)->Add({});
    counter_.Inc(7);
  }
  std::unique_ptr<Exporter> Start(ExporterOptions o = {}) {
    o.bind_address = "127.0.0.1";
    o.port = 0;
    auto e = Exporter::Start(
        o, &registry_, [this]() -> Status { return live_ ? Status::Ok() : Internal("dead"); },
        [this]() -> Status { return ready_ ? Status::Ok() : Unavailable("no layout yet"); });
    EXPECT_THAT(e, IsOk());
    return e.ok() ? std::move(*e) : nullptr;
  }
  Registry registry_;
  Counter counter_;
  std::atomic<bool> live_{true}, ready_{false};
};

TEST_F(ExporterTest, ServesMetricsAndProbes) {
  auto e = Start();
  ASSERT_NE(e, nullptr);
  ASSERT_NE(e->port(), 0);
  std::string r = Get(e->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK");
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos);
  EXPECT_EQ(Body(r), registry_.Serialize());
  EXPECT_NE(Body(r).find("zps_test_total 7\n"), std::string::npos);
  EXPECT_NE(r.find("Content-Length: " + std::to_string(Body(r).size()) + "\r\n"),
            std::string::npos);

  EXPECT_EQ(StatusLine(Get(e->port(), "GET /healthz HTTP/1.1\r\n\r\n")), "HTTP/1.1 200 OK");
  r = Get(e->port(), "GET /readyz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusLine(r), "HTTP/1.0 503 Service Unavailable");
  EXPECT_NE(Body(r).find("no layout yet"), std::string::npos);
  ready_ = true;
  EXPECT_EQ(StatusLine(Get(e->port(), "GET /readyz?verbose=1 HTTP/1.1\r\n\r\n")),
            "HTTP/1.1 200 OK");
  live_ = false;
  EXPECT_EQ(StatusLine(Get(e->port(), "GET /healthz HTTP/1.1\r\n\r\n")),
            "HTTP/1.1 503 Service Unavailable");

  r = Get(e->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK");
  EXPECT_EQ(Body(r), "");
}

TEST_F(ExporterTest, RejectsWhatItDoesNotServe) {
  auto e = Start();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(StatusLine(Get(e->port(), "GET /nope HTTP/1.1\r\n\r\n")), "HTTP/1.1 404 Not Found");
  std::string r = Get(e->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(StatusLine(r), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(r.find("Allow: GET, HEAD\r\n"), std::string::npos);
  // (CivetWeb reads "GET /metrics  HTTP/1.1", with two spaces, as GET /metrics, as RFC 9112
  // allows a lenient parser to; it is not in this list.)
  for (std::string_view garbage : {"\x16\x03\x01\x02\x01\xfc\x03\x03\r\n\r\n", "GET\r\n\r\n",
                                   "GET /metrics\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(Code(Get(e->port(), garbage)), 400) << garbage;
  }
  EXPECT_EQ(Code(Get(e->port(), "GET /metrics HTTP/2.0\r\n\r\n")), 505);
  // A head larger than the bound: an error, and the server did not buffer it all.
  std::string big = "GET /metrics HTTP/1.1\r\nX-Fill: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Code(Get(e->port(), big)), 400);
  // Still serving afterwards.
  EXPECT_EQ(StatusLine(Get(e->port(), "GET /metrics HTTP/1.1\r\n\r\n")), "HTTP/1.1 200 OK");
}

TEST_F(ExporterTest, SlowClientsAreDroppedAndDoNotBlockOthers) {
  ExporterOptions o;
  o.request_timeout_ms = 300;
  auto e = Start(o);
  ASSERT_NE(e, nullptr);
  Sock silent(e->port());
  Sock partial(e->port());
  ASSERT_TRUE(partial.Send("GET /metr"));
  // Others are served while those two dawdle.
  EXPECT_EQ(StatusLine(Get(e->port(), "GET /healthz HTTP/1.1\r\n\r\n")), "HTTP/1.1 200 OK");
  bool eof1 = false, eof2 = false;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(silent.ReadAll(3000ms, &eof1), "");
  std::string late = partial.ReadAll(3000ms, &eof2);  // CivetWeb: a 400 for the half request
  EXPECT_TRUE(late.empty() || Code(late) == 400) << late;
  EXPECT_TRUE(eof1 && eof2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2500ms);
}

// max_connections connections are served at once (CivetWeb's worker threads); one more waits
// in the accept queue until a thread is free, then is served.
TEST_F(ExporterTest, ConnectionLimit) {
  ExporterOptions o;
  o.max_connections = 2;
  o.request_timeout_ms = 2000;
  auto e = Start(o);
  ASSERT_NE(e, nullptr);
  Sock a(e->port()), b(e->port());
  std::this_thread::sleep_for(100ms);  // let the server accept both
  Sock c(e->port());
  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(c.ReadAll(300ms), "");  // over the limit: waits
  ASSERT_TRUE(a.Send("GET /healthz HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(StatusLine(a.ReadAll()), "HTTP/1.1 200 OK");
  EXPECT_EQ(StatusLine(c.ReadAll()), "HTTP/1.1 200 OK");  // a's thread took it
}

TEST_F(ExporterTest, StopWithOpenConnectionsAndPortInUse) {
  auto e = Start();
  ASSERT_NE(e, nullptr);
  ExporterOptions same;
  same.bind_address = "127.0.0.1";
  same.port = e->port();
  EXPECT_EQ(Exporter::Start(same, &registry_, nullptr, nullptr).status().code(), Code::kIoError);
  same.bind_address = "not an address";
  EXPECT_EQ(Exporter::Start(same, &registry_, nullptr, nullptr).status().code(),
            Code::kInvalidArgument);
  Sock idle(e->port());
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  e->Stop();
  e->Stop();  // idempotent
  // CivetWeb's thread on the idle connection sees the stop at its next 2 s poll quantum.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2500ms);
  bool eof = false;
  idle.ReadAll(1000ms, &eof);
  EXPECT_TRUE(eof);
}

TEST(UcxTransportInfo, ClassesFromTheContext) {
  auto ctx = ucx::Context::Create({.transports = "tcp"});
  ASSERT_THAT(ctx, IsOk());
  EXPECT_EQ(UcxTransportClasses(**ctx), (std::vector<std::string>{"tcp"}));
  auto shm = ucx::Context::Create({.transports = "shm"});
  ASSERT_THAT(shm, IsOk());
  EXPECT_EQ(UcxTransportClasses(**shm), (std::vector<std::string>{"shm"}));

  Registry r;
  auto pm = ProcessMetrics::Create(r, "worker");
  ASSERT_THAT(pm, IsOk());
  ASSERT_THAT(pm->SetUcxTransports(**ctx), IsOk());
  EXPECT_NE(r.Serialize().find("zps_ucx_transport_info{transport=\"tcp\"} 1\n"), std::string::npos);
}

}  // namespace
}  // namespace zps::metrics
