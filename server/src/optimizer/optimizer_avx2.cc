// AVX2 + FMA + F16C kernels: 8 fp32 lanes. Same structure as optimizer_avx512.cc.
// GCC 12 reports -Wuninitialized false positives inside its own intrinsic headers
// (`__m512i __Y = __Y;` in _mm512_undefined_*) once they are inlined into these kernels; the
// pragma must precede the header to apply to its lines.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "optimizer_kernels.h"
#include "state_codec.h"
#include "zps/common/dtype.h"
#include "zps/common/simd_convert.h"

#if defined(__clang__)  // the clang build (thread-safety analysis, TSan): same region
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace zps::server::internal {
namespace avx2 {

struct V {
  using F = __m256;
  static constexpr size_t kLanes = 8;
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  template <bool STREAM>
  static void StoreState(float* p, F x) {
    if constexpr (STREAM) {
      _mm256_stream_ps(p, x);
    } else {
      _mm256_storeu_ps(p, x);
    }
  }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  template <DType G>
  static F LoadGrad(const void* base, size_t i) {
    if constexpr (G == DType::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      return G == DType::kF16 ? simd::F16ToF32x8(h) : simd::BF16ToF32x8(h);
    }
  }
  template <DType OUT, bool STREAM>
  static void StoreOut(uint16_t* p, F x) {
    const __m128i h = OUT == DType::kF16 ? simd::F32ToF16x8(x) : simd::F32ToBF16x8(x);
    if constexpr (STREAM) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    }
  }
  // ---- packed moments (optimizer_compact_body.inc; state_codec.h defines each lane) ----
  using I = __m256i;
  static F LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static I Fmix(I h) {
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  }
  // Unsigned a < b: flip the sign bits and compare signed.
  static I LessU(I a, I b) {
    const I flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    return _mm256_cmpgt_epi32(_mm256_xor_si256(b, flip), _mm256_xor_si256(a, flip));
  }
  static I SrStart(uint32_t lo, uint32_t lo_first, uint32_t key0, uint32_t key1) {
    const I iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const I idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(lo)), iota);
    const I wrapped = LessU(idx, _mm256_set1_epi32(static_cast<int>(lo_first)));
    const I key = _mm256_blendv_epi8(_mm256_set1_epi32(static_cast<int>(key0)),
                                     _mm256_set1_epi32(static_cast<int>(key1)), wrapped);
    return Fmix(_mm256_xor_si256(idx, key));
  }
  static I Dither(I start, uint32_t offset) {
    return _mm256_add_epi32(start, _mm256_set1_epi32(static_cast<int>(offset)));
  }
  static void StoreBf16Sr(uint16_t* p, F x, I bits, int shift) {
    const I r = _mm256_and_si256(_mm256_srli_epi32(bits, shift), _mm256_set1_epi32(0xffff));
    I y = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(x), r), 16);
    const I nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    y = _mm256_blendv_epi8(y, _mm256_set1_epi32(0x7fc0), nan);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  // A plain load per lane: faster than vgatherdps from the table on the machine of
  // docs/benchmarks.md ("int8 state on AVX2"), with the same values.
  static F Dequant(const uint8_t* codes, const float* table) {
    return _mm256_setr_ps(table[codes[0]], table[codes[1]], table[codes[2]], table[codes[3]],
                          table[codes[4]], table[codes[5]], table[codes[6]], table[codes[7]]);
  }
  // Int8Quantize of each lane, as a dword.
  template <bool SIGNED>
  static I Codes(F x, F inv) {
    const MapConsts& c = SIGNED ? kSignedMap : kUnsignedMap;
    const I bits = _mm256_castps_si256(x);
    const F a = _mm256_mul_ps(
        _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff))), inv);
    // d = how many bounds a reaches: each compare is -1 where it does, summed as a tree.
    static_assert(std::size(kDecadeBound) == 6);
    I ge[6];
    for (int j = 0; j < 6; ++j) {
      ge[j] = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(kDecadeBound[j]), _CMP_GE_OQ));
    }
    const I d =
        _mm256_sub_epi32(_mm256_setzero_si256(),
                         _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(ge[0], ge[1]), ge[2]),
                                          _mm256_add_epi32(_mm256_add_epi32(ge[3], ge[4]), ge[5])));
    const F sc = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c.scale), d);
    const F ce = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c.cells), d);
    const F t = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(a, sc), _mm256_set1_ps(0.1f)), ce);
    I cell = _mm256_max_epi32(_mm256_cvttps_epi32(t), _mm256_setzero_si256());
    const I lim = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.limit)), d);
    cell = _mm256_min_epi32(cell, lim);
    const I base = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.base)), d);
    I k = _mm256_add_epi32(base, cell);
    const I zero = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(c.zero_below), _CMP_LT_OQ));
    k = _mm256_andnot_si256(zero, k);
    if constexpr (SIGNED) {
      k = _mm256_or_si256(k,
                          _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
    }
    return k;
  }
  // The codes of four vectors, 32 bytes. Both packs work within 128-bit halves, so the dwords
  // come out as x[0..3]'s low halves, then their high halves; the permute puts them in order.
  template <bool SIGNED>
  static void Quant4(uint8_t* out, const F* x, F inv) {
    const I w01 = _mm256_packus_epi32(Codes<SIGNED>(x[0], inv), Codes<SIGNED>(x[1], inv));
    const I w23 = _mm256_packus_epi32(Codes<SIGNED>(x[2], inv), Codes<SIGNED>(x[3], inv));
    const I b = _mm256_packus_epi16(w01, w23);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  static I AbsBits(F x) {
    return _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
  }
  static I MaxU(I a, I b) { return _mm256_max_epu32(a, b); }
  static uint32_t ReduceMax(I x) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
  }
  static void StreamFence() { _mm_sfence(); }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

#include "optimizer_kernel_body.inc"

// Four accumulators of 4 lanes.
template <DType G>
size_t SumSquaresLanes(const void* g, size_t begin, size_t end, double* lanes) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    // 2 KiB ahead, as in optimizer_avx512.cc (an integer address: never faults, never UB).
    _mm_prefetch(
        reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(g) + i * DTypeSize(G) + 2048),
        _MM_HINT_T0);
    const __m256 x0 = V::LoadGrad<G>(g, i);
    const __m256 x1 = V::LoadGrad<G>(g, i + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    acc[0] = _mm256_fmadd_pd(d0, d0, acc[0]);
    acc[1] = _mm256_fmadd_pd(d1, d1, acc[1]);
    acc[2] = _mm256_fmadd_pd(d2, d2, acc[2]);
    acc[3] = _mm256_fmadd_pd(d3, d3, acc[3]);
  }
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes + 4 * k, acc[k]);
  return i;
}

#include "optimizer_kernel_entry.inc"

}  // namespace avx2
}  // namespace zps::server::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace zps::server::internal {
const KernelTable& Avx2Kernels() {
  static constexpr KernelTable table{&avx2::UpdateRange, &avx2::SumSquaresRange};
  return table;
}
}  // namespace zps::server::internal
