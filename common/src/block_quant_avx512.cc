// AVX-512 kernels of block_quant.h: 16 fp32 lanes. Same operations as the scalar reference in
// block_quant.cc (see block_quant_kernels.h); the loops are block_quant_kernel_body.inc's, this
// file supplies the ISA's operations.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "block_quant_kernels.h"
#include "zps/common/simd_convert.h"

#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

namespace zps::internal {
namespace avx512 {
namespace {

struct V {
  using F = __m512;
  using Flags = __mmask16;  // set bits where a value was not finite
  static constexpr size_t kLanes = 16;
  static constexpr size_t kCodeStep = 16;

  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F Abs(F x) { return _mm512_abs_ps(x); }

  static Flags NoFlags() { return 0; }
  static Flags FlagNonFinite(Flags bad, F abs) {
    return bad | _mm512_cmp_ps_mask(abs, _mm512_set1_ps(3.40282347e38f), _CMP_NLE_UQ);
  }
  static bool AnyFlag(Flags bad) { return bad != 0; }

  static void StoreBF16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), simd::F32ToBF16x16(x));
  }
  static void StoreF16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), simd::F32ToF16x16(x));
  }

  static F LoadInt8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  template <int kPart>
  static F Int8Lanes(__m128i codes) {
    static_assert(kPart == 0);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
  }

  // 16 codes as 16 int8 bytes in element order.
  static __m128i Code16(const float* x, F inv, F qmax, F nqmax) {
    F y = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
    y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm512_min_ps(_mm512_max_ps(y, nqmax), qmax);
    return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(y));
  }

  static void Codes8(const float* x, F inv, F qmax, F nqmax, uint8_t* out) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Code16(x, inv, qmax, nqmax));
  }

  static void Codes4(const float* x, F inv, F qmax, F nqmax, uint8_t* out) {
    const __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(Code16(x, inv, qmax, nqmax)),
                                              Code16(x + 16, inv, qmax, nqmax), 1);
    const __m256i lo = _mm256_and_si256(c, _mm256_set1_epi16(0x000f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm256_cvtepi16_epi8(_mm256_or_si256(lo, hi)));
  }
};

#include "block_quant_kernel_body.inc"

}  // namespace
}  // namespace avx512
}  // namespace zps::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace zps::internal {
const BlockQuantKernels& BlockQuantAvx512() {
  static constexpr BlockQuantKernels table{&avx512::Absmax, &avx512::AddAbsmax, &avx512::Codes,
                                           &avx512::Dequant};
  return table;
}
}  // namespace zps::internal
