// Scalar kernels: the portable fallback (and the path ZPS_ISA=scalar tests). One lane, no FMA:
// every operation rounds once, as in the vector paths, but a*b+c rounds twice here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "optimizer_kernels.h"
#include "state_codec.h"
#include "zps/common/dtype.h"

namespace zps::server::internal {
namespace scalar {

struct V {
  using F = float;
  static constexpr size_t kLanes = 1;
  static F Set1(float x) { return x; }
  static F Load(const float* p) { return *p; }
  static void Store(float* p, F x) { *p = x; }
  template <bool STREAM>
  static void StoreState(float* p, F x) {
    *p = x;
  }
  static F Mul(F a, F b) { return a * b; }
  static F Fma(F a, F b, F c) { return a * b + c; }
  static F Fnma(F a, F b, F c) { return c - a * b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Div(F a, F b) { return a / b; }
  template <DType G>
  static F LoadGrad(const void* base, size_t i) {
    if constexpr (G == DType::kF32) {
      float x;
      std::memcpy(&x, static_cast<const unsigned char*>(base) + i * 4, 4);
      return x;
    } else {
      uint16_t h;
      std::memcpy(&h, static_cast<const unsigned char*>(base) + i * 2, 2);
      return G == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  template <DType OUT, bool STREAM>
  static void StoreOut(uint16_t* p, F x) {
    *p = OUT == DType::kF16 ? FloatToHalf(x) : FloatToBf16(x);
  }
  // ---- packed moments (optimizer_compact_body.inc): state_codec.h's definitions as they are ----
  using I = uint32_t;
  static F LoadBf16(const uint16_t* p) { return Bf16Value(*p); }
  static I SrStart(uint32_t lo, uint32_t lo_first, uint32_t key0, uint32_t key1) {
    return Fmix32(lo ^ (lo < lo_first ? key1 : key0));
  }
  static I Dither(I start, uint32_t offset) { return start + offset; }
  static void StoreBf16Sr(uint16_t* p, F x, I bits, int shift) {
    *p = Bf16Stochastic(x, bits >> shift);
  }
  static F Dequant(const uint8_t* codes, const float* table) { return table[*codes]; }
  template <bool SIGNED>
  static void Quant4(uint8_t* out, const F* x, F inv) {
    for (int j = 0; j < 4; ++j) out[j] = Int8Quantize<SIGNED>(x[j], inv);
  }
  static I AbsBits(F x) { return std::bit_cast<uint32_t>(x) & 0x7fffffffu; }
  static I MaxU(I a, I b) { return a > b ? a : b; }
  static uint32_t ReduceMax(I x) { return x; }
  static void StreamFence() {}
  static void Prefetch(const void*) {}
};

#include "optimizer_kernel_body.inc"

// One element at a time into its lane.
template <DType G>
size_t SumSquaresLanes(const void* g, size_t begin, size_t end, double* lanes) {
  for (size_t k = 0; k < 16; ++k) lanes[k] = 0.0;
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    for (size_t k = 0; k < 16; ++k) {
      const double x = V::LoadGrad<G>(g, i + k);
      lanes[k] += x * x;
    }
  }
  return i;
}

#include "optimizer_kernel_entry.inc"

}  // namespace scalar

const KernelTable& ScalarKernels() {
  static constexpr KernelTable table{&scalar::UpdateRange, &scalar::SumSquaresRange};
  return table;
}

}  // namespace zps::server::internal
