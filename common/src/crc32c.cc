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

__attribute__((target("sse4.2"))) uint64_t Lane(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  return c;
}

// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so one
// dependent chain runs at a third of the speed. Long buffers go through three independent lanes
// of kLane bytes each; the lanes are joined by "shifting" a register over kLane zero bytes, a
// linear map done with four 256-entry tables (Z(c) = T0[c&ff] ^ T1[..] ^ T2[..] ^ T3[c>>24]),
// since crc(s, A‖B) = Z_|B|(crc(s, A)) ^ crc(0, B) for the raw (unconditioned) register.
constexpr size_t kLane = 4096;

struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> t{};
};

__attribute__((target("sse4.2"))) ShiftTables MakeShiftTables() {
  ShiftTables z;
  for (int byte = 0; byte < 4; ++byte) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint64_t c = static_cast<uint64_t>(v) << (8 * byte);
      for (size_t i = 0; i < kLane; i += 8) c = _mm_crc32_u64(c, 0);
      z.t[byte][v] = static_cast<uint32_t>(c);
    }
  }
  return z;
}

inline uint32_t Shift(const ShiftTables& z, uint32_t c) {
  return z.t[0][c & 0xffu] ^ z.t[1][(c >> 8) & 0xffu] ^ z.t[2][(c >> 16) & 0xffu] ^ z.t[3][c >> 24];
}

const ShiftTables& Tables();

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = ~crc;
  if (n >= 3 * kLane) {
    const ShiftTables& z = Tables();
    while (n >= 3 * kLane) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kLane; i += 8) {
        uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, p + kLane + i, 8);
        std::memcpy(&wd, p + 2 * kLane + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
      }
      c = Shift(z, Shift(z, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(d);
      p += 3 * kLane;
      n -= 3 * kLane;
    }
  }
  c = Lane(c, p, n);
  p += n & ~size_t{7};
  n &= 7;
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

const bool kHasSse42 = __builtin_cpu_supports("sse4.2");

const ShiftTables& Tables() {
  static const ShiftTables z = MakeShiftTables();  // only reached when kHasSse42
  return z;
}

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
