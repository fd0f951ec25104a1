// ShardCheckpoints and the state dtype: a --data-dir whose checkpoints hold another state dtype
// than the job's is refused when the job is bound (and by a restore), with an error naming both
// dtypes; the same dtype binds, and the shard's checkpoints record it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "shard/shard_driver.h"
#include "zps/server/checkpoint.h"
#include "zps/server/optimizer.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

class ShardCheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zps-shard-ckpt-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto l = Layout::Build({{"w", {3000}}, {"b", {70}}},
                           {.chunk_elems = 1024, .align_elems = 64, .num_shards = 1});
    ASSERT_THAT(l, IsOk());
    job_.layout = *l;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes checkpoint `step` of every chunk directly, its moments packed in `dtype`.
  void WriteCheckpoint(int64_t step, StateDType dtype) {
    CheckpointOptions o;
    auto store = CheckpointStore::Open(dir_ + "/checkpoints", o);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->SetIdentity(job_.layout, 0), IsOk());
    auto w = (*store)->BeginCheckpoint(step, dtype);
    ASSERT_THAT(w, IsOk());
    for (uint32_t c = 0; c < job_.layout.num_chunks(); ++c) {
      const uint64_t n = job_.layout.chunk_size(c);
      std::vector<float> master(n, 1.0f);
      std::vector<std::byte> m(MomentBytes(dtype, n)), v(m.size());
      ASSERT_THAT((*w)->AddChunk(c, step, {master, m, v}), IsOk());
    }
    ASSERT_THAT((*w)->Commit(), IsOk());
  }
  std::string dir_;
  JobSpec job_;
};

TEST_F(ShardCheckpointsTest, AnotherStateDTypeIsRefusedByName) {
  WriteCheckpoint(10, StateDType::kBF16);
  job_.optimizer.state_dtype = StateDType::kInt8;
  {
    auto ckpt = ShardCheckpoints::Open(dir_);
    ASSERT_THAT(ckpt, IsOk());
    Status s = (*ckpt)->Bind(job_, 0);
    EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
    for (const char* part : {"step 10", "holds bf16 optimizer state", "state_dtype is int8",
                             "state_dtype bf16 to resume"}) {
      EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
    }
  }
  job_.optimizer.state_dtype = StateDType::kBF16;  // its own dtype: it binds
  auto ckpt = ShardCheckpoints::Open(dir_);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT((*ckpt)->Bind(job_, 0), IsOk());
  auto steps = (*ckpt)->Steps(/*verify=*/true);
  ASSERT_THAT(steps, IsOk());
  EXPECT_EQ(*steps, std::vector<int64_t>{10});
}

TEST_F(ShardCheckpointsTest, Fp32JobsBindToCheckpointsOfOlderBuilds) {
  // An fp32 checkpoint keeps the manifest format older builds wrote (no dtype field).
  WriteCheckpoint(5, StateDType::kF32);
  auto ckpt = ShardCheckpoints::Open(dir_);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_THAT((*ckpt)->Bind(job_, 0), IsOk());
  job_.optimizer.state_dtype = StateDType::kInt8;
  auto other = ShardCheckpoints::Open(dir_ + "-none");  // no checkpoints: any dtype binds
  ASSERT_THAT(other, IsOk());
  EXPECT_THAT((*other)->Bind(job_, 0), IsOk());
  std::error_code ec;
  std::filesystem::remove_all(dir_ + "-none", ec);
}

}  // namespace
}  // namespace zps::server
