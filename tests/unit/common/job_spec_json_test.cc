// The job spec's JSON codec (JobSpecFromJson, what zps.torch sends through the C API): defaults,
// every key of the field lists, enums by name, and errors that name the key.
#include <gtest/gtest.h>

#include <string>

#include "zps/common/job_spec.h"
#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

constexpr const char* kParams = R"("params": [{"name": "a", "shape": [100]},
                                              {"name": "b", "shape": [30]},
                                              {"name": "c", "shape": [7, 9]}])";

Result<JobSpec> FromJson(const std::string& rest) {
  return JobSpecFromJson("{" + std::string(kParams) + (rest.empty() ? "" : ", " + rest) + "}");
}

void ExpectError(const std::string& rest, const std::string& message) {
  auto j = FromJson(rest);
  ASSERT_THAT(j, StatusIs(Code::kInvalidArgument)) << rest;
  EXPECT_NE(j.status().message().find(message), std::string::npos)
      << rest << " gave: " << j.status().message();
}

TEST(JobSpecJson, AbsentKeysKeepTheDefaults) {
  auto j = FromJson("");
  ASSERT_THAT(j, IsOk());
  EXPECT_EQ(j->shard, ShardJob{});
  EXPECT_EQ(j->optimizer, OptimizerConfig{});
  EXPECT_EQ(j->commit, CommitConfig{});
  EXPECT_EQ(j->layout.options().chunk_elems, LayoutOptions{}.chunk_elems);
  EXPECT_EQ(j->layout.num_params(), 3u);
  // Null is absent too.
  auto n = FromJson(R"("optimizer": {"lr": null}, "shard": null)");
  ASSERT_THAT(n, IsOk());
  EXPECT_EQ(n->optimizer, OptimizerConfig{});
}

// Without "align_elems" a block-quantized serving copy lays every parameter on blocks of its
// own (a: 0, b: 256, c: 512); a given value wins; other serving dtypes keep 64.
TEST(JobSpecJson, QuantizedServingCopyAlignsParametersToItsBlock) {
  auto q = FromJson(R"("shard": {"serving_dtype": "int8-block"})");
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->layout.options().align_elems, 256u);
  EXPECT_EQ(q->layout.param_offset(1), 256u);
  EXPECT_EQ(q->layout.param_offset(2), 512u);
  auto given = FromJson(R"("shard": {"serving_dtype": "int8-block"}, "align_elems": 512)");
  ASSERT_THAT(given, IsOk());
  EXPECT_EQ(given->layout.options().align_elems, 512u);
  for (const char* t : {"bf16", "fp16", "fp32"}) {
    auto j = FromJson(std::string(R"("shard": {"serving_dtype": ")") + t + R"("})");
    ASSERT_THAT(j, IsOk()) << t;
    EXPECT_EQ(j->layout.options().align_elems, 64u) << t;
    EXPECT_EQ(j->layout.param_offset(1), 128u) << t;
  }
}

TEST(JobSpecJson, EveryKeyIsRead) {
  auto j = FromJson(R"(
    "chunk_elems": 128, "align_elems": 64, "num_shards": 2,
    "optimizer": {"type": "sgd", "lr": 0.25, "beta1": 0.5, "beta2": 0.75, "eps": 1e-6,
                  "weight_decay": 0.125, "bias_correction": false, "momentum": 0.5,
                  "nesterov": true, "state_dtype": "int8"},
    "commit": {"max_grad_norm": 1.5, "grad_divisor": 8, "dynamic_loss_scale": true,
               "initial_loss_scale": 1024, "scale_factor": 3, "scale_window": 50,
               "min_loss_scale": 0.5},
    "shard": {"reduction": "pre-reduced", "update": "speculative", "world_size": 2,
              "grad_dtype": "bf16", "serving_dtype": "fp32", "accumulation_steps": 4,
              "param_groups": [{"lr": 0.001, "weight_decay": 0.01},
                               {"lr": 0.0005, "weight_decay": 0}],
              "param_group": [0, 1, 1], "frozen": [0, 0, 1],
              "lr_schedule": {"type": "WarmupCosineLR", "warmup_min_lr": 0.5,
                              "warmup_max_lr": 0.75, "warmup_num_steps": 50,
                              "warmup_type": "linear", "total_num_steps": 1000,
                              "warmup_min_ratio": 0.05, "cos_min_ratio": 0.001}})");
  ASSERT_THAT(j, IsOk());
  EXPECT_EQ(j->layout.options().chunk_elems, 128u);
  EXPECT_EQ(j->layout.options().align_elems, 64u);
  EXPECT_EQ(j->layout.options().num_shards, 2u);
  OptimizerConfig o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.25f;
  o.beta1 = 0.5f;
  o.beta2 = 0.75f;
  o.eps = 1e-6f;
  o.weight_decay = 0.125f;
  o.bias_correction = false;
  o.momentum = 0.5f;
  o.nesterov = true;
  o.state_dtype = StateDType::kInt8;
  EXPECT_EQ(j->optimizer, o);
  CommitConfig c{1.5, 8, true, 1024, 3, 50, 0.5};
  EXPECT_EQ(j->commit, c);
  ShardJob s;
  s.mode = ReductionMode::kPreReduced;
  s.update_mode = UpdateMode::kSpeculative;
  s.world_size = 2;
  s.grad_dtype = DType::kBF16;
  s.serving_dtype = DType::kF32;
  s.accumulation_steps = 4;
  s.param_groups = {{0.001f, 0.01f}, {0.0005f, 0.0f}};
  s.param_group = {0, 1, 1};
  s.frozen = {0, 0, 1};
  s.lr_schedule = {
      LrScheduleKind::kWarmupCosineLR, 0.5, 0.75, 50, WarmupType::kLinear, 1000, 0.05, 0.001};
  EXPECT_EQ(j->shard, s);
  // The binary form round-trips what JSON built.
  auto back = JobSpec::Deserialize(j->Serialize());
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->Hash(), j->Hash());
  EXPECT_EQ(back->shard, s);
  EXPECT_EQ(back->optimizer, o);
}

TEST(JobSpecJson, ErrorsNameTheKey) {
  ExpectError(R"("shard": {"bogus": 1})", "unknown key job.shard.bogus");
  ExpectError(R"("bogus": 1)", "unknown key job.bogus");
  ExpectError(R"("shard": {"lr_schedule": {"type": "WarmupLR", "x": 1}})",
              "unknown key job.shard.lr_schedule.x");
  ExpectError(R"("shard": {"param_groups": [{"lr": 1, "x": 1}]})",
              "unknown key job.shard.param_groups[0].x");
  ExpectError(R"("params": [{"name": "a", "shape": [4], "x": 1}])", "unknown key job.params[0].x");
  ExpectError(R"("optimizer": {"beta1": 2})", "job.optimizer.beta1 = 2 is out of range");
  ExpectError(R"("optimizer": {"lr": "big"})", "job.optimizer.lr must be a number");
  ExpectError(R"("commit": {"scale_window": 1.5})", "job.commit.scale_window must be an integer");
  ExpectError(R"("commit": {"dynamic_loss_scale": 1})",
              "job.commit.dynamic_loss_scale must be true or false");
  ExpectError(R"("shard": {"reduction": "x"})",
              "reduction mode must be server-sum or pre-reduced; got 'x'");
  ExpectError(R"("shard": {"update": "async"})",
              "update mode must be sync or speculative; got 'async'");
  ExpectError(R"("shard": {"reduction": 1})", "job.shard.reduction must be a string");
  ExpectError(R"("optimizer": {"type": "lamb"})", "optimizer must be adam, adamw or sgd");
  ExpectError(R"("optimizer": {"state_dtype": "fp8"})",
              "optimizer: state_dtype must be fp32, bf16 or int8; got 'fp8'");
  ExpectError(R"("align_elems": 32, "chunk_elems": 128, "optimizer": {"state_dtype": "int8"})",
              "optimizer.state_dtype int8 needs align_elems to be a multiple of 64, got 32");
  ExpectError(R"("shard": {"lr_schedule": {"warmup_type": "cubic"}})",
              "warmup_type must be log or linear");
  ExpectError(R"("shard": {"lr_schedule": 3})", "job.shard.lr_schedule must be a JSON object");
  ExpectError(R"("shard": {"grad_dtype": "fp8"})", "fp8");
  ExpectError(R"("shard": {"frozen": [0, 2, 0]})", "job.shard.frozen must be integers in [0, 1]");
  ExpectError(R"("shard": {"frozen": 1})", "job.shard.frozen must be a list of integers");
  ExpectError(R"("shard": {"param_groups": 1})",
              "job.shard.param_groups must be a list of {lr, weight_decay}");
  ExpectError(R"("num_shards": 0)", "job.num_shards = 0 is out of range");
  // Validate runs last.
  ExpectError(R"("shard": {"frozen": [0, 1]})", "frozen has 2 entries for 3 parameters");
  EXPECT_THAT(JobSpecFromJson("{"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(JobSpecFromJson("{}"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(JobSpecFromJson(R"({"params": []})"), StatusIs(Code::kInvalidArgument));
}

TEST(JobSpecJson, EnumNamesRoundTrip) {
  for (auto m : {ReductionMode::kServerSum, ReductionMode::kPreReduced}) {
    EXPECT_EQ(ParseReductionMode(ReductionModeName(m)).value(), m);
  }
  for (auto m : {UpdateMode::kSync, UpdateMode::kSpeculative}) {
    EXPECT_EQ(ParseUpdateMode(UpdateModeName(m)).value(), m);
  }
  for (auto k : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    EXPECT_EQ(ParseOptimizerKind(OptimizerKindName(k)).value(), k);
  }
  for (auto k : {LrScheduleKind::kNone, LrScheduleKind::kWarmupLR, LrScheduleKind::kWarmupDecayLR,
                 LrScheduleKind::kWarmupCosineLR}) {
    EXPECT_EQ(ParseLrScheduleKind(LrScheduleKindName(k)).value(), k);
  }
  for (auto t : {WarmupType::kLog, WarmupType::kLinear}) {
    EXPECT_EQ(ParseWarmupType(WarmupTypeName(t)).value(), t);
  }
  for (auto t : {StateDType::kF32, StateDType::kBF16, StateDType::kInt8}) {
    EXPECT_EQ(ParseStateDType(StateDTypeName(t)).value(), t);
  }
  EXPECT_EQ(StateDTypeName(StateDType::kInt8), "int8");
  EXPECT_EQ(ReductionModeName(ReductionMode::kPreReduced), "pre-reduced");
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdamW), "adamw");
  EXPECT_EQ(OptimizerKindName(static_cast<OptimizerKind>(9)), "unknown");
}

}  // namespace
}  // namespace zps
