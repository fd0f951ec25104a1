// Checkpoints of compact optimizer state: m and v are stored packed in the job's state dtype
// (MomentBytes), read back bit for bit, and the manifest records the dtype, across a reopen.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "ckpt_test_util.h"
#include "zps/server/checkpoint.h"
#include "zps/server/optimizer.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {
namespace {

// Packed moment bytes for (chunk, kind): any bytes will do, the store does not interpret them.
std::vector<std::byte> Packed(StateDType dtype, uint64_t n, uint32_t chunk, int kind) {
  std::vector<std::byte> b(MomentBytes(dtype, n));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte((i * 131 + chunk * 7 + kind) & 0xff);
  return b;
}

class StateDTypeCheckpointTest : public ::testing::TestWithParam<StateDType> {
 protected:
  std::unique_ptr<CheckpointStore> Open() {
    CheckpointOptions o;
    o.slice_bytes = 4096;  // several slices per chunk, the last partial
    o.write_buffer_bytes = 4ull << 20;
    auto s = CheckpointStore::Open(dir_.sub("db"), o);
    EXPECT_THAT(s, IsOk());
    return s.ok() ? std::move(*s) : nullptr;
  }
  TempDir dir_;
  Layout layout_ = SmallLayout(1, 1536);
};

TEST_P(StateDTypeCheckpointTest, StoresPackedMomentsAndRecordsTheDType) {
  const StateDType dtype = GetParam();
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->SetIdentity(layout_, 0), IsOk());
    auto w = store->BeginCheckpoint(4, dtype);
    ASSERT_THAT(w, IsOk());
    for (uint32_t c : layout_.ChunksOfShard(0)) {
      const uint64_t n = layout_.chunk_size(c);
      auto d = MakeChunk(layout_, c, 4);
      auto m = Packed(dtype, n, c, 1), v = Packed(dtype, n, c, 2);
      if (dtype != StateDType::kF32) {  // fp32-sized moments are not this dtype's
        EXPECT_FALSE((*w)->AddChunk(c, 5, d.tensors()).ok());
      }
      ASSERT_THAT((*w)->AddChunk(c, 5, {d.master, m, v}), IsOk());
    }
    ASSERT_THAT((*w)->Commit(), IsOk());
  }
  auto store = Open();  // the manifest, decoded afresh
  ASSERT_NE(store, nullptr);
  auto list = store->ListCheckpoints(/*verify=*/true);
  ASSERT_THAT(list, IsOk());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].verification, Verification::kVerified) << (*list)[0].problem;
  EXPECT_EQ((*list)[0].state_dtype, dtype);
  uint64_t bytes = 0;
  for (uint32_t c : layout_.ChunksOfShard(0)) {
    bytes += layout_.chunk_size(c) * 4 + 2 * MomentBytes(dtype, layout_.chunk_size(c));
  }
  EXPECT_EQ((*list)[0].bytes, bytes);  // stored compactly: the packed sizes, nothing more
  auto r = store->OpenCheckpoint(4);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)->info().state_dtype, dtype);
  for (uint32_t c : layout_.ChunksOfShard(0)) {
    const uint64_t n = layout_.chunk_size(c);
    std::vector<float> master(n);
    std::vector<std::byte> m(MomentBytes(dtype, n)), v(m.size());
    ASSERT_THAT((*r)->ReadChunk(c, {master, m, v}), IsOk());
    EXPECT_EQ(master, MakeChunk(layout_, c, 4).master);
    EXPECT_EQ(m, Packed(dtype, n, c, 1));
    EXPECT_EQ(v, Packed(dtype, n, c, 2));
    if (dtype != StateDType::kF32) {  // moments sized for another dtype are refused
      std::vector<std::byte> f32(MomentBytes(StateDType::kF32, n));
      EXPECT_EQ((*r)->ReadChunk(c, {{}, f32, {}}).code(), Code::kInvalidArgument);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, StateDTypeCheckpointTest,
                         ::testing::Values(StateDType::kF32, StateDType::kBF16, StateDType::kInt8),
                         [](const auto& p) { return std::string(StateDTypeName(p.param)); });

}  // namespace
}  // namespace zps::server::testing
