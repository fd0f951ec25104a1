#include "zps/common/pacer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace zps {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(Pacer, WaitsUntilTheShareIsDue) {
  const auto t0 = Clock::now();
  Pacer p(100, 0.2);
  p.Wait(0);
  p.Wait(50);  // due 0.1 s after the start
  EXPECT_GE(SecondsSince(t0), 0.1);
  p.Wait(1000);  // capped at the total: due at 0.2 s
  EXPECT_GE(SecondsSince(t0), 0.2);
}

TEST(Pacer, NoBudgetNeverWaits) {
  Pacer none(100, 0.0);
  Pacer empty(0, 3600.0);
  none.Wait(100);
  empty.Wait(100);
  // (Had either waited, the test would run for an hour: ctest's timeout fails it.)
}

TEST(Pacer, HurryEndsAWaitNowAndLater) {
  Pacer p(100, 3600.0);
  std::thread waiter([&] { p.Wait(100); });  // due in an hour
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  p.Hurry();
  waiter.join();
  p.Wait(100);  // returns at once after Hurry
}

}  // namespace
}  // namespace zps
