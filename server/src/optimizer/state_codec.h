// state_codec.h — the packed moment formats of zps/server/optimizer.h, element by element: bf16
// (m rounded to nearest, v rounded up or down by a counter-based golden-ratio dither), and the
// int8 dynamic quantization map. The scalar kernel uses these functions as they are; the vector
// kernels compute the same integer and IEEE single operations lane by lane (no FMA, no approximate
// instructions), so every ISA packs every element to the same bits. Tests check the kernels
// against this file.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

namespace zps::server::internal {

// ---- bf16: m rounded to nearest, v with a low-discrepancy dither --------------------------------
//
// m (and SGD's buffer) is stored as FloatToBf16(m) (zps/common/dtype.h: round to nearest, ties to
// even, the serving copy's conversion; NaN stays a quiet NaN), v as Bf16Stochastic(v, bits) with
// the high 16 bits of SrBits. Why the two differ: a moment is an average with factor b, and a
// deterministic rounding's error, at most half an ulp a step, is carried on with weight b, so it
// can add up to half an ulp / (1 - b). For m (b1 = 0.9) that is 5 ulps, 2-4% of |m| at worst,
// and far less when the gradient's noise makes successive errors differ in sign; for v
// (b2 = 0.999) it is 500 ulps, more than v itself: an update (1 - b2) x (g^2 - v) below half an
// ulp rounds back to the old v, and v stalls, rising from 0 towards g^2 it stops between a fifth
// and a third of the way (optimizer_bf16_sr_test.cc). So v rounds up with a probability equal to
// its discarded fraction of an ulp, which keeps it unbiased.
//
// Where that probability's draws come from: independent draws (a hash of index and step) leave
// an error of rms an ulp x sqrt(1/6) each step, carried on with weight b2, so v's stored value
// wanders like a random walk, about 4% rms around the fp32 recurrence. Instead each element's
// draws follow a golden-ratio (Weyl) sequence over steps: u_t = h(index) + t x 2^32 / phi mod
// 2^32, h a hash of the index. Every run of T steps visits [0, 1) evenly (a value whose fraction
// is f rounds up f x T times, give or take O(log T)), so successive errors of one element cancel
// instead of adding up: v's spread falls to about 3% on a noisy stream (optimizer_bf16_sr_test.cc),
// and to about 1% where the gradient holds still; neighbouring elements still draw independently
// (h). It is a function of (index, step) alone, the same on every ISA, shard count and in the
// reference. m stays rounded to nearest: independent stochastic rounding of m measurably slowed
// zps-train's LM (docs/benchmarks.md, "Why bf16 state lags on zps-train's LM").

/// murmur3's 32-bit finaliser: a bijection whose every output bit depends on every input bit.
constexpr uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/// The key for the indices whose top 32 bits are `hi` (the same in every step).
constexpr uint32_t SrKey(uint32_t hi) { return Fmix32((hi * 0x27d4eb2fu) ^ 0x165667b1u); }

/// The element's starting point, h(index): a hash of the element at `index` of the layout's flat
/// space, whose key for index >> 32 is `key`.
constexpr uint32_t SrStart(uint32_t key, uint64_t index) {
  return Fmix32(static_cast<uint32_t>(index) ^ key);
}

/// 2^32 / phi (phi the golden ratio), the stride of the dither between steps.
inline constexpr uint32_t kSrStride = 0x9e3779b9u;

/// How far every element's dither has moved by `step`: step x 2^32 / phi mod 2^32. Only the
/// step's low 32 bits matter (mod 2^32 the high bits times the stride vanish), and the product
/// wraps as unsigned arithmetic does on every ISA.
constexpr uint32_t SrOffset(int64_t step) {
  return static_cast<uint32_t>(static_cast<uint64_t>(step)) * kSrStride;
}

/// The element's 32 dither bits in a step: SrStart + SrOffset (mod 2^32); the high 16
/// (`>> kBf16VShift`) round v.
constexpr uint32_t SrBits(uint32_t key, uint64_t index, int64_t step) {
  return SrStart(key, index) + SrOffset(step);
}
inline constexpr int kBf16VShift = 16;

/// x rounded to bf16 stochastically: up (in magnitude) with probability equal to the discarded
/// fraction of an ulp, given 16 uniform bits `r16`. NaN becomes the quiet NaN 0x7fc0 (adding to
/// its bits could carry into the sign).
inline uint16_t Bf16Stochastic(float x, uint32_t r16) {
  if (x != x) return 0x7fc0;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + (r16 & 0xffffu)) >> 16);
}

inline float Bf16Value(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// ---- int8: the dynamic quantization map
// ----------------------------------------------------------
//
// Dettmers et al.'s dynamic map (bitsandbytes' create_dynamic_map): a value relative to the
// block's scale, a in [0, 1], falls in a decade d = 0..6 ([1e-7, 1e-6), ..., [0.1, 1)), which
// is cut into N_d equal cells; the code's value is its cell's midpoint. Signed (m, SGD's buffer):
// a sign bit and N_d = 2^d cells, magnitude index k = 2^d + cell (1..127), 0 for zero; the code
// is sign << 7 | k (0x80 is -0). Unsigned (v): N_d = 2^(d+1), k = 2^(d+1) - 1 + cell (1..254),
// 0 for zero, 255 for 1.0.
//
// Quantizing a = |x| x (1 / scale): d = the number of decade bounds 1e-6 ... 0.1 that a reaches;
// t = (a x 10^(6-d) - 0.1) x (N_d / 0.9); cell = trunc(t) (the conversion's "integer
// indefinite" 0x80000000 for NaN or out of range), clamped to [0, N_d - 1] (unsigned, decade 6:
// [0, N_d], N_d being 1.0's code). Zero: signed, a below half the smallest value; unsigned, only
// a < 1e-38, so a positive v is never stored as 0 (it divides the update: a v rounded to zero
// would turn a small m into a step of m / eps).

inline constexpr int kDecades = 7;
/// The decade bounds a is compared against (d = how many it reaches).
inline constexpr float kDecadeBound[6] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f};

/// Per-decade constants, padded to 8 lanes for the vector permutes.
struct MapConsts {
  float scale[8];    // 10^(6-d)
  float cells[8];    // N_d / 0.9
  int32_t base[8];   // magnitude index of the decade's first cell
  int32_t limit[8];  // largest cell index
  float zero_below;  // a below this is stored as 0
};

constexpr MapConsts MakeMapConsts(bool is_signed) {
  MapConsts c{};
  double p = 1e6;
  for (int d = 0; d < 8; ++d) {
    const int dd = d < kDecades ? d : kDecades - 1;
    const int n = is_signed ? (1 << dd) : (2 << dd);
    c.scale[d] = static_cast<float>(p);
    if (d < kDecades - 1) p /= 10.0;
    c.cells[d] = static_cast<float>(n / 0.9);
    c.base[d] = is_signed ? n : n - 1;
    c.limit[d] = (!is_signed && dd == kDecades - 1) ? n : n - 1;
  }
  c.zero_below = is_signed ? 2.75e-7f : 1e-38f;
  return c;
}

inline constexpr MapConsts kSignedMap = MakeMapConsts(true);
inline constexpr MapConsts kUnsignedMap = MakeMapConsts(false);

/// The value of each code (relative to the scale): 256 floats, signed map or unsigned map.
const float* Int8Table(bool is_signed);

/// cvttss2si's result: trunc(t), or 0x80000000 for NaN and values out of int32's range.
inline int32_t TruncOrIndefinite(float t) {
  if (!(t >= -2147483648.0f && t < 2147483648.0f)) return INT32_MIN;
  return static_cast<int32_t>(t);
}

/// One element's code, given the block's 1 / scale.
template <bool SIGNED>
inline uint8_t Int8Quantize(float x, float inv) {
  const MapConsts& c = SIGNED ? kSignedMap : kUnsignedMap;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float a = std::bit_cast<float>(bits & 0x7fffffffu) * inv;
  int d = 0;
  for (float b : kDecadeBound) d += a >= b ? 1 : 0;
  const float t = (a * c.scale[d] - 0.1f) * c.cells[d];
  int32_t cell = TruncOrIndefinite(t);
  cell = cell < 0 ? 0 : cell;
  cell = cell > c.limit[d] ? c.limit[d] : cell;
  uint32_t k = static_cast<uint32_t>(c.base[d] + cell);
  if (a < c.zero_below) k = 0;
  if constexpr (SIGNED) k |= (bits >> 24) & 0x80u;
  return static_cast<uint8_t>(k);
}

/// The block's scale: its largest |x| (as the bits of a non-negative float, so NaN is largest
/// and every ISA agrees) rounded UP to a bf16, so that every a = |x| / scale is at most 1.
inline uint16_t Int8ScaleUp(uint32_t absmax_bits) {
  if ((absmax_bits & 0xffffu) != 0) absmax_bits += 0x10000u;
  return static_cast<uint16_t>(absmax_bits >> 16);
}

/// 1 / scale, and 0 for a zero scale (every code is then 0).
inline float Int8Inverse(uint16_t scale) {
  const float s = Bf16Value(scale);
  return s == 0.0f ? 0.0f : 1.0f / s;
}

/// A block's scale as the kernels measure it: its absmax (as bits), the bf16 scale, 1 / scale.
struct Int8Scale {
  uint32_t absmax = 0;
  uint16_t scale = 0;
  float inv = 0.0f;
};

// ---- int8: the same codes by binade (the AVX-512 quantiser) -------------------------------------
//
// Int8Quantize's decade, with its zero rule folded in, is D = the number of thresholds
// {zero_below, 1e-6, 1e-5, ..., 0.1} that a reaches (D = 0: code 0; else d = D - 1). a's binade
// [2^e, 2^(e+1)) holds at most one threshold (static_assert below), so D = dlo[e] + (a >= bound[e])
// from two 32-entry tables indexed by a's exponent field, clamped below at 96 (every a < 2^-30
// shares entry 0, which holds the unsigned map's zero_below). With the per-D constants the cell
// arithmetic is Int8Quantize's, operation for operation; the clamp below 0 is not needed, because
// for finite a a cell's t is above -1 (a * scale - 0.1 >= -0.1 and cells <= 2.3 in decade 0; just
// below 0 from rounding at a decade's bound otherwise), and D = 0 has every constant 0. This holds
// for a finite a in [0, 2) (a block whose scale is finite, with a finite 1 / scale: see
// Int8BinadeApplies); tests compare it with Int8Quantize.

/// The binade tables and the per-D constants of one map (arrays padded to 16 lanes).
struct BinadeConsts {
  int32_t dlo[32];     // D at the binade's lowest a
  uint32_t bound[32];  // the bits of the threshold inside the binade, 0x7fffffff if none
  float scale[16];     // 10^(6-d); 0 for D = 0
  float cells[16];     // N_d / 0.9; 0 for D = 0
  int32_t base[16];    // magnitude index of decade d's first cell; 0 for D = 0
  int32_t kmax[16];    // base + the largest cell; 0 for D = 0
};

inline constexpr uint32_t kBinadeFloor = 96;  // exponent fields at or below share entry 0

constexpr BinadeConsts MakeBinadeConsts(bool is_signed) {
  const MapConsts& m = is_signed ? kSignedMap : kUnsignedMap;
  uint32_t thresholds[kDecades] = {std::bit_cast<uint32_t>(m.zero_below)};
  for (int j = 0; j < kDecades - 1; ++j)
    thresholds[j + 1] = std::bit_cast<uint32_t>(kDecadeBound[j]);
  BinadeConsts c{};
  for (uint32_t i = 0; i < 32; ++i) {
    const uint32_t lo = i == 0 ? 0 : (kBinadeFloor + i) << 23;
    const uint32_t hi = (kBinadeFloor + i + 1) << 23;
    int below = 0, inside = 0;
    c.bound[i] = 0x7fffffffu;
    for (uint32_t t : thresholds) {
      if (t <= lo) ++below;
      if (t > lo && t < hi) {
        ++inside;
        c.bound[i] = t;
      }
    }
    if (inside > 1) throw "two int8 thresholds in one binade";  // not a constant expression
    c.dlo[i] = below;
  }
  for (int d = 0; d < kDecades; ++d) {
    c.scale[d + 1] = m.scale[d];
    c.cells[d + 1] = m.cells[d];
    c.base[d + 1] = m.base[d];
    c.kmax[d + 1] = m.base[d] + m.limit[d];
  }
  return c;
}

inline constexpr BinadeConsts kSignedBinades = MakeBinadeConsts(true);
inline constexpr BinadeConsts kUnsignedBinades = MakeBinadeConsts(false);

/// Whether a block may take the binade form: its absmax (as bits) is finite and its 1 / scale is
/// finite, so every a = |x| / scale is finite and below 2. Otherwise (inf or NaN in the block, a
/// scale so small that 1 / scale overflows) the kernels call Int8Quantize.
inline bool Int8BinadeApplies(uint32_t absmax_bits, float inv) {
  return absmax_bits < 0x7f800000u && (std::bit_cast<uint32_t>(inv) & 0x7fffffffu) < 0x7f800000u;
}

/// Int8Quantize in the binade form, one element: the model the AVX-512 lanes follow.
template <bool SIGNED>
inline uint8_t Int8QuantizeBinade(float x, float inv) {
  const BinadeConsts& c = SIGNED ? kSignedBinades : kUnsignedBinades;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float a = std::bit_cast<float>(bits & 0x7fffffffu) * inv;
  const uint32_t ab = std::bit_cast<uint32_t>(a);
  const uint32_t e = std::max(ab >> 23, kBinadeFloor) & 31u;
  const int32_t d = c.dlo[e] + (ab >= c.bound[e] ? 1 : 0);
  const float t = (a * c.scale[d] - 0.1f) * c.cells[d];
  const int32_t k = std::min(c.base[d] + static_cast<int32_t>(t), c.kmax[d]);
  uint32_t code = static_cast<uint32_t>(k);
  if constexpr (SIGNED) code |= (bits >> 24) & 0x80u;
  return static_cast<uint8_t>(code);
}

}  // namespace zps::server::internal
