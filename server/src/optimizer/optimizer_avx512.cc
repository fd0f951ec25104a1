// AVX-512 (F, BW, VL, DQ) kernels: 16 fp32 lanes. Compiled under a pragma target region so the
// rest of the binary keeps the baseline ISA; Optimizer::Create only selects this table after
// checking the CPU (zps/common/cpu.h).
// GCC 12 reports -Wuninitialized false positives inside its own intrinsic headers
// (`__m512i __Y = __Y;` in _mm512_undefined_*) once they are inlined into these kernels; the
// pragma must precede the header to apply to its lines.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "optimizer_kernels.h"
#include "state_codec.h"
#include "zps/common/dtype.h"
#include "zps/common/simd_convert.h"

#if defined(__clang__)  // the clang build (thread-safety analysis, TSan): same region
#pragma clang attribute push(                                                    \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

namespace zps::server::internal {
namespace avx512 {

struct V {
  using F = __m512;
  static constexpr size_t kLanes = 16;
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  template <bool STREAM>
  static void StoreState(float* p, F x) {
    if constexpr (STREAM) {
      _mm512_stream_ps(p, x);
    } else {
      _mm512_storeu_ps(p, x);
    }
  }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  template <DType G>
  static F LoadGrad(const void* base, size_t i) {
    if constexpr (G == DType::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
      return G == DType::kF16 ? simd::F16ToF32x16(h) : simd::BF16ToF32x16(h);
    }
  }
  template <DType OUT, bool STREAM>
  static void StoreOut(uint16_t* p, F x) {
    const __m256i h = OUT == DType::kF16 ? simd::F32ToF16x16(x) : simd::F32ToBF16x16(x);
    if constexpr (STREAM) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    }
  }
  // ---- packed moments (optimizer_compact_body.inc; state_codec.h defines each lane) ----
  using I = __m512i;
  static F LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static I Fmix(I h) {
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85ebca6bu)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u)));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  }
  static I SrBits(uint32_t lo, uint32_t lo_first, uint32_t key0, uint32_t key1) {
    const I iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const I idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)), iota);
    const __mmask16 wrapped =
        _mm512_cmplt_epu32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo_first)));
    const I key = _mm512_mask_blend_epi32(wrapped, _mm512_set1_epi32(static_cast<int>(key0)),
                                          _mm512_set1_epi32(static_cast<int>(key1)));
    return Fmix(_mm512_xor_si512(idx, key));
  }
  static void StoreBf16Sr(uint16_t* p, F x, I bits, int shift) {
    const I r = _mm512_and_si512(_mm512_srli_epi32(bits, static_cast<unsigned>(shift)),
                                 _mm512_set1_epi32(0xffff));
    I y = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x), r), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    y = _mm512_mask_mov_epi32(y, nan, _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(y));
  }
  static F Dequant(const uint8_t* codes, const float* table) {
    const I idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    return _mm512_i32gather_ps(idx, table, 4);
  }
  template <bool SIGNED>
  static void Quant(uint8_t* out, F x, F inv) {
    const MapConsts& c = SIGNED ? kSignedMap : kUnsignedMap;
    const I bits = _mm512_castps_si512(x);
    const F a = _mm512_mul_ps(
        _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff))), inv);
    I d = _mm512_setzero_si512();
    const I one = _mm512_set1_epi32(1);
    for (float b : kDecadeBound) {
      d = _mm512_mask_add_epi32(d, _mm512_cmp_ps_mask(a, _mm512_set1_ps(b), _CMP_GE_OQ), d, one);
    }
    const F sc = _mm512_permutexvar_ps(d, _mm512_castps256_ps512(_mm256_loadu_ps(c.scale)));
    const F ce = _mm512_permutexvar_ps(d, _mm512_castps256_ps512(_mm256_loadu_ps(c.cells)));
    const F t = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(a, sc), _mm512_set1_ps(0.1f)), ce);
    I cell = _mm512_max_epi32(_mm512_cvttps_epi32(t), _mm512_setzero_si512());
    const I lim = _mm512_permutexvar_epi32(
        d, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.limit))));
    cell = _mm512_min_epi32(cell, lim);
    const I base = _mm512_permutexvar_epi32(
        d, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.base))));
    I k = _mm512_add_epi32(base, cell);
    k = _mm512_mask_mov_epi32(k, _mm512_cmp_ps_mask(a, _mm512_set1_ps(c.zero_below), _CMP_LT_OQ),
                              _mm512_setzero_si512());
    if constexpr (SIGNED) {
      k = _mm512_or_si512(k,
                          _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(k));
  }
  static I AbsBits(F x) {
    return _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  }
  static I MaxU(I a, I b) { return _mm512_max_epu32(a, b); }
  static uint32_t ReduceMax(I x) { return _mm512_reduce_max_epu32(x); }
  static void StreamFence() { _mm_sfence(); }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

#include "optimizer_kernel_body.inc"

template <DType G>
__m512 LoadF32x16(const void* base, size_t i) {
  return V::LoadGrad<G>(base, i);
}

// One stream alone gets little from the hardware prefetchers (they restart at every 4 KiB page):
// prefetching 2 KiB ahead measured ~1.4x on this pass at 1 thread. Prefetches never fault, and the
// address is formed as an integer, so running past the end of the buffer is harmless.
template <DType G>
inline void Prefetch2K(const void* g, size_t i) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(g) + i * DTypeSize(G) + 2048;
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

// Squares of fp32 values are exact in double, so the only rounding is in the additions: 16
// double lanes per block (two accumulators of 8), reduced in a fixed order.
template <DType G>
double SumSquaresBlock(const void* g, size_t begin, size_t end) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    Prefetch2K<G>(g, i);
    const __m512 x = LoadF32x16<G>(g, i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, acc0);
  _mm512_store_pd(lanes + 8, acc1);
  double s = 0.0;
  for (double x : lanes) s += x;
  for (; i < end; ++i) {
    const double x = LoadAsFloat(g, G, i);
    s += x * x;
  }
  return s;
}

template <DType G>
double SumSquaresRangeT(const void* g, size_t begin, size_t end) {
  double s = 0.0;
  for (size_t b = begin; b < end; b += kStatsBlock)
    s += SumSquaresBlock<G>(g, b, std::min(end, b + kStatsBlock));
  return s;
}

double SumSquaresRange(const void* g, DType dtype, size_t begin, size_t end) {
  switch (dtype) {
    case DType::kF32:
      return SumSquaresRangeT<DType::kF32>(g, begin, end);
    case DType::kF16:
      return SumSquaresRangeT<DType::kF16>(g, begin, end);
    case DType::kBF16:
      return SumSquaresRangeT<DType::kBF16>(g, begin, end);
  }
  return 0.0;
}

void UpdateRange(const KernelArgs& a, size_t begin, size_t end) {
  UpdateRangeImpl<V>(a, begin, end);
}

}  // namespace avx512
}  // namespace zps::server::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace zps::server::internal {
const KernelTable& Avx512Kernels() {
  static constexpr KernelTable table{&avx512::UpdateRange, &avx512::SumSquaresRange};
  return table;
}
}  // namespace zps::server::internal
