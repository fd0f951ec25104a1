// JobSpec's binary form against bytes (and hashes) written by the encoder that predates the field
// lists of zps/common/job_spec.h: every version still decodes to the same spec and encodes to the
// same bytes, so a job registered by an older build keeps its hash.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "job_spec_base.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

std::vector<std::byte> FromHex(std::string_view hex) {
  std::vector<std::byte> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

using testing::BaseJobSpec;
using testing::SurfaceJobSpec;

// Every field away from its default.
JobSpec Rich() {
  JobSpec j = SurfaceJobSpec();
  j.shard.mode = ReductionMode::kPreReduced;
  j.shard.grad_dtype = DType::kBF16;
  j.optimizer.kind = OptimizerKind::kSgd;
  j.optimizer.lr = 0.25f;
  j.optimizer.momentum = 0.5f;
  j.optimizer.nesterov = true;
  j.optimizer.weight_decay = 0.125f;
  j.optimizer.bias_correction = false;
  j.commit.max_grad_norm = 1.5;
  j.commit.grad_divisor = 8;
  j.commit.dynamic_loss_scale = true;
  j.commit.initial_loss_scale = 1024;
  j.commit.scale_factor = 3;
  j.commit.scale_window = 50;
  j.commit.min_loss_scale = 0.5;
  return j;
}

JobSpec Speculative(JobSpec j) {
  j.shard.update_mode = UpdateMode::kSpeculative;
  return j;
}

struct Golden {
  const char* name;
  JobSpec spec;
  uint64_t hash;
  const char* hex;
};

void ExpectSameSpec(const JobSpec& a, const JobSpec& b) {
  EXPECT_EQ(a.layout.Serialize(), b.layout.Serialize());
  EXPECT_EQ(a.shard, b.shard);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.commit, b.commit);
}

TEST(JobSpecGolden, OldBytesDecodeTheSameAndEncodeTheSame) {
  const Golden cases[] = {
      {"version 1", BaseJobSpec(), 0x2deaa5be312aa541ull,
       "4a53505a010000004e0000004c53505a010000008000000000000000400000000200000003000000"
       "01000000610164000000000000000100000062011e00000000000000010000006302070000000000"
       "0000090000000000000000020000000002270000005a4f505401001b00016f12833a6666663f77be"
       "7f3f77cc2b3200000000010000000000a9320bdb0000000000000000000000000000f03f00000000"
       "000000f0400000000000000040e803000000000000000000000000f03f"},
      {"version 3 without version 2 fields", Speculative(BaseJobSpec()), 0x6661c34ce7eac440ull,
       "4a53505a030000004e0000004c53505a010000008000000000000000400000000200000003000000"
       "01000000610164000000000000000100000062011e00000000000000010000006302070000000000"
       "0000090000000000000000020000000002270000005a4f505401001b00016f12833a6666663f77be"
       "7f3f77cc2b3200000000010000000000a9320bdb0000000000000000000000000000f03f00000000"
       "000000f0400000000000000040e803000000000000000000000000f03f0100000000000000000000"
       "0000000000000000000000000000fca9f1d24d62503fe80300000000000000000000000000000000"
       "000000000000002d431cebe2361a3f01"},
      {"version 2", Rich(), 0xbb2d47379f3993cfull,
       "4a53505a020000004e0000004c53505a010000008000000000000000400000000200000003000000"
       "01000000610164000000000000000100000062011e00000000000000010000006302070000000000"
       "0000090000000000000001020000000200270000005a4f505401001b00020000803e6666663f77be"
       "7f3f77cc2b320000003e000000003f0174e027f1000000000000f83f000000000000204001000000"
       "000000904000000000000008403200000000000000000000000000e03f04000000020000006f1283"
       "3a0ad7233c6f12033a00000000030000000000000001000000010000000300000000000103000000"
       "0000000000fca9f1d24d62503f320000000000000001e8030000000000009a9999999999a93ffca9"
       "f1d24d62503f"},
      {"version 3", Speculative(Rich()), 0x699c6e9c095b582dull,
       "4a53505a030000004e0000004c53505a010000008000000000000000400000000200000003000000"
       "01000000610164000000000000000100000062011e00000000000000010000006302070000000000"
       "0000090000000000000001020000000200270000005a4f505401001b00020000803e6666663f77be"
       "7f3f77cc2b320000003e000000003f0174e027f1000000000000f83f000000000000204001000000"
       "000000904000000000000008403200000000000000000000000000e03f04000000020000006f1283"
       "3a0ad7233c6f12033a00000000030000000000000001000000010000000300000000000103000000"
       "0000000000fca9f1d24d62503f320000000000000001e8030000000000009a9999999999a93ffca9"
       "f1d24d62503f01"},
  };
  for (const Golden& g : cases) {
    SCOPED_TRACE(g.name);
    const std::vector<std::byte> bytes = FromHex(g.hex);
    auto decoded = JobSpec::Deserialize(bytes);
    ASSERT_THAT(decoded, IsOk());
    ExpectSameSpec(*decoded, g.spec);
    EXPECT_EQ(g.spec.Serialize(), bytes);
    EXPECT_EQ(decoded->Serialize(), bytes);
    EXPECT_EQ(g.spec.Hash(), g.hash);
    EXPECT_EQ(decoded->Hash(), g.hash);
  }
}

}  // namespace
}  // namespace zps::server
