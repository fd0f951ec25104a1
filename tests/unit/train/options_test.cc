#include "zps/train/options.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zps::train
