#include "zps/common/log_rate_limit.h"

#include <gtest/gtest.h>

namespace zps::log {
namespace {

using namespace std::chrono_literals;

TEST(LogRateLimit, LetsABurstThroughPerWindowAndCountsTheRest) {
  LogRateLimit limit(3, 1s);
  const auto t0 = LogRateLimit::Clock::time_point{} + 100s;
  uint64_t held = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limit.Allow(&held, t0 + i * 1ms));
    EXPECT_EQ(held, 0u);
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limit.Allow(&held, t0 + 500ms));
  // The next window: the first record says how many were held back, then they start again.
  ASSERT_TRUE(limit.Allow(&held, t0 + 1s));
  EXPECT_EQ(held, 5u);
  ASSERT_TRUE(limit.Allow(&held, t0 + 1s + 1ms));
  EXPECT_EQ(held, 0u);
}

TEST(LogRateLimit, AZeroWindowLimitsNothing) {
  LogRateLimit limit(1, LogRateLimit::Clock::duration::zero());
  uint64_t held = 7;
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(limit.Allow(&held));
  EXPECT_EQ(held, 0u);
}

}  // namespace
}  // namespace zps::log
