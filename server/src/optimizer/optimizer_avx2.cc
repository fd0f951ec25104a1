// AVX2 + FMA + F16C kernels: 8 fp32 lanes. Same structure as optimizer_avx512.cc.
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
  static void StreamFence() { _mm_sfence(); }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

#include "optimizer_kernel_body.inc"

// Squares of fp32 values are exact in double; 16 double lanes per block (four accumulators of
// 4), reduced in a fixed order.
template <DType G>
double SumSquaresBlock(const void* g, size_t begin, size_t end) {
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
  alignas(32) double lanes[16];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes + 4 * k, acc[k]);
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
