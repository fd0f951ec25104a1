// The int8 dynamic quantization maps' code values (state_codec.h describes the map).
#include "state_codec.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "zps/common/dtype.h"
#include "zps/server/optimizer.h"
#include "zps/server/packed_moment.h"

namespace zps::server::internal {
namespace {

// The midpoint of cell `cell` of decade d's `n` cells: 10^(d-6) x (0.1 + (cell + 0.5) x 0.9 / n),
// formed in double and rounded once.
float CellValue(int d, int cell, int n) {
  double decade = 1.0;
  for (int i = d; i < kDecades - 1; ++i) decade /= 10.0;
  return static_cast<float>(decade * (0.1 + (cell + 0.5) * 0.9 / n));
}

std::array<float, 256> MakeTable(bool is_signed) {
  std::array<float, 256> t{};
  for (int d = 0; d < kDecades; ++d) {
    const MapConsts& c = is_signed ? kSignedMap : kUnsignedMap;
    const int n = is_signed ? (1 << d) : (2 << d);
    for (int cell = 0; cell < n; ++cell) {
      const int k = c.base[d] + cell;
      t[static_cast<size_t>(k)] = CellValue(d, cell, n);
      if (is_signed) t[static_cast<size_t>(k | 0x80)] = -CellValue(d, cell, n);
    }
  }
  if (is_signed) {
    t[0x80] = -0.0f;
  } else {
    t[255] = 1.0f;
  }
  return t;
}

}  // namespace

const float* Int8Table(bool is_signed) {
  alignas(64) static const std::array<float, 256> kSigned = MakeTable(true);
  alignas(64) static const std::array<float, 256> kUnsigned = MakeTable(false);
  return is_signed ? kSigned.data() : kUnsigned.data();
}

}  // namespace zps::server::internal

namespace zps::server {

Status PackMoment(StateDType dtype, MomentKind kind, std::span<const float> values,
                  std::span<std::byte> packed) {
  const size_t n = values.size();
  if (packed.size() != MomentBytes(dtype, n)) {
    return InvalidArgument("pack moment: " + std::to_string(packed.size()) + " bytes for " +
                           std::to_string(n) + " elements of " +
                           std::string(StateDTypeName(dtype)));
  }
  if (dtype == StateDType::kF32) {
    std::memcpy(packed.data(), values.data(), n * sizeof(float));
  } else if (dtype == StateDType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = FloatToBf16(values[i]);
      std::memcpy(packed.data() + 2 * i, &h, 2);
    }
  } else {
    std::fill(packed.begin(), packed.end(), std::byte{0});
    auto* out = reinterpret_cast<uint8_t*>(packed.data());
    for (size_t b = 0; b < n; b += kInt8BlockElems) {
      const size_t len = std::min<size_t>(kInt8BlockElems, n - b);
      uint8_t* block = out + b / kInt8BlockElems * kInt8BlockBytes;
      uint32_t mx = 0;
      for (size_t i = 0; i < len; ++i) {
        mx = std::max(mx, std::bit_cast<uint32_t>(values[b + i]) & 0x7fffffffu);
      }
      const uint16_t scale = internal::Int8ScaleUp(mx);
      const float inv = internal::Int8Inverse(scale);
      for (size_t i = 0; i < len; ++i) {
        block[i] = kind == MomentKind::kM ? internal::Int8Quantize<true>(values[b + i], inv)
                                          : internal::Int8Quantize<false>(values[b + i], inv);
      }
      std::memcpy(block + kInt8BlockElems, &scale, 2);
    }
  }
  return Status::Ok();
}

Status UnpackMoment(StateDType dtype, MomentKind kind, std::span<const std::byte> packed,
                    std::span<float> values) {
  const size_t n = values.size();
  if (packed.size() != MomentBytes(dtype, n)) {
    return InvalidArgument("unpack moment: " + std::to_string(packed.size()) + " bytes for " +
                           std::to_string(n) + " elements of " +
                           std::string(StateDTypeName(dtype)));
  }
  if (dtype == StateDType::kF32) {
    std::memcpy(values.data(), packed.data(), n * sizeof(float));
  } else if (dtype == StateDType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, packed.data() + 2 * i, 2);
      values[i] = internal::Bf16Value(h);
    }
  } else {
    const float* table = internal::Int8Table(kind == MomentKind::kM);
    const auto* in = reinterpret_cast<const uint8_t*>(packed.data());
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* block = in + i / kInt8BlockElems * kInt8BlockBytes;
      uint16_t scale;
      std::memcpy(&scale, block + kInt8BlockElems, 2);
      values[i] = table[block[i % kInt8BlockElems]] * internal::Bf16Value(scale);
    }
  }
  return Status::Ok();
}

}  // namespace zps::server
