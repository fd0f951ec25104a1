// A CRC or master read of a spilled ShardState waits for an update pass in progress (the store
// holds its own mutex for the whole pass) without holding the state's mutex, so fetches and
// pushes, which need that mutex on the UCX thread, are answered meanwhile. The pass is held in
// its first NVMe read by a gate in the I/O engine, so it is "long" for as long as the test likes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "shard_steps.h"
#include "zps/server/nvme.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

// Blocks the first read pushed after Arm() until Release(); every other request passes.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false, blocked = false, released = false;

  void Arm() {
    std::lock_guard<std::mutex> l(mu);
    armed = true;
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
  bool WaitBlocked() {  // the bound only keeps a broken build from hanging
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, 60s, [&] { return blocked; });
  }
  void OnRead() {
    std::unique_lock<std::mutex> l(mu);
    if (!armed || blocked) return;
    blocked = true;
    cv.notify_all();
    cv.wait(l, [&] { return released; });
  }
};

class GateEngine final : public IoEngine {
 public:
  GateEngine(std::unique_ptr<IoEngine> inner, std::shared_ptr<Gate> gate)
      : inner_(std::move(inner)), gate_(std::move(gate)) {}
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight(); }
  Status Push(const IoRequest& req) override {
    if (req.op == IoRequest::Op::kRead) gate_->OnRead();
    return inner_->Push(req);
  }
  Status Flush() override { return inner_->Flush(); }
  Result<IoCompletion> Wait() override { return inner_->Wait(); }

 private:
  std::unique_ptr<IoEngine> inner_;
  std::shared_ptr<Gate> gate_;
};

struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void Set(Status s) {
    std::lock_guard<std::mutex> l(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
  bool Wait() {  // the bound only turns the stall under test into a failure, not a hang
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, 20s, [&] { return done; });
  }
};

void PushStep(const Layout& layout, ShardState& s, int64_t step, uint32_t ranks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      for (uint32_t r = 0; r < ranks; ++r) {
        std::vector<float> v(piece.length);
        for (auto& x : v) x = dist(rng);
        ASSERT_THAT(
            testing::Push(s, {step, piece.chunk, piece.chunk_offset, piece.length, r, DType::kF32},
                          v.data()),
            IsOk());
      }
    }
  }
}

class CrcDuringPass : public ::testing::TestWithParam<int> {};

// Param 0: ChunkCrc, 1: StateCrc, 2: MasterOf, each asked while the pass is held.
TEST_P(CrcDuringPass, FetchesAndPushesAreAnsweredWhileACrcWaitsForTheUpdatePass) {
  auto l = Layout::Build({{"a", {20000}}, {"b", {9000}}},
                         {.chunk_elems = 4096, .align_elems = 64, .num_shards = 1});
  ASSERT_THAT(l, IsOk());
  const Layout layout = *l;
  ShardJob job{ReductionMode::kServerSum, 2, DType::kF32, DType::kBF16};
  auto gate = std::make_shared<Gate>();
  ChunkStoreOptions so;
  so.memory_budget = 6 * 3 * 16384;  // the pipeline's buffers and about one resident chunk
  so.spill_dir = ::testing::TempDir();
  so.file_prefix = "shard-crc-pass-" + std::to_string(::getpid());
  so.serving_records = false;  // serving copies in RAM: a fetch is answered under mu_ at once
  so.wrap_engine = [gate](std::unique_ptr<IoEngine> e) -> std::unique_ptr<IoEngine> {
    return std::make_unique<GateEngine>(std::move(e), gate);
  };
  auto made = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, so);
  ASSERT_THAT(made, IsOk());
  ShardState& s = **made;
  PushStep(layout, s, kInitStep, 1, 1);
  PushStep(layout, s, 0, 2, 2);
  ASSERT_THAT(s.WaitForGradients(0, 1000ms), IsOk());
  ASSERT_THAT(s.ReduceStep(0), IsOk());

  gate->Arm();
  Status commit;
  std::thread pass([&] { commit = s.ApplyCommit({0, false, 0.5f, 1}); });
  ASSERT_TRUE(gate->WaitBlocked()) << "the update pass never read from the store";

  std::atomic<bool> crc_started{false};
  Status crc_status;
  std::thread crc([&] {
    crc_started = true;
    switch (GetParam()) {
      case 0:
        crc_status = s.ChunkCrc(0).status();
        break;
      case 1:
        (void)s.StateCrc();
        break;
      default:
        crc_status = s.MasterOf(1).status();
        break;
    }
  });
  while (!crc_started) std::this_thread::yield();
  // Give the CRC request time to reach the store, where it waits for the pass. Had it taken the
  // state's mutex first (the bug), the fetch and the push below would wait behind it.
  std::this_thread::sleep_for(200ms);

  Answer fetched;
  s.Fetch({2, 0, 64, 0}, [&](const Status& st, int64_t, std::span<const std::byte>,
                             std::shared_ptr<const void>) { fetched.Set(st); });
  Answer pushed;
  std::thread push([&] {
    // A push for the next step: refused or granted, it must be answered.
    auto t = s.BeginPush({1, 3, 0, 64, 0, DType::kF32});
    pushed.Set(t.status());
  });
  const bool fetch_answered = fetched.Wait();
  const bool push_answered = pushed.Wait();
  gate->Release();
  pass.join();
  crc.join();
  push.join();
  EXPECT_TRUE(fetch_answered) << "a fetch waited for a CRC request that waited for the pass";
  EXPECT_TRUE(push_answered) << "a push waited for a CRC request that waited for the pass";
  EXPECT_THAT(fetched.status, IsOk());
  EXPECT_THAT(commit, IsOk());
  EXPECT_THAT(crc_status, IsOk());
  EXPECT_EQ(s.version(), 1);
}

INSTANTIATE_TEST_SUITE_P(Reads, CrcDuringPass, ::testing::Values(0, 1, 2), [](const auto& p) {
  return std::string(p.param == 0 ? "ChunkCrc" : p.param == 1 ? "StateCrc" : "MasterOf");
});

}  // namespace
}  // namespace zps::server
