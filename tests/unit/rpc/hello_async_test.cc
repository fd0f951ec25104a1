// The asynchronous hello hook (Server::OnHelloAsync): the hello is answered when the hook calls
// `done`, from any thread, and no io thread waits meanwhile. The shard uses it to make a
// worker's UCX endpoint on its progress thread, so a busy progress thread never stalls the
// control plane.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "zps/common/rpc.h"
#include "zps/testing/status_matchers.h"

namespace zps::rpc {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "async-hello-token";
constexpr uint16_t kEcho = 10;

std::vector<std::byte> Bytes(std::string_view s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
std::string Str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

class AsyncHello : public ::testing::Test {
 protected:
  void Start(int hello_timeout_ms = 10000) {
    ServerOptions o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    o.token = kToken;
    o.io_threads = 1;  // one io thread: a hook that blocked it would stall every connection
    o.hello_timeout_ms = hello_timeout_ms;
    auto s = Server::Create(o);
    ASSERT_THAT(s, IsOk());
    server_ = std::move(*s);
    server_->Register(kEcho, [](const Peer&, std::span<const std::byte> p, Responder r) {
      r.Reply(std::vector<std::byte>(p.begin(), p.end()));
    });
    server_->OnHelloAsync([this](const Peer&, std::span<const std::byte> extra, HelloDone done) {
      const std::string what = Str(extra);
      if (what == "park") {
        std::lock_guard<std::mutex> l(mu_);
        parked_.push_back(std::move(done));
        cv_.notify_all();
        return;
      }
      if (what == "refuse") return done(FailedPrecondition("refused by the hook"));
      done(Bytes("at once"));
    });
    ASSERT_THAT(server_->Start(), IsOk());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  ClientOptions Opts(std::string_view extra) const {
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = server_->port();
    o.token = kToken;
    o.role = rpc::PeerRole::kWorker;
    o.name = "async-hello-test";
    o.hello_extra = Bytes(extra);
    o.connect_timeout_ms = 20000;
    return o;
  }
  HelloDone TakeParked() {  // the bound only keeps a broken build from hanging
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, 20s, [&] { return !parked_.empty(); })) return nullptr;
    HelloDone d = std::move(parked_.front());
    parked_.erase(parked_.begin());
    return d;
  }

  std::unique_ptr<Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<HelloDone> parked_;
};

TEST_F(AsyncHello, OtherConnectionsAreServedWhileAHelloWaitsForItsHook) {
  Start();
  Result<std::unique_ptr<Client>> late = Unavailable("not connected yet");
  std::thread t([&] { late = Client::Connect(Opts("park")); });
  HelloDone done = TakeParked();
  ASSERT_NE(done, nullptr) << "the hook never saw the parked hello";

  // The only io thread is free: a second peer says hello and calls while the first one waits.
  auto other = Client::Connect(Opts(""));
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(Str((*other)->hello_reply_extra()), "at once");
  auto r = (*other)->Call(kEcho, Bytes("ping"), 10s);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(Str(*r), "ping");

  // Answered from another thread, the parked hello completes with what the hook said.
  std::thread answer([d = std::move(done)] { d(Bytes("later")); });
  answer.join();
  t.join();
  ASSERT_THAT(late, IsOk());
  EXPECT_EQ(Str((*late)->hello_reply_extra()), "later");
  auto r2 = (*late)->Call(kEcho, Bytes("pong"), 10s);
  ASSERT_THAT(r2, IsOk());
  EXPECT_EQ(Str(*r2), "pong");
}

TEST_F(AsyncHello, ARefusalThroughDoneReachesThePeer) {
  Start();
  auto c = Client::Connect(Opts("refuse"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kFailedPrecondition) << c.status().ToString();
  EXPECT_NE(c.status().message().find("refused by the hook"), std::string::npos);
}

TEST_F(AsyncHello, AHookThatNeverAnswersEndsInTheHelloTimeoutAndALateAnswerIsDropped) {
  Start(/*hello_timeout_ms=*/300);
  Result<std::unique_ptr<Client>> c = Unavailable("not connected yet");
  std::thread t([&] { c = Client::Connect(Opts("park")); });
  HelloDone done = TakeParked();
  ASSERT_NE(done, nullptr);
  t.join();
  ASSERT_FALSE(c.ok()) << "a hello the hook never answered was accepted";
  done(Bytes("too late"));  // the connection is gone: nothing happens
  auto fresh = Client::Connect(Opts(""));
  ASSERT_THAT(fresh, IsOk());
}

}  // namespace
}  // namespace zps::rpc
