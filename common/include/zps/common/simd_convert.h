// zps/common/simd_convert.h — inline fp32 <-> fp16/bf16 conversions on SIMD registers, for the
// vectorised kernels (bulk conversion here, fused optimizer passes in server/).
//
// Each function carries its own target attribute, so including this header needs no compiler
// flags; call them only from code that runs after a runtime ISA check (see cpu.h). Results are
// bit-identical to the scalar conversions in dtype.h (RNE, Inf kept, NaN quietened with payload).
//
// Thread-safety: pure functions.
#pragma once

#include <immintrin.h>

#define ZPS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ZPS_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace zps::simd {

// ---- AVX-512: 16 lanes ----------------------------------------------------------------------

ZPS_TARGET_AVX512 inline __m256i F32ToF16x16(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ZPS_TARGET_AVX512 inline __m512 F16ToF32x16(__m256i h) { return _mm512_cvtph_ps(h); }

ZPS_TARGET_AVX512 inline __m256i F32ToBF16x16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan,
                            _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
ZPS_TARGET_AVX512 inline __m512 BF16ToF32x16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// ---- AVX2: 8 lanes ----------------------------------------------------------------------------

ZPS_TARGET_AVX2 inline __m128i F32ToF16x8(__m256 v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ZPS_TARGET_AVX2 inline __m256 F16ToF32x8(__m128i h) { return _mm256_cvtph_ps(h); }

ZPS_TARGET_AVX2 inline __m128i F32ToBF16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(nan));
  // Values are <= 0xffff, so unsigned saturating pack is exact; fix the lane order after it.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
ZPS_TARGET_AVX2 inline __m256 BF16ToF32x8(__m128i b) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

}  // namespace zps::simd
