// AVX-512 kernels of block_quant.h: 16 fp32 lanes. Same structure as block_quant_avx2.cc.
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

// absmax of x[0..n) (prefix); kAdd: of g + x instead, written back to out (out may be x).
template <bool kAdd>
size_t AbsmaxOf(const float* g, const float* x, float* out, size_t n, float* absmax,
                bool* nonfinite) {
  const __m512 big = _mm512_set1_ps(3.40282347e38f);
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    if constexpr (kAdd) {
      v = _mm512_add_ps(_mm512_loadu_ps(g + i), v);
      _mm512_storeu_ps(out + i, v);
    }
    const __m512 a = _mm512_abs_ps(v);
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);
    m = _mm512_max_ps(m, a);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = *absmax;
  for (float v : lanes) r = r > v ? r : v;
  *absmax = r;
  if (bad != 0) *nonfinite = true;
  return i;
}

size_t Absmax(const float* x, size_t n, float* absmax, bool* nonfinite) {
  return AbsmaxOf<false>(nullptr, x, nullptr, n, absmax, nonfinite);
}

size_t AddAbsmax(const float* g, float* r, size_t n, float* absmax, bool* nonfinite) {
  return AbsmaxOf<true>(g, r, r, n, absmax, nonfinite);
}

// 16 codes as int32 lanes.
__m512i Code16(const float* x, __m512 inv, __m512 qmax, __m512 nqmax) {
  __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
  y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  y = _mm512_min_ps(_mm512_max_ps(y, nqmax), qmax);
  return _mm512_cvttps_epi32(y);
}

size_t Codes(int bits, const float* x, size_t n, float inv_s, float qmax_s, uint8_t* codes) {
  const __m512 inv = _mm512_set1_ps(inv_s), qmax = _mm512_set1_ps(qmax_s),
               nqmax = _mm512_set1_ps(-qmax_s);
  size_t i = 0;
  if (bits == 8) {
    for (; i + 16 <= n; i += 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                       _mm512_cvtepi32_epi8(Code16(x + i, inv, qmax, nqmax)));
    }
  } else {
    for (; i + 32 <= n; i += 32) {
      const __m128i a = _mm512_cvtepi32_epi8(Code16(x + i, inv, qmax, nqmax));
      const __m128i b = _mm512_cvtepi32_epi8(Code16(x + i + 16, inv, qmax, nqmax));
      const __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
      const __m256i lo = _mm256_and_si256(c, _mm256_set1_epi16(0x000f));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / 2),
                       _mm256_cvtepi16_epi8(_mm256_or_si256(lo, hi)));
    }
  }
  return i;
}

void Put(DequantOp op, void* out, size_t j, __m512 v) {
  switch (op) {
    case DequantOp::kStore:
      _mm512_storeu_ps(static_cast<float*>(out) + j, v);
      break;
    case DequantOp::kAdd: {
      float* p = static_cast<float*>(out) + j;
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), v));
      break;
    }
    case DequantOp::kSub: {
      float* p = static_cast<float*>(out) + j;
      _mm512_storeu_ps(p, _mm512_sub_ps(_mm512_loadu_ps(p), v));
      break;
    }
    case DequantOp::kBF16:
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + j),
                          simd::F32ToBF16x16(v));
      break;
    case DequantOp::kF16:
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + j),
                          simd::F32ToF16x16(v));
      break;
  }
}

__m512 Values16(__m128i bytes16, __m512 scale) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes16)), scale);
}

size_t Dequant(int bits, const uint8_t* codes, size_t from, size_t n, float scale_s, DequantOp op,
               void* out) {
  const __m512 scale = _mm512_set1_ps(scale_s);
  size_t i = 0;
  if (bits == 8) {
    for (; i + 16 <= n; i += 16) {
      Put(op, out, i,
          Values16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + from + i)), scale));
    }
  } else {
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (; i + 32 <= n; i += 32) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (from + i) / 2));
      const __m128i lo = _mm_and_si128(x, mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
      const __m128i c0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
      const __m128i c1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
      Put(op, out, i, Values16(c0, scale));
      Put(op, out, i + 16, Values16(c1, scale));
    }
  }
  return i;
}

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
