// GPU tests of the CUDA backend and the NCCL collectives (ctest label `gpu`). Without a device
// the program prints why and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
// CI also runs it against tests/fakes/fake_cudart.cc (ZPS_CUDART;
// integration.worker_cuda_fake_runtime): the backend's and the Client's logic around the runtime,
// not CUDA itself.
//
//   - CudaBackend: bytes through a pinned slot to the device and back are the same bytes, with
//     more copies than max_inflight queued at once (each held until its event completed);
//     staging slots are reused, and a buffer larger than a slot is staged outside the pool.
//   - A worker Client fetching into the backend's staging slots from a real zps-server
//     process (the slots registered with its UCX context), copies to the device and back (the
//     served bf16 bits), a gradient pushed from device memory (the commit's norm is its norm),
//     and a second Client refused the same slots.
//   - NcclCollectives at world sizes 2 to min(devices, 4) (one rank per device, as threads),
//     rendezvous through a real zps-server's kv: reduce-scatter with a size not divisible by
//     the world size (integer-valued inputs, exact sums), all-gather and all-reduce. Skipped
//     with fewer than two devices. The same on host buffers (NcclOptions::host_buffers: what
//     zps.torch's BucketReducer drives), at world size 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shard_process.h"
#include "zps/common/dtype.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"
#include "zps/worker/collectives.h"
#include "zps/worker/cuda_backend.h"
#include "zps/worker/nccl_collectives.h"

namespace zps::worker {
namespace {

using namespace std::chrono_literals;

TEST(CudaBackendGpuTest, RoundTripThroughSlots) {
  auto be =
      CudaBackend::Create({.device = 0, .slot_bytes = 1 << 20, .slots = 2, .max_inflight = 2});
  // Six 1 MiB copies through two slots, at most two in flight: the pool is exhausted after two
  // (the rest overflow), and every slot is free again once the copies completed.
  ASSERT_THAT(be, IsOk());
  constexpr size_t kBytes = 1 << 20;
  constexpr int kCopies = 6;
  std::vector<DeviceBuffer> dev;
  for (int k = 0; k < kCopies; ++k) {
    auto host = (*be)->staging()->Allocate(kBytes);
    ASSERT_THAT(host, IsOk());
    for (size_t i = 0; i < kBytes; ++i)
      host->data()[i] = static_cast<std::byte>((i * 7 + k) & 0xff);
    auto d = (*be)->AllocateDeviceMemory(kBytes);
    ASSERT_THAT(d, IsOk());
    auto keep = std::make_shared<DeviceBuffer>(std::move(*host));
    ASSERT_THAT((*be)->CopyToDevice(d->data(), {keep->data(), kBytes}, keep, 0), IsOk());
    dev.push_back(std::move(*d));
  }
  ASSERT_THAT((*be)->Synchronize(), IsOk());
  EXPECT_EQ((*be)->stats().free_slots, 2u);
  for (int k = 0; k < kCopies; ++k) {
    auto back = (*be)->CopyToHost(dev[k].data(), kBytes, 0);
    ASSERT_THAT(back, IsOk());
    for (size_t i = 0; i < kBytes; i += 4099) {
      ASSERT_EQ(back->data()[i], static_cast<std::byte>((i * 7 + k) & 0xff)) << k << " " << i;
    }
  }
  auto big = (*be)->staging()->Allocate(3 << 20);  // larger than the pool
  ASSERT_THAT(big, IsOk());
  EXPECT_GE((*be)->stats().overflow_allocs, 1u);
  auto two = (*be)->staging()->Allocate(2 << 20);  // both slots, one run
  ASSERT_THAT(two, IsOk());
  EXPECT_EQ((*be)->stats().free_slots, 0u);
  EXPECT_EQ((*be)->stats().h2d_bytes, uint64_t{kBytes} * kCopies);
}

// One zps-server shard process with a token file, on a free port.
struct Cluster {
  Cluster() {
    port = FreePort();
    dir = "/tmp/zps-cuda-test-" + std::to_string(::getpid()) + "-" + std::to_string(port);
    (void)std::system(("mkdir -p " + dir + " && printf cuda-token > " + dir + "/token").c_str());
    shard = std::make_unique<ShardProcess>(std::vector<std::string>{
        ZPS_SERVER_BIN, "--ordinal=0", "--shards=1", "--port=" + std::to_string(port),
        "--bind=127.0.0.1", "--token-file=" + dir + "/token", "--metrics-port=0", "--threads=1",
        "--log-level=warning", "--ucx-tls=tcp"});
  }
  ~Cluster() {
    shard.reset();
    (void)std::system(("rm -rf " + dir).c_str());
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
  uint16_t port = 0;
  std::string dir;
  std::unique_ptr<ShardProcess> shard;
};

TEST(CudaBackendGpuTest, ClientFetchesIntoSlotsAndPushesFromTheDevice) {
  Cluster cluster;
  ASSERT_TRUE(cluster.shard->started());
  auto be =
      CudaBackend::Create({.device = 0, .slot_bytes = 256 << 10, .slots = 16, .max_inflight = 2});
  ASSERT_THAT(be, IsOk());
  // Two parameters: one within a slot, one spanning several (1.4 MB of bf16).
  const std::vector<int64_t> sizes = {5000, 700000};
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < sizes.size(); ++i) specs.push_back({"p" + std::to_string(i), {sizes[i]}});
  auto layout = Layout::Build(specs, {.chunk_elems = 1 << 18, .align_elems = 64, .num_shards = 1});
  ASSERT_THAT(layout, IsOk());
  server::JobSpec job{std::move(*layout), {}, {}, {}};
  job.optimizer.kind = server::OptimizerKind::kSgd;
  WorkerOptions wo;
  wo.endpoint = cluster.endpoint();
  wo.token = "cuda-token";
  wo.ucx_tls = "tcp";
  wo.device = (*be)->staging();
  wo.op_timeout = 60s;
  auto client = Client::Connect(wo, job.Serialize(), job.Hash());
  ASSERT_THAT(client, IsOk());
  // A second Client cannot register the same slots.
  auto other = Client::Connect(wo, job.Serialize(), job.Hash());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), Code::kFailedPrecondition) << other.status().ToString();
  // Values exact in bf16: quarters of small integers.
  auto value = [](size_t p, int64_t i) { return static_cast<float>((i * 7 + p) % 64) * 0.25f; };
  for (size_t p = 0; p < sizes.size(); ++p) {
    std::vector<float> init(sizes[p]);
    for (int64_t i = 0; i < sizes[p]; ++i) init[i] = value(p, i);
    ASSERT_THAT((*client)->PushInitial(p, init), IsOk());
  }
  ASSERT_THAT((*client)->FlushPushes(), IsOk());
  const uint32_t slots_free = (*be)->stats().free_slots;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const size_t bytes = sizes[p] * 2;
    auto buf = (*client)->Fetch(p, 0);
    ASSERT_THAT(buf, IsOk());
    EXPECT_LT((*be)->stats().free_slots, slots_free) << "the fetch did not land in a slot";
    auto dev = (*be)->AllocateDeviceMemory(bytes);
    ASSERT_THAT(dev, IsOk());
    ASSERT_THAT((*be)->CopyToDevice(dev->data(), (*buf)->bytes(), *buf, 0), IsOk());
    buf->reset();  // the copy holds the slot until it completed
    auto back = (*be)->CopyToHost(dev->data(), bytes, 0);
    ASSERT_THAT(back, IsOk());
    const auto* bf = reinterpret_cast<const uint16_t*>(back->data());
    for (int64_t i = 0; i < sizes[p]; ++i) {
      ASSERT_EQ(Bf16ToFloat(bf[i]), value(p, i)) << "param " << p << " element " << i;
    }
  }
  ASSERT_THAT((*be)->Synchronize(), IsOk());
  // Every slot comes back (the Client's UCX thread may drop its last reference to a completed
  // fetch a moment after Wait returned: poll, bounded).
  for (int i = 0; i < 1000 && (*be)->stats().free_slots != 16u; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ((*be)->stats().free_slots, 16u);
  EXPECT_EQ((*be)->stats().overflow_allocs, 0u);
  // Gradients from device memory: 0.5 everywhere, so the norm is 0.5 * sqrt(numel).
  double sq = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    std::vector<float> g(sizes[p], 0.5f);
    sq += 0.25 * sizes[p];
    auto dev = (*be)->AllocateDeviceMemory(g.size() * 4);
    ASSERT_THAT(dev, IsOk());
    auto keep = std::make_shared<std::vector<float>>(g);
    ASSERT_TRUE(
        (*be)
            ->CopyToDevice(dev->data(), std::as_bytes(std::span<const float>(*keep)), keep, 0)
            .ok());
    auto host = (*be)->CopyToHost(dev->data(), g.size() * 4, 0);
    ASSERT_THAT(host, IsOk());
    ASSERT_TRUE(
        (*client)->PushGrad(p, 0, {reinterpret_cast<const float*>(host->data()), g.size()}).ok());
  }
  ASSERT_THAT((*client)->FlushPushes(), IsOk());
  auto commit = (*client)->AwaitCommit(0);
  ASSERT_THAT(commit, IsOk());
  EXPECT_NEAR(commit->global_norm, std::sqrt(sq), 1e-3 * std::sqrt(sq));
  EXPECT_GT((*be)->stats().d2h_bytes, 0u);
}

int DeviceCount() {
  int n = 0;
  while (n < 8 && CudaAvailable(n).ok()) ++n;
  return n;
}

TEST(NcclGpuTest, CollectivesAcrossDevices) {
  const int devices = DeviceCount();
  if (devices < 2) GTEST_SKIP() << "NCCL needs one device per rank; " << devices << " here";
  if (!NcclAvailable().ok()) GTEST_SKIP() << NcclAvailable().ToString();
  const uint16_t port = FreePort();
  const std::string dir = "/tmp/zps-nccl-test-" + std::to_string(::getpid());
  (void)std::system(("mkdir -p " + dir + " && printf nccl-token > " + dir + "/token").c_str());
  ShardProcess shard({ZPS_SERVER_BIN, "--ordinal=0", "--shards=1", "--port=" + std::to_string(port),
                      "--bind=127.0.0.1", "--token-file=" + dir + "/token", "--metrics-port=0",
                      "--threads=1", "--log-level=warning", "--ucx-tls=tcp"});
  ASSERT_TRUE(shard.started());
  for (uint32_t world = 2; world <= static_cast<uint32_t>(std::min(devices, 4)); ++world) {
    const uint64_t n = 4099;
    std::vector<std::thread> ranks;
    std::vector<std::string> errors(world);
    for (uint32_t r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        auto fail = [&](const std::string& m) { errors[r] = m; };
        auto be = CudaBackend::Create(
            {.device = static_cast<int>(r), .slot_bytes = 1 << 20, .slots = 2, .max_inflight = 2});
        if (!be.ok()) return fail(be.status().ToString());
        auto c = NcclCollectives::Create({.endpoint = "127.0.0.1:" + std::to_string(port),
                                          .token = "nccl-token",
                                          .rank = r,
                                          .world_size = world,
                                          .prefix = "nccl-test/" + std::to_string(world),
                                          .device = static_cast<int>(r),
                                          .timeout = 60s});
        if (!c.ok()) return fail(c.status().ToString());
        std::vector<float> in(n);
        for (uint64_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 13) + r);
        auto d = (*be)->AllocateDeviceMemory(n * sizeof(float));
        if (!d.ok()) return fail(d.status().ToString());
        auto keep = std::make_shared<std::vector<float>>(in);
        if (auto s = (*be)->CopyToDevice(d->data(), std::as_bytes(std::span<const float>(*keep)),
                                         keep, 0);
            !s.ok())
          return fail(s.ToString());
        if (auto s = (*be)->Synchronize(); !s.ok()) return fail(s.ToString());
        float* dev = reinterpret_cast<float*>(d->data());
        if (auto s = (*c)->ReduceScatter({dev, n}); !s.ok()) return fail(s.ToString());
        auto back = (*be)->CopyToHost(dev, n * sizeof(float), 0);
        if (!back.ok()) return fail(back.status().ToString());
        const float* out = reinterpret_cast<const float*>(back->data());
        const SliceRange mine = RankSlice(n, world, r);
        const float ranks_sum = static_cast<float>(world * (world - 1) / 2);
        for (uint64_t i = mine.begin; i < mine.begin + mine.length; ++i) {
          const float want = static_cast<float>(world * (i % 13)) + ranks_sum;
          if (out[i] != want) return fail("reduce-scatter element " + std::to_string(i));
        }
        if (auto s = (*c)->AllReduce({dev, n}); !s.ok()) return fail(s.ToString());
        const size_t block = 64;
        auto g = (*be)->AllocateDeviceMemory(block * world);
        if (!g.ok()) return fail(g.status().ToString());
        auto mark = std::make_shared<std::vector<std::byte>>(block, static_cast<std::byte>(r + 1));
        if (auto s = (*be)->CopyToDevice(g->data() + r * block, *mark, mark, 0); !s.ok()) {
          return fail(s.ToString());
        }
        if (auto s = (*be)->Synchronize(); !s.ok()) return fail(s.ToString());
        if (auto s = (*c)->AllGather({g->data(), block * world}, block); !s.ok()) {
          return fail(s.ToString());
        }
        auto gathered = (*be)->CopyToHost(g->data(), block * world, 0);
        if (!gathered.ok()) return fail(gathered.status().ToString());
        for (uint32_t q = 0; q < world; ++q) {
          if (gathered->data()[q * block] != static_cast<std::byte>(q + 1)) {
            return fail("all-gather block " + std::to_string(q));
          }
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (uint32_t r = 0; r < world; ++r)
      EXPECT_EQ(errors[r], "") << "world " << world << " rank " << r;
  }
  (void)std::system(("rm -rf " + dir).c_str());
}

TEST(NcclGpuTest, HostBuffersAreStagedThroughTheDevice) {
  if (DeviceCount() < 2) GTEST_SKIP() << "NCCL needs one device per rank";
  if (!NcclAvailable().ok()) GTEST_SKIP() << NcclAvailable().ToString();
  const uint16_t port = FreePort();
  const std::string dir = "/tmp/zps-nccl-host-test-" + std::to_string(::getpid());
  (void)std::system(("mkdir -p " + dir + " && printf nccl-token > " + dir + "/token").c_str());
  ShardProcess shard({ZPS_SERVER_BIN, "--ordinal=0", "--shards=1", "--port=" + std::to_string(port),
                      "--bind=127.0.0.1", "--token-file=" + dir + "/token", "--metrics-port=0",
                      "--threads=1", "--log-level=warning", "--ucx-tls=tcp"});
  ASSERT_TRUE(shard.started());
  constexpr uint32_t world = 2;
  const uint64_t n = 4099;
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto fail = [&](const std::string& m) { errors[r] = m; };
      auto c = NcclCollectives::Create({.endpoint = "127.0.0.1:" + std::to_string(port),
                                        .token = "nccl-token",
                                        .rank = r,
                                        .world_size = world,
                                        .prefix = "nccl-host-test",
                                        .device = static_cast<int>(r),
                                        .timeout = 60s,
                                        .host_buffers = true});
      if (!c.ok()) return fail(c.status().ToString());
      std::vector<float> v(n);
      for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 13) + r);
      if (auto s = (*c)->ReduceScatter(v); !s.ok()) return fail(s.ToString());
      const SliceRange mine = RankSlice(n, world, r);
      for (uint64_t i = mine.begin; i < mine.begin + mine.length; ++i) {
        if (v[i] != static_cast<float>(2 * (i % 13) + 1)) {
          return fail("reduce-scatter element " + std::to_string(i));
        }
      }
      std::vector<float> all(n, static_cast<float>(r + 1));
      if (auto s = (*c)->AllReduce(all); !s.ok()) return fail(s.ToString());
      if (all[0] != 3.0f || all[n - 1] != 3.0f) return fail("all-reduce");
      const size_t block = 32;  // a CheckedCollectives descriptor
      std::vector<std::byte> g(block * world);
      std::fill_n(g.begin() + r * block, block, static_cast<std::byte>(r + 1));
      if (auto s = (*c)->AllGather(g, block); !s.ok()) return fail(s.ToString());
      for (uint32_t q = 0; q < world; ++q) {
        if (g[q * block] != static_cast<std::byte>(q + 1)) {
          return fail("all-gather block " + std::to_string(q));
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (uint32_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  (void)std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace zps::worker

int main(int argc, char** argv) {
  const zps::Status avail = zps::worker::CudaAvailable(0);
  if (!avail.ok()) {
    std::printf("skipped: %s\n", avail.ToString().c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
