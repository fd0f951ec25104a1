// One-sided fetches of published versions (protocol 3, docs/protocol.md "One-sided fetch of a
// published version"), through real zps-server processes over UCX shared memory: a worker that
// learned where a chunk's serving copy is reads it with RMA get and no request, at the version
// the shard's publish notice announced, and must see exactly that version's bits (checked
// against the shard's fp32 master read over the control plane); after its own push for a chunk
// it asks again; spilled serving copies (--serving-budget) always go by request.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shard_process.h"
#include "zps/common/dtype.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"

namespace zps {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "direct-fetch-test-token";
constexpr uint64_t kChunk = 2048;  // bf16: 4 KiB serving records
constexpr uint32_t kParams = 12;   // one chunk each

class DirectFetchTest : public ::testing::Test {
 protected:
  void TearDown() override {
    client_.reset();
    cluster_.shards.clear();
    if (!data_dir_.empty()) std::filesystem::remove_all(data_dir_);
  }

  void Connect(int shards, const std::vector<std::string>& extra = {}) {
    ASSERT_TRUE(cluster_.Start(shards, "shm", kToken, "zps-direct-fetch", extra));
    std::vector<ParamSpec> specs;
    for (uint32_t p = 0; p < kParams; ++p) {
      specs.push_back({"p" + std::to_string(p), {static_cast<int64_t>(kChunk)}});
    }
    auto layout = Layout::Build(
        specs,
        {.chunk_elems = kChunk, .align_elems = 64, .num_shards = static_cast<uint32_t>(shards)});
    ASSERT_THAT(layout, IsOk());
    server::JobSpec job{*layout, {}, {}, {}};
    job.optimizer.kind = server::OptimizerKind::kSgd;
    worker::WorkerOptions wo;
    wo.endpoint = cluster_.endpoint;
    wo.token = kToken;
    wo.ucx_tls = "shm";
    wo.connect_timeout = 60s;
    wo.op_timeout = 60s;
    auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
    ASSERT_THAT(c, IsOk());
    client_ = std::move(*c);
    for (uint32_t p = 0; p < kParams; ++p) {
      ASSERT_THAT(client_->PushInitial(p, Values(kChunk, 10 + p, 1.0f)), IsOk());
    }
    ASSERT_THAT(client_->FlushPushes(), IsOk());
  }

  // The serving copy the shard must hold at `version`: bf16 of its fp32 master.
  std::vector<uint16_t> Expected(uint32_t p, int64_t version) {
    const Layout& l = client_->layout();
    auto pieces = l.Pieces(p, 0, l.param_numel(p));
    EXPECT_THAT(pieces, IsOk());
    std::vector<float> master;
    for (const Piece& piece : *pieces) {
      msg::ReadMasterRequest req{version, piece.chunk, piece.chunk_offset, piece.length};
      auto r = client_->CallShard(l.shard_of_chunk(piece.chunk), msg::kReadMaster, req.Encode());
      EXPECT_THAT(r, IsOk());
      if (!r.ok()) return {};
      auto m = msg::MasterRange::Decode(*r);
      EXPECT_THAT(m, IsOk());
      EXPECT_EQ(m->version, version);
      master.insert(master.end(), m->values.begin(), m->values.end());
    }
    std::vector<uint16_t> out(master.size());
    ConvertF32ToBF16(master, out);
    return out;
  }

  // Fetches `p` at min_version `v` and checks its bits against the master at version `v`.
  void FetchAndCheck(uint32_t p, int64_t v) {
    auto b = client_->Fetch(p, v);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ((*b)->version, v) << "param " << p;
    const auto want = Expected(p, v);
    ASSERT_EQ((*b)->bytes().size(), want.size() * 2);
    EXPECT_EQ(0, std::memcmp((*b)->bytes().data(), want.data(), want.size() * 2))
        << "param " << p << " at version " << v;
  }

  void PushStep(int64_t step, uint32_t first, uint32_t end) {
    for (uint32_t p = first; p < end; ++p) {
      ASSERT_TRUE(
          client_->PushGrad(p, step, Values(kChunk, static_cast<uint32_t>(100 * step + p), 10.0f))
              .ok());
    }
    ASSERT_THAT(client_->FlushPushes(), IsOk());
  }

  LocalShards cluster_;
  std::unique_ptr<worker::Client> client_;
  std::string data_dir_;
};

TEST_F(DirectFetchTest, PublishedVersionIsReadWithoutAskingAndHasItsBits) {
  Connect(2);
  for (uint32_t p = 0; p < kParams; ++p) FetchAndCheck(p, 0);  // ask: learn the addresses
  EXPECT_EQ(client_->direct_fetches(), 0u);
  for (uint32_t p = 0; p < kParams; ++p) FetchAndCheck(p, 0);  // now one-sided
  EXPECT_EQ(client_->direct_fetches(), kParams);
  const std::vector<uint16_t> v0 = Expected(0, 0);

  // Step 0 committed: each shard publishes version 1 and tells the worker (a notice per shard).
  PushStep(0, 0, kParams);
  ASSERT_THAT(client_->AwaitCommit(0), IsOk());
  for (int i = 0; i < 3000 && client_->serving_notices() < 2; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(client_->serving_notices(), 2u) << "no publish notice from the shards";
  const uint64_t before = client_->direct_fetches();
  for (uint32_t p = 0; p < kParams; ++p) FetchAndCheck(p, 1);  // no request at all
  EXPECT_EQ(client_->direct_fetches(), before + kParams);
  // The update really changed the bits that were read one-sided.
  EXPECT_NE(Expected(0, 1), v0);

  // A push of step 1 for parameter 0: the shard may rewrite its chunk from now on, so a fetch
  // of it asks again (and still gets version 1); the other chunks stay one-sided.
  PushStep(1, 0, 1);
  const uint64_t after_push = client_->direct_fetches();
  FetchAndCheck(0, 1);
  EXPECT_EQ(client_->direct_fetches(), after_push);
  FetchAndCheck(1, 1);
  EXPECT_EQ(client_->direct_fetches(), after_push + 1);
  // A version not published yet is asked for (and answered once step 1 is published).
  auto pending = client_->FetchAsync(2, 2);
  PushStep(1, 1, kParams);
  auto b = pending.Wait(60s);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->version, 2);
  EXPECT_EQ(client_->direct_fetches(), after_push + 1);
  FetchAndCheck(2, 2);
}

TEST_F(DirectFetchTest, SpilledServingCopiesAreAlwaysAskedFor) {
  char tmpl[] = "/tmp/zps-direct-fetch-data-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  data_dir_ = tmpl;
  // 44 KiB: the 4 fetch staging buffers, the spill pipeline's 5 and 2 resident copies of 4 KiB;
  // the other 10 serving copies live in the spill file and are read back per fetch.
  Connect(1, {"--data-dir=" + data_dir_, "--serving-budget=44KiB"});
  for (int round = 0; round < 2; ++round) {
    for (uint32_t p = 0; p < kParams; ++p) FetchAndCheck(p, 0);
  }
  const uint64_t resident = client_->direct_fetches();
  EXPECT_GT(resident, 0u);
  EXPECT_LT(resident, kParams) << "a spilled serving copy was read one-sided";
  PushStep(0, 0, kParams);
  ASSERT_THAT(client_->AwaitCommit(0), IsOk());
  for (int i = 0; i < 3000 && client_->serving_notices() < 1; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(client_->serving_notices(), 1u);
  for (uint32_t p = 0; p < kParams; ++p) FetchAndCheck(p, 1);
  EXPECT_EQ(client_->direct_fetches(), 2 * resident);
}

}  // namespace
}  // namespace zps
