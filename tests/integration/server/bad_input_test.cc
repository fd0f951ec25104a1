// Every kind of bad input from issue 3, sent to a real ShardServer (control plane over TCP, data
// plane over UCX): each gets a clear error reply (or, for framing errors, a closed connection),
// the server keeps serving, and the stored state is unchanged: the chunk CRCs (master, m, v,
// serving copy) and the gradient slots (the Status document's gradient_crc: slot bytes,
// coverage and landed counts), which are what a push could reach.
//
// The data-plane cases run over UCX tcp and over shared memory ("shm" = posix,cma,self, as the
// other shm tests), where fetches and pushes go by RMA (issue 12, item 6):
//   - FetchRma (kAmFetchRma) with a bad chunk, range, version or session: a typed
//     kAmFetchRmaReply with no rkey; a good one names the serving copy, which the peer reads
//     with RMA get and compares (so a wrong address or rkey fails the test);
//   - PushRma (kAmPushRma) with a valid header but a malformed rkey (garbage bytes, all ones, a
//     truncated packed rkey, one byte): each must get INVALID_ARGUMENT (not a crash, not
//     silence) and leave the gradient slots unchanged; then a push by RMA from the peer's real
//     region lands (the slots change), so the checks above could see a change.
//   - PushRma with the well-formed rkey of a region the peer has freed (StaleRkeyIsRefused, shm
//     only): INVALID_ARGUMENT, the shard keeps serving (UCX 1.13's ucp_ep_rkey_unpack crashed
//     the shard here; ucx::Worker::Get now probes posix keys with UCT first).
//   Not covered: a well-formed rkey with a forged address (the documented trust limit,
//   docs/protocol.md).
// Over tcp UCX emulates RMA (the peer's UCX serves the get from its own memory), so the rkey
// cases there check our layout check, not what UCX would do with the key.
// CI time: ~3 s over tcp and ~1 s over shm on top of the tcp-only version.
// The control-plane cases do not depend on the UCX transport and run once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "raw_socket.h"
#include "zps/common/bytes.h"
#include "zps/common/crc32c.h"
#include "zps/common/frame.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/common/ucx.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"

namespace zps {
namespace {

using namespace std::chrono_literals;
using rpc::testing::HelloPayload;
using rpc::testing::RawSocket;

constexpr char kToken[] = "bad-input-test-token";

// A data-plane peer that speaks raw UCX: crafted headers, replies collected by request id.
class RawPeer {
 public:
  // What a kAmFetchRmaReply said.
  struct RmaReply {
    Status status;
    int64_t version = -1;
    uint64_t remote_address = 0;
    std::vector<std::byte> rkey;
  };

  Status Connect(uint16_t port, const std::string& tls) {
    ZPS_ASSIGN_OR_RETURN(ctx_, ucx::Context::Create({.transports = tls}));
    ZPS_ASSIGN_OR_RETURN(worker_, ucx::Worker::Create(*ctx_, {.thread_name = "raw-peer"}));
    ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(msg::kAmFetchReply, [this](ucx::AmMessage& m) {
      auto h = msg::FetchReplyHeader::Decode(m.header());
      if (h.ok()) Deliver(h->request, msg::StatusFromWire(h->code, h->message));
    }));
    ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(msg::kAmPushReply, [this](ucx::AmMessage& m) {
      auto h = msg::PushReplyHeader::Decode(m.header());
      if (h.ok()) Deliver(h->request, msg::StatusFromWire(h->code, h->message));
    }));
    ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(msg::kAmFetchRmaReply, [this](ucx::AmMessage& m) {
      auto h = msg::FetchRmaReplyHeader::Decode(m.header());
      if (!h.ok()) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        rma_replies_[h->request] = {msg::StatusFromWire(h->code, h->message), h->version,
                                    h->remote_address, h->rkey};
      }
      Deliver(h->request, Status::Ok());
    }));
    ZPS_RETURN_IF_ERROR(worker_->Start());
    rpc::ClientOptions co{"127.0.0.1",        port, kToken, rpc::PeerRole::kWorker, 1, "raw-peer",
                          worker_->Address(), 5000};
    ZPS_ASSIGN_OR_RETURN(rpc_, rpc::Client::Connect(co));
    session_ = rpc_->session_token();
    ZPS_ASSIGN_OR_RETURN(ep_, worker_->Connect(rpc_->hello_reply_extra()));
    return Status::Ok();
  }
  ~RawPeer() {
    if (worker_) worker_->Stop();
  }
  uint64_t session() const { return session_; }

  // Sends a push (header as given, with a fresh request id) and waits for the reply.
  Status Push(msg::PushHeader h, std::vector<std::byte> data) {
    h.request = ++next_;
    auto f = Expect(h.request);
    auto keep = std::make_shared<std::vector<std::byte>>(std::move(data));
    worker_->SendAm(ep_, msg::kAmPush, h.Encode(), *keep, keep, [](Status) {});
    return Await(std::move(f));
  }
  // A push by RMA (kAmPushRma): `data` is attached only to test that the shard refuses it.
  Status PushRma(msg::PushRmaHeader h, std::vector<std::byte> data = {}) {
    h.push.request = ++next_;
    auto f = Expect(h.push.request);
    auto keep = std::make_shared<std::vector<std::byte>>(std::move(data));
    worker_->SendAm(ep_, msg::kAmPushRma, h.Encode(), *keep, keep, [](Status) {});
    return Await(std::move(f));
  }
  Status Fetch(msg::FetchHeader h) {
    h.request = ++next_;
    auto f = Expect(h.request);
    worker_->SendAm(ep_, msg::kAmFetch, h.Encode(), {}, nullptr, [](Status) {});
    return Await(std::move(f));
  }
  // A fetch by RMA: the shard answers where the data is (kAmFetchRmaReply). A reply of another
  // kind (kAmFetchReply, for a copy outside the serving region) leaves `rkey` empty.
  RmaReply FetchRma(msg::FetchHeader h) {
    h.request = ++next_;
    auto f = Expect(h.request);
    worker_->SendAm(ep_, msg::kAmFetchRma, h.Encode(), {}, nullptr, [](Status) {});
    Status s = Await(std::move(f));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rma_replies_.find(h.request);
    if (it == rma_replies_.end()) return {s.ok() ? Internal("not an RMA reply") : s};
    RmaReply r = std::move(it->second);
    rma_replies_.erase(it);
    return r;
  }
  // RMA get of `n` bytes from the shard (a FetchRma reply's address and rkey).
  Result<std::vector<std::byte>> Get(uint64_t address, std::span<const std::byte> rkey, size_t n) {
    auto buf = std::make_shared<std::vector<std::byte>>(n, std::byte{0});
    std::promise<Status> p;
    auto f = p.get_future();
    worker_->Get(ep_, *buf, address, rkey, buf, [&p](Status s) { p.set_value(std::move(s)); });
    ZPS_RETURN_IF_ERROR(Await(std::move(f)));
    return *buf;
  }
  // A UCX region of this peer's own (pushes by RMA read from it).
  Result<std::unique_ptr<ucx::MemoryRegion>> Allocate(size_t n) { return ctx_->Allocate(n); }
  // Bytes that decode as no header at all: the shard drops them (and must stay up).
  void SendGarbage(uint16_t id) {
    std::vector<std::byte> junk(7, std::byte{0x5a});
    worker_->SendAm(ep_, id, junk, {}, nullptr, [](Status) {});
  }

 private:
  std::future<Status> Expect(uint64_t request) {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_[request].get_future();
  }
  Status Await(std::future<Status> f) {
    if (f.wait_for(10s) != std::future_status::ready) return DeadlineExceeded("no reply");
    return f.get();
  }
  void Deliver(uint64_t request, Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(request);
    if (it == pending_.end()) return;
    it->second.set_value(std::move(s));
    pending_.erase(it);
  }

  std::unique_ptr<ucx::Context> ctx_;
  std::unique_ptr<ucx::Worker> worker_;
  std::unique_ptr<rpc::Client> rpc_;
  ucx::Endpoint ep_;
  uint64_t session_ = 0;
  uint64_t next_ = 1000;
  std::mutex mu_;
  std::map<uint64_t, std::promise<Status>> pending_;
  std::map<uint64_t, RmaReply> rma_replies_;
};

// The control-plane cases (TEST_F) run over tcp; DataPlaneBadInputTest repeats the data-plane
// ones per UCX transport.
class BadInputTest : public ::testing::Test {
 protected:
  virtual std::string Tls() const { return "tcp"; }
  void SetUp() override {
    server::ShardServerOptions o;
    o.ordinal = 0;
    o.shards = 1;
    o.port = 0;
    o.bind_address = "127.0.0.1";
    o.token = kToken;
    o.ucx_tls = Tls();
    o.metrics_port = 0;
    o.optimizer_threads = 1;
    auto s = server::ShardServer::Create(o);
    ASSERT_THAT(s, IsOk());
    server_ = std::move(*s);
    ASSERT_THAT(server_->Start(), IsOk());
    port_ = server_->port();

    // A job of two parameters in 2 chunks of 256 elements, world size 2, fp16 grads.
    auto layout = Layout::Build({{"w", {300}}, {"b", {20}}},
                                {.chunk_elems = 256, .align_elems = 64, .num_shards = 1});
    ASSERT_THAT(layout, IsOk());
    server::JobSpec job{*layout, {}, {}, {}};
    job.shard.world_size = 2;
    job.shard.grad_dtype = DType::kF16;
    worker::WorkerOptions wo;
    wo.endpoint = "127.0.0.1:" + std::to_string(port_);
    wo.token = kToken;
    wo.ucx_tls = Tls();
    wo.op_timeout = 10s;
    auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
    ASSERT_THAT(c, IsOk());
    client_ = std::move(*c);
    for (uint32_t p = 0; p < 2; ++p) {
      std::vector<float> v(client_->layout().param_numel(p), 0.25f + p);
      ASSERT_THAT(client_->PushInitial(p, v), IsOk());
    }
    ASSERT_THAT(client_->FlushPushes(), IsOk());
    Status rc = raw_.Connect(port_, Tls());
    ASSERT_THAT(rc, IsOk());
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Stop();
  }

  // The CRCs of every chunk: "the stored state".
  std::vector<std::pair<uint32_t, uint32_t>> StateCrcs() {
    auto r = client_->CallShard(0, msg::kChunkCrcs, msg::ChunkCrcsRequest{0}.Encode());
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return {};
    auto m = msg::ChunkCrcs::Decode(*r);
    EXPECT_THAT(m, IsOk());
    return m.ok() ? m->crcs : std::vector<std::pair<uint32_t, uint32_t>>{};
  }
  // The gradient slots of the step in progress (the Status document's gradient_crc): what a
  // push could reach. StateCrcs does not cover them.
  uint64_t GradientCrc() {
    auto r = client_->CallShard(0, msg::kStatus, {});
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return 0;
    auto j =
        nlohmann::json::parse(std::string(reinterpret_cast<const char*>(r->data()), r->size()));
    EXPECT_TRUE(j.contains("gradient_crc"));
    return j.value("gradient_crc", uint64_t{0});
  }
  void ExpectServing() {
    auto st = client_->CallShard(0, msg::kStatus, {});
    EXPECT_THAT(st, IsOk()) << "server stopped serving: " << st.status().ToString();
  }

  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::Client> client_;
  RawPeer raw_;
  uint16_t port_ = 0;
};

class DataPlaneBadInputTest : public BadInputTest,
                              public ::testing::WithParamInterface<std::string> {
 protected:
  std::string Tls() const override { return GetParam(); }
};

std::vector<std::byte> Halves(size_t n) {
  std::vector<std::byte> b(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = FloatToHalf(0.5f);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

TEST_P(DataPlaneBadInputTest, DataPlaneErrorsAreTypedAndChangeNothing) {
  const auto before = StateCrcs();
  ASSERT_EQ(before.size(), 2u);
  const uint64_t grads_before = GradientCrc();
  const uint64_t s = raw_.session();
  struct Case {
    const char* what;
    msg::PushHeader h;
    size_t elems;
    Code code;
  } cases[] = {
      {"chunk id out of range", {s, 0, 0, 99, 0, 16, 1, DType::kF16}, 16, Code::kOutOfRange},
      {"range past the chunk", {s, 0, 0, 0, 250, 16, 1, DType::kF16}, 16, Code::kOutOfRange},
      {"range into padding", {s, 0, 0, 1, 40, 40, 1, DType::kF16}, 40, Code::kOutOfRange},
      {"wrong dtype", {s, 0, 0, 0, 0, 16, 1, DType::kBF16}, 16, Code::kInvalidArgument},
      {"wrong size", {s, 0, 0, 0, 0, 16, 1, DType::kF16}, 15, Code::kInvalidArgument},
      {"rank out of range", {s, 0, 0, 0, 0, 16, 7, DType::kF16}, 16, Code::kInvalidArgument},
      // The raw peer's session is rank 1's: it may not push as rank 0.
      {"another session's rank", {s, 0, 0, 0, 0, 16, 0, DType::kF16}, 16, Code::kInvalidArgument},
      {"stale step", {s, 0, -2, 0, 0, 16, 1, DType::kF16}, 16, Code::kFailedPrecondition},
      {"future step", {s, 0, 3, 0, 0, 16, 1, DType::kF16}, 16, Code::kFailedPrecondition},
      {"wrong session token",
       {s ^ 0x5555, 0, 0, 0, 0, 16, 1, DType::kF16},
       16,
       Code::kUnauthenticated},
  };
  for (const auto& c : cases) {
    Status st = raw_.Push(c.h, Halves(c.elems));
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.ToString();
    EXPECT_FALSE(st.message().empty()) << c.what;
  }
  // None of them reached a gradient slot.
  EXPECT_EQ(GradientCrc(), grads_before);
  // A duplicate push from the same rank: the first is accepted (the slots change), the second
  // refused; from here on nothing may change them.
  ASSERT_THAT(raw_.Push({s, 0, 0, 0, 0, 16, 1, DType::kF16}, Halves(16)), IsOk());
  const uint64_t grads_accepted = GradientCrc();
  EXPECT_NE(grads_accepted, grads_before);
  Status dup = raw_.Push({s, 0, 0, 0, 0, 16, 1, DType::kF16}, Halves(16));
  EXPECT_EQ(dup.code(), Code::kAlreadyExists) << dup.ToString();
  // Fetches: out-of-range chunk, range, a version far ahead, a bad token.
  EXPECT_EQ(raw_.Fetch({s, 0, 42, 0, 8, 0}).code(), Code::kOutOfRange);
  EXPECT_EQ(raw_.Fetch({s, 0, 0, 200, 100, 0}).code(), Code::kOutOfRange);
  EXPECT_EQ(raw_.Fetch({s, 0, 0, 0, 8, 9}).code(), Code::kFailedPrecondition);
  EXPECT_EQ(raw_.Fetch({s + 1, 0, 0, 0, 8, 0}).code(), Code::kUnauthenticated);
  EXPECT_THAT(raw_.Fetch({s, 0, 0, 0, 8, 0}), IsOk());
  // Pushes by RMA are validated as pushes before the shard reads anything (the rkey below is
  // never unpacked: every case fails first); one that carries data is refused.
  const std::vector<std::byte> bogus_rkey(24, std::byte{0x11});
  EXPECT_EQ(raw_.PushRma({{s ^ 1, 0, 0, 0, 0, 16, 1, DType::kF16}, 4096, bogus_rkey}).code(),
            Code::kUnauthenticated);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 99, 0, 16, 1, DType::kF16}, 4096, bogus_rkey}).code(),
            Code::kOutOfRange);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 0, 0, 16, 1, DType::kBF16}, 4096, bogus_rkey}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      raw_.PushRma({{s, 0, 0, 0, 16, 16, 1, DType::kF16}, 4096, bogus_rkey}, Halves(16)).code(),
      Code::kInvalidArgument);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 0, 0, 16, 1, DType::kF16}, 4096, bogus_rkey}).code(),
            Code::kAlreadyExists);  // rank 1 pushed [0, 16) of chunk 0 above
  raw_.SendGarbage(msg::kAmPushRma);
  raw_.SendGarbage(msg::kAmPush);
  raw_.SendGarbage(msg::kAmFetch);
  // An out-of-range parameter id is refused by the worker library before anything is sent.
  EXPECT_EQ(client_->Fetch(99, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(client_->PushGrad(99, 0, std::vector<float>(4)).code(), Code::kOutOfRange);

  ExpectServing();
  // Stored state (master, m, v, serving) unchanged, and the gradient slots hold only the one
  // accepted push.
  EXPECT_EQ(StateCrcs(), before);
  EXPECT_EQ(GradientCrc(), grads_accepted);
}

// Fetches and pushes by RMA, the shared-memory data path, fed bad input (see the file header).
TEST_P(DataPlaneBadInputTest, RmaErrorsAreTypedAndChangeNothing) {
  const auto before = StateCrcs();
  ASSERT_EQ(before.size(), 2u);
  const uint64_t grads_before = GradientCrc();
  const uint64_t s = raw_.session();
  // FetchRma with bad input: a typed kAmFetchRmaReply, and never an rkey.
  struct FetchCase {
    const char* what;
    msg::FetchHeader h;
    Code code;
  } fetch_cases[] = {
      {"chunk id out of range", {s, 0, 42, 0, 8, 0}, Code::kOutOfRange},
      {"range past the chunk", {s, 0, 0, 200, 100, 0}, Code::kOutOfRange},
      {"range past the last chunk's end", {s, 0, 1, 80, 16, 0}, Code::kOutOfRange},
      {"huge length", {s, 0, 0, 0, ~0ull >> 1, 0}, Code::kOutOfRange},
      {"version far ahead", {s, 0, 0, 0, 8, 9}, Code::kFailedPrecondition},
      {"wrong session token", {s + 1, 0, 0, 0, 8, 0}, Code::kUnauthenticated},
  };
  for (const auto& c : fetch_cases) {
    RawPeer::RmaReply r = raw_.FetchRma(c.h);
    EXPECT_EQ(r.status.code(), c.code) << c.what << ": " << r.status.ToString();
    EXPECT_FALSE(r.status.message().empty()) << c.what;
    EXPECT_TRUE(r.rkey.empty()) << c.what;
  }
  // A good one names the serving copy (bf16 of the initial 0.25): read it and compare.
  {
    RawPeer::RmaReply r = raw_.FetchRma({s, 0, 0, 8, 16, 0});
    ASSERT_THAT(r.status, IsOk());
    EXPECT_EQ(r.version, 0);
    ASSERT_FALSE(r.rkey.empty());
    auto got = raw_.Get(r.remote_address, r.rkey, 16 * 2);
    ASSERT_THAT(got, IsOk());
    for (size_t i = 0; i < 16; ++i) {
      uint16_t b;
      std::memcpy(&b, got->data() + 2 * i, 2);
      EXPECT_EQ(b, FloatToBf16(0.25f)) << "serving element " << 8 + i;
    }
  }

  // Pushes by RMA whose header is valid (rank 1, step 0, fp16, 16 elements) but whose rkey is
  // malformed: refused with INVALID_ARGUMENT before UCX parses it (ucx::Worker::Get; UCX 1.13
  // itself reads past such a key, and aborts the process on some), nothing written.
  auto region = raw_.Allocate(4096);
  ASSERT_THAT(region, IsOk());
  {
    const auto h = Halves(16);
    std::memcpy((*region)->memory().data(), h.data(), h.size());
  }
  const std::vector<std::byte> good_rkey((*region)->rkey().begin(), (*region)->rkey().end());
  const msg::PushHeader ph{s, 0, 0, 1, 0, 16, 1, DType::kF16};
  const uint64_t base = (*region)->remote_address();
  // Each case names its own range of chunk 0 (16 elements at 16 k), so a case the shard
  // wrongly accepted cannot hide the next one behind an "already pushed" refusal.
  struct PushCase {
    const char* what;
    uint64_t address;
    std::vector<std::byte> rkey;
  } push_cases[] = {
      {"garbage rkey", base, std::vector<std::byte>(24, std::byte{0x11})},
      {"all-ones rkey", base, std::vector<std::byte>(64, std::byte{0xff})},
      {"truncated rkey", base,
       std::vector<std::byte>(good_rkey.begin(), good_rkey.begin() + good_rkey.size() / 2)},
      {"one-byte rkey", base, std::vector<std::byte>(1, good_rkey.front())},
  };
  uint64_t k = 0;
  for (const auto& c : push_cases) {
    msg::PushHeader h = ph;
    h.chunk = 0;
    h.offset = 16 * ++k;
    Status st = raw_.PushRma({h, c.address, c.rkey});
    EXPECT_FALSE(st.ok()) << c.what << ": accepted";
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.what << ": " << st.ToString();
    EXPECT_FALSE(st.message().empty()) << c.what;
    ExpectServing();
    EXPECT_EQ(GradientCrc(), grads_before) << c.what << " changed the gradient slots";
  }
  EXPECT_EQ(StateCrcs(), before);

  // The real region: the push lands, and a repeat is a duplicate.
  ASSERT_THAT(raw_.PushRma({ph, base, good_rkey}), IsOk());
  const uint64_t grads_accepted = GradientCrc();
  EXPECT_NE(grads_accepted, grads_before);
  EXPECT_EQ(raw_.PushRma({ph, base, good_rkey}).code(), Code::kAlreadyExists);
  ExpectServing();
  EXPECT_EQ(StateCrcs(), before);
  EXPECT_EQ(GradientCrc(), grads_accepted);
}

// KNOWN BUG, not fixed (UCX 1.13): the well-formed packed rkey of a region its owner has freed
// (or of a worker that exited after sending a PushRma that the shard had not read yet) makes
// the shard's ucp_ep_rkey_unpack fail to open the posix segment ("open(/proc/<pid>/fd/<n>)
// failed"), and UCX's own error path then frees an uninitialised transport key: SIGSEGV in
// uct_posix_rkey_release. Run it with --gtest_also_run_disabled_tests to see it; it passes once
// the shard survives that (a UCX fix, or a check of the segment before unpacking).
TEST_P(DataPlaneBadInputTest, StaleRkeyIsRefused) {
  if (Tls() != "shm") GTEST_SKIP() << "over tcp the peer's own UCX serves emulated RMA";
  const uint64_t grads_before = GradientCrc();
  std::vector<std::byte> stale_rkey;
  uint64_t stale_address = 0;
  {
    auto gone = raw_.Allocate(4096);
    ASSERT_THAT(gone, IsOk());
    stale_rkey.assign((*gone)->rkey().begin(), (*gone)->rkey().end());
    stale_address = (*gone)->remote_address();
  }  // unmapped here: its rkey names memory that no longer exists
  Status st =
      raw_.PushRma({{raw_.session(), 0, 0, 0, 0, 16, 1, DType::kF16}, stale_address, stale_rkey});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), Code::kDeadlineExceeded) << "the shard never answered";
  ExpectServing();
  EXPECT_EQ(GradientCrc(), grads_before);
}

INSTANTIATE_TEST_SUITE_P(Transports, DataPlaneBadInputTest, ::testing::Values("tcp", "shm"),
                         [](const auto& p) { return p.param; });

TEST_F(BadInputTest, ControlPlaneGarbageClosesOnlyThatConnection) {
  const auto before = StateCrcs();
  auto good_frame = [](uint16_t type, std::span<const std::byte> payload) {
    return EncodeFrame(type, 1, payload);
  };
  {  // garbage bytes
    RawSocket s(port_);
    std::vector<std::byte> junk(64, std::byte{0xab});
    ASSERT_TRUE(s.Send(junk));
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // wrong magic
    RawSocket s(port_);
    auto f = good_frame(kTypeHello, HelloPayload(kToken));
    f[0] = std::byte{'X'};
    ASSERT_TRUE(s.Send(f));
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // wrong protocol version in the header
    RawSocket s(port_);
    auto f = good_frame(kTypeHello, HelloPayload(kToken));
    f[4] = std::byte{9};
    ASSERT_TRUE(s.Send(f));
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // a length field over the bound
    RawSocket s(port_);
    auto f = good_frame(kTypeHello, HelloPayload(kToken));
    uint32_t huge = kMaxPayloadBytes + 1;
    std::memcpy(f.data() + 16, &huge, 4);
    ASSERT_TRUE(s.Send(f));
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // a truncated frame, then EOF
    RawSocket s(port_);
    auto f = good_frame(kTypeHello, HelloPayload(kToken));
    ASSERT_TRUE(s.Send(std::span(f).first(f.size() - 3)));
    s.ShutdownWrite();
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // a bad CRC
    RawSocket s(port_);
    auto f = good_frame(kTypeHello, HelloPayload(kToken));
    f.back() ^= std::byte{1};
    ASSERT_TRUE(s.Send(f));
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // a wrong token: an Unauthenticated error frame, then close
    RawSocket s(port_);
    ASSERT_TRUE(s.Send(good_frame(kTypeHello, HelloPayload("not-the-token"))));
    auto reply = s.ReadFrame(3s);
    ASSERT_TRUE(reply.has_value());
    auto h = DecodeFrameHeader(std::span(*reply).first(kFrameHeaderBytes), kMaxPayloadBytes);
    ASSERT_THAT(h, IsOk());
    EXPECT_EQ(h->type, kTypeError);
    EXPECT_TRUE(s.WaitClosed(3s));
  }
  {  // an unknown type after a good hello: a typed error, the connection stays
    RawSocket s(port_);
    ASSERT_TRUE(s.Send(good_frame(kTypeHello, HelloPayload(kToken))));
    ASSERT_TRUE(s.ReadFrame(3s).has_value());
    ASSERT_TRUE(s.Send(EncodeFrame(0x1234, 2, {})));
    auto reply = s.ReadFrame(3s);
    ASSERT_TRUE(reply.has_value());
    auto h = DecodeFrameHeader(std::span(*reply).first(kFrameHeaderBytes), kMaxPayloadBytes);
    ASSERT_THAT(h, IsOk());
    EXPECT_EQ(h->type, kTypeError);
    auto err = DecodeErrorPayload(std::span(*reply).subspan(kFrameHeaderBytes));
    EXPECT_EQ(err.code(), Code::kUnimplemented);
  }
  {  // malformed payloads of known types get InvalidArgument
    rpc::ClientOptions co{"127.0.0.1", port_, kToken, rpc::PeerRole::kTool, 0, "tool", {}, 3000};
    auto c = rpc::Client::Connect(co);
    ASSERT_THAT(c, IsOk());
    std::vector<std::byte> junk(3, std::byte{1});
    for (uint16_t t :
         {msg::kJoin, msg::kReport, msg::kAwaitCommit, msg::kRegisterShard, msg::kChunkCrcs}) {
      EXPECT_EQ((*c)->Call(t, junk, 3s).status().code(), Code::kInvalidArgument) << t;
    }
    // A report for a step that is not current, and a chunk of another shard.
    msg::Report rep{5, 0, {{0, 1.0, false}}};
    EXPECT_EQ((*c)->Call(msg::kReport, rep.Encode(), 3s).status().code(),
              Code::kFailedPrecondition);
  }
  {  // a client that connects and never speaks is closed after the hello timeout (5 s)
    RawSocket s(port_);
    EXPECT_TRUE(s.WaitClosed(10s));
  }
  ExpectServing();
  EXPECT_EQ(StateCrcs(), before);
}

}  // namespace
}  // namespace zps
