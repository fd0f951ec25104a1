// FreeLoopbackPort: ports below the ephemeral range, distinct, and kept in the reservation file
// that python/zps/ports.py shares: a port reserved there (by either) in the last
// kPortReserveSeconds is not handed out, an older one may be, and what is handed out is written
// down in the same format.
#include "zps/common/free_port.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>
#include <string>

#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

namespace fs = std::filesystem;

int EphemeralLow() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  return low;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TMPDIR pointed at a folder of the test's own, so that the reservation file is the test's.
class FreePortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("TMPDIR");
    if (old != nullptr) old_tmpdir_ = old;
    dir_ = fs::temp_directory_path() / ("zps-free-port-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (old_tmpdir_.empty()) {
      ::unsetenv("TMPDIR");
    } else {
      ::setenv("TMPDIR", old_tmpdir_.c_str(), 1);
    }
    fs::remove_all(dir_);
  }
  fs::path File() const { return dir_ / ("zps-ports-" + std::to_string(::getuid())); }

  fs::path dir_;
  std::string old_tmpdir_;
};

TEST_F(FreePortTest, HandsOutDistinctPortsBelowTheEphemeralRangeAndWritesThemDown) {
  auto ports = FreeLoopbackPorts(8);
  ASSERT_THAT(ports, IsOk());
  const std::set<uint16_t> distinct(ports->begin(), ports->end());
  EXPECT_EQ(distinct.size(), 8u);
  for (uint16_t p : *ports) {
    EXPECT_GE(p, 10000);
    EXPECT_LT(p, EphemeralLow());
  }
  std::ifstream in(File());
  std::set<uint16_t> written;
  int port = 0;
  double when = 0;
  while (in >> port >> when) {
    written.insert(static_cast<uint16_t>(port));
    EXPECT_NEAR(when, Now(), 60.0);
  }
  EXPECT_EQ(written, distinct);
}

// The file reserves every even port of the range now and every odd one longer ago than
// kPortReserveSeconds, in zps.ports' format: each port handed out is odd, and below the
// ephemeral range (had the old reservations counted, no port would be left to draw).
TEST_F(FreePortTest, AvoidsThePortsTheFileReservesAndForgetsOldOnes) {
  const int low = EphemeralLow();
  ASSERT_GT(low, 10010);
  {
    std::ofstream out(File(), std::ios::trunc);
    out << std::fixed << std::setprecision(3);
    const double now = Now();
    for (int p = 10000; p < low; ++p) {
      out << p << " " << (p % 2 == 0 ? now : now - kPortReserveSeconds - 5) << "\n";
    }
  }
  for (int i = 0; i < 20; ++i) {
    auto port = FreeLoopbackPort();
    ASSERT_THAT(port, IsOk());
    EXPECT_EQ(*port % 2, 1) << *port;
    EXPECT_LT(*port, low);
  }
}

}  // namespace
}  // namespace zps
