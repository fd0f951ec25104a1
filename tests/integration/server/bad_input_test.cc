// Every kind of bad input from issue 3, sent to a real ShardServer (control plane over TCP, data
// plane over UCX tcp): each gets a clear error reply (or, for framing errors, a closed
// connection), the server keeps serving, and the stored state is unchanged (chunk CRCs).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
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
  Status Connect(uint16_t port) {
    ZPS_ASSIGN_OR_RETURN(ctx_, ucx::Context::Create({.transports = "tcp"}));
    ZPS_ASSIGN_OR_RETURN(worker_, ucx::Worker::Create(*ctx_, {.thread_name = "raw-peer"}));
    ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(msg::kAmFetchReply, [this](ucx::AmMessage& m) {
      auto h = msg::FetchReplyHeader::Decode(m.header());
      if (h.ok()) Deliver(h->request, msg::StatusFromWire(h->code, h->message));
    }));
    ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(msg::kAmPushReply, [this](ucx::AmMessage& m) {
      auto h = msg::PushReplyHeader::Decode(m.header());
      if (h.ok()) Deliver(h->request, msg::StatusFromWire(h->code, h->message));
    }));
    ZPS_RETURN_IF_ERROR(worker_->Start());
    rpc::ClientOptions co{"127.0.0.1", port, kToken, msg::kRoleWorker, 1, "raw-peer",
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
};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ShardServerOptions o;
    o.ordinal = 0;
    o.shards = 1;
    o.port = 0;
    o.bind_address = "127.0.0.1";
    o.token = kToken;
    o.ucx_tls = "tcp";
    o.metrics_port = 0;
    o.optimizer_threads = 1;
    auto s = server::ShardServer::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();

    // A job of two parameters in 2 chunks of 256 elements, world size 2, fp16 grads.
    auto layout = Layout::Build({{"w", {300}}, {"b", {20}}},
                                {.chunk_elems = 256, .align_elems = 64, .num_shards = 1});
    ASSERT_TRUE(layout.ok());
    server::JobSpec job{*layout, {}, {}, {}};
    job.shard.world_size = 2;
    job.shard.grad_dtype = DType::kF16;
    worker::WorkerOptions wo;
    wo.endpoint = "127.0.0.1:" + std::to_string(port_);
    wo.token = kToken;
    wo.ucx_tls = "tcp";
    wo.op_timeout = 10s;
    auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    for (uint32_t p = 0; p < 2; ++p) {
      std::vector<float> v(client_->layout().param_numel(p), 0.25f + p);
      ASSERT_TRUE(client_->PushInitial(p, v).ok());
    }
    ASSERT_TRUE(client_->FlushPushes().ok());
    ASSERT_TRUE(raw_.Connect(port_).ok());
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Stop();
  }

  // The CRCs of every chunk: "the stored state".
  std::vector<std::pair<uint32_t, uint32_t>> StateCrcs() {
    auto r = client_->CallShard(0, msg::kChunkCrcs, msg::ChunkCrcsRequest{0}.Encode());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    auto m = msg::ChunkCrcs::Decode(*r);
    EXPECT_TRUE(m.ok());
    return m.ok() ? m->crcs : std::vector<std::pair<uint32_t, uint32_t>>{};
  }
  // The gradient slots of the step in progress (the Status document's gradient_crc): what a
  // push could reach. StateCrcs does not cover them.
  uint64_t GradientCrc() {
    auto r = client_->CallShard(0, msg::kStatus, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return 0;
    auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(r->data()), r->size()));
    EXPECT_TRUE(j.contains("gradient_crc"));
    return j.value("gradient_crc", uint64_t{0});
  }
  void ExpectServing() {
    auto st = client_->CallShard(0, msg::kStatus, {});
    EXPECT_TRUE(st.ok()) << "server stopped serving: " << st.status().ToString();
  }

  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::Client> client_;
  RawPeer raw_;
  uint16_t port_ = 0;
};

std::vector<std::byte> Halves(size_t n) {
  std::vector<std::byte> b(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = FloatToHalf(0.5f);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

TEST_F(BadInputTest, DataPlaneErrorsAreTypedAndChangeNothing) {
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
      {"wrong session token", {s ^ 0x5555, 0, 0, 0, 0, 16, 1, DType::kF16}, 16,
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
  ASSERT_TRUE(raw_.Push({s, 0, 0, 0, 0, 16, 1, DType::kF16}, Halves(16)).ok());
  const uint64_t grads_accepted = GradientCrc();
  EXPECT_NE(grads_accepted, grads_before);
  Status dup = raw_.Push({s, 0, 0, 0, 0, 16, 1, DType::kF16}, Halves(16));
  EXPECT_EQ(dup.code(), Code::kAlreadyExists) << dup.ToString();
  // Fetches: out-of-range chunk, range, a version far ahead, a bad token.
  EXPECT_EQ(raw_.Fetch({s, 0, 42, 0, 8, 0}).code(), Code::kOutOfRange);
  EXPECT_EQ(raw_.Fetch({s, 0, 0, 200, 100, 0}).code(), Code::kOutOfRange);
  EXPECT_EQ(raw_.Fetch({s, 0, 0, 0, 8, 9}).code(), Code::kFailedPrecondition);
  EXPECT_EQ(raw_.Fetch({s + 1, 0, 0, 0, 8, 0}).code(), Code::kUnauthenticated);
  EXPECT_TRUE(raw_.Fetch({s, 0, 0, 0, 8, 0}).ok());
  // Pushes by RMA are validated as pushes before the shard reads anything (the rkey below is
  // never unpacked: every case fails first); one that carries data is refused.
  const std::vector<std::byte> bogus_rkey(24, std::byte{0x11});
  EXPECT_EQ(raw_.PushRma({{s ^ 1, 0, 0, 0, 0, 16, 1, DType::kF16}, 4096, bogus_rkey}).code(),
            Code::kUnauthenticated);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 99, 0, 16, 1, DType::kF16}, 4096, bogus_rkey}).code(),
            Code::kOutOfRange);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 0, 0, 16, 1, DType::kBF16}, 4096, bogus_rkey}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(raw_.PushRma({{s, 0, 0, 0, 16, 16, 1, DType::kF16}, 4096, bogus_rkey}, Halves(16))
                .code(),
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
    ASSERT_TRUE(h.ok());
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
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->type, kTypeError);
    auto err = DecodeErrorPayload(std::span(*reply).subspan(kFrameHeaderBytes));
    EXPECT_EQ(err.code(), Code::kUnimplemented);
  }
  {  // malformed payloads of known types get InvalidArgument
    rpc::ClientOptions co{"127.0.0.1", port_, kToken, msg::kRoleTool, 0, "tool", {}, 3000};
    auto c = rpc::Client::Connect(co);
    ASSERT_TRUE(c.ok());
    std::vector<std::byte> junk(3, std::byte{1});
    for (uint16_t t : {msg::kJoin, msg::kReport, msg::kAwaitCommit, msg::kRegisterShard,
                       msg::kChunkCrcs}) {
      EXPECT_EQ((*c)->Call(t, junk, 3s).status().code(), Code::kInvalidArgument) << t;
    }
    // A report for a step that is not current, and a chunk of another shard.
    msg::Report rep{5, 0, {{0, 1.0, false}}};
    EXPECT_EQ((*c)->Call(msg::kReport, rep.Encode(), 3s).status().code(), Code::kFailedPrecondition);
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
