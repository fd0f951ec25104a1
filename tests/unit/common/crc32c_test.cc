#include "zps/common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace zps {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 and the common check value.
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xe3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(Bytes(zeros)), 0x8a9136aau);
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(Bytes(ones)), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
}

TEST(Crc32c, HardwareMatchesPortableAndExtends) {
  std::mt19937 rng(7);
  // 12288 and up take the three-lane path (3 x 4096-byte lanes joined by table shifts).
  for (size_t n : {1u, 7u, 8u, 9u, 63u, 1000u, 4097u, 12287u, 12288u, 12295u, 40000u, 100003u}) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    auto b = Bytes(s);
    EXPECT_EQ(Crc32cExtend(0, b), Crc32cExtendPortable(0, b)) << n;
    size_t cut = n / 3;
    EXPECT_EQ(Crc32cExtend(Crc32c(b.first(cut)), b.subspan(cut)), Crc32c(b)) << n;
  }
}

}  // namespace
}  // namespace zps
