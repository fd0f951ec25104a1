// The coordinator's key-value rendezvous (KvSet/KvGet) and the Gloo collectives built on it,
// against a real zps-server process (shard 0 = the coordinator) on loopback: real Gloo over tcp,
// one GlooCollectives per rank, the ranks as threads of this process.
//
//   - CoordinatorKv: set/get, a get parked until another connection sets the key, a wait that
//     expires, bounds and a wrong token;
//   - ReduceScatter, AllGather and AllReduce at world sizes 1 to 4 with sizes not divisible by
//     the world size (1, 7, 1023, 4099 elements): integer-valued inputs (exact in any summation
//     order) checked against the expected sums on every rank's slice (RankSlice);
//   - determinism: the same random inputs reduce-scatter to the same bits twice;
//   - a lost peer fails a collective soon; SIGPIPE is ignored where it was at its default.
#include "zps/worker/collectives.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shard_process.h"
#include "zps/common/config.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"
#include "zps/worker/coordinator_kv.h"
#include "zps/worker/gloo_collectives.h"

namespace zps {
namespace {

using namespace std::chrono_literals;
constexpr char kToken[] = "collectives-test-token";

class CollectivesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/zps-collectives-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string token_file = *dir_ + "/token";
    FILE* f = std::fopen(token_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(kToken, f);
    std::fclose(f);
    const uint16_t port = FreePort();
    ASSERT_NE(port, 0);
    endpoint_ = new std::string("127.0.0.1:" + std::to_string(port));
    shard_ = new ShardProcess({ZPS_SERVER_BIN, "--ordinal=0", "--shards=1",
                               "--port=" + std::to_string(port), "--bind=127.0.0.1",
                               "--token-file=" + token_file, "--metrics-port=0", "--threads=1",
                               "--log-level=warning", "--ucx-tls=tcp"});
    ASSERT_TRUE(shard_->started());
  }
  static void TearDownTestSuite() {
    delete shard_;
    std::string cmd = "rm -rf " + *dir_;
    (void)std::system(cmd.c_str());
    delete dir_;
    delete endpoint_;
  }

  static Result<std::unique_ptr<worker::CoordinatorKv>> Kv(std::string token = kToken) {
    return worker::CoordinatorKv::Connect(
        {.endpoint = *endpoint_, .token = std::move(token), .rank = 0, .connect_timeout = 20s});
  }

  // Runs fn(rank, collectives) on `world` threads, each with its own communicator.
  static void RunRanks(uint32_t world, const std::string& prefix,
                       const std::function<void(uint32_t, worker::Collectives&)>& fn) {
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        worker::GlooOptions o;
        o.endpoint = *endpoint_;
        o.token = kToken;
        o.rank = r;
        o.world_size = world;
        o.prefix = prefix;
        o.hostname = "127.0.0.1";
        o.timeout = 60s;
        auto c = worker::GlooCollectives::Create(o);
        ASSERT_THAT(c, IsOk()) << "rank " << r << ": " << c.status().ToString();
        EXPECT_EQ((*c)->rank(), r);
        EXPECT_EQ((*c)->world_size(), world);
        fn(r, **c);
      });
    }
    for (auto& t : threads) t.join();
  }

  static std::string* dir_;
  static std::string* endpoint_;
  static ShardProcess* shard_;
};
std::string* CollectivesTest::dir_ = nullptr;
std::string* CollectivesTest::endpoint_ = nullptr;
ShardProcess* CollectivesTest::shard_ = nullptr;

std::vector<std::byte> Bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

TEST_F(CollectivesTest, KvSetGetWaitAndBounds) {
  auto a = Kv();
  ASSERT_THAT(a, IsOk());
  auto b = Kv();
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT((*a)->Set("kv-test/x", Bytes("hello")), IsOk());
  auto v = (*b)->Get("kv-test/x", 0ms);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, Bytes("hello"));
  EXPECT_NE((*a)->generation(), 0u);
  EXPECT_EQ((*a)->generation(), (*b)->generation());

  // A get parked until another connection sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_THAT((*a)->Set("kv-test/later", Bytes("late")), IsOk());
  });
  auto late = (*b)->Get("kv-test/later", 10000ms);
  setter.join();
  ASSERT_THAT(late, IsOk());
  EXPECT_EQ(*late, Bytes("late"));

  EXPECT_EQ((*b)->Get("kv-test/never", 100ms).status().code(), Code::kDeadlineExceeded);
  EXPECT_EQ((*b)->Get("kv-test/never", 0ms).status().code(), Code::kNotFound);
  EXPECT_EQ((*a)->Set("", Bytes("x")).code(), Code::kInvalidArgument);
  EXPECT_EQ((*a)->Set(std::string(600, 'k'), Bytes("x")).code(), Code::kInvalidArgument);
  EXPECT_EQ((*a)->Set("kv-test/big", std::vector<std::byte>((4u << 20) + 1)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Kv("wrong-token").status().code(), Code::kUnauthenticated);

  // A malformed request gets a typed error and the connection stays.
  auto hp = SplitHostPort(*endpoint_);
  ASSERT_THAT(hp, IsOk());
  auto raw = rpc::Client::Connect(
      {hp->first, hp->second, kToken, rpc::PeerRole::kTool, 0, "raw", {}, 5000});
  ASSERT_THAT(raw, IsOk());
  const std::vector<std::byte> junk(5, std::byte{0xff});
  EXPECT_EQ((*raw)->Call(msg::kKvSet, junk, 5s).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*raw)->Call(msg::kKvGet, junk, 5s).status().code(), Code::kInvalidArgument);
  // A generation that is not the current one: rebuild.
  msg::KvGet stale{(*a)->generation() + 5, "kv-test/x", 0};
  EXPECT_EQ((*raw)->Call(msg::kKvGet, stale.Encode(), 5s).status().code(), Code::kUnavailable);
  msg::KvGet ok{0, "kv-test/x", 0};
  auto okr = (*raw)->Call(msg::kKvGet, ok.Encode(), 5s);
  ASSERT_THAT(okr, IsOk());
  auto decoded = msg::KvReply::Decode(*okr);
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->value, Bytes("hello"));
}

// Integer-valued inputs: rank r's element i is (r + 1) * 1000 + i % 97, exact in any order.
float Input(uint32_t r, uint64_t i) { return static_cast<float>((r + 1) * 1000 + i % 97); }
float Sum(uint32_t world, uint64_t i) {
  float s = 0;
  for (uint32_t r = 0; r < world; ++r) s += Input(r, i);
  return s;
}

TEST_F(CollectivesTest, ReduceScatterAllGatherAllReduceOddSizes) {
  for (uint32_t world = 1; world <= 4; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    RunRanks(world, "ops-w" + std::to_string(world), [&](uint32_t r, worker::Collectives& c) {
      for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{1023}, uint64_t{4099}}) {
        // Reduce-scatter: this rank's slice holds the sum.
        std::vector<float> buf(n);
        for (uint64_t i = 0; i < n; ++i) buf[i] = Input(r, i);
        Status s = c.ReduceScatter(buf);
        ASSERT_THAT(s, IsOk());
        const worker::SliceRange mine = worker::RankSlice(n, world, r);
        for (uint64_t i = mine.begin; i < mine.begin + mine.length; ++i) {
          ASSERT_EQ(buf[i], Sum(world, i)) << "rank " << r << " n " << n << " i " << i;
        }
        // All-gather of byte blocks (the slices of a padded 2-byte array).
        const size_t block = worker::SliceElems(n, world) * 2;
        std::vector<std::byte> g(block * world, std::byte{0});
        for (size_t k = 0; k < block; ++k)
          g[r * block + k] = static_cast<std::byte>((r * 31 + k) & 0xff);
        s = c.AllGather(g, block);
        ASSERT_THAT(s, IsOk());
        for (uint32_t q = 0; q < world; ++q) {
          for (size_t k = 0; k < block; ++k) {
            ASSERT_EQ(g[q * block + k], static_cast<std::byte>((q * 31 + k) & 0xff));
          }
        }
        EXPECT_EQ(c.AllGather(std::span<std::byte>(g).subspan(1), block).code(),
                  Code::kInvalidArgument);
        // All-reduce: the whole sum everywhere.
        for (uint64_t i = 0; i < n; ++i) buf[i] = Input(r, i);
        s = c.AllReduce(buf);
        ASSERT_THAT(s, IsOk());
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], Sum(world, i));
      }
    });
  }
}

TEST_F(CollectivesTest, ReduceScatterIsDeterministic) {
  constexpr uint32_t kWorld = 3;
  constexpr uint64_t kN = 10007;
  std::vector<std::vector<uint32_t>> bits(2 * kWorld);
  for (int run = 0; run < 2; ++run) {
    RunRanks(kWorld, "det-run" + std::to_string(run), [&](uint32_t r, worker::Collectives& c) {
      std::mt19937 gen(1234 + r);
      std::normal_distribution<float> d(0.0f, 1.0f);
      std::vector<float> buf(kN);
      for (auto& x : buf) x = d(gen);
      ASSERT_THAT(c.ReduceScatter(buf), IsOk());
      const auto mine = worker::RankSlice(kN, kWorld, r);
      std::vector<uint32_t>& out = bits[run * kWorld + r];
      out.resize(mine.length);
      std::memcpy(out.data(), buf.data() + mine.begin, mine.length * 4);
    });
  }
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(bits[r], bits[kWorld + r]) << "rank " << r;
}

// A rank that goes away (its communicator destroyed: process exit, re-join) fails the others'
// collectives with an error soon, not at the 60 s timeout and not a hang.
TEST_F(CollectivesTest, LostPeerFailsTheCollective) {
  std::vector<std::unique_ptr<worker::GlooCollectives>> comms(2);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = worker::GlooCollectives::Create(
          {*endpoint_, kToken, r, 2, "lost-peer", "127.0.0.1", 60s});
      ASSERT_THAT(c, IsOk());
      comms[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  std::thread leaver([&] {
    std::this_thread::sleep_for(300ms);
    comms[1].reset();
  });
  std::vector<float> buf(1 << 16, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = comms[0]->AllReduce(buf);
  leaver.join();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), Code::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << s.ToString();
}

// A rank whose peer died must get the write's error, not die of SIGPIPE (the default action,
// silent: a pre-reduced rank writing its reduce-scatter to a rank killed a moment before ended
// that way, exit status 141). Create ignores SIGPIPE where it is at its default and leaves a
// program's own disposition alone (gloo_collectives.h).
void OwnSigpipeHandler(int) {}

TEST_F(CollectivesTest, CreateIgnoresADefaultSigpipeAndKeepsTheProgramsOwn) {
  struct sigaction saved = {};
  struct sigaction now = {};
  struct sigaction set = {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &saved), 0);
  set.sa_handler = SIG_DFL;
  sigemptyset(&set.sa_mask);
  ASSERT_EQ(::sigaction(SIGPIPE, &set, nullptr), 0);
  RunRanks(2, "sigpipe-default", [](uint32_t, worker::Collectives&) {});
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);

  set.sa_handler = OwnSigpipeHandler;
  ASSERT_EQ(::sigaction(SIGPIPE, &set, nullptr), 0);
  RunRanks(2, "sigpipe-own", [](uint32_t, worker::Collectives&) {});
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &OwnSigpipeHandler);
  ASSERT_EQ(::sigaction(SIGPIPE, &saved, nullptr), 0);
}

// The Client's ranged fetch and push (what bandwidth-centric and pre-reduced are built on),
// without Gloo: one rank of a pre-reduced job with fp32 serving copies pushes a gradient in two
// disjoint ranges, a third overlapping one is refused, and ranged fetches read sub-ranges.
// (Last in this suite: it registers the server's one job.)
TEST_F(CollectivesTest, ZRangedFetchAndPush) {
  auto layout = Layout::Build({{"a", {1000}}, {"b", {37}}},
                              {.chunk_elems = 512, .align_elems = 64, .num_shards = 1});
  ASSERT_THAT(layout, IsOk());
  server::JobSpec job{*layout, {}, {}, {}};
  job.shard.mode = server::ReductionMode::kPreReduced;
  job.shard.serving_dtype = DType::kF32;
  job.optimizer.kind = server::OptimizerKind::kSgd;
  job.commit.max_grad_norm = 0;
  ASSERT_THAT(job.Validate(), IsOk());
  worker::WorkerOptions wo;
  wo.endpoint = *endpoint_;
  wo.token = kToken;
  wo.ucx_tls = "tcp";
  wo.op_timeout = 60s;
  auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
  ASSERT_THAT(c, IsOk());
  worker::Client& cl = **c;
  for (uint32_t p = 0; p < 2; ++p) {
    std::vector<float> v(cl.layout().param_numel(p));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    ASSERT_THAT(cl.PushInitial(p, v), IsOk());
  }
  ASSERT_THAT(cl.FlushPushes(), IsOk());
  // A range across the chunk boundary of "a" (elements 500..524 span chunks 0 and 1).
  auto r = cl.FetchAsync(0, 500, 25, 0).Wait(60s);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)->begin, 500u);
  ASSERT_EQ((*r)->bytes().size(), 25u * 4);
  const auto* f = reinterpret_cast<const float*>((*r)->bytes().data());
  for (int i = 0; i < 25; ++i) EXPECT_EQ(f[i], 500.0f + i);
  auto empty = cl.FetchAsync(1, 37, 0, 0).Wait(60s);
  ASSERT_THAT(empty, IsOk());
  EXPECT_TRUE((*empty)->bytes().empty());
  EXPECT_EQ(cl.FetchAsync(1, 30, 8, 0).Wait(60s).status().code(), Code::kOutOfRange);
  EXPECT_EQ(cl.FetchAsync(5, 0, 1, 0).Wait(60s).status().code(), Code::kOutOfRange);

  // Step 0: each parameter's gradient in two disjoint ranges covers it; the step commits.
  std::vector<float> g(1000, 1.0f);
  EXPECT_EQ(cl.PushGradRange(1, 0, 30, std::span<const float>(g).first(8)).code(),
            Code::kOutOfRange);
  ASSERT_THAT(cl.PushGradRange(0, 0, 0, std::span<const float>(g).first(600)), IsOk());
  ASSERT_THAT(cl.PushGradRange(0, 0, 600, std::span<const float>(g).first(400)), IsOk());
  ASSERT_THAT(cl.PushGradRange(1, 0, 0, std::span<const float>(g).first(37)), IsOk());
  ASSERT_THAT(cl.FlushPushes(), IsOk());
  auto commit = cl.AwaitCommit(0);
  ASSERT_THAT(commit, IsOk());
  EXPECT_FALSE(commit->skip);
  // Step 1 (once the shard published version 1): an overlapping range is a duplicate in
  // pre-reduced mode.
  auto v1 = cl.FetchAsync(1, 0, 37, 1).Wait(60s);
  ASSERT_THAT(v1, IsOk());
  EXPECT_GE((*v1)->version, 1);
  ASSERT_THAT(cl.PushGradRange(1, 1, 0, std::span<const float>(g).first(20)), IsOk());
  ASSERT_THAT(cl.PushGradRange(1, 1, 10, std::span<const float>(g).first(5)), IsOk());
  EXPECT_EQ(cl.FlushPushes().code(), Code::kAlreadyExists);
}

TEST(RankSlice, CoversEveryElementOnce) {
  for (uint64_t n : {0, 1, 2, 3, 5, 64, 1023}) {
    for (uint32_t w = 1; w <= 5; ++w) {
      uint64_t next = 0;
      for (uint32_t r = 0; r < w; ++r) {
        const auto s = worker::RankSlice(n, w, r);
        ASSERT_EQ(s.begin, next) << n << " " << w << " " << r;
        ASSERT_LE(s.length, worker::SliceElems(n, w));
        next = s.begin + s.length;
      }
      EXPECT_EQ(next, n);
      EXPECT_EQ(worker::PaddedCount(n, w) % w, 0u);
    }
  }
}

}  // namespace
}  // namespace zps
