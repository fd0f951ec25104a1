#include "zps/common/crc32c.h"

#include <immintrin.h>

#include <array>
#include <cstring>

namespace zps {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

const bool kHasSse42 = __builtin_cpu_supports("sse4.2");

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, std::span<const std::byte> data) {
  uint32_t c = ~crc;
  for (std::byte b : data) c = kTable[(c ^ static_cast<uint8_t>(b)) & 0xffu] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, std::span<const std::byte> data) {
  if (kHasSse42) {
    return ExtendHardware(crc, reinterpret_cast<const uint8_t*>(data.data()), data.size());
  }
  return Crc32cExtendPortable(crc, data);
}

bool Crc32cIsHardware() { return kHasSse42; }

}  // namespace zps
