// block_quant_kernels.h — internal interface between block_quant.cc (formats, record walking,
// dispatch, the scalar reference) and the vector kernels (block_quant_{avx2,avx512}.cc, whose loops
// are written once in block_quant_kernel_body.inc).
//
// A vector kernel handles the longest prefix it can do in whole vectors and returns how many
// elements it did; block_quant.cc finishes the rest with the scalar functions below, which do
// the same IEEE operations, so the split point never changes a bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace zps::internal {

/// What a dequantizing kernel writes: fp32, fp32 accumulated (acc += value), bf16, fp16, or
/// fp32 reduced (r -= value: the error-feedback residual).
enum class DequantOp : uint8_t { kStore = 0, kAdd = 1, kBF16 = 2, kF16 = 3, kSub = 4 };

struct BlockQuantKernels {
  /// absmax of |x[0..n)| over a prefix; sets *nonfinite when a NaN or Inf is seen. Returns the
  /// prefix length (the caller folds the rest in).
  size_t (*absmax)(const float* x, size_t n, float* absmax, bool* nonfinite);
  /// The same over r = g + r (one IEEE add per element, r rewritten) in the same pass: the
  /// error feedback's first step.
  size_t (*add_absmax)(const float* g, float* r, size_t n, float* absmax, bool* nonfinite);
  /// Codes of x[0..n) with multiplier inv and bound qmax, for a prefix; int4 prefixes are even.
  size_t (*codes)(int bits, const float* x, size_t n, float inv, float qmax, uint8_t* codes);
  /// Dequantizes elements [from, from + n) of a block (int4: from even) into out[0..n) with op,
  /// for a prefix.
  size_t (*dequant)(int bits, const uint8_t* codes, size_t from, size_t n, float scale,
                    DequantOp op, void* out);
};

const BlockQuantKernels& BlockQuantAvx2();
const BlockQuantKernels& BlockQuantAvx512();

/// Round half to even (the default rounding mode, as the vector round instructions are told),
/// then clamp to [-qmax, qmax]. Inputs are finite.
inline float RoundCode(float y, float qmax) {
  return std::min(std::max(std::nearbyint(y), -qmax), qmax);
}

inline int DecodeInt4(uint8_t byte, size_t i) {
  const int nib = (i & 1) ? (byte >> 4) : (byte & 0xf);
  return (nib ^ 8) - 8;
}

}  // namespace zps::internal
