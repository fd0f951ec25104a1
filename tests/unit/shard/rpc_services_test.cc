// The plain classes under the shard's RPC handlers (server/src/shard/rpc_service.h), in-process:
// ChunkCrcs/ReadMaster over a ShardState (shard_queries.h), the coordinator's caller checks
// (CoordinatorService) and the rendezvous generations (KvService).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "coordinator/coordinator_service.h"
#include "coordinator/kv_service.h"
#include "shard/shard_queries.h"
#include "shard_steps.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Chunks of 128 elements over 2 shards: shard 0 owns chunks 0 (p0[0..128)) and 2 (p1).
class ShardQueriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = Layout::Build({{"p0", {200}}, {"p1", {5, 10}}},
                           {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
    ASSERT_THAT(l, IsOk());
    layout_ = *l;
    auto s = ShardState::Create(layout_, 0, {ReductionMode::kServerSum, 1, DType::kF32},
                                OptimizerConfig{}, nullptr);
    ASSERT_THAT(s, IsOk());
    st_ = std::move(*s);
  }
  void Init() {
    std::vector<float> v(128);
    std::iota(v.begin(), v.end(), 1.0f);
    for (auto [chunk, n] : {std::pair<uint32_t, uint64_t>{0, 128}, {2, 50}}) {
      ASSERT_THAT(testing::Push(*st_, {kInitStep, chunk, 0, n, 0, DType::kF32}, v.data()), IsOk());
    }
    ASSERT_EQ(st_->version(), 0);
  }
  Layout layout_;
  std::unique_ptr<ShardState> st_;
};

TEST_F(ShardQueriesTest, NoJobOrOlderVersionIsUnavailable) {
  EXPECT_THAT(ChunkCrcsOf(nullptr, {}), StatusIs(Code::kUnavailable, HasSubstr("no job yet")));
  EXPECT_THAT(ReadMasterOf(nullptr, {}), StatusIs(Code::kUnavailable, HasSubstr("no job yet")));
  // Not initialised: version -1.
  EXPECT_THAT(ChunkCrcsOf(st_.get(), {0}), StatusIs(Code::kUnavailable, HasSubstr("version -1")));
  EXPECT_THAT(ReadMasterOf(st_.get(), {0, 0, 0, 1}), StatusIs(Code::kUnavailable));
  Init();
  EXPECT_THAT(ChunkCrcsOf(st_.get(), {1}), StatusIs(Code::kUnavailable, HasSubstr("version 0")));
  EXPECT_THAT(ReadMasterOf(st_.get(), {1, 0, 0, 1}), StatusIs(Code::kUnavailable));
}

TEST_F(ShardQueriesTest, ChunkCrcsListsEveryLocalChunkInOrder) {
  Init();
  auto r = ChunkCrcsOf(st_.get(), {0});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->version, 0);
  ASSERT_EQ(r->crcs.size(), 2u);
  EXPECT_EQ(r->crcs[0].first, 0u);
  EXPECT_EQ(r->crcs[1].first, 2u);
  EXPECT_EQ(r->crcs[0].second, *st_->ChunkCrc(0));
  EXPECT_EQ(r->crcs[1].second, *st_->ChunkCrc(2));
  EXPECT_NE(r->crcs[0].second, r->crcs[1].second);
}

TEST_F(ShardQueriesTest, ReadMasterReturnsTheRangeOfALocalChunk) {
  Init();
  auto r = ReadMasterOf(st_.get(), {0, 0, 10, 4});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->version, 0);
  EXPECT_THAT(r->values, ElementsAre(11.0f, 12.0f, 13.0f, 14.0f));
  r = ReadMasterOf(st_.get(), {0, 0, 128, 0});  // an empty range at the end
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->values.empty());
}

TEST_F(ShardQueriesTest, ReadMasterRefusesOtherChunksAndRangesPastTheEnd) {
  Init();
  EXPECT_THAT(ReadMasterOf(st_.get(), {0, 1, 0, 1}), StatusIs(Code::kOutOfRange));  // shard 1's
  EXPECT_THAT(ReadMasterOf(st_.get(), {0, 0, 120, 9}),
              StatusIs(Code::kOutOfRange, HasSubstr("past chunk 0")));
  EXPECT_THAT(ReadMasterOf(st_.get(), {0, 0, 129, 0}), StatusIs(Code::kOutOfRange));
  // A length that would wrap offset + length.
  EXPECT_THAT(ReadMasterOf(st_.get(), {0, 0, 1, ~uint64_t{0}}), StatusIs(Code::kOutOfRange));
}

rpc::Peer ShardPeer(uint32_t ordinal) {
  rpc::Peer p;
  p.role = rpc::PeerRole::kShard;
  p.rank = ordinal;
  p.session_id = 40 + ordinal;
  return p;
}

TEST(CoordinatorService, ShardCallsMustComeFromTheShardItself) {
  Coordinator c(2);
  KvStore kv;
  CoordinatorService s(&c, &kv);
  rpc::Peer worker;
  worker.role = rpc::PeerRole::kWorker;
  worker.rank = 1;
  EXPECT_THAT(s.RegisterShard(worker, {1, "h:1"}),
              StatusIs(Code::kInvalidArgument, HasSubstr("shard 1's own connection")));
  EXPECT_THAT(s.RegisterShard(ShardPeer(0), {1, "h:1"}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(s.RegisterShard(ShardPeer(1), {1, "h:1"}), IsOk());
  msg::CheckpointReport report;
  report.ordinal = 1;
  EXPECT_THAT(s.CheckpointReport(ShardPeer(0), report), StatusIs(Code::kInvalidArgument));
  msg::ShardSync sync;
  sync.ordinal = 1;
  EXPECT_THAT(s.ShardSync(worker, sync), StatusIs(Code::kInvalidArgument));
}

TEST(CoordinatorService, JoinWithABadSpecNamesIt) {
  Coordinator c(1);
  KvStore kv;
  CoordinatorService s(&c, &kv);
  msg::Join join;
  join.job_spec = std::vector<std::byte>(7, std::byte{0xff});
  bool answered = false;
  s.Join({}, join, [&](const Result<msg::JoinReply>& r) {
    answered = true;
    EXPECT_THAT(r, ::testing::Not(IsOk()));
    if (!r.ok()) {
      EXPECT_THAT(r.status().message(), HasSubstr("job spec"));
    }
  });
  EXPECT_TRUE(answered);
}

TEST(KvService, SetAndGetInTheCurrentGeneration) {
  Coordinator c(1);
  KvStore kv;
  KvService s(&c, &kv);
  auto set = s.Set({0, "k", {std::byte{1}, std::byte{2}}});
  ASSERT_THAT(set, IsOk());
  EXPECT_EQ(set->generation, kv.generation());  // 0 names the current generation
  EXPECT_TRUE(set->value.empty());
  bool answered = false;
  s.Get({0, "k", 0}, [&](const Result<msg::KvReply>& r) {
    answered = true;
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->generation, kv.generation());
    EXPECT_THAT(r->value, ElementsAre(std::byte{1}, std::byte{2}));
  });
  EXPECT_TRUE(answered);
}

TEST(KvService, NothingIsServedOnceTheCoordinatorStopped) {
  Coordinator c(1);
  KvStore kv;
  KvService s(&c, &kv);
  c.Shutdown(Unavailable("the coordinator is shutting down; retry"));
  EXPECT_THAT(s.Set({0, "k", {}}), StatusIs(Code::kUnavailable));
  bool answered = false;
  s.Get({0, "k", 1000}, [&](const Result<msg::KvReply>& r) {
    answered = true;
    EXPECT_THAT(r, StatusIs(Code::kUnavailable));
  });
  EXPECT_TRUE(answered);
}

}  // namespace
}  // namespace zps::server
