// AVX2 kernels of block_quant.h: 8 fp32 lanes. Same operations as the scalar reference in
// block_quant.cc (see block_quant_kernels.h); block_quant_avx512.cc has the same structure.
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

// absmax of x[0..n) (prefix); kAdd: of g + x instead, written back to out (out may be x).
template <bool kAdd>
size_t AbsmaxOf(const float* g, const float* x, float* out, size_t n, float* absmax,
                bool* nonfinite) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 big = _mm256_set1_ps(3.40282347e38f);
  __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if constexpr (kAdd) {
      v = _mm256_add_ps(_mm256_loadu_ps(g + i), v);
      _mm256_storeu_ps(out + i, v);
    }
    const __m256 a = _mm256_andnot_ps(sign, v);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
    m = _mm256_max_ps(m, a);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = *absmax;
  for (float v : lanes) r = r > v ? r : v;
  *absmax = r;
  if (_mm256_movemask_ps(bad) != 0) *nonfinite = true;
  return i;
}

size_t Absmax(const float* x, size_t n, float* absmax, bool* nonfinite) {
  return AbsmaxOf<false>(nullptr, x, nullptr, n, absmax, nonfinite);
}

size_t AddAbsmax(const float* g, float* r, size_t n, float* absmax, bool* nonfinite) {
  return AbsmaxOf<true>(g, r, r, n, absmax, nonfinite);
}

// Eight codes as int32 lanes.
__m256i Code8(const float* x, __m256 inv, __m256 qmax, __m256 nqmax) {
  __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
  y = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  y = _mm256_min_ps(_mm256_max_ps(y, nqmax), qmax);
  return _mm256_cvttps_epi32(y);
}

// 32 codes as 32 int8 bytes in element order.
__m256i Code32(const float* x, __m256 inv, __m256 qmax, __m256 nqmax) {
  const __m256i p01 =
      _mm256_packs_epi32(Code8(x, inv, qmax, nqmax), Code8(x + 8, inv, qmax, nqmax));
  const __m256i p23 =
      _mm256_packs_epi32(Code8(x + 16, inv, qmax, nqmax), Code8(x + 24, inv, qmax, nqmax));
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Pairs of int8 codes (element 2j low byte, 2j+1 high byte of a 16-bit lane) to one nibble byte
// each, in the low byte of the lane.
__m256i Nibbles(__m256i c) {
  const __m256i lo = _mm256_and_si256(c, _mm256_set1_epi16(0x000f));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0));
  return _mm256_or_si256(lo, hi);
}

size_t Codes(int bits, const float* x, size_t n, float inv_s, float qmax_s, uint8_t* codes) {
  const __m256 inv = _mm256_set1_ps(inv_s), qmax = _mm256_set1_ps(qmax_s),
               nqmax = _mm256_set1_ps(-qmax_s);
  size_t i = 0;
  if (bits == 8) {
    for (; i + 32 <= n; i += 32) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), Code32(x + i, inv, qmax, nqmax));
    }
  } else {
    for (; i + 64 <= n; i += 64) {
      const __m256i a = Nibbles(Code32(x + i, inv, qmax, nqmax));
      const __m256i b = Nibbles(Code32(x + i + 32, inv, qmax, nqmax));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i / 2),
                          _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xd8));
    }
  }
  return i;
}

void Put(DequantOp op, void* out, size_t j, __m256 v) {
  switch (op) {
    case DequantOp::kStore:
      _mm256_storeu_ps(static_cast<float*>(out) + j, v);
      break;
    case DequantOp::kAdd: {
      float* p = static_cast<float*>(out) + j;
      _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), v));
      break;
    }
    case DequantOp::kSub: {
      float* p = static_cast<float*>(out) + j;
      _mm256_storeu_ps(p, _mm256_sub_ps(_mm256_loadu_ps(p), v));
      break;
    }
    case DequantOp::kBF16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + j),
                       simd::F32ToBF16x8(v));
      break;
    case DequantOp::kF16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + j),
                       simd::F32ToF16x8(v));
      break;
  }
}

__m256 Values8(__m128i bytes8, __m256 scale) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8)), scale);
}

size_t Dequant(int bits, const uint8_t* codes, size_t from, size_t n, float scale_s, DequantOp op,
               void* out) {
  const __m256 scale = _mm256_set1_ps(scale_s);
  size_t i = 0;
  if (bits == 8) {
    for (; i + 8 <= n; i += 8) {
      Put(op, out, i,
          Values8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + from + i)), scale));
    }
  } else {
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (; i + 16 <= n; i += 16) {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + (from + i) / 2));
      const __m128i lo = _mm_and_si128(x, mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
      __m128i c = _mm_unpacklo_epi8(lo, hi);
      c = _mm_sub_epi8(_mm_xor_si128(c, eight), eight);
      Put(op, out, i, Values8(c, scale));
      Put(op, out, i + 8, Values8(_mm_srli_si128(c, 8), scale));
    }
  }
  return i;
}

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
