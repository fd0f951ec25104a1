// zps/common/crc32c.h — CRC32C (Castagnoli), with the SSE4.2 crc32 instruction where the CPU has
// it and a table-driven fallback elsewhere. Both give identical results.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace zps {

/// Extends `crc` (0 to start) over `data`. Crc32c(a+b) == Crc32cExtend(Crc32c(a), b).
uint32_t Crc32cExtend(uint32_t crc, std::span<const std::byte> data);
inline uint32_t Crc32c(std::span<const std::byte> data) { return Crc32cExtend(0, data); }
inline uint32_t Crc32c(const void* data, size_t n) {
  return Crc32c(std::span<const std::byte>(static_cast<const std::byte*>(data), n));
}
/// The portable implementation, exposed so tests can compare it with the hardware path.
uint32_t Crc32cExtendPortable(uint32_t crc, std::span<const std::byte> data);
/// True when the hardware path is in use.
bool Crc32cIsHardware();

}  // namespace zps
