// worker::Client in-process against two real ShardServers in the same process (shard 0 the
// coordinator), over their real control plane (RPC on loopback) and data plane (UCX tcp): no
// zps-server processes. One step of SGD end to end: initial values, a fetch of version 0, a fetch
// of version 1 parked before the gradients are pushed, the pushes, the commit, and the served
// version 1 against the update computed here; and the Client's documented argument errors.
// The values are chosen so that every result is exact in bf16, so the comparison is equality.
#include "zps/worker/client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "client-test-token";
constexpr uint32_t kShards = 2;
constexpr float kLr = 0.5f;

float Initial(uint32_t param, uint64_t i) {
  return static_cast<float>((i + param) % 7) * 0.25f - 1;
}
float Grad(uint32_t param, uint64_t i) { return static_cast<float>((i + 2 * param) % 5) * 0.125f; }

std::vector<float> Served(const worker::ParamBuffer& b) {
  std::vector<float> out(b.bytes().size() / 2);
  const auto* words = reinterpret_cast<const uint16_t*>(b.bytes().data());
  for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16ToFloat(words[i]);
  return out;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t s = 0; s < kShards; ++s) {
      server::ShardServerOptions o;
      o.ordinal = static_cast<int>(s);
      o.shards = kShards;
      o.port = 0;
      o.bind_address = "127.0.0.1";
      o.token = kToken;
      o.ucx_tls = "tcp";
      o.metrics_port = 0;
      o.optimizer_threads = 1;
      if (s > 0) o.coordinator = "127.0.0.1:" + std::to_string(servers_[0]->port());
      auto server = server::ShardServer::Create(o);
      ASSERT_THAT(server, IsOk());
      servers_.push_back(std::move(*server));
      ASSERT_THAT(servers_.back()->Start(), IsOk());
    }
    // Three parameters over 256-element chunks on two shards: "b" spans chunks of both, so its
    // fetches and pushes fan out.
    auto layout = Layout::Build({{"a", {300}}, {"b", {1024}}, {"c", {20}}},
                                {.chunk_elems = 256, .align_elems = 64, .num_shards = kShards});
    ASSERT_THAT(layout, IsOk());
    server::JobSpec job{*layout, {}, {}, {}};
    job.optimizer.kind = OptimizerKind::kSgd;
    job.optimizer.lr = kLr;
    worker::WorkerOptions wo;
    wo.endpoint = "127.0.0.1:" + std::to_string(servers_[0]->port());
    wo.token = kToken;
    wo.ucx_tls = "tcp";
    wo.connect_timeout = 60s;
    wo.op_timeout = 60s;  // only a lost answer waits this long (DeadlineExceeded fails the test)
    auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
    ASSERT_THAT(c, IsOk());
    client_ = std::move(*c);
  }

  void TearDown() override {
    client_.reset();
    for (auto& s : servers_) s->Stop();
    servers_.clear();
  }

  uint64_t Numel(uint32_t p) const { return client_->layout().param_numel(p); }
  std::vector<float> Values(uint32_t p, float (*f)(uint32_t, uint64_t)) const {
    std::vector<float> v(Numel(p));
    for (uint64_t i = 0; i < v.size(); ++i) v[i] = f(p, i);
    return v;
  }

  std::vector<std::unique_ptr<server::ShardServer>> servers_;
  std::unique_ptr<worker::Client> client_;
};

TEST_F(ClientTest, OneStepEndToEndServesTheUpdatedParameters) {
  EXPECT_EQ(client_->resume_step(), 0);
  EXPECT_EQ(client_->serving_dtype(), DType::kBF16);
  const uint32_t params = client_->layout().num_params();
  for (uint32_t p = 0; p < params; ++p) {
    ASSERT_THAT(client_->PushInitial(p, Values(p, Initial)), IsOk());
  }
  ASSERT_THAT(client_->FlushPushes(), IsOk());
  for (uint32_t p = 0; p < params; ++p) {
    auto b = client_->Fetch(p, 0);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ((*b)->version, 0);
    EXPECT_EQ(Served(**b), Values(p, Initial)) << "param " << p;
  }
  // Parked on the shards until step 0 is published.
  worker::FetchOp parked = client_->FetchAsync(1, 1);
  for (uint32_t p = 0; p < params; ++p) {
    ASSERT_THAT(client_->PushGrad(p, 0, Values(p, Grad)), IsOk());
  }
  ASSERT_THAT(client_->FlushPushes(), IsOk());
  auto commit = client_->AwaitCommit(0);
  ASSERT_THAT(commit, IsOk());
  EXPECT_EQ(commit->step, 0);
  EXPECT_FALSE(commit->skip);
  EXPECT_EQ(commit->optimizer_step, 1);
  EXPECT_EQ(commit->grad_scale, 1.0f);
  for (uint32_t p = 0; p < params; ++p) {
    std::vector<float> want(Numel(p));
    for (uint64_t i = 0; i < want.size(); ++i) want[i] = Initial(p, i) - kLr * Grad(p, i);
    auto b = p == 1 ? parked.Wait(client_->op_timeout()) : client_->Fetch(p, 1);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ((*b)->version, 1);
    EXPECT_EQ(Served(**b), want) << "param " << p;
  }
}

TEST_F(ClientTest, ArgumentErrorsAreReturnedAndTheClientGoesOn) {
  const uint32_t params = client_->layout().num_params();
  EXPECT_THAT(client_->PushGrad(params, 0, Values(0, Grad)), StatusIs(Code::kOutOfRange));
  std::vector<float> short_grad(Numel(0) - 1, 0.0f);
  EXPECT_THAT(client_->PushGrad(0, 0, short_grad), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(client_->PushGrad(0, 0, Values(0, Grad), /*micro=*/1),
              StatusIs(Code::kInvalidArgument));  // accumulation_steps is 1
  // Gradients already in the job's dtype (fp32 here), copied or not.
  const std::vector<std::byte> raw(Numel(0) * 4), short_raw(Numel(0) * 4 - 1);
  EXPECT_THAT(client_->PushGradRaw(params, 0, raw), StatusIs(Code::kOutOfRange));
  EXPECT_THAT(client_->PushGradRaw(0, 0, short_raw),
              StatusIs(Code::kInvalidArgument, "raw gradient has the wrong byte length"));
  EXPECT_THAT(client_->PushGradRaw(0, 0, raw, /*micro=*/1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(client_->PushGradShared(params, 0, raw, nullptr), StatusIs(Code::kOutOfRange));
  EXPECT_THAT(client_->PushGradShared(0, 0, short_raw, nullptr),
              StatusIs(Code::kInvalidArgument, "shared gradient has the wrong byte length"));
  EXPECT_THAT(client_->PushGradShared(0, 0, raw, nullptr, /*micro=*/1),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(client_->Fetch(params, 0).status(), StatusIs(Code::kOutOfRange));
  EXPECT_THAT(client_->FetchAsync(0, Numel(0), 1, 0).Wait(client_->op_timeout()).status(),
              StatusIs(Code::kOutOfRange));
  // None of these reached a shard: the job starts as usual.
  for (uint32_t p = 0; p < params; ++p) {
    ASSERT_THAT(client_->PushInitial(p, Values(p, Initial)), IsOk());
  }
  ASSERT_THAT(client_->FlushPushes(), IsOk());
  auto b = client_->Fetch(0, 0);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(Served(**b), Values(0, Initial));
}

}  // namespace
}  // namespace zps
