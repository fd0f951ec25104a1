// Shared fixture: a real server on 127.0.0.1 (ephemeral port) with a few test handlers, and a
// counter of the protocol-error kinds it reports.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/bytes.h"
#include "zps/common/frame.h"
#include "zps/common/rpc.h"

namespace zps::rpc::testing {

using namespace std::chrono_literals;

inline constexpr uint16_t kEcho = 10;    // replies with the payload
inline constexpr uint16_t kFail = 11;    // replies Error NotFound("no such thing")
inline constexpr uint16_t kPark = 12;    // parks the Responder; ReleaseParked answers later
inline constexpr uint16_t kDrop = 13;    // never answers
inline constexpr uint16_t kWhoAmI = 14;  // replies with the peer's rank u32 + name
inline constexpr uint16_t kThrow = 15;   // throws
inline constexpr char kToken[] = "s3cret-token";

inline std::vector<std::byte> Bytes(std::string_view s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
inline std::string Str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ServerOptions{}); }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  /// (Re)starts the server with `o` (address, port and token forced for tests).
  void StartServer(ServerOptions o) {
    if (server_) server_->Stop();
    o.bind_address = "127.0.0.1";
    o.port = 0;
    if (o.token.empty()) o.token = kToken;
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    server_->Register(kEcho, [](const Peer&, std::span<const std::byte> p, Responder r) {
      r.Reply(std::vector<std::byte>(p.begin(), p.end()));
    });
    server_->Register(kFail, [](const Peer&, std::span<const std::byte>, Responder r) {
      r.Error(NotFound("no such thing"));
    });
    server_->Register(kPark, [this](const Peer&, std::span<const std::byte>, Responder r) {
      std::lock_guard<std::mutex> l(mu_);
      parked_.push_back(r);
      cv_.notify_all();
    });
    server_->Register(kDrop, [](const Peer&, std::span<const std::byte>, Responder) {});
    server_->Register(kWhoAmI, [](const Peer& peer, std::span<const std::byte>, Responder r) {
      ByteWriter w;
      w.U32(peer.rank);
      w.U32(static_cast<uint32_t>(peer.role));
      w.Str(peer.name);
      w.U64(peer.session_token);
      r.Reply(w.Take());
    });
    server_->Register(kThrow, [](const Peer&, std::span<const std::byte>, Responder) {
      throw std::runtime_error("boom");
    });
    server_->OnHello(
        [](const Peer& peer, std::span<const std::byte> extra) -> Result<std::vector<std::byte>> {
          if (Str(extra) == "refuse-me")
            return FailedPrecondition("rank " + std::to_string(peer.rank) + " refused");
          return Bytes("server-info");
        });
    server_->OnDisconnect([this](const Peer&) {
      std::lock_guard<std::mutex> l(mu_);
      ++disconnects_;
      cv_.notify_all();
    });
    server_->OnProtocolError([this](std::string_view kind) {
      std::lock_guard<std::mutex> l(mu_);
      ++errors_[std::string(kind)];
      cv_.notify_all();
    });
    ASSERT_TRUE(server_->Start().ok());
  }

  ClientOptions Opts(std::string token = kToken) const {
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = server_->port();
    o.token = std::move(token);
    o.role = PeerRole::kWorker;
    o.rank = 4;
    o.name = "test-client";
    o.connect_timeout_ms = 2000;
    return o;
  }

  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect(Opts());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  /// A fresh client can connect and echo: the server survived whatever came before.
  void ExpectServerHealthy() {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    auto r = c->Call(kEcho, Bytes("still alive"), 2s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(Str(*r), "still alive");
  }

  /// Waits until the protocol error `kind` was reported at least `n` times.
  bool WaitError(const std::string& kind, int n = 1, std::chrono::milliseconds t = 3s) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, t, [&] { return errors_[kind] >= n; });
  }
  int ErrorCount(const std::string& kind) {
    std::lock_guard<std::mutex> l(mu_);
    return errors_[kind];
  }
  bool WaitParked(size_t n, std::chrono::milliseconds t = 3s) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, t, [&] { return parked_.size() >= n; });
  }
  std::vector<Responder> TakeParked() {
    std::lock_guard<std::mutex> l(mu_);
    return std::move(parked_);
  }
  bool WaitConnections(size_t n, std::chrono::milliseconds t = 3s) {
    auto deadline = std::chrono::steady_clock::now() + t;
    while (server_->connections() != n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }

  std::unique_ptr<Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> errors_;
  std::vector<Responder> parked_;
  int disconnects_ = 0;
};

}  // namespace zps::rpc::testing
