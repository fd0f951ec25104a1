// UCX data plane in one process: two Workers (each with its own Context) over tcp or shared
// memory. Test names carry the "ucx/" prefix so `ctest -R ucx` selects them.
#include "zps/common/ucx.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "ucx_test_util.h"
#include "zps/testing/status_matchers.h"

namespace zps::ucx {
namespace {

using namespace std::chrono_literals;
using testing::Completions;
using testing::MakeHeader;
using testing::ParseHeader;
using testing::RandomBytes;

constexpr uint16_t kEcho = 1;   // B: receive and send back through the reply endpoint
constexpr uint16_t kReply = 2;  // A: the echoed message
constexpr uint16_t kSink = 3;   // B: receive, check the CRC, count

struct Received {
  std::vector<std::byte> data;
  bool rendezvous = false;
  bool crc_ok = false;
};

class UcxPairTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ContextOptions copts{.transports = GetParam()};
    auto ca = Context::Create(copts);
    ASSERT_THAT(ca, IsOk());
    ctx_a_ = std::move(*ca);
    auto cb = Context::Create(copts);
    ASSERT_THAT(cb, IsOk());
    ctx_b_ = std::move(*cb);

    auto wa = Worker::Create(*ctx_a_, {.thread_name = "ucx-a", .close_timeout = 500ms});
    ASSERT_THAT(wa, IsOk());
    a_ = std::move(*wa);
    auto wb = Worker::Create(*ctx_b_, {.thread_name = "ucx-b", .close_timeout = 500ms});
    ASSERT_THAT(wb, IsOk());
    b_ = std::move(*wb);

    Worker* b = b_.get();
    ASSERT_TRUE(b_->SetAmHandler(kEcho, [b](AmMessage& m) {
                    auto buf = std::make_shared<std::vector<std::byte>>(m.data_length());
                    std::vector<std::byte> header(m.header().begin(), m.header().end());
                    Endpoint reply = m.reply_endpoint();
                    m.Receive(*buf, [b, reply, buf, header](Status s) {
                       if (!s.ok()) return;
                       SendOptions o;
                       o.force_rendezvous = buf->size() > 65536;
                       b->SendAm(reply, kReply, header, *buf, buf, nullptr, o);
                     }).IgnoreError();
                  }).ok());
    ASSERT_TRUE(b_->SetAmHandler(kSink, [this](AmMessage& m) {
                    last_reply_ = m.reply_endpoint();
                    auto buf = std::make_shared<std::vector<std::byte>>(m.data_length());
                    auto header = ParseHeader(m.header());
                    m.Receive(*buf, [this, buf, header](Status s) {
                       if (s.ok() && header.length == buf->size() && Crc32c(*buf) == header.crc) {
                         sink_ok_.fetch_add(1);
                       } else {
                         sink_bad_.fetch_add(1);
                       }
                     }).IgnoreError();
                  }).ok());
    ASSERT_TRUE(a_->SetAmHandler(kReply, [this](AmMessage& m) {
                    auto r = std::make_shared<Received>();
                    r->data.resize(m.data_length());
                    r->rendezvous = m.rendezvous();
                    auto header = ParseHeader(m.header());
                    m.Receive(r->data, [this, r, header](Status s) {
                       r->crc_ok = s.ok() && Crc32c(r->data) == header.crc;
                       std::lock_guard<std::mutex> lock(mu_);
                       replies_.push_back(r);
                       cv_.notify_all();
                     }).IgnoreError();
                  }).ok());
    ASSERT_THAT(a_->Start(), IsOk());
    ASSERT_THAT(b_->Start(), IsOk());
    auto ep = a_->Connect(b_->Address(), [this](const Endpoint&, const Status& s) {
      std::lock_guard<std::mutex> lock(mu_);
      ep_error_ = s;
      cv_.notify_all();
    });
    ASSERT_THAT(ep, IsOk());
    ep_ = *ep;
  }

  void TearDown() override {
    ReleaseB();
    if (a_) a_->Stop();
    if (b_) b_->Stop();
    a_.reset();
    b_.reset();
  }

  std::shared_ptr<Received> WaitReply() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, testing::kTimeout, [&] { return !replies_.empty(); })) return nullptr;
    auto r = replies_.front();
    replies_.erase(replies_.begin());
    return r;
  }

  void EchoRoundTrip(size_t size, bool rendezvous) {
    auto payload = std::make_shared<std::vector<std::byte>>(RandomBytes(size, 7));
    Completions sent;
    SendOptions o;
    o.force_rendezvous = rendezvous;
    o.force_eager = !rendezvous;
    a_->SendAm(ep_, kEcho, MakeHeader(*payload, 1), *payload, payload, sent.Callback(), o);
    ASSERT_TRUE(sent.WaitFor(1));
    EXPECT_THAT(sent.statuses()[0], IsOk());
    auto reply = WaitReply();
    ASSERT_NE(reply, nullptr);
    EXPECT_TRUE(reply->crc_ok);
    EXPECT_EQ(reply->data, *payload);
    EXPECT_EQ(reply->rendezvous, size > 65536);
  }

  // Holds B's progress thread in a task until ReleaseB (or TearDown), so that A's rendezvous
  // sends to B cannot finish.
  [[nodiscard]] bool StallB() {
    b_released_.store(false);
    return b_->Post([this] {
      while (!b_released_.load()) std::this_thread::sleep_for(1ms);
    });
  }
  void ReleaseB() { b_released_.store(true); }

  // Sends `n` rendezvous messages of 1 MiB (bytes from `seed`) from A to B's sink, completing
  // into `done`, and gives them 50 ms to reach B.
  void SendRendezvousToSink(int n, uint32_t seed, Completions& done) {
    auto payload = std::make_shared<std::vector<std::byte>>(RandomBytes(1 << 20, seed));
    SendOptions o;
    o.force_rendezvous = true;
    for (int i = 0; i < n; ++i) {
      a_->SendAm(ep_, kSink, MakeHeader(*payload, 0), *payload, payload, done.Callback(), o);
    }
    std::this_thread::sleep_for(50ms);
  }

  std::unique_ptr<Context> ctx_a_, ctx_b_;
  std::unique_ptr<Worker> a_, b_;
  Endpoint ep_;
  Endpoint last_reply_;  // written on B's progress thread; read after a completion
  std::atomic<int> sink_ok_{0}, sink_bad_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Received>> replies_;
  Status ep_error_;
  std::atomic<bool> b_released_{true};
};

TEST_P(UcxPairTest, AddressIsNonEmptyAndStatusConverts) {
  EXPECT_FALSE(a_->Address().empty());
  // UCX 1.13 has peer-failure handling on tcp only (shared memory: pid check / Fail()).
  EXPECT_EQ(ep_.peer_error_handling(), GetParam() == "tcp");
  EXPECT_EQ(FromUcs(UCS_OK, "x").code(), Code::kOk);
  EXPECT_EQ(FromUcs(UCS_ERR_CONNECTION_RESET, "x").code(), Code::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_ENDPOINT_TIMEOUT, "x").code(), Code::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_CANCELED, "x").code(), Code::kCancelled);
  EXPECT_EQ(FromUcs(UCS_ERR_NO_MEMORY, "x").code(), Code::kResourceExhausted);
  EXPECT_EQ(FromUcs(UCS_ERR_UNSUPPORTED, "x").code(), Code::kUnimplemented);
}

TEST_P(UcxPairTest, AmEagerEcho) { EchoRoundTrip(1000, false); }

TEST_P(UcxPairTest, AmEagerEmptyPayload) { EchoRoundTrip(0, false); }

TEST_P(UcxPairTest, AmRendezvousEcho) { EchoRoundTrip(8 << 20, true); }

TEST_P(UcxPairTest, RmaGet) {
  std::vector<std::byte> remote = RandomBytes(4 << 20, 11);
  auto region = ctx_b_->Register(remote);
  ASSERT_THAT(region, IsOk());

  // Into a registered local buffer, the whole region.
  std::vector<std::byte> local(remote.size());
  auto local_region = ctx_a_->Register(local);
  ASSERT_THAT(local_region, IsOk());
  Completions done;
  a_->Get(ep_, local, (*region)->remote_address(), (*region)->rkey(), nullptr, done.Callback(),
          local_region->get());
  // Into an unregistered buffer, 1 MiB at an offset (same rkey: cached unpack).
  std::vector<std::byte> part(1 << 20);
  a_->Get(ep_, part, (*region)->remote_address() + 12345, (*region)->rkey(), nullptr,
          done.Callback());
  ASSERT_TRUE(done.WaitFor(2));
  for (auto& s : done.statuses()) EXPECT_THAT(s, IsOk());
  EXPECT_EQ(local, remote);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), remote.begin() + 12345));
}

TEST_P(UcxPairTest, GetWithBadArgumentsFails) {
  std::vector<std::byte> local(16);
  Completions done;
  a_->Get(ep_, local, 0, {}, nullptr, done.Callback());            // no rkey
  a_->Get(Endpoint(), local, 0, local, nullptr, done.Callback());  // invalid endpoint
  ASSERT_TRUE(done.WaitFor(2));
  for (auto& s : done.statuses()) EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
}

TEST_P(UcxPairTest, ConcurrentSendsFromThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 60;
  const size_t sizes[] = {0, 64, 4096, 70000, 300000};
  Completions done;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        size_t size = sizes[(t + i) % 5];
        auto payload = std::make_shared<std::vector<std::byte>>(
            RandomBytes(size, static_cast<uint32_t>(t * 1000 + i)));
        SendOptions o;
        o.force_rendezvous = size == 300000;
        a_->SendAm(ep_, kSink, MakeHeader(*payload, static_cast<uint32_t>(i)), *payload, payload,
                   done.Callback(), o);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(done.WaitFor(kThreads * kPerThread));
  EXPECT_EQ(done.ok_count(), static_cast<size_t>(kThreads * kPerThread));
  // Sends complete when the sender is done; the receiver may still be finishing rendezvous.
  auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (sink_ok_.load() + sink_bad_.load() < kThreads * kPerThread &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(sink_ok_.load(), kThreads * kPerThread);
  EXPECT_EQ(sink_bad_.load(), 0);
  auto stats = a_->GetStats();
  EXPECT_GE(stats.ops_started, static_cast<uint64_t>(kThreads * kPerThread));
}

TEST_P(UcxPairTest, ReplyEndpointOffProgressThreadFails) {
  auto payload = std::make_shared<std::vector<std::byte>>(RandomBytes(100, 3));
  Completions sent;
  a_->SendAm(ep_, kSink, MakeHeader(*payload, 0), *payload, payload, sent.Callback());
  ASSERT_TRUE(sent.WaitFor(1));
  auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (sink_ok_.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(sink_ok_.load(), 1);
  ASSERT_TRUE(last_reply_.is_reply());
  Completions reply;
  b_->SendAm(last_reply_, kReply, {}, {}, nullptr, reply.Callback());
  ASSERT_TRUE(reply.WaitFor(1));
  EXPECT_EQ(reply.statuses()[0].code(), Code::kFailedPrecondition);
}

TEST_P(UcxPairTest, CloseThenSendFailsFast) {
  Completions closed;
  a_->Close(ep_, closed.Callback());
  ASSERT_TRUE(closed.WaitFor(1));
  EXPECT_THAT(closed.statuses()[0], IsOk());
  Completions sent;
  a_->SendAm(ep_, kSink, {}, {}, nullptr, sent.Callback());
  ASSERT_TRUE(sent.WaitFor(1));
  EXPECT_EQ(sent.statuses()[0].code(), Code::kUnavailable);
}

TEST_P(UcxPairTest, StopCompletesPendingOperations) {
  // Stall B's progress thread so A's rendezvous sends cannot finish, then stop A.
  // A rendezvous round trip first, so the sends below always find UCX's wireup complete in both
  // directions (the same state in every run; a wireup reply still pending towards the stalled
  // peer took another path through UCX's teardown).
  EchoRoundTrip(1 << 20, true);
  ASSERT_TRUE(StallB());
  Completions done;
  SendRendezvousToSink(4, 5, done);
  auto start = std::chrono::steady_clock::now();
  a_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(done.WaitFor(4, 1s));
  for (auto& s : done.statuses()) EXPECT_FALSE(s.ok());
  // After Stop, new operations fail at once.
  Completions late;
  a_->SendAm(ep_, kSink, {}, {}, nullptr, late.Callback());
  ASSERT_TRUE(late.WaitFor(1, 1s));
  EXPECT_EQ(late.statuses()[0].code(), Code::kCancelled);
  ReleaseB();
}

TEST_P(UcxPairTest, FailCompletesPendingOperations) {
  // The owner declares the endpoint failed (as when its control-plane connection breaks) while
  // rendezvous sends wait on a stalled peer: they complete with the given reason. (Wireup
  // first, as in StopCompletesPendingOperations.)
  EchoRoundTrip(1 << 20, true);
  ASSERT_TRUE(StallB());
  Completions done;
  SendRendezvousToSink(4, 5, done);
  a_->Fail(ep_, Unavailable("control plane to peer lost"));
  ASSERT_TRUE(done.WaitFor(4, 2s));
  for (auto& s : done.statuses()) {
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    EXPECT_EQ(s.message(), "control plane to peer lost");
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 1s, [&] { return !ep_error_.ok(); }));
  }
  Completions late;
  a_->SendAm(ep_, kSink, {}, {}, nullptr, late.Callback());
  ASSERT_TRUE(late.WaitFor(1));
  EXPECT_EQ(late.statuses()[0].code(), Code::kUnavailable);
  ReleaseB();
  std::this_thread::sleep_for(100ms);  // let B process the orphaned requests before teardown
}

TEST_P(UcxPairTest, FailDuringGracefulCloseCompletesIt) {
  // A graceful Close waits for its flush, which a stalled peer never answers; declaring the
  // endpoint failed must finish the close and the pending sends.
  ASSERT_TRUE(StallB());
  Completions sends;
  SendRendezvousToSink(2, 9, sends);
  Completions closed;
  a_->Close(ep_, closed.Callback());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(closed.WaitFor(1, 1ms));  // still flushing
  a_->Fail(ep_, Unavailable("control plane to peer lost"));
  ASSERT_TRUE(closed.WaitFor(1, 2s));
  ASSERT_TRUE(sends.WaitFor(2, 2s));
  for (auto& s : sends.statuses()) EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  ReleaseB();
  std::this_thread::sleep_for(100ms);
}

TEST_P(UcxPairTest, RemoteWorkerDestroyedFailsPendingSends) {
  if (GetParam() != "tcp") {
    GTEST_SKIP() << "UCX 1.13 shared memory has no peer-failure handling: see UcxProcessTest "
                    "(peer pid check) and FailCompletesPendingOperations";
  }
  ASSERT_TRUE(StallB());
  Completions done;
  SendRendezvousToSink(8, 5, done);
  std::thread destroy([&] {
    b_->Stop();
    b_.reset();
  });
  std::this_thread::sleep_for(10ms);
  ReleaseB();
  destroy.join();
  ASSERT_TRUE(done.WaitFor(8));
  for (auto& s : done.statuses()) EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, testing::kTimeout, [&] { return !ep_error_.ok(); }));
    EXPECT_EQ(ep_error_.code(), Code::kUnavailable);
  }
  Completions late;
  a_->SendAm(ep_, kSink, {}, {}, nullptr, late.Callback());
  ASSERT_TRUE(late.WaitFor(1));
  EXPECT_EQ(late.statuses()[0].code(), Code::kUnavailable);
}

TEST(UcxContextTest, BadTransportOptionIsAnError) {
  auto ctx = Context::Create({.config = {{"RNDV_THRESH", "not-a-size"}}});
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), Code::kInvalidArgument);
}

TEST(UcxContextTest, SetAmHandlerAfterStartFails) {
  auto ctx = Context::Create({.transports = "tcp"});
  ASSERT_THAT(ctx, IsOk());
  auto w = Worker::Create(**ctx);
  ASSERT_THAT(w, IsOk());
  EXPECT_FALSE((*w)->Connect((*w)->Address()).ok());  // not started
  ASSERT_THAT((*w)->Start(), IsOk());
  EXPECT_EQ((*w)->SetAmHandler(9, [](AmMessage&) {}).code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->Start().code(), Code::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(ucx, UcxPairTest, ::testing::Values("tcp", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace zps::ucx
