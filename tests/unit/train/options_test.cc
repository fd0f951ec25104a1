#include "zps/train/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train_flags.h"
#include "zps/testing/status_matchers.h"

namespace zps::train {
namespace {

TEST(OptionsTest, FlagsFillConfig) {
  ModelConfig mc;
  DataOptions d;
  std::string corpus;
  Flags flags("t", "test");
  AddModelFlags(flags, &mc);
  AddDataFlags(flags, &d, &corpus);
  const char* argv[] = {"t",         "--d-model=64",    "--n-layers",  "6", "--model-seed=9",
                        "--batch=3", "--corpus=/tmp/x", "--data-seed", "12"};
  auto r = flags.Parse(9, argv);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(mc.d_model, 64);
  EXPECT_EQ(mc.n_layers, 6);
  EXPECT_EQ(mc.seed, 9u);
  EXPECT_EQ(d.batch, 3);
  EXPECT_EQ(d.seed, 12u);
  EXPECT_EQ(corpus, "/tmp/x");
  Flags bad("t", "test");
  ModelConfig mc2;
  AddModelFlags(bad, &mc2);
  const char* argv2[] = {"t", "--model-seed=-1"};
  EXPECT_FALSE(bad.Parse(2, argv2).ok());
}

// zps-train's options after parsing `args` (zps-train's own flags, as its main() registers them)
// and setting o.job, before ApplyQuantizedFlags.
TrainOptions Parsed(std::vector<const char*> args) {
  TrainFlags t;
  EXPECT_THAT(t.Parse(std::move(args)), IsOk());
  auto json = t.job.Json();
  EXPECT_THAT(json.status(), IsOk());
  if (json.ok()) t.o.job = *json;
  return t.o;
}

TEST(OptionsTest, QuantizedFlagsSetTheirBlockDTypes) {
  TrainOptions none = Parsed({"--grad-dtype=bf16"});
  const nlohmann::json before = none.job;
  ASSERT_THAT(ApplyQuantizedFlags(&none), IsOk());
  EXPECT_EQ(none.job, before);

  TrainOptions both = Parsed({"--quantized-grads=int4", "--quantized-weights=int8"});
  ASSERT_THAT(ApplyQuantizedFlags(&both), IsOk());
  EXPECT_EQ(both.job["shard"]["grad_dtype"], "int4-block");
  EXPECT_EQ(both.job["shard"]["serving_dtype"], "int8-block");

  TrainOptions grads = Parsed({"--quantized-grads=int8"});
  ASSERT_THAT(ApplyQuantizedFlags(&grads), IsOk());
  EXPECT_EQ(grads.job["shard"]["grad_dtype"], "int8-block");
  EXPECT_FALSE(grads.job["shard"].contains("serving_dtype"));
}

TEST(OptionsTest, BadOrContradictingQuantizedFlagsAreNamed) {
  struct Case {
    std::vector<const char*> args;
    const char* message;
  };
  const Case cases[] = {
      {{"--quantized-grads=int2"}, "--quantized-grads must be int8 or int4, not 'int2'"},
      {{"--quantized-grads=int4", "--grad-dtype=bf16"},
       "--quantized-grads and --grad-dtype both set the push dtype: give one"},
      {{"--quantized-weights=int4"}, "--quantized-weights must be int8; got 'int4'"},
      {{"--quantized-weights=int8", "--serving-dtype=fp32"},
       "--quantized-weights and --serving-dtype both set the serving copy: give one"},
      // A good flag beside a bad one: the bad one is named, and the job is left as it was.
      {{"--quantized-grads=int8", "--quantized-weights=fp8"},
       "--quantized-weights must be int8; got 'fp8'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    TrainOptions o = Parsed(c.args);
    const nlohmann::json before = o.job;
    EXPECT_THAT(ApplyQuantizedFlags(&o),
                StatusIs(Code::kInvalidArgument, ::testing::Eq(std::string(c.message))));
    EXPECT_EQ(o.job, before);
  }
}

}  // namespace
}  // namespace zps::train
