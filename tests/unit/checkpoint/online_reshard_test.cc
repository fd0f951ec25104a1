// The online reshard in one process (the endpoints are real rpc servers on loopback, one thread
// per shard), for what an operator sees of it: the zps_reshard_* series of ReshardProgress while
// it moves a job from 2 to 3 shards, and while a shard waits for a peer that never comes. The
// multi-process runs, with crashes and donors, are tests/integration/scale/scale.sh.
#include "zps/server/online_reshard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_test_util.h"
#include "zps/common/free_port.h"
#include "zps/common/metrics.h"
#include "zps/server/checkpoint.h"
#include "zps/server/job.h"
#include "zps/server/reshard_progress.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {
namespace {

namespace fs = std::filesystem;

// A free loopback port (zps/common/free_port.h); the test fails without one.
uint16_t FreePort() {
  auto port = FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status().ToString();
  return port.ok() ? *port : 0;
}

JobSpec SmallJob(uint32_t shards) {
  JobSpec j;
  j.layout = SmallLayout(shards, 1536);
  return j;
}

// `<root>/s<i>/checkpoints` for each old shard, with a checkpoint of `step`.
void MakeOldStores(const std::string& root, uint32_t shards, int64_t step) {
  const JobSpec job = SmallJob(shards);
  for (uint32_t s = 0; s < shards; ++s) {
    const std::string dir = root + "/s" + std::to_string(s);
    fs::create_directories(dir);
    CheckpointOptions o;
    o.slice_bytes = 4096;
    auto store = CheckpointStore::Open(dir + "/checkpoints", o);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->SetIdentity(job.layout, s), IsOk());
    ASSERT_THAT((*store)->PutJobSpec(job), IsOk());
    ASSERT_THAT(WriteCheckpoint(**store, job.layout, s, step), IsOk());
  }
}

struct Shard {
  metrics::Registry registry;
  ReshardProgress progress;
  Result<std::unique_ptr<ReshardHandle>> result = Unavailable("not run");
};

TEST(ReshardOnline, ProgressCountsEveryChunkOfATwoToThreeReshard) {
  TempDir dir;
  MakeOldStores(dir.sub("j"), 2, 20);
  constexpr uint32_t kShards = 3;
  OnlineReshardOptions o;
  for (uint32_t i = 0; i < kShards; ++i) {
    o.peers += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(FreePort());
  }
  o.timeout_s = 60;
  std::vector<std::unique_ptr<Shard>> shards;
  for (uint32_t i = 0; i < kShards; ++i) {
    shards.push_back(std::make_unique<Shard>());
    auto p = ReshardProgress::Create(shards.back()->registry);
    ASSERT_THAT(p, IsOk());
    shards.back()->progress = *p;
  }
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kShards; ++i) {
    threads.emplace_back([&, i] {
      auto peers = o.PeerList();
      ASSERT_THAT(peers, IsOk());
      OnlineReshardOptions mine = o;
      mine.port = std::stoi((*peers)[i].substr((*peers)[i].rfind(':') + 1));
      const ReshardSelf self{dir.sub("j") + "/s" + std::to_string(i), i, kShards, "127.0.0.1",
                             "reshard-test-token"};
      shards[i]->result = ReshardAtStart(mine, self, shards[i]->progress);
    });
  }
  for (auto& t : threads) t.join();

  const Layout three = SmallJob(kShards).layout;
  uint64_t fetched = 0, served = 0;
  for (uint32_t i = 0; i < kShards; ++i) {
    SCOPED_TRACE("shard " + std::to_string(i));
    const Shard& s = *shards[i];
    ASSERT_THAT(s.result, IsOk());
    EXPECT_EQ(s.progress.phase(), ReshardPhase::kDone);
    EXPECT_EQ(s.progress.chunks_total(), three.ChunksOfShard(i).size());
    EXPECT_EQ(s.progress.chunks_copied() + s.progress.chunks_fetched(), s.progress.chunks_total());
    EXPECT_EQ(s.progress.wait_seconds(), 0.0);
    EXPECT_GE(s.progress.peers_reached(), 1u);  // shard 0 at least
    fetched += s.progress.fetched_bytes();
    served += s.progress.served_bytes();
    CheckpointOptions ro;
    ro.read_only = true;
    ro.create_if_missing = false;
    auto store =
        CheckpointStore::Open(dir.sub("j") + "/s" + std::to_string(i) + "/checkpoints", ro);
    ASSERT_THAT(store, IsOk());
    ExpectCheckpoint(**store, three, i, 20);
    // The series are what the registry exports.
    const std::string text = s.registry.Serialize();
    EXPECT_NE(text.find("zps_reshard_phase 4"), std::string::npos) << text;
    EXPECT_NE(text.find("zps_reshard_chunks{kind=\"total\"} " +
                        std::to_string(s.progress.chunks_total())),
              std::string::npos)
        << text;
  }
  // Shard 2 had no old store: every chunk and the state blob came from its peers.
  EXPECT_EQ(shards[2]->progress.chunks_copied(), 0u);
  EXPECT_EQ(shards[2]->progress.chunks_fetched(), shards[2]->progress.chunks_total());
  EXPECT_GT(shards[2]->progress.fetched_bytes(), 0u);
  EXPECT_EQ(shards[2]->progress.served_bytes(), 0u);
  // Shard 0 counted every new store committed before it switched.
  EXPECT_EQ(shards[0]->progress.committed(), kShards);
  // What was fetched was served: each reply counted once at each end.
  EXPECT_EQ(fetched, served);
}

TEST(ReshardOnline, ProgressShowsAWaitForAPeerThatNeverComes) {
  TempDir dir;
  OnlineReshardOptions o;
  o.peers = "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.1:" + std::to_string(FreePort());
  o.timeout_s = 1;
  metrics::Registry registry;
  auto progress = ReshardProgress::Create(registry);
  ASSERT_THAT(progress, IsOk());
  fs::create_directories(dir.sub("s1"));
  const ReshardSelf self{dir.sub("s1"), 1, 2, "127.0.0.1", "reshard-test-token"};
  // Shard 1 of a new volume asks shard 0 for the job; nothing answers.
  EXPECT_THAT(ReshardAtStart(o, self, *progress).status(), StatusIs(Code::kDeadlineExceeded));
  EXPECT_EQ(progress->phase(), ReshardPhase::kFailed);
  EXPECT_GT(progress->wait_seconds(), 0.0);  // the last value the wait reached
  EXPECT_EQ(progress->peers_reached(), 0u);
  EXPECT_EQ(progress->chunks_total(), 0u);
  // Registered twice in one registry is refused.
  EXPECT_THAT(ReshardProgress::Create(registry).status(), StatusIs(Code::kAlreadyExists));
}

TEST(ReshardOnline, ProgressStaysAtNoneWithoutAReshard) {
  TempDir dir;
  MakeOldStores(dir.sub("j"), 2, 20);
  OnlineReshardOptions o;
  o.peers = "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.1:" + std::to_string(FreePort());
  metrics::Registry registry;
  auto progress = ReshardProgress::Create(registry);
  ASSERT_THAT(progress, IsOk());
  // Shard 1 of the same count: its store is current, nothing to ask anyone.
  const ReshardSelf self{dir.sub("j") + "/s1", 1, 2, "127.0.0.1", "reshard-test-token"};
  auto r = ReshardAtStart(o, self, *progress);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(progress->phase(), ReshardPhase::kNone);
  EXPECT_EQ(progress->peers_reached(), 0u);
}

}  // namespace
}  // namespace zps::server::testing
