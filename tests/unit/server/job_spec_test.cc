// JobSpec: the versioned encoding (version 1 for specs without the optimizer-surface fields,
// byte for byte as before; version 2 with them), round trips, and validation naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "job_spec_base.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using testing::BaseJobSpec;
using testing::SurfaceJobSpec;

uint32_t VersionOf(const std::vector<std::byte>& b) {
  uint32_t v;
  std::memcpy(&v, b.data() + 4, 4);
  return v;
}

TEST(JobSpec, DefaultsEncodeAsVersion1AndRoundTrip) {
  const JobSpec j = BaseJobSpec();
  const auto bytes = j.Serialize();
  EXPECT_EQ(VersionOf(bytes), 1u);
  auto back = JobSpec::Deserialize(bytes);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->Serialize(), bytes);
  EXPECT_EQ(back->shard.accumulation_steps, 1u);
  EXPECT_TRUE(back->shard.param_groups.empty());
  EXPECT_EQ(back->shard.lr_schedule, LrScheduleConfig{});
}

TEST(JobSpec, NewFieldsEncodeAsVersion2AndRoundTrip) {
  const JobSpec j = SurfaceJobSpec();
  ASSERT_THAT(j.Validate(), IsOk());
  const auto bytes = j.Serialize();
  EXPECT_EQ(VersionOf(bytes), 2u);
  auto back = JobSpec::Deserialize(bytes);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->Serialize(), bytes);
  EXPECT_EQ(back->Hash(), j.Hash());
  EXPECT_NE(BaseJobSpec().Hash(), j.Hash());
  EXPECT_EQ(back->shard.serving_dtype, DType::kF32);
  EXPECT_EQ(back->shard.accumulation_steps, 4u);
  EXPECT_EQ(back->shard.param_groups, j.shard.param_groups);
  EXPECT_EQ(back->shard.param_group, j.shard.param_group);
  EXPECT_EQ(back->shard.frozen, j.shard.frozen);
  EXPECT_EQ(back->shard.lr_schedule, j.shard.lr_schedule);
  // Each field is part of the hash.
  JobSpec k = j;
  k.shard.lr_schedule.cos_min_ratio = 0.002;
  EXPECT_NE(k.Hash(), j.Hash());
  k = j;
  k.shard.frozen = {0, 1, 1};
  EXPECT_NE(k.Hash(), j.Hash());
  k = j;
  k.shard.param_groups[1].weight_decay = 0.5f;
  EXPECT_NE(k.Hash(), j.Hash());
}

TEST(JobSpec, TruncatedOrUnknownVersionIsRejected) {
  auto bytes = SurfaceJobSpec().Serialize();
  for (size_t cut : {size_t{1}, size_t{9}, size_t{40}}) {
    std::vector<std::byte> b(bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(cut));
    EXPECT_EQ(JobSpec::Deserialize(b).status().code(), Code::kInvalidArgument) << cut;
  }
  auto b = bytes;
  const uint32_t v5 = 5;
  std::memcpy(b.data() + 4, &v5, 4);
  EXPECT_EQ(JobSpec::Deserialize(b).status().code(), Code::kInvalidArgument);
}

// optimizer.state_dtype rides in optimizer record version 2, which only job spec version 4
// carries: an fp32-state spec keeps its bytes and hash, a compact one is version 4.
TEST(JobSpec, StateDtypeEncodesAsVersion4AndRoundTrips) {
  for (JobSpec j : {BaseJobSpec(), SurfaceJobSpec()}) {
    const auto fp32_bytes = j.Serialize();
    EXPECT_LE(VersionOf(fp32_bytes), 2u);
    for (StateDType sd : {StateDType::kBF16, StateDType::kInt8}) {
      j.optimizer.state_dtype = sd;
      const auto bytes = j.Serialize();
      EXPECT_EQ(VersionOf(bytes), 4u);
      auto back = JobSpec::Deserialize(bytes);
      ASSERT_THAT(back, IsOk());
      EXPECT_EQ(back->optimizer.state_dtype, sd);
      EXPECT_EQ(back->Serialize(), bytes);
      EXPECT_NE(bytes, fp32_bytes);
      // Claiming version 3 for the same bytes is refused (by the trailing bytes, or by the
      // record version a version-3 spec cannot carry).
      auto old = bytes;
      const uint32_t v3 = 3;
      std::memcpy(old.data() + 4, &v3, 4);
      EXPECT_EQ(JobSpec::Deserialize(old).status().code(), Code::kInvalidArgument);
    }
    j.optimizer.state_dtype = StateDType::kF32;
    EXPECT_EQ(j.Serialize(), fp32_bytes);
  }
}

TEST(JobSpec, SpeculativeUpdateEncodesAsVersion3AndRoundTrips) {
  for (JobSpec j : {BaseJobSpec(), SurfaceJobSpec()}) {
    const uint64_t sync_hash = j.Hash();
    j.shard.update_mode = UpdateMode::kSpeculative;
    const auto bytes = j.Serialize();
    EXPECT_EQ(VersionOf(bytes), 3u);
    auto back = JobSpec::Deserialize(bytes);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->shard.update_mode, UpdateMode::kSpeculative);
    EXPECT_EQ(back->Serialize(), bytes);
    EXPECT_NE(j.Hash(), sync_hash);  // the mode is part of the job every process agrees on
    auto bad = bytes;
    bad.back() = std::byte{7};  // no such mode
    EXPECT_EQ(JobSpec::Deserialize(bad).status().code(), Code::kInvalidArgument);
  }
  EXPECT_EQ(ParseUpdateMode("speculative").value(), UpdateMode::kSpeculative);
  EXPECT_EQ(ParseUpdateMode("sync").value(), UpdateMode::kSync);
  EXPECT_EQ(ParseUpdateMode("async").status().code(), Code::kInvalidArgument);
}

void ExpectInvalid(const JobSpec& j, std::string_view field) {
  const Status s = j.Validate();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  // The same spec does not come back from the wire either (Deserialize validates).
  EXPECT_EQ(JobSpec::Deserialize(j.Serialize()).status().code(), Code::kInvalidArgument) << field;
}

TEST(JobSpec, Int8StateNeedsBlockAlignedParameters) {
  auto l = Layout::Build({{"a", {100}}, {"b", {30}}},
                         {.chunk_elems = 128, .align_elems = 32, .num_shards = 1});
  ASSERT_THAT(l, IsOk());
  JobSpec j{*l, {}, {}, {}};
  j.optimizer.state_dtype = StateDType::kBF16;
  EXPECT_THAT(j.Validate(), IsOk());  // bf16 has no blocks
  j.optimizer.state_dtype = StateDType::kInt8;
  ExpectInvalid(j, "align_elems");
}

TEST(JobSpec, ValidationNamesTheField) {
  JobSpec j = SurfaceJobSpec();
  j.shard.accumulation_steps = 0;
  ExpectInvalid(j, "accumulation_steps");
  j = SurfaceJobSpec();
  j.shard.accumulation_steps = 2000;
  ExpectInvalid(j, "accumulation_steps");
  j = SurfaceJobSpec();
  j.shard.param_groups[1].lr = -1.0f;
  ExpectInvalid(j, "param_groups[1].lr");
  j = SurfaceJobSpec();
  j.shard.param_groups[0].weight_decay = std::nanf("");
  ExpectInvalid(j, "param_groups[0].weight_decay");
  j = SurfaceJobSpec();
  j.shard.param_group = {0, 1};  // 3 parameters
  ExpectInvalid(j, "param_group");
  j = SurfaceJobSpec();
  j.shard.param_group = {0, 2, 1};  // 2 groups
  ExpectInvalid(j, "param_group[1]");
  j = SurfaceJobSpec();
  j.shard.param_groups.clear();
  ExpectInvalid(j, "param_group");
  j = SurfaceJobSpec();
  j.shard.frozen = {0, 0};
  ExpectInvalid(j, "frozen");
  j = SurfaceJobSpec();
  j.shard.frozen = {0, 3, 0};
  ExpectInvalid(j, "frozen[1]");
  j = SurfaceJobSpec();
  j.shard.lr_schedule.total_num_steps = 0;
  ExpectInvalid(j, "total_num_steps");
  j = SurfaceJobSpec();
  j.shard.lr_schedule.kind = LrScheduleKind::kWarmupLR;
  j.shard.lr_schedule.warmup_max_lr = 200.0;  // adamw: 200 * 0.01 > 1
  ExpectInvalid(j, "lr * weight_decay");
  j = SurfaceJobSpec();
  j.shard.world_size = 0;
  ExpectInvalid(j, "world_size");
  // fp32 serving is valid; an unknown dtype byte is not.
  j = SurfaceJobSpec();
  j.shard.serving_dtype = static_cast<DType>(7);
  EXPECT_EQ(j.Validate().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::server
