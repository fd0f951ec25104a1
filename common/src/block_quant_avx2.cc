// AVX2 kernels of block_quant.h: 8 fp32 lanes. Same operations as the scalar reference in
// block_quant.cc (see block_quant_kernels.h); the loops are block_quant_kernel_body.inc's, this
// file supplies the ISA's operations.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "block_quant_kernels.h"
#include "zps/common/simd_convert.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace zps::internal {
namespace avx2 {
namespace {

struct V {
  using F = __m256;
  using Flags = __m256;  // all-ones lanes where a value was not finite
  static constexpr size_t kLanes = 8;
  static constexpr size_t kCodeStep = 32;

  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F Abs(F x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

  static Flags NoFlags() { return _mm256_setzero_ps(); }
  static Flags FlagNonFinite(Flags bad, F abs) {
    return _mm256_or_ps(bad, _mm256_cmp_ps(abs, _mm256_set1_ps(3.40282347e38f), _CMP_NLE_UQ));
  }
  static bool AnyFlag(Flags bad) { return _mm256_movemask_ps(bad) != 0; }

  static void StoreBF16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), simd::F32ToBF16x8(x));
  }
  static void StoreF16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), simd::F32ToF16x8(x));
  }

  static F LoadInt8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  template <int kPart>
  static F Int8Lanes(__m128i codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8 * kPart)));
  }

  // Eight codes as int32 lanes.
  static __m256i Code8(const float* x, F inv, F qmax, F nqmax) {
    F y = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
    y = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm256_min_ps(_mm256_max_ps(y, nqmax), qmax);
    return _mm256_cvttps_epi32(y);
  }

  // 32 codes as 32 int8 bytes in element order.
  static __m256i Code32(const float* x, F inv, F qmax, F nqmax) {
    const __m256i p01 =
        _mm256_packs_epi32(Code8(x, inv, qmax, nqmax), Code8(x + 8, inv, qmax, nqmax));
    const __m256i p23 =
        _mm256_packs_epi32(Code8(x + 16, inv, qmax, nqmax), Code8(x + 24, inv, qmax, nqmax));
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }

  // Pairs of int8 codes (element 2j low byte, 2j+1 high byte of a 16-bit lane) to one nibble
  // byte each, in the low byte of the lane.
  static __m256i Nibbles(__m256i c) {
    const __m256i lo = _mm256_and_si256(c, _mm256_set1_epi16(0x000f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0));
    return _mm256_or_si256(lo, hi);
  }

  static void Codes8(const float* x, F inv, F qmax, F nqmax, uint8_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), Code32(x, inv, qmax, nqmax));
  }

  static void Codes4(const float* x, F inv, F qmax, F nqmax, uint8_t* out) {
    const __m256i a = Nibbles(Code32(x, inv, qmax, nqmax));
    const __m256i b = Nibbles(Code32(x + 32, inv, qmax, nqmax));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xd8));
  }
};

#include "block_quant_kernel_body.inc"

}  // namespace
}  // namespace avx2
}  // namespace zps::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace zps::internal {
const BlockQuantKernels& BlockQuantAvx2() {
  static constexpr BlockQuantKernels table{&avx2::Absmax, &avx2::AddAbsmax, &avx2::Codes,
                                           &avx2::Dequant};
  return table;
}
}  // namespace zps::internal
