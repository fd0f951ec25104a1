// JobFlags and BuildJob: zps-train's job-spec flags make the JSON job description zps.torch sends,
// decoded by the job spec's one JSON codec. The oracle for "the job is unchanged" is the job spec
// zps-train built field by field from the same flags before (FieldByField below).
#include "zps/train/job_flags.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "zps/testing/status_matchers.h"
#include "zps/train/options.h"

namespace zps::train {
namespace {

// zps-train's job options and their defaults (train/src/main.cc's TrainOptions).
struct Options {
  int world_size = 2;
  int shards = 2;
  int64_t steps = 400;
  std::string optimizer = "adamw";
  double lr = 3e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_grad_norm = 1.0;
  std::string lr_schedule = "none";
  int64_t warmup_num_steps = 1000;
  int64_t total_num_steps = 0;
  std::string warmup_type = "log";
  bool loss_scaling = false;
  double initial_loss_scale = 65536.0;
  std::string grad_dtype = "";
  std::string serving_dtype = "";
  std::string state_dtype = "fp32";
  std::string reduction = "server-sum";
  std::string update = "sync";
  uint64_t chunk_elems = 256u << 10;
  ModelConfig model;
};

// Registers the flags as zps-train does (names and keys).
void Register(JobFlags& j, Flags& f, Options& o) {
  j.Add("world-size", "", "shard.world_size", &o.world_size, 1, 65536);
  j.Add("shards", "", "num_shards", &o.shards, 1, 4096);
  f.Add("steps", "", &o.steps, 1, INT64_MAX / 2);
  j.Add("optimizer", "", "optimizer.type", &o.optimizer);
  j.Add("lr", "", "optimizer.lr", &o.lr);
  j.Add("weight-decay", "", "optimizer.weight_decay", &o.weight_decay);
  j.Add("beta1", "", "optimizer.beta1", &o.beta1);
  j.Add("beta2", "", "optimizer.beta2", &o.beta2);
  j.Add("eps", "", "optimizer.eps", &o.eps);
  j.Add("max-grad-norm", "", "commit.max_grad_norm", &o.max_grad_norm);
  j.Add("lr-schedule", "", "shard.lr_schedule.type", &o.lr_schedule);
  j.Add("warmup-num-steps", "", "shard.lr_schedule.warmup_num_steps", &o.warmup_num_steps, 1,
        INT64_MAX / 2);
  j.Add("total-num-steps", "", "shard.lr_schedule.total_num_steps", &o.total_num_steps, 0,
        INT64_MAX / 2);
  j.Add("warmup-type", "", "shard.lr_schedule.warmup_type", &o.warmup_type);
  j.Add("loss-scaling", "", "commit.dynamic_loss_scale", &o.loss_scaling);
  j.Add("initial-loss-scale", "", "commit.initial_loss_scale", &o.initial_loss_scale);
  j.Add("grad-dtype", "", "shard.grad_dtype", &o.grad_dtype);
  j.Add("serving-dtype", "", "shard.serving_dtype", &o.serving_dtype);
  j.Add("state-dtype", "", "optimizer.state_dtype", &o.state_dtype);
  j.Add("reduction", "", "shard.reduction", &o.reduction);
  j.Add("update", "", "shard.update", &o.update);
  j.AddBytes("chunk-elems", "", "chunk_elems", &o.chunk_elems);
  AddModelFlags(f, &o.model);
}

// The job spec zps-train built from these options field by field before it went through JSON.
Result<JobSpec> FieldByField(const Options& o) {
  ZPS_ASSIGN_OR_RETURN(
      Layout layout,
      Layout::Build(LayoutSpecs(Specs(o.model)), {.chunk_elems = o.chunk_elems,
                                                  .align_elems = 64,
                                                  .num_shards = static_cast<uint32_t>(o.shards)}));
  JobSpec job{std::move(layout), {}, {}, {}};
  ZPS_ASSIGN_OR_RETURN(job.shard.mode, ParseReductionMode(o.reduction));
  job.shard.world_size = static_cast<uint32_t>(o.world_size);
  ZPS_ASSIGN_OR_RETURN(job.shard.update_mode, ParseUpdateMode(o.update));
  std::string gd = o.grad_dtype.empty() ? (o.loss_scaling ? "fp16" : "fp32") : o.grad_dtype;
  std::string sd = o.serving_dtype.empty() ? (o.loss_scaling ? "fp16" : "bf16") : o.serving_dtype;
  ZPS_ASSIGN_OR_RETURN(job.shard.grad_dtype, ParseDType(gd));
  ZPS_ASSIGN_OR_RETURN(job.shard.serving_dtype, ParseDType(sd));
  ZPS_ASSIGN_OR_RETURN(job.optimizer.kind, ParseOptimizerKind(o.optimizer));
  ZPS_ASSIGN_OR_RETURN(job.optimizer.state_dtype, ParseStateDType(o.state_dtype));
  job.optimizer.lr = static_cast<float>(o.lr);
  job.optimizer.beta1 = static_cast<float>(o.beta1);
  job.optimizer.beta2 = static_cast<float>(o.beta2);
  job.optimizer.eps = static_cast<float>(o.eps);
  job.optimizer.weight_decay = static_cast<float>(o.weight_decay);
  LrScheduleConfig& ls = job.shard.lr_schedule;
  ZPS_ASSIGN_OR_RETURN(ls.kind, ParseLrScheduleKind(o.lr_schedule));
  ZPS_ASSIGN_OR_RETURN(ls.warmup_type, ParseWarmupType(o.warmup_type));
  ls.warmup_num_steps = o.warmup_num_steps;
  ls.total_num_steps = o.total_num_steps > 0 ? o.total_num_steps : o.steps;
  ls.warmup_min_lr = 0.0;
  ls.warmup_max_lr = o.lr;
  if (ls.kind == LrScheduleKind::kNone) ls = {};
  job.commit.max_grad_norm = o.max_grad_norm;
  job.commit.grad_divisor = o.world_size;
  job.commit.dynamic_loss_scale = o.loss_scaling;
  job.commit.initial_loss_scale = o.initial_loss_scale;
  ZPS_RETURN_IF_ERROR(job.Validate());
  return job;
}

struct Built {
  Result<JobSpec> job = Internal("not built");
  Result<JobSpec> oracle = Internal("not built");
};

Built BuildFrom(std::vector<const char*> args) {
  Options o;
  Flags f("t", "test");
  JobFlags j(&f);
  Register(j, f, o);
  args.insert(args.begin(), "t");
  Built b;
  auto parsed = f.Parse(static_cast<int>(args.size()), args.data());
  if (!parsed.ok()) return {parsed.status(), parsed.status()};
  auto json = j.Json();
  if (!json.ok()) return {json.status(), FieldByField(o)};
  b.job = BuildJob(*json, o.model, o.steps);
  b.oracle = FieldByField(o);
  return b;
}

void ExpectSameJob(const JobSpec& a, const JobSpec& b) {
  EXPECT_EQ(a.Serialize(), b.Serialize());
  EXPECT_EQ(a.Hash(), b.Hash());
  EXPECT_EQ(a.shard, b.shard);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.commit, b.commit);
}

TEST(JobFlagsTest, FlagSetsBuildTheJobZpsTrainBuiltFieldByField) {
  const std::vector<std::vector<const char*>> sets = {
      {},
      {"--optimizer=sgd", "--lr=0.05", "--weight-decay=0.01", "--reduction=pre-reduced",
       "--world-size=3", "--shards=4", "--chunk-elems=64KiB"},
      {"--loss-scaling", "--initial-loss-scale=1024", "--max-grad-norm=0", "--update=speculative",
       "--state-dtype=int8"},
      {"--loss-scaling", "--grad-dtype=bf16", "--serving-dtype=fp32"},
      {"--lr-schedule=WarmupDecayLR", "--warmup-num-steps=7", "--warmup-type=linear", "--steps=50"},
      {"--lr-schedule=WarmupCosineLR", "--total-num-steps=90", "--lr=0.1", "--beta1=0.8",
       "--beta2=0.95", "--eps=1e-6"},
      {"--lr-schedule=none", "--warmup-num-steps=7", "--total-num-steps=3"},
  };
  for (const auto& args : sets) {
    std::string line;
    for (const char* a : args) line += std::string(a) + " ";
    SCOPED_TRACE(line);
    Built b = BuildFrom(args);
    ASSERT_THAT(b.job.status(), IsOk());
    ASSERT_THAT(b.oracle.status(), IsOk());
    ExpectSameJob(*b.job, *b.oracle);
  }
}

TEST(JobFlagsTest, AFlagSetAndTheEquivalentJsonGiveTheSameJob) {
  Options o;
  Flags f("t", "test");
  JobFlags j(&f);
  Register(j, f, o);
  const char* argv[] = {"t",
                        "--optimizer=adam",
                        "--lr=0.01",
                        "--world-size=4",
                        "--shards=3",
                        "--chunk-elems=4096",
                        "--loss-scaling",
                        "--lr-schedule=WarmupLR",
                        "--warmup-num-steps=20",
                        "--steps=100",
                        "--update=speculative",
                        "--d-model=32",
                        "--n-layers=1",
                        "--n-heads=2",
                        "--d-ff=64",
                        "--seq-len=16"};
  ASSERT_THAT(f.Parse(static_cast<int>(std::size(argv)), argv), IsOk());
  auto flags_json = j.Json();
  ASSERT_THAT(flags_json.status(), IsOk());
  auto from_flags = BuildJob(*flags_json, o.model, o.steps);
  ASSERT_THAT(from_flags.status(), IsOk());

  // What zps.torch would send for the same job (keys of the job spec's field lists).
  nlohmann::json params = nlohmann::json::array();
  for (const ParamSpec& p : LayoutSpecs(Specs(o.model))) {
    params.push_back({{"name", p.name}, {"shape", p.shape}});
  }
  const nlohmann::json torch = {
      {"params", params},
      {"chunk_elems", 4096},
      {"align_elems", 64},
      {"num_shards", 3},
      {"optimizer",
       {{"type", "adam"},
        {"lr", 0.01},
        {"beta1", 0.9},
        {"beta2", 0.999},
        {"eps", 1e-8},
        {"weight_decay", 0.0}}},
      {"commit",
       {{"max_grad_norm", 1.0},
        {"grad_divisor", 4},
        {"dynamic_loss_scale", true},
        {"initial_loss_scale", 65536.0}}},
      {"shard",
       {{"reduction", "server-sum"},
        {"world_size", 4},
        {"grad_dtype", "fp16"},
        {"serving_dtype", "fp16"},
        {"update", "speculative"},
        {"lr_schedule",
         {{"type", "WarmupLR"},
          {"warmup_min_lr", 0.0},
          {"warmup_max_lr", 0.01},
          {"warmup_num_steps", 20},
          {"total_num_steps", 100}}}}},
  };
  auto from_json = JobSpecFromJson(torch.dump());
  ASSERT_THAT(from_json.status(), IsOk());
  ExpectSameJob(*from_flags, *from_json);
  EXPECT_EQ(from_flags->layout.Serialize(), from_json->layout.Serialize());
}

TEST(JobFlagsTest, BadValuesAreRefusedNamingTheirKeyOrFlag) {
  EXPECT_THAT(BuildFrom({"--optimizer=lion"}).job.status(), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(BuildFrom({"--lr-schedule=Cyclic"}).job.status(), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(BuildFrom({"--beta1=1.5"}).job.status(), StatusIs(Code::kInvalidArgument));
  // Unused without a schedule, but still checked (as zps-train always did).
  Built unused = BuildFrom({"--lr-schedule=none", "--warmup-type=sideways"});
  EXPECT_THAT(unused.job.status(), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(unused.oracle.status(), StatusIs(Code::kInvalidArgument));
  // JSON has no NaN: it would read back as the default.
  Built nan = BuildFrom({"--lr=nan"});
  EXPECT_THAT(nan.job.status(), StatusIs(Code::kInvalidArgument));
  EXPECT_NE(nan.job.status().message().find("--lr"), std::string::npos);
}

TEST(JobFlagsTest, AnEmptyStringLeavesTheKeyOut) {
  Options o;
  Flags f("t", "test");
  JobFlags j(&f);
  Register(j, f, o);
  const char* argv[] = {"t", "--serving-dtype=fp32"};
  ASSERT_THAT(f.Parse(2, argv), IsOk());
  auto json = j.Json();
  ASSERT_THAT(json.status(), IsOk());
  EXPECT_FALSE((*json)["shard"].contains("grad_dtype"));
  EXPECT_EQ((*json)["shard"]["serving_dtype"], "fp32");
  EXPECT_EQ((*json)["optimizer"]["lr"], 3e-3);
  EXPECT_EQ((*json)["num_shards"], 2);
}

}  // namespace
}  // namespace zps::train
