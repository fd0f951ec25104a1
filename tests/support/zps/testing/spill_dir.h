// The directory tests put spill files in: $ZPS_TEST_SPILL_DIR (to test on a chosen disk), else
// gtest's TempDir().
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace zps::testing {

/// Without a trailing slash. Thread-safe; never fails.
inline std::string SpillDir() {
  const char* d = std::getenv("ZPS_TEST_SPILL_DIR");
  std::string dir = d != nullptr ? d : ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

}  // namespace zps::testing
