// The server-side optimizer surface end to end, through real zps-server processes and two worker
// Clients (ranks 0 and 1) in this process, over UCX tcp (fetch by AM) and shared memory (fetch by
// RMA get): a job with fp32 serving copies, two parameter groups, a frozen parameter, a WarmupLR
// schedule and accumulation over k = 2 micro-batches. After one step every fetched fp32 copy must
// equal, bit for bit, the fused optimizer applied directly to the initial values with the sum of
// the four contributions in contributor order (rank * 2 + micro), the commit's grad scale, the
// scheduled lr and the group's weight decay; the frozen parameter must be unchanged.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shard_process.h"
#include "zps/server/job.h"
#include "zps/server/lr_schedule.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"

namespace zps {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "optimizer-surface-test-token";
constexpr int kShards = 2;
constexpr uint32_t kWorld = 2, kMicro = 2;

class OptimizerSurfaceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start(kShards, GetParam(), kToken, "zps-optimizer-surface"));
  }

  void TearDown() override {
    clients_.clear();
    cluster_.shards.clear();
  }

  LocalShards cluster_;
  std::vector<std::unique_ptr<worker::Client>> clients_;
};

TEST_P(OptimizerSurfaceTest, GroupsFrozenScheduleAccumulationAndFp32Serving) {
  // Three parameters; the first spans both shards' chunks.
  auto layout = Layout::Build({{"emb", {1500}}, {"w", {700}}, {"frozen", {300}}},
                              {.chunk_elems = 1024, .align_elems = 64, .num_shards = kShards});
  ASSERT_THAT(layout, IsOk());
  server::JobSpec job{*layout, {}, {}, {}};
  job.shard.world_size = kWorld;
  job.shard.serving_dtype = DType::kF32;
  job.shard.accumulation_steps = kMicro;
  job.shard.param_groups = {{1e-2f, 0.1f}, {3e-3f, 0.0f}};
  job.shard.param_group = {0, 1, 1};
  job.shard.frozen = {0, 0, 1};
  job.shard.lr_schedule.kind = server::LrScheduleKind::kWarmupLR;
  job.shard.lr_schedule.warmup_min_lr = 1e-3;
  job.shard.lr_schedule.warmup_max_lr = 2e-2;
  job.shard.lr_schedule.warmup_num_steps = 4;
  job.shard.lr_schedule.warmup_type = server::WarmupType::kLinear;
  job.commit.grad_divisor = kWorld * kMicro;  // the mean over every micro-batch of every rank
  ASSERT_THAT(job.Validate(), IsOk());
  const auto spec = job.Serialize();
  for (uint32_t r = 0; r < kWorld; ++r) {
    worker::WorkerOptions wo;
    wo.endpoint = cluster_.endpoint;
    wo.token = kToken;
    wo.rank = r;
    wo.ucx_tls = GetParam();
    wo.connect_timeout = 60s;
    wo.op_timeout = 60s;
    auto c = worker::Client::Connect(wo, spec, job.Hash());
    ASSERT_THAT(c, IsOk());
    EXPECT_EQ((*c)->accumulation_steps(), kMicro);
    clients_.push_back(std::move(*c));
  }
  const Layout& l = clients_[0]->layout();
  std::vector<std::vector<float>> init;
  for (uint32_t p = 0; p < l.num_params(); ++p) {
    init.push_back(Values(l.param_numel(p), 10 + p, 1.0f));
    ASSERT_THAT(clients_[0]->PushInitial(p, init[p]), IsOk());
  }
  ASSERT_THAT(clients_[0]->FlushPushes(), IsOk());
  for (uint32_t p = 0; p < l.num_params(); ++p) {
    auto b = clients_[1]->Fetch(p, 0);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ((*b)->dtype, DType::kF32);
    ASSERT_EQ((*b)->bytes().size(), init[p].size() * 4);
    EXPECT_EQ(0, std::memcmp((*b)->bytes().data(), init[p].data(), init[p].size() * 4));
  }

  // Step 0: every rank pushes both micro-batches of the trained parameters, in any order.
  auto grad = [&](uint32_t p, uint32_t rank, uint32_t micro) {
    return Values(l.param_numel(p), 100 * p + 10 * rank + micro, 0.1f);
  };
  EXPECT_EQ(clients_[0]->PushGrad(0, 0, grad(0, 0, 0), kMicro).code(), Code::kInvalidArgument);
  for (uint32_t micro : {1u, 0u}) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      for (uint32_t p = 0; p < 2; ++p) {
        ASSERT_THAT(clients_[r]->PushGrad(p, 0, grad(p, r, micro), micro), IsOk());
      }
    }
  }
  for (auto& c : clients_) ASSERT_THAT(c->FlushPushes(), IsOk());
  auto ci = clients_[0]->AwaitCommit(0);
  ASSERT_THAT(ci, IsOk());
  ASSERT_FALSE(ci->skip);
  EXPECT_EQ(ci->optimizer_step, 1);

  // Direct: the same fused optimizer on the parameter alone (the update is element-wise).
  const server::LrSchedule sched(job.shard.lr_schedule);
  for (uint32_t p = 0; p < l.num_params(); ++p) {
    std::vector<float> want = init[p];
    if (!job.shard.frozen[p]) {
      const server::ParamGroup& g = job.shard.param_groups[job.shard.param_group[p]];
      std::vector<float> sum = grad(p, 0, 0);
      for (uint32_t c = 1; c < kWorld * kMicro; ++c) {
        const auto gc = grad(p, c / kMicro, c % kMicro);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += gc[i];
      }
      auto opt = server::Optimizer::Create(job.optimizer, nullptr);
      ASSERT_THAT(opt, IsOk());
      std::vector<float> m(want.size(), 0.0f), v(want.size(), 0.0f);
      server::UpdateParams up;
      up.step = 1;
      up.grad_scale = ci->grad_scale;
      up.lr = sched.LrFor(0, g.lr);  // the first update: WarmupLR's warmup_min_lr
      up.weight_decay = g.weight_decay;
      ASSERT_THAT((*opt)->Update({want, std::as_writable_bytes(std::span<float>(m)),
                                  std::as_writable_bytes(std::span<float>(v))},
                                 {sum.data(), DType::kF32, sum.size()}, up),
                  IsOk());
    }
    auto b = clients_[1]->Fetch(p, 1);
    ASSERT_THAT(b, IsOk());
    ASSERT_EQ((*b)->bytes().size(), want.size() * 4);
    EXPECT_EQ(0, std::memcmp((*b)->bytes().data(), want.data(), want.size() * 4))
        << "parameter " << l.spec(p).name;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, OptimizerSurfaceTest, ::testing::Values("tcp", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace zps
