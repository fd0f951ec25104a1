// Quantized weights on a shard (serving_dtype int8-block): the serving copy is QuantizeBlocks of
// each chunk's whole fp32 master (blocks from the chunk's start), made in the update's pass, and
// a fetch of any run carries exactly its covering blocks. Checked against a twin job that serves
// fp32 (a copy of the master, bit for bit), fed the same pushes: with the state in RAM (sync and
// speculative, a frozen parameter) and with the serving copies spilled to NVMe. The master is the
// same as the twin's, and the serving gauge reports the quantized size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>

#include "shard_steps.h"
#include "zps/common/serving_quant.h"
#include "zps/server/shard_state.h"
#include "zps/server/step_commit.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

constexpr DType kQ = DType::kI8Block;

// 1 shard, chunks of 4096 elements: pieces at offsets that are not block starts, pieces shorter
// than a block and longer than one, padding, a frozen parameter (c).
Layout QuantLayout() {
  auto l = Layout::Build({{"a", {5000}}, {"b", {3, 300}}, {"c", {700}}, {"d", {10}}, {"e", {6100}}},
                         {.chunk_elems = 4096, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

using zps::testing::SpillDir;

enum class Where { kRamSync, kRamSpeculative, kSpilled };

std::unique_ptr<ShardState> Make(const Layout& layout, DType serving, Where where) {
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, serving};
  job.frozen = {0, 0, 1, 0, 0};
  job.update_mode = where == Where::kRamSpeculative ? UpdateMode::kSpeculative : UpdateMode::kSync;
  std::optional<ChunkStoreOptions> spill;
  if (where == Where::kSpilled) {
    ChunkStoreOptions so;
    so.memory_budget = 6 * 3 * 16384;  // the pipeline's 5 buffers and one resident chunk
    so.serving_records = true;
    // The staging buffers and one resident copy: the others spill.
    so.serving_memory_budget =
        (kServingStagingBuffers + 1) * AlignUp(ServingBytes(serving, layout.chunk_size(0)));
    so.spill_dir = SpillDir();
    so.file_prefix = "quantized-weights-test-" + std::to_string(::getpid()) + "-" +
                     std::string(DTypeName(serving));
    spill = so;
  }
  auto s = ShardState::Create(layout, 0, job, OptimizerConfig{}, nullptr, spill);
  EXPECT_THAT(s, IsOk()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Fetches elements [offset, offset + length) of `chunk` at `version` and returns its bytes.
Result<std::vector<std::byte>> Fetch(ShardState& s, uint32_t chunk, uint64_t offset,
                                     uint64_t length, int64_t version) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::vector<std::byte> bytes;
  s.Fetch(
      {chunk, offset, length, version},
      [&](const Status& st, int64_t, std::span<const std::byte> d, std::shared_ptr<const void>) {
        std::lock_guard<std::mutex> lock(mu);
        status = st;
        bytes.assign(d.begin(), d.end());
        done = true;
        cv.notify_all();
      });
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, 60s, [&] { return done; })) return DeadlineExceeded("fetch");
  if (!status.ok()) return status;
  return bytes;
}

using testing::Push;

// Every piece of every parameter fetched from `q` is the covering blocks of QuantizeBlocks of
// the chunk's master, which `f` (fp32 serving) gives whole.
void ExpectServedQuantizedMaster(ShardState& q, ShardState& f, const Layout& layout,
                                 int64_t version) {
  const QuantFormat fmt = ServingQuantFormat(kQ);
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    const uint64_t n = layout.chunk_size(c);
    auto master = Fetch(f, c, 0, n, version);
    ASSERT_THAT(master, IsOk());
    std::vector<float> m(n);
    std::memcpy(m.data(), master->data(), n * sizeof(float));
    std::vector<std::byte> want(ServingBytes(kQ, n));
    QuantizeBlocks(fmt, m, want);
    auto whole = Fetch(q, c, 0, n, version);
    ASSERT_THAT(whole, IsOk());
    EXPECT_EQ(*whole, want) << "chunk " << c << " at version " << version;
  }
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      const uint64_t n = layout.chunk_size(piece.chunk);
      auto got = Fetch(q, piece.chunk, piece.chunk_offset, piece.length, version);
      auto exact = Fetch(f, piece.chunk, piece.chunk_offset, piece.length, version);
      ASSERT_THAT(got, IsOk());
      ASSERT_THAT(exact, IsOk());
      const QuantRange r = ServingRange(kQ, n, piece.chunk_offset, piece.length);
      ASSERT_EQ(got->size(), r.bytes) << "param " << p << " chunk " << piece.chunk;
      // Dequantized, the piece is within half a step of each block's scale of the master.
      std::vector<float> deq(piece.length), m(piece.length);
      DequantizeRange(fmt, *got, r.skip, piece.length, DequantTarget::kF32, deq.data());
      std::memcpy(m.data(), exact->data(), piece.length * sizeof(float));
      float absmax = 0.0f;
      for (float x : m) absmax = std::max(absmax, std::abs(x));
      for (uint64_t i = 0; i < piece.length; ++i) {
        ASSERT_LE(std::abs(deq[i] - m[i]), absmax / 127.0f) << "param " << p << " element " << i;
      }
    }
  }
}

class ShardStateQuantizedWeights : public ::testing::TestWithParam<Where> {};

TEST_P(ShardStateQuantizedWeights, ServesTheBlocksOfTheUpdatedMaster) {
  const Layout layout = QuantLayout();
  auto q = Make(layout, kQ, GetParam());
  auto f = Make(layout, DType::kF32, GetParam());
  ASSERT_TRUE(q && f);
  std::mt19937 rng(5);
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    auto pieces = layout.Pieces(p);
    ASSERT_THAT(pieces, IsOk());
    for (const Piece& piece : *pieces) {
      std::vector<float> v(piece.length);
      std::normal_distribution<float> dist(0.0f, 0.5f);
      for (auto& x : v) x = dist(rng);
      for (ShardState* s : {q.get(), f.get()}) {
        ASSERT_THAT(
            Push(*s, {kInitStep, piece.chunk, piece.chunk_offset, piece.length, 0, DType::kF32},
                 v.data()),
            IsOk());
      }
    }
  }
  ExpectServedQuantizedMaster(*q, *f, layout, 0);
  auto order_for = [](int64_t step) {
    return CommitOrder{step, false, StepCommit::UnclippedScale(1.0, 1.0), step + 1};
  };
  for (ShardState* s : {q.get(), f.get()}) s->ArmSpeculation(order_for(0));
  for (int64_t step = 0; step < 3; ++step) {
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    for (uint32_t p = 0; p < layout.num_params(); ++p) {
      if (p == 2) continue;  // frozen: never pushed
      auto pieces = layout.Pieces(p);
      ASSERT_THAT(pieces, IsOk());
      for (const Piece& piece : *pieces) {
        std::vector<float> g(piece.length);
        for (auto& x : g) x = dist(rng);
        for (ShardState* s : {q.get(), f.get()}) {
          ASSERT_THAT(
              Push(*s, {step, piece.chunk, piece.chunk_offset, piece.length, 0, DType::kF32},
                   g.data()),
              IsOk());
        }
      }
    }
    for (ShardState* s : {q.get(), f.get()}) {
      ASSERT_THAT(s->WaitForGradients(step, 2000ms), IsOk());
      ASSERT_THAT(s->ReduceStep(step), IsOk());
      ASSERT_THAT(s->ApplyCommit(order_for(step), order_for(step + 1)), IsOk());
    }
    ExpectServedQuantizedMaster(*q, *f, layout, step + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Where, ShardStateQuantizedWeights,
                         ::testing::Values(Where::kRamSync, Where::kRamSpeculative,
                                           Where::kSpilled),
                         [](const ::testing::TestParamInfo<Where>& i) {
                           return i.param == Where::kRamSync          ? "ram_sync"
                                  : i.param == Where::kRamSpeculative ? "ram_speculative"
                                                                      : "spilled";
                         });

// The serving gauge (zps_shard_state_bytes{kind="serving"}) reads state_bytes().serving.
TEST(ShardStateQuantizedWeightsBytes, TheServingCopyIsAboutHalfOfBf16) {
  const Layout layout = QuantLayout();
  auto q = Make(layout, kQ, Where::kRamSync);
  auto b = Make(layout, DType::kBF16, Where::kRamSync);
  ASSERT_TRUE(q && b);
  const uint64_t qs = q->state_bytes().serving, bs = b->state_bytes().serving;
  uint64_t want = 0;
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) want += ServingBytes(kQ, layout.chunk_size(c));
  EXPECT_EQ(qs, want);
  EXPECT_LE(static_cast<double>(qs), 0.52 * static_cast<double>(bs));
  EXPECT_EQ(q->state_bytes().master, b->state_bytes().master);
}

TEST(ShardStateQuantizedWeightsJob, Int4WeightsAreRefused) {
  ShardJob job{ReductionMode::kServerSum, 1, DType::kF32, DType::kI4Block};
  EXPECT_THAT(ShardState::Create(QuantLayout(), 0, job, OptimizerConfig{}, nullptr),
              StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::server
