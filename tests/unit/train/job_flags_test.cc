// JobFlags and BuildJob: zps-train's job-spec flags make the JSON job description zps.torch sends,
// decoded by the job spec's one JSON codec. The flags are zps-train's own (AddTrainFlags, as its
// main() registers them), and the job spec's fields are read through its field lists
// (zps/common/job_spec.h), so a flag, key or default that drifts fails here. The oracle for "the
// job is unchanged" is the job spec zps-train built field by field from the same flags before
// (FieldByField below).
#include "zps/train/job_flags.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "train_flags.h"
#include "zps/common/block_quant.h"
#include "zps/common/serving_quant.h"
#include "zps/testing/status_matchers.h"
#include "zps/train/options.h"

namespace zps::train {
namespace {

// The job spec zps-train built from these options field by field before it went through JSON.
Result<JobSpec> FieldByField(const TrainOptions& o) {
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
  TrainFlags t;
  Built b;
  auto parsed = t.Parse(std::move(args));
  if (!parsed.ok()) return {parsed.status(), parsed.status()};
  auto json = t.job.Json();
  if (!json.ok()) return {json.status(), FieldByField(t.o)};
  b.job = BuildJob(*json, t.o.model, t.o.steps);
  b.oracle = FieldByField(t.o);
  return b;
}

void ExpectSameJob(const JobSpec& a, const JobSpec& b) {
  EXPECT_EQ(a.Serialize(), b.Serialize());
  EXPECT_EQ(a.Hash(), b.Hash());
  EXPECT_EQ(a.shard, b.shard);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.commit, b.commit);
}

// ---- The job spec's fields by their JSON key, read through its field lists ----

nlohmann::json J(bool v) { return v; }
nlohmann::json J(float v) { return v; }
nlohmann::json J(double v) { return v; }
nlohmann::json J(int64_t v) { return v; }
nlohmann::json J(uint32_t v) { return v; }
nlohmann::json J(uint8_t v) { return v; }
nlohmann::json J(DType v) { return std::string(DTypeName(v)); }
nlohmann::json J(ReductionMode v) { return std::string(ReductionModeName(v)); }
nlohmann::json J(UpdateMode v) { return std::string(UpdateModeName(v)); }
nlohmann::json J(OptimizerKind v) { return std::string(OptimizerKindName(v)); }
nlohmann::json J(LrScheduleKind v) { return std::string(LrScheduleKindName(v)); }
nlohmann::json J(WarmupType v) { return std::string(WarmupTypeName(v)); }
nlohmann::json J(StateDType v) { return std::string(StateDTypeName(v)); }
nlohmann::json J(const ParamGroup& g) {
  nlohmann::json o = nlohmann::json::object();
#define ZPS_TEST_FIELD(type, member, def, key, ...) o[key] = J(g.member);
  ZPS_PARAM_GROUP_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
  return o;
}
nlohmann::json J(const LrScheduleConfig& c) {
  nlohmann::json o = nlohmann::json::object();
#define ZPS_TEST_FIELD(type, member, def, key, ...) o[key] = J(c.member);
  ZPS_LR_SCHEDULE_CONFIG_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
  return o;
}
template <typename T>
nlohmann::json J(const std::vector<T>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const T& x : v) a.push_back(J(x));
  return a;
}

// Every field of `job` at its dotted JSON key ("optimizer.lr", "shard.lr_schedule.type"; the
// schedule also as one object at "shard.lr_schedule"), and the layout's keys.
std::map<std::string, nlohmann::json> Fields(const JobSpec& job) {
  std::map<std::string, nlohmann::json> f;
  f["num_shards"] = job.layout.options().num_shards;
  f["chunk_elems"] = job.layout.options().chunk_elems;
  f["align_elems"] = job.layout.options().align_elems;
#define ZPS_TEST_FIELD(type, member, def, key, ...) f["optimizer." key] = J(job.optimizer.member);
  ZPS_OPTIMIZER_CONFIG_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
#define ZPS_TEST_FIELD(type, member, def, key, ...) f["commit." key] = J(job.commit.member);
  ZPS_COMMIT_CONFIG_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
#define ZPS_TEST_FIELD(type, member, def, key, ...) f["shard." key] = J(job.shard.member);
  ZPS_SHARD_JOB_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
#define ZPS_TEST_FIELD(type, member, def, key, ...) \
  f["shard.lr_schedule." key] = J(job.shard.lr_schedule.member);
  ZPS_LR_SCHEDULE_CONFIG_FIELDS(ZPS_TEST_FIELD)
#undef ZPS_TEST_FIELD
  return f;
}

// The flags' JSON job description decoded as it is, without what BuildJob derives or drops.
Result<JobSpec> DecodeAsIs(nlohmann::json j, const ModelConfig& model) {
  nlohmann::json& params = j["params"] = nlohmann::json::array();
  for (const ParamSpec& p : LayoutSpecs(Specs(model))) {
    params.push_back({{"name", p.name}, {"shape", p.shape}});
  }
  j["align_elems"] = 64;
  return JobSpecFromJson(j.dump());
}

// Where zps-train's defaults depart from the field lists' (and what BuildJob derives from them).
std::map<std::string, nlohmann::json> ZpsTrainOwnDefaults() {
  return {{"num_shards", 2},
          {"chunk_elems", 256 << 10},
          {"align_elems", 64},
          {"shard.world_size", 2},
          {"commit.grad_divisor", 2.0},
          {"optimizer.lr", J(3e-3f)},
          {"commit.max_grad_norm", 1.0}};
}

TEST(JobFlagsTest, DefaultsAreTheFieldListsDefaultsButZpsTrainsOwn) {
  TrainFlags t;
  ASSERT_THAT(t.Parse({}), IsOk());
  auto flags_json = t.job.Json();
  ASSERT_THAT(flags_json.status(), IsOk());
  auto built = BuildJob(*flags_json, t.o.model, t.o.steps);
  ASSERT_THAT(built.status(), IsOk());
  auto as_is = DecodeAsIs(*flags_json, t.o.model);
  ASSERT_THAT(as_is.status(), IsOk());
  const JobSpec defaults{built->layout, {}, {}, {}};  // every field at its field list's default
  const auto want = Fields(defaults);
  const auto own = ZpsTrainOwnDefaults();
  auto expected = [&](const std::string& key) {
    auto it = own.find(key);
    return it != own.end() ? it->second : want.at(key);
  };
  // zps-train's job with no flag given.
  for (const auto& [key, value] : Fields(*built)) {
    SCOPED_TRACE(key);
    EXPECT_EQ(value, expected(key));
  }
  // Each flag's default as the codec reads it (BuildJob leaves the schedule out when it is none,
  // so its flags are checked here).
  const auto got = Fields(*as_is);
  for (const JobFlags::Binding& b : t.job.Bindings()) {
    SCOPED_TRACE("--" + b.flag + " (" + b.key + ")");
    ASSERT_EQ(got.count(b.key), 1u) << "the key names no job-spec field";
    EXPECT_EQ(got.at(b.key), expected(b.key));
  }
}

TEST(JobFlagsTest, EachJobSpecFlagLandsInItsField) {
  // A value other than the default for each flag, and the field's value it must give.
  struct Case {
    const char* arg;
    nlohmann::json want;
  };
  const std::map<std::string, Case> cases = {
      {"world-size", {"--world-size=3", 3}},
      {"shards", {"--shards=3", 3}},
      {"optimizer", {"--optimizer=sgd", "sgd"}},
      {"lr", {"--lr=0.25", J(0.25f)}},
      {"weight-decay", {"--weight-decay=0.125", J(0.125f)}},
      {"beta1", {"--beta1=0.5", J(0.5f)}},
      {"beta2", {"--beta2=0.75", J(0.75f)}},
      {"eps", {"--eps=0.5", J(0.5f)}},
      {"max-grad-norm", {"--max-grad-norm=2.5", 2.5}},
      {"lr-schedule", {"--lr-schedule=WarmupCosineLR", "WarmupCosineLR"}},
      {"warmup-num-steps", {"--warmup-num-steps=7", 7}},
      {"total-num-steps", {"--total-num-steps=90", 90}},
      {"warmup-type", {"--warmup-type=linear", "linear"}},
      {"loss-scaling", {"--loss-scaling", true}},
      {"initial-loss-scale", {"--initial-loss-scale=1024", 1024.0}},
      {"grad-dtype", {"--grad-dtype=bf16", "bf16"}},
      {"serving-dtype", {"--serving-dtype=fp32", "fp32"}},
      {"state-dtype", {"--state-dtype=int8", "int8"}},
      {"reduction", {"--reduction=pre-reduced", "pre-reduced"}},
      {"update", {"--update=speculative", "speculative"}},
      {"chunk-elems", {"--chunk-elems=64KiB", 64 << 10}},
  };
  TrainFlags t;
  const std::vector<JobFlags::Binding> bindings = t.job.Bindings();
  ASSERT_FALSE(bindings.empty());
  Built plain = BuildFrom({});
  ASSERT_THAT(plain.job.status(), IsOk());
  const auto defaults = Fields(*plain.job);
  for (const JobFlags::Binding& b : bindings) {
    SCOPED_TRACE("--" + b.flag + " (" + b.key + ")");
    auto c = cases.find(b.flag);
    ASSERT_NE(c, cases.end()) << "no test value for this flag: add one to `cases`";
    ASSERT_EQ(defaults.count(b.key), 1u) << "the key names no job-spec field";
    ASSERT_NE(defaults.at(b.key), c->second.want) << "the test value is the default";
    // The schedule's other fields are kept only with a schedule.
    std::vector<const char*> args = {c->second.arg};
    if (b.key.starts_with("shard.lr_schedule.") && b.key != "shard.lr_schedule.type") {
      args.push_back("--lr-schedule=WarmupDecayLR");
    }
    Built built = BuildFrom(args);
    ASSERT_THAT(built.job.status(), IsOk());
    EXPECT_EQ(Fields(*built.job).at(b.key), c->second.want);
  }
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
  TrainFlags t;
  ASSERT_THAT(t.Parse({"--optimizer=adam", "--lr=0.01", "--world-size=4", "--shards=3",
                       "--chunk-elems=4096", "--loss-scaling", "--lr-schedule=WarmupLR",
                       "--warmup-num-steps=20", "--steps=100", "--update=speculative",
                       "--d-model=32", "--n-layers=1", "--n-heads=2", "--d-ff=64", "--seq-len=16"}),
              IsOk());
  auto flags_json = t.job.Json();
  ASSERT_THAT(flags_json.status(), IsOk());
  auto from_flags = BuildJob(*flags_json, t.o.model, t.o.steps);
  ASSERT_THAT(from_flags.status(), IsOk());

  // What zps.torch would send for the same job (keys of the job spec's field lists).
  nlohmann::json params = nlohmann::json::array();
  for (const ParamSpec& p : LayoutSpecs(Specs(t.o.model))) {
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
  for (const char* arg : {"--optimizer=lion", "--lr-schedule=Cyclic", "--beta1=1.5"}) {
    EXPECT_THAT(BuildFrom({arg}).job.status(), StatusIs(Code::kInvalidArgument)) << arg;
  }
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
  TrainFlags t;
  ASSERT_THAT(t.Parse({"--serving-dtype=fp32"}), IsOk());
  auto json = t.job.Json();
  ASSERT_THAT(json.status(), IsOk());
  EXPECT_FALSE((*json)["shard"].contains("grad_dtype"));
  EXPECT_EQ((*json)["shard"]["serving_dtype"], "fp32");
  EXPECT_EQ((*json)["optimizer"]["lr"], 3e-3);
  EXPECT_EQ((*json)["num_shards"], 2);
}

// Quantized weights: every parameter of zps-train's default model starts on a weight block of its
// own, so each block's scale is its own parameter's absmax. With parameters 64-aligned, a
// LayerNorm gain (1.0) and the bias beside it shared a block, and the bias (here 1e-3) was read
// back with a quantum of 1/127: as zeros.
TEST(JobFlagsTest, QuantizedWeightsGiveEveryParameterItsOwnBlocks) {
  TrainFlags t;
  ASSERT_THAT(t.Parse({"--quantized-weights=int8"}), IsOk());
  auto json = t.job.Json();
  ASSERT_THAT(json.status(), IsOk());
  TrainOptions& o = t.o;
  o.job = *json;
  ASSERT_THAT(ApplyQuantizedFlags(&o), IsOk());
  auto job = BuildJob(o.job, o.model, o.steps);
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_EQ(job->shard.serving_dtype, DType::kI8Block);
  const Layout& layout = job->layout;
  EXPECT_EQ(layout.options().align_elems % kWeightQuantBlock, 0u);

  // A master whose parameters differ in magnitude by up to 1000x, as gains, biases and weights
  // do; each chunk quantized as the shards serve it.
  std::vector<float> master(layout.total_elems(), 0.0f);
  for (uint32_t id = 0; id < layout.num_params(); ++id) {
    const float mag = id % 3 == 0 ? 1.0f : id % 3 == 1 ? 1e-3f : 0.02f;
    const uint64_t off = layout.param_offset(id);
    for (uint64_t i = 0; i < layout.param_numel(id); ++i) {
      master[off + i] = mag * (0.5f + 0.5f * static_cast<float>((i * 37) % 101) / 100.0f);
    }
  }
  const QuantFormat qf = ServingQuantFormat(DType::kI8Block);
  const uint64_t ce = layout.options().chunk_elems;
  std::vector<float> read(master.size());
  for (uint32_t c = 0; c < layout.num_chunks(); ++c) {
    const uint64_t n = layout.chunk_size(c);
    std::vector<std::byte> q(QuantizedBytes(qf, n));
    QuantizeBlocks(qf, std::span<const float>(master).subspan(c * ce, n), q);
    DequantizeBlocks(qf, q, std::span<float>(read).subspan(c * ce, n));
  }
  for (uint32_t id = 0; id < layout.num_params(); ++id) {
    const uint64_t off = layout.param_offset(id), n = layout.param_numel(id);
    float absmax = 0.0f, err = 0.0f;
    for (uint64_t i = off; i < off + n; ++i) {
      absmax = std::max(absmax, std::fabs(master[i]));
      err = std::max(err, std::fabs(read[i] - master[i]));
    }
    // Half a quantum of the parameter's own scale (absmax / 127), and a little rounding.
    EXPECT_LE(err, absmax / 254.0f * 1.001f) << layout.spec(id).name;
  }
}

}  // namespace
}  // namespace zps::train
