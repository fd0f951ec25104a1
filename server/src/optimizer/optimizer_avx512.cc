// AVX-512 (F, BW, VL, DQ) kernels: 16 fp32 lanes. Compiled under a pragma target region so the
// rest of the binary keeps the baseline ISA; Optimizer::Create only selects this table after
// checking the CPU (zps/common/cpu.h).
// GCC 12 reports -Wuninitialized false positives inside its own intrinsic headers
// (`__m512i __Y = __Y;` in _mm512_undefined_*) once they are inlined into these kernels; the
// pragma must precede the header to apply to its lines.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
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

// ---- int8 blocks (state_codec.h), four vectors of 16 lanes each ---------------------------------
//
// Decoding looks each code up in the 256-entry value table held as 16-bit halves: vpermt2w picks
// 32 words from 64 entries, so a table of 256 takes four lookups and three blends per half (the
// signed map: two and one over the 128 magnitudes, then the sign bit), and unpacking the low and
// high halves gives the floats. A 16-lane gather costs about 13 cycles on AMD's Zen 5, more than
// this whole lookup of 32 floats. Encoding computes the codes in the binade
// form of state_codec.h (Int8QuantizeBinade), lane by lane, and packs them with the signs.

static_assert(kInt8BlockElems == 64, "the int8 codec holds a block in four vectors");

struct Int8WordTables {
  alignas(64) uint16_t signed_lo[128];  // magnitudes 0..127 (the sign is bit 7 of the code)
  alignas(64) uint16_t signed_hi[128];
  alignas(64) uint16_t unsigned_lo[256];
  alignas(64) uint16_t unsigned_hi[256];
};

const Int8WordTables& WordTables() {
  static const Int8WordTables tables = [] {
    Int8WordTables t{};
    const float* s = Int8Table(true);
    const float* u = Int8Table(false);
    for (size_t k = 0; k < 256; ++k) {
      const uint32_t sb = std::bit_cast<uint32_t>(s[k]);
      const uint32_t ub = std::bit_cast<uint32_t>(u[k]);
      if (k < 128) {
        t.signed_lo[k] = static_cast<uint16_t>(sb);
        t.signed_hi[k] = static_cast<uint16_t>(sb >> 16);
      }
      t.unsigned_lo[k] = static_cast<uint16_t>(ub);
      t.unsigned_hi[k] = static_cast<uint16_t>(ub >> 16);
    }
    return t;
  }();
  return tables;
}

// Word order for 32 codes such that unpacking the looked-up halves gives elements 0..15 (low)
// and 16..31 (high): unpack takes words 8L..8L+3 (low) and 8L+4..8L+7 (high) of each 128-bit lane
// L.
alignas(64) constexpr uint16_t kDecodeOrder[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,
                                                   7,  20, 21, 22, 23, 8,  9,  10, 11, 24, 25,
                                                   26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
// After packing four vectors of dwords to bytes, dword 4L + j holds elements 16j + 4L .. + 3.
alignas(64) constexpr int32_t kEncodeOrder[16] = {0, 4, 8,  12, 1, 5, 9,  13,
                                                  2, 6, 10, 14, 3, 7, 11, 15};

struct Int8Codec {
  const Int8WordTables* words = &WordTables();

  // out[j] = elements [16j, 16j + 16) of the block, dequantised.
  template <bool SIGNED>
  __attribute__((always_inline)) void Decode(const uint8_t* block, __m512* out) const {
    uint16_t scale;
    std::memcpy(&scale, block + kInt8BlockElems, sizeof scale);
    const __m512 s = _mm512_set1_ps(Bf16Value(scale));
    const __m512i order = _mm512_load_si512(kDecodeOrder);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512i w = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * h)));
      w = _mm512_permutexvar_epi16(order, w);
      const __mmask32 b6 = _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40));
      __m512i lo, hi;
      if constexpr (SIGNED) {
        lo = _mm512_mask_blend_epi16(b6, Lookup(words->signed_lo, w),
                                     Lookup(words->signed_lo + 64, w));
        hi = _mm512_mask_blend_epi16(b6, Lookup(words->signed_hi, w),
                                     Lookup(words->signed_hi + 64, w));
        // hi | (code bit 7 -> bit 15)
        hi = _mm512_ternarylogic_epi32(hi, _mm512_slli_epi16(w, 8),
                                       _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xf8);
      } else {
        const __mmask32 b7 = _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x80));
        lo = Lookup256(words->unsigned_lo, w, b6, b7);
        hi = Lookup256(words->unsigned_hi, w, b6, b7);
      }
      out[2 * h] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(lo, hi)), s);
      out[2 * h + 1] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(lo, hi)), s);
    }
  }

  // The block's absmax scale and its inverse.
  __attribute__((always_inline)) Int8Scale Measure(const __m512* x) const {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    const __m512i mx =
        _mm512_max_epu32(_mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x[0]), abs),
                                          _mm512_and_si512(_mm512_castps_si512(x[1]), abs)),
                         _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x[2]), abs),
                                          _mm512_and_si512(_mm512_castps_si512(x[3]), abs)));
    const uint32_t absmax = _mm512_reduce_max_epu32(mx);
    const uint16_t scale = Int8ScaleUp(absmax);
    return {absmax, scale, Int8Inverse(scale)};
  }

  // Every code with the block's scale `s` (Measure(x)), then the scale: the binade form when it
  // applies (all but blocks with inf, NaN or a scale whose inverse overflows), Int8Quantize
  // element by element otherwise.
  template <bool SIGNED>
  __attribute__((always_inline)) void Write(const __m512* x, const Int8Scale& s,
                                            uint8_t* block) const {
    if (Int8BinadeApplies(s.absmax, s.inv)) [[likely]] {
      const __m512 vinv = _mm512_set1_ps(s.inv);
      __m512i codes = _mm512_packus_epi16(
          _mm512_packus_epi32(Codes<SIGNED>(x[0], vinv), Codes<SIGNED>(x[1], vinv)),
          _mm512_packus_epi32(Codes<SIGNED>(x[2], vinv), Codes<SIGNED>(x[3], vinv)));
      if constexpr (SIGNED) {  // the signs, packed the same way with signed saturation
        const __m512i signs = _mm512_packs_epi16(
            _mm512_packs_epi32(_mm512_castps_si512(x[0]), _mm512_castps_si512(x[1])),
            _mm512_packs_epi32(_mm512_castps_si512(x[2]), _mm512_castps_si512(x[3])));
        codes = _mm512_ternarylogic_epi32(codes, signs, _mm512_set1_epi8(static_cast<char>(0x80)),
                                          0xf8);
      }
      codes = _mm512_permutexvar_epi32(_mm512_load_si512(kEncodeOrder), codes);
      _mm512_storeu_si512(block, codes);
    } else {
      WriteRare<SIGNED>(x, s.inv, block);
    }
    std::memcpy(block + kInt8BlockElems, &s.scale, sizeof s.scale);
  }

 private:
  template <bool SIGNED>
  __attribute__((noinline)) static void WriteRare(const __m512* x, float inv, uint8_t* block) {
    alignas(64) float buf[kInt8BlockElems];
    for (int j = 0; j < 4; ++j) _mm512_store_ps(buf + 16 * j, x[j]);
    for (size_t i = 0; i < kInt8BlockElems; ++i) block[i] = Int8Quantize<SIGNED>(buf[i], inv);
  }
  // Entries [0, 64) of a word table, at w's low 6 bits.
  static __m512i Lookup(const uint16_t* table, __m512i w) {
    return _mm512_permutex2var_epi16(_mm512_load_si512(table), w, _mm512_load_si512(table + 32));
  }
  static __m512i Lookup256(const uint16_t* table, __m512i w, __mmask32 b6, __mmask32 b7) {
    const __m512i low = _mm512_mask_blend_epi16(b6, Lookup(table, w), Lookup(table + 64, w));
    const __m512i high =
        _mm512_mask_blend_epi16(b6, Lookup(table + 128, w), Lookup(table + 192, w));
    return _mm512_mask_blend_epi16(b7, low, high);
  }
  // Int8QuantizeBinade's magnitude codes for 16 lanes (as dwords).
  template <bool SIGNED>
  static __m512i Codes(__m512 x, __m512 inv) {
    const BinadeConsts& c = SIGNED ? kSignedBinades : kUnsignedBinades;
    const __m512i ab =
        _mm512_and_si512(_mm512_castps_si512(_mm512_mul_ps(x, inv)), _mm512_set1_epi32(0x7fffffff));
    const __m512i e = _mm512_max_epu32(_mm512_srli_epi32(ab, 23),
                                       _mm512_set1_epi32(static_cast<int>(kBinadeFloor)));
    const __m512i dlo =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(c.dlo), e, _mm512_loadu_si512(c.dlo + 16));
    const __m512i bound =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(c.bound), e, _mm512_loadu_si512(c.bound + 16));
    const __m512i d =
        _mm512_mask_add_epi32(dlo, _mm512_cmpge_epu32_mask(ab, bound), dlo, _mm512_set1_epi32(1));
    const __m512 a = _mm512_castsi512_ps(ab);
    const __m512 sc = _mm512_permutexvar_ps(d, _mm512_loadu_ps(c.scale));
    const __m512 ce = _mm512_permutexvar_ps(d, _mm512_loadu_ps(c.cells));
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(a, sc), _mm512_set1_ps(0.1f)), ce);
    const __m512i k = _mm512_add_epi32(_mm512_cvttps_epi32(t),
                                       _mm512_permutexvar_epi32(d, _mm512_loadu_si512(c.base)));
    return _mm512_min_epi32(k, _mm512_permutexvar_epi32(d, _mm512_loadu_si512(c.kmax)));
  }
};

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
  using Int8Codec = avx512::Int8Codec;
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
  static I SrStart(uint32_t lo, uint32_t lo_first, uint32_t key0, uint32_t key1) {
    const I iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const I idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)), iota);
    const __mmask16 wrapped =
        _mm512_cmplt_epu32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo_first)));
    const I key = _mm512_mask_blend_epi32(wrapped, _mm512_set1_epi32(static_cast<int>(key0)),
                                          _mm512_set1_epi32(static_cast<int>(key1)));
    return Fmix(_mm512_xor_si512(idx, key));
  }
  static I Dither(I start, uint32_t offset) {
    return _mm512_add_epi32(start, _mm512_set1_epi32(static_cast<int>(offset)));
  }
  static void StoreBf16Sr(uint16_t* p, F x, I bits, int shift) {
    const I r = _mm512_and_si512(_mm512_srli_epi32(bits, static_cast<unsigned>(shift)),
                                 _mm512_set1_epi32(0xffff));
    I y = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x), r), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    y = _mm512_mask_mov_epi32(y, nan, _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(y));
  }
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

// Two accumulators of 8 lanes.
template <DType G>
size_t SumSquaresLanes(const void* g, size_t begin, size_t end, double* lanes) {
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
  _mm512_store_pd(lanes, acc0);
  _mm512_store_pd(lanes + 8, acc1);
  return i;
}

#include "optimizer_kernel_entry.inc"

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
