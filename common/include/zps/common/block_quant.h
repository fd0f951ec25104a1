// zps/common/block_quant.h — symmetric block quantization (int8 and int4 with one fp32 scale per
// block): the quantized serving copy the shards send (weights) and the quantized gradients the
// workers push, with error feedback.
//
// Format. Elements are cut into blocks of `block` elements from element 0 (the last block may be
// short). Each block is stored as one record, interleaved:
//
//   [ fp32 scale, little-endian, 4 bytes ][ codes: block bytes (int8) or block / 2 bytes (int4) ]
//
// so block k of a buffer starts at k * QuantizedBlockStride(f) and any run of blocks is one
// contiguous byte range (a fetch of part of a chunk reads its covering blocks in one transfer).
// The short last block's record is 4 + len (int8) or 4 + ceil(len / 2) (int4) bytes.
//   - scale = absmax / qmax, with qmax = 127 (int8) or 7 (int4), absmax = max |x| of the block;
//   - code  = clamp(round_half_even(x * (qmax / absmax)), -qmax, qmax): int8 codes are two's
//     complement bytes; int4 codes are two's-complement nibbles, element 2j in the low nibble of
//     code byte j and element 2j+1 in its high nibble (an odd last element leaves a zero nibble);
//   - value = float(code) * scale, one IEEE multiply.
// Special blocks:
//   - a block holding a NaN or an Inf gets scale NaN and zero codes: every element of it
//     dequantizes to NaN, so a sum that includes it stays non-finite and the coordinator's
//     non-finite rule skips the step;
//   - a block whose absmax is below 2^-120 (all zeros, or values so small that qmax / absmax
//     would overflow) gets scale 0 and zero codes: it dequantizes to zeros.
//
// Every ISA (scalar, AVX2, AVX-512, selected at run time as cpu.h says) gives the same bits: the
// vector paths do the same IEEE single operations lane by lane (division and the products
// correctly rounded, no FMA: the file is built with -ffp-contract=off), and the maximum is
// order-free. test_common checks each ISA against golden CRCs.
//
// Preconditions, not checked here (internal contracts, never peer input: callers validate
// formats and sizes read from the wire or a file before calling):
//   - f.bits is 8 or 4 and f.block is a positive multiple of 64 (ValidateQuantFormat);
//   - byte spans are exactly QuantizedBytes(f, n) for the n elements they hold unless a function
//     says otherwise.
//
// Thread-safety: pure functions over caller-owned buffers; concurrent calls on disjoint outputs
// are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "zps/common/status.h"

namespace zps {

struct QuantFormat {
  uint8_t bits = 8;       ///< 8 or 4. Default: 8.
  uint32_t block = 2048;  ///< Elements per block, a positive multiple of 64. Default: 2048.
};

/// Elements per block of the int8 serving copy (quantized weights): the smallest block whose
/// bytes stay well under the 0.52x-of-bf16 egress target, with the least error (chosen by
/// `zps-bench quant`, docs/benchmarks.md "Block-quantized serving copy: the block size").
inline constexpr uint32_t kWeightQuantBlock = 256;

/// OK when f is a format this file implements. Errors: InvalidArgument naming the bad field.
Status ValidateQuantFormat(QuantFormat f);

/// Bytes of the code part of a full block: block (int8) or block / 2 (int4).
constexpr size_t QuantizedCodeBytes(QuantFormat f, size_t n) {
  return f.bits == 4 ? (n + 1) / 2 : n;
}
/// Bytes of one full block's record (scale + codes).
constexpr size_t QuantizedBlockStride(QuantFormat f) { return 4 + QuantizedCodeBytes(f, f.block); }
/// Bytes of n elements: scales + codes, the last block short.
constexpr size_t QuantizedBytes(QuantFormat f, size_t n) {
  const size_t full = n / f.block, tail = n % f.block;
  return full * QuantizedBlockStride(f) + (tail ? 4 + QuantizedCodeBytes(f, tail) : 0);
}

/// The byte range of a quantized buffer of n elements that holds elements [begin, end): its
/// covering blocks. `skip` is the position of element `begin` inside the first covering block
/// (what DequantizeRange takes). Requires begin < end <= n.
struct QuantRange {
  size_t offset = 0;  ///< byte offset of the first covering block
  size_t bytes = 0;   ///< bytes of the covering blocks
  size_t skip = 0;    ///< begin - (first covering block's first element)
};
QuantRange QuantizedCovering(QuantFormat f, size_t n, size_t begin, size_t end);

/// Quantizes in.size() elements into out (out.size() >= QuantizedBytes(f, in.size())).
void QuantizeBlocks(QuantFormat f, std::span<const float> in, std::span<std::byte> out);

/// out = deq(in) for out.size() elements; in holds QuantizedBytes(f, out.size()) bytes.
void DequantizeBlocks(QuantFormat f, std::span<const std::byte> in, std::span<float> out);
/// The same, written as bf16 / fp16 (the conversions of dtype.h applied to each fp32 value).
void DequantizeBlocksToBf16(QuantFormat f, std::span<const std::byte> in, std::span<uint16_t> out);
void DequantizeBlocksToF16(QuantFormat f, std::span<const std::byte> in, std::span<uint16_t> out);

/// acc[i] += deq(in)[i], one multiply then one add per element (no FMA), elements in order:
/// the shards sum pushed gradients in a fixed order with this.
void DequantizeAddBlocks(QuantFormat f, std::span<const std::byte> in, std::span<float> acc);

/// Error feedback: t = g + r; out = Q(t); r = t - deq(out) (r is updated in place). A block of t
/// that is non-finite is sent with a NaN scale (as QuantizeBlocks does) and its residual is reset
/// to zero: carrying a NaN forward would poison every later step, and the step that held it is
/// skipped by the coordinator. g.size() == residual.size().
void QuantizeWithResidual(QuantFormat f, std::span<const float> g, std::span<float> residual,
                          std::span<std::byte> out);

/// Output element types of DequantizeRange.
enum class DequantTarget : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

/// Dequantizes part of a block stream: `blocks` starts at a block boundary (for example the
/// bytes QuantizedCovering names) and holds whole block records; the out_elems elements that
/// start `skip` elements into its first block are written to `out` as `target` (float* or
/// uint16_t*). Requires skip + out_elems to lie inside the blocks held.
void DequantizeRange(QuantFormat f, std::span<const std::byte> blocks, size_t skip,
                     size_t out_elems, DequantTarget target, void* out);

}  // namespace zps
