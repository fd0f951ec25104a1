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
