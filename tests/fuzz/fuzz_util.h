// fuzz_util.h — shared by the fuzz targets: the round-trip oracle. A decoder may refuse any
// input; what it accepts must encode to bytes that decode again to the same encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#define ZPS_FUZZ_CHECK(cond)                                             \
  do {                                                                   \
    if (!(cond)) __builtin_trap(); /* libFuzzer reports it as a crash */ \
  } while (0)

namespace zps::fuzz {

inline std::span<const std::byte> Bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// M has static Result<M> Decode(span) and std::vector<std::byte> Encode() const.
template <typename M>
void RoundTrip(std::span<const std::byte> in) {
  auto m = M::Decode(in);
  if (!m.ok()) return;
  const auto bytes = m->Encode();
  auto again = M::Decode(bytes);
  ZPS_FUZZ_CHECK(again.ok());
  ZPS_FUZZ_CHECK(again->Encode() == bytes);
}

}  // namespace zps::fuzz
