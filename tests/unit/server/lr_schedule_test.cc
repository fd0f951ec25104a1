// LrSchedule against DeepSpeed's formulas written out independently here (docs/optimizer.md
// "Learning-rate schedules"), at chosen steps: the first update, mid-warmup, the end of warmup,
// mid-decay and past the total.
#include "zps/server/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

constexpr double kPi = 3.14159265358979323846;

LrScheduleConfig Cosine(WarmupType t) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupCosineLR;
  c.total_num_steps = 100;
  c.warmup_num_steps = 10;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  c.warmup_type = t;
  return c;
}

// `applied` updates before this one: DeepSpeed's scheduler is at iteration applied - 1.
TEST(LrSchedule, WarmupCosineRatioTimesEachGroupsLr) {
  const LrSchedule s(Cosine(WarmupType::kLinear));
  const float base = 0.002f;
  const double b = static_cast<double>(base);
  EXPECT_EQ(s.LrAt(0, b), 0.0);      // iteration -1: DeepSpeed's initial lr is 0
  EXPECT_EQ(s.LrAt(1, b), b * 0.1);  // iteration 0: warmup_min_ratio
  EXPECT_EQ(s.LrAt(6, b), b * (0.1 + (5.0 / 10.0) * (1.0 - 0.1)));  // iteration 5 of 10
  const double end_warm = 0.01 + (1.0 - 0.01) * ((1.0 + std::cos(kPi * (1.0 / 90.0))) / 2.0);
  EXPECT_EQ(s.LrAt(11, b), b * end_warm);  // iteration 10: first cosine step
  const double mid = 0.01 + (1.0 - 0.01) * ((1.0 + std::cos(kPi * (46.0 / 90.0))) / 2.0);
  EXPECT_EQ(s.LrAt(56, b), b * mid);                           // iteration 55
  EXPECT_EQ(s.LrAt(101, b), b * (0.01 + (1.0 - 0.01) * 0.0));  // iteration 100: the floor
  EXPECT_EQ(s.LrAt(5000, b), s.LrAt(101, b));                  // and it stays there
  EXPECT_EQ(s.LrFor(56, base), static_cast<float>(b * mid));   // one rounding to float
  // The ratio scales every group: another base lr, the same ratio.
  EXPECT_EQ(s.LrAt(56, 1.0), mid);
}

TEST(LrSchedule, WarmupCosineLog) {
  const LrSchedule s(Cosine(WarmupType::kLog));
  const double ratio = (1.0 / std::log(10.0)) * std::log(4.0 + 1.0);  // iteration 4
  EXPECT_EQ(s.LrAt(5, 1.0), 0.1 + ratio * (1.0 - 0.1));
  EXPECT_EQ(s.LrAt(1, 1.0), 0.1);  // log(1) = 0
}

TEST(LrSchedule, WarmupLRIsAbsoluteAndIgnoresTheGroupLr) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupLR;
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 4;
  c.warmup_type = WarmupType::kLinear;
  const LrSchedule s(c);
  const double d = 1e-3 - 1e-5;
  EXPECT_EQ(s.LrAt(0, 0.5), 1e-5);              // iteration -1: min_lrs
  EXPECT_EQ(s.LrAt(1, 0.5), 1e-5 + d * 0.0);    // iteration 0
  EXPECT_EQ(s.LrAt(3, 0.5), 1e-5 + d * 0.5);    // iteration 2 of 4
  EXPECT_EQ(s.LrAt(5, 0.5), 1e-5 + d * 1.0);    // iteration 4: warmup done
  EXPECT_EQ(s.LrAt(999, 7.0), 1e-5 + d * 1.0);  // constant after, whatever the group lr
  c.warmup_type = WarmupType::kLog;
  const LrSchedule l(c);
  EXPECT_EQ(l.LrAt(3, 0.5), 1e-5 + d * ((1.0 / std::log(4.0)) * std::log(3.0)));
}

TEST(LrSchedule, WarmupDecayLRDecaysLinearlyToZero) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupDecayLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.01;
  c.warmup_num_steps = 4;
  c.total_num_steps = 20;
  c.warmup_type = WarmupType::kLinear;
  const LrSchedule s(c);
  EXPECT_EQ(s.LrAt(3, 1.0), 0.01 * (2.0 / 4.0));     // warmup, iteration 2
  EXPECT_EQ(s.LrAt(5, 1.0), 0.01 * (16.0 / 16.0));   // iteration 4: (20 - 4) / (20 - 4)
  EXPECT_EQ(s.LrAt(11, 1.0), 0.01 * (10.0 / 16.0));  // iteration 10
  EXPECT_EQ(s.LrAt(21, 1.0), 0.0);                   // iteration 20
  EXPECT_EQ(s.LrAt(30, 1.0), 0.0);                   // clamped at 0
}

TEST(LrSchedule, WarmupStepsBelowTwoActAsTwo) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1.0;
  c.warmup_num_steps = 1;  // DeepSpeed: max(2, warmup_num_steps)
  c.warmup_type = WarmupType::kLinear;
  const LrSchedule s(c);
  EXPECT_EQ(s.LrAt(2, 1.0), 0.5);  // iteration 1 of 2
  EXPECT_EQ(s.LrAt(3, 1.0), 1.0);
}

TEST(LrSchedule, NoneIsEachGroupsLr) {
  const LrSchedule s(LrScheduleConfig{});
  EXPECT_EQ(s.LrFor(0, 1e-3f), 1e-3f);
  EXPECT_EQ(s.LrFor(12345, 0.3f), 0.3f);
}

void ExpectBad(const LrScheduleConfig& c, std::string_view field) {
  const Status s = c.Validate();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(LrSchedule, ValidationNamesTheField) {
  EXPECT_THAT(LrScheduleConfig{}.Validate(), IsOk());
  LrScheduleConfig c;
  c.warmup_min_lr = -1;
  ExpectBad(c, "warmup_min_lr");
  c = {};
  c.warmup_max_lr = std::nan("");
  ExpectBad(c, "warmup_max_lr");
  c = {};
  c.warmup_num_steps = 0;
  ExpectBad(c, "warmup_num_steps");
  c = {};
  c.kind = LrScheduleKind::kWarmupCosineLR;  // total_num_steps not set
  ExpectBad(c, "total_num_steps");
  c.total_num_steps = 10;
  c.cos_min_ratio = -0.5;
  ExpectBad(c, "cos_min_ratio");
  c.cos_min_ratio = 0;
  c.warmup_min_ratio = INFINITY;
  ExpectBad(c, "warmup_min_ratio");
  c = {};
  c.kind = static_cast<LrScheduleKind>(9);
  ExpectBad(c, "kind");
  EXPECT_EQ(ParseLrScheduleKind("WarmupCosineLR").value(), LrScheduleKind::kWarmupCosineLR);
  EXPECT_FALSE(ParseLrScheduleKind("OneCycle").ok());
  EXPECT_EQ(ParseWarmupType("linear").value(), WarmupType::kLinear);
  EXPECT_FALSE(ParseWarmupType("cosine").ok());
}

}  // namespace
}  // namespace zps::server
