#include "zps/common/dtype.h"

#include <string>

#include "zps/common/cpu.h"
#include "zps/common/simd_convert.h"

namespace zps {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8Block:
      return "int8-block";
    case DType::kI4Block:
      return "int4-block";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view text) {
  if (text == "fp32" || text == "f32" || text == "float32") return DType::kF32;
  if (text == "fp16" || text == "f16" || text == "float16") return DType::kF16;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "int8-block") return DType::kI8Block;
  if (text == "int4-block") return DType::kI4Block;
  return InvalidArgument("dtype must be fp32, fp16, bf16, int8-block or int4-block; got '" +
                         std::string(text) + "'");
}

Result<DType> DTypeFromByte(uint8_t b) {
  if (b > static_cast<uint8_t>(DType::kI4Block)) {
    return InvalidArgument("unknown dtype code " + std::to_string(b));
  }
  return static_cast<DType>(b);
}

namespace {

Isa Level() {
  auto isa = ActiveIsa();
  return isa.ok() ? *isa : Isa::kScalar;
}

ZPS_TARGET_AVX512 void F32ToF16Avx512(const float* in, uint16_t* out, size_t n, size_t& i) {
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        simd::F32ToF16x16(_mm512_loadu_ps(in + i)));
  }
}
ZPS_TARGET_AVX2 void F32ToF16Avx2(const float* in, uint16_t* out, size_t n, size_t& i) {
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     simd::F32ToF16x8(_mm256_loadu_ps(in + i)));
  }
}
ZPS_TARGET_AVX512 void F16ToF32Avx512(const uint16_t* in, float* out, size_t n, size_t& i) {
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        out + i, simd::F16ToF32x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  }
}
ZPS_TARGET_AVX2 void F16ToF32Avx2(const uint16_t* in, float* out, size_t n, size_t& i) {
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     simd::F16ToF32x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
}
ZPS_TARGET_AVX512 void F32ToBF16Avx512(const float* in, uint16_t* out, size_t n, size_t& i) {
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        simd::F32ToBF16x16(_mm512_loadu_ps(in + i)));
  }
}
ZPS_TARGET_AVX2 void F32ToBF16Avx2(const float* in, uint16_t* out, size_t n, size_t& i) {
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     simd::F32ToBF16x8(_mm256_loadu_ps(in + i)));
  }
}
ZPS_TARGET_AVX512 void BF16ToF32Avx512(const uint16_t* in, float* out, size_t n, size_t& i) {
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        out + i, simd::BF16ToF32x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  }
}
ZPS_TARGET_AVX2 void BF16ToF32Avx2(const uint16_t* in, float* out, size_t n, size_t& i) {
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     simd::BF16ToF32x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
}

}  // namespace

void ConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out) {
  size_t i = 0, n = in.size();
  Isa isa = Level();
  if (isa == Isa::kAvx512)
    F32ToF16Avx512(in.data(), out.data(), n, i);
  else if (isa == Isa::kAvx2)
    F32ToF16Avx2(in.data(), out.data(), n, i);
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void ConvertF16ToF32(std::span<const uint16_t> in, std::span<float> out) {
  size_t i = 0, n = in.size();
  Isa isa = Level();
  if (isa == Isa::kAvx512)
    F16ToF32Avx512(in.data(), out.data(), n, i);
  else if (isa == Isa::kAvx2)
    F16ToF32Avx2(in.data(), out.data(), n, i);
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void ConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out) {
  size_t i = 0, n = in.size();
  Isa isa = Level();
  if (isa == Isa::kAvx512)
    F32ToBF16Avx512(in.data(), out.data(), n, i);
  else if (isa == Isa::kAvx2)
    F32ToBF16Avx2(in.data(), out.data(), n, i);
  for (; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

void ConvertBF16ToF32(std::span<const uint16_t> in, std::span<float> out) {
  size_t i = 0, n = in.size();
  Isa isa = Level();
  if (isa == Isa::kAvx512)
    BF16ToF32Avx512(in.data(), out.data(), n, i);
  else if (isa == Isa::kAvx2)
    BF16ToF32Avx2(in.data(), out.data(), n, i);
  for (; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

}  // namespace zps
