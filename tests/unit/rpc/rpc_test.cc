// Control-plane behaviour with well-behaved peers: real sockets on 127.0.0.1.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "rpc_fixture.h"
#include "zps/testing/status_matchers.h"

namespace zps::rpc::testing {
namespace {

TEST_F(RpcTest, RoundTripAndHello) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->connected());
  EXPECT_EQ(Str(c->hello_reply_extra()), "server-info");
  EXPECT_NE(c->session_token(), 0u);
  auto r = c->Call(kEcho, Bytes("ping"), 2s);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(Str(*r), "ping");
  auto empty = c->Call(kEcho, {}, 2s);
  ASSERT_THAT(empty, IsOk());
  EXPECT_TRUE(empty->empty());

  // The handler sees the peer the hello established.
  auto who = c->Call(kWhoAmI, {}, 2s);
  ASSERT_THAT(who, IsOk());
  ByteReader rd(*who);
  EXPECT_EQ(*rd.U32("rank"), 4u);
  EXPECT_EQ(*rd.U32("role"), 1u);
  EXPECT_EQ(*rd.Str("name", 100), "test-client");
  EXPECT_EQ(*rd.U64("session_token"), c->session_token());
  EXPECT_EQ(server_->connections(), 1u);
}

TEST_F(RpcTest, SessionTokensDiffer) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->session_token(), b->session_token());
  EXPECT_NE(a->session_id(), b->session_id());
}

TEST_F(RpcTest, TypedErrorReply) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto r = c->Call(kFail, {}, 2s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().message(), "no such thing");
  // A throwing handler becomes Error Internal; the connection stays.
  auto t = c->Call(kThrow, {}, 2s);
  EXPECT_EQ(t.status().code(), Code::kInternal);
  EXPECT_NE(t.status().message().find("boom"), std::string::npos);
  EXPECT_THAT(c->Call(kEcho, Bytes("x"), 2s), IsOk());
}

TEST_F(RpcTest, ConcurrentCallsFromSeveralThreads) {
  StartServer(ServerOptions{.io_threads = 2});
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::string msg = "t" + std::to_string(t) + "-" + std::to_string(i) +
                          std::string(static_cast<size_t>(i % 7) * 100, 'z');
        auto r = c->Call(kEcho, Bytes(msg), 5s);
        if (!r.ok() || Str(*r) != msg) ++bad;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(RpcTest, LongPollAnsweredLaterFromAnotherThread) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::thread waiter([&] {
    auto r = c->Call(kPark, {}, 5s);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(Str(*r), "released");
  });
  ASSERT_TRUE(WaitParked(1));
  // The parked request blocks nothing: other calls on the same connection complete.
  auto r = c->Call(kEcho, Bytes("meanwhile"), 2s);
  ASSERT_THAT(r, IsOk());
  auto parked = TakeParked();
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_FALSE(parked[0].answered());
  std::thread replier([p = parked[0]]() mutable {
    std::this_thread::sleep_for(100ms);
    p.Reply(Bytes("released"));
    p.Reply(Bytes("second reply is a no-op"));
    p.Error(Internal("so is this"));
  });
  replier.join();
  waiter.join();
  EXPECT_TRUE(parked[0].answered());
  EXPECT_THAT(c->Call(kEcho, Bytes("after"), 2s), IsOk());
}

TEST_F(RpcTest, ResponderAfterDisconnectIsANoOp) {
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    std::thread t([&] { (void)c->Call(kPark, {}, 2s); });
    ASSERT_TRUE(WaitParked(1));
    c->Close();
    t.join();
  }
  ASSERT_TRUE(WaitConnections(0));
  for (auto& r : TakeParked()) r.Reply(Bytes("nobody listens"));
  Responder empty;
  EXPECT_FALSE(empty.valid());
  empty.Reply({});
  ExpectServerHealthy();
  std::unique_lock<std::mutex> l(mu_);
  EXPECT_TRUE(cv_.wait_for(l, 2s, [&] { return disconnects_ >= 1; }));
}

TEST_F(RpcTest, CallDeadline) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->Call(kDrop, {}, 150ms);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.status().code(), Code::kDeadlineExceeded);
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 1500ms);
  // The connection is still usable.
  EXPECT_THAT(c->Call(kEcho, Bytes("ok"), 2s), IsOk());
}

TEST_F(RpcTest, ServerStopGivesUnavailable) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  Result<std::vector<std::byte>> pending = Internal("not run");
  std::thread t([&] { pending = c->Call(kPark, {}, 5s); });
  ASSERT_TRUE(WaitParked(1));
  server_->Stop();
  t.join();
  EXPECT_EQ(pending.status().code(), Code::kUnavailable) << pending.status().ToString();
  EXPECT_FALSE(c->connected());
  EXPECT_EQ(c->Call(kEcho, Bytes("x"), 1s).status().code(), Code::kUnavailable);
  server_->Stop();  // idempotent
  // Connecting to a port nobody listens on.
  auto o = Opts();
  auto refused = Client::Connect(o);
  EXPECT_EQ(refused.status().code(), Code::kUnavailable) << refused.status().ToString();
}

TEST_F(RpcTest, ClientCloseFailsPendingCalls) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  Result<std::vector<std::byte>> pending = Internal("not run");
  std::thread t([&] { pending = c->Call(kPark, {}, 5s); });
  ASSERT_TRUE(WaitParked(1));
  c->Close();
  t.join();
  EXPECT_EQ(pending.status().code(), Code::kUnavailable);
  c->Close();  // idempotent
  EXPECT_EQ(c->Call(kEcho, {}, 1s).status().code(), Code::kUnavailable);
}

TEST_F(RpcTest, HelloRefusals) {
  auto wrong = Client::Connect(Opts("not-the-token"));
  EXPECT_EQ(wrong.status().code(), Code::kUnauthenticated) << wrong.status().ToString();
  auto o = Opts();
  o.hello_extra = Bytes("refuse-me");
  auto refused = Client::Connect(o);
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("rank 4 refused"), std::string::npos);
  auto bad_opts = Opts();
  bad_opts.token = std::string(kMaxTokenBytes + 1, 'x');
  EXPECT_EQ(Client::Connect(bad_opts).status().code(), Code::kInvalidArgument);
  ExpectServerHealthy();
}

TEST_F(RpcTest, LargePayloadsAndTheBound) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<std::byte> big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 131);
  auto r = c->Call(kEcho, big, 5s);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(*r, big);
  std::vector<std::byte> too_big(kMaxPayloadBytes + 1);
  EXPECT_EQ(c->Call(kEcho, too_big, 1s).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->Call(0x8005, {}, 1s).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(c->connected());
}

TEST_F(RpcTest, HundredsOfShortLivedConnections) {
  StartServer(ServerOptions{.io_threads = 2});
  for (int i = 0; i < 300; ++i) {
    auto c = Client::Connect(Opts());
    ASSERT_THAT(c, IsOk()) << i << ": " << c.status().ToString();
    if (i % 3 == 0) {
      auto r = (*c)->Call(kEcho, Bytes("x"), 2s);
      ASSERT_THAT(r, IsOk());
    }
  }
  EXPECT_TRUE(WaitConnections(0));
  std::unique_lock<std::mutex> l(mu_);
  EXPECT_TRUE(cv_.wait_for(l, 3s, [&] { return disconnects_ >= 300; }));
}

TEST_F(RpcTest, MaxConnections) {
  StartServer(ServerOptions{.max_connections = 2});
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  auto c = Client::Connect(Opts());
  EXPECT_EQ(c.status().code(), Code::kUnavailable) << c.status().ToString();
  EXPECT_TRUE(WaitError("too_many_connections"));
  a.reset();
  ASSERT_TRUE(WaitConnections(1));
  ExpectServerHealthy();
}

TEST_F(RpcTest, IdleTimeoutClosesASilentAuthenticatedPeer) {
  StartServer(ServerOptions{.idle_timeout_ms = 200});
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->Call(kEcho, Bytes("x"), 1s), IsOk());
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (c->connected() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(c->connected());
  EXPECT_TRUE(WaitError("timeout"));
  ExpectServerHealthy();
}

TEST(RpcServerCreate, OptionErrors) {
  EXPECT_EQ(Server::Create(ServerOptions{.bind_address = "not-an-ip"}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Server::Create(ServerOptions{.bind_address = "127.0.0.1", .port = 0, .io_threads = 0})
                .status()
                .code(),
            Code::kInvalidArgument);
  auto a = Server::Create(ServerOptions{.bind_address = "127.0.0.1", .port = 0});
  ASSERT_THAT(a, IsOk());
  // The same port twice: IoError (a listening socket, even with SO_REUSEADDR).
  auto b = Server::Create(ServerOptions{.bind_address = "127.0.0.1", .port = (*a)->port()});
  EXPECT_EQ(b.status().code(), Code::kIoError) << b.status().ToString();
  // Stop without Start, twice, then Start fails.
  (*a)->Stop();
  (*a)->Stop();
  EXPECT_EQ((*a)->Start().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace zps::rpc::testing
