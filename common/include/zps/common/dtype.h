// zps/common/dtype.h — element types and scalar fp16/bf16 conversion.
//
// Conversions from fp32 round to nearest, ties to even. Inf stays Inf; NaN stays NaN (made quiet,
// keeping the top payload bits, as the F16C instructions do); fp16 subnormals are produced and read
// exactly. Values at or beyond 65520 round to fp16 Inf.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "zps/common/status.h"

namespace zps {

/// Element types of parameters, gradients and serving copies. Stable numeric values (wire format).
/// kI8Block and kI4Block are block-quantized buffers (zps/common/block_quant.h: one fp32 scale
/// per block, int8 or int4 codes): they have no per-element size, and a buffer of n elements
/// takes QuantizedBytes(format, n) bytes.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI8Block = 3, kI4Block = 4 };

constexpr bool IsBlockQuantized(DType t) { return t == DType::kI8Block || t == DType::kI4Block; }
/// Bytes per element of fp32/fp16/bf16. Block-quantized dtypes return 0: their sizes come from
/// QuantizedBytes, and a 0 here makes a caller that forgot that fail loudly, never overrun.
constexpr size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kF16 || t == DType::kBF16) ? 2 : 0;
}
/// Code bits of a block-quantized dtype (8 or 4); 0 for the others.
constexpr uint8_t DTypeQuantBits(DType t) {
  return t == DType::kI8Block ? 8 : t == DType::kI4Block ? 4 : 0;
}
std::string_view DTypeName(DType t);
/// "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16", "int8-block",
/// "int4-block". Where a block dtype is allowed is the job spec's validation's business.
Result<DType> ParseDType(std::string_view text);
/// Validates a dtype byte from the wire or a file.
Result<DType> DTypeFromByte(uint8_t b);

inline uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x47800000u) {  // >= 2^16 (Inf after rounding), Inf or NaN
    if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (x < 0x38800000u) {  // below the smallest fp16 normal: let the FPU round at 2^-24 steps
    float r = std::bit_cast<float>(x) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // rebias the exponent (-112) and round half to even
  return static_cast<uint16_t>(sign | (x >> 13));
}

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

/// Reads element i of a buffer of dtype `t` as fp32 (NaN for block-quantized dtypes).
inline float LoadAsFloat(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kI8Block:  // not element-addressable: see block_quant.h
    case DType::kI4Block:
      break;
  }
  return std::bit_cast<float>(0x7fc00000u);
}

/// Bulk conversions, vectorised for the active ISA (see cpu.h). `out` must be at least as long
/// as `in`; only the first in.size() elements are written.
void ConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out);
void ConvertF16ToF32(std::span<const uint16_t> in, std::span<float> out);
void ConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out);
void ConvertBF16ToF32(std::span<const uint16_t> in, std::span<float> out);

}  // namespace zps
