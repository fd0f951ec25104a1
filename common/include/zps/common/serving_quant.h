// zps/common/serving_quant.h — the serving copy's format (ShardJob::serving_dtype): the one place
// shards, their store and workers agree on its size and on which bytes a fetch carries.
//
// A 16-bit or fp32 copy holds each element at element offset x its size. An int8-block copy
// (quantized weights) is QuantizeBlocks of the chunk's fp32 master with blocks of
// kWeightQuantBlock elements from the chunk's first element (block_quant.h), so a fetch of any
// run of elements carries its covering blocks (QuantizedCovering: one contiguous byte range) and
// the reader dequantizes the run out of them (DequantizeRange, from `skip`).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zps/common/block_quant.h"
#include "zps/common/dtype.h"

namespace zps {

/// The block format of a block-quantized serving dtype (IsBlockQuantized(t) must hold).
constexpr QuantFormat ServingQuantFormat(DType t) { return {DTypeQuantBits(t), kWeightQuantBlock}; }

/// The parameter alignment (LayoutOptions::align_elems) a job serving copies of `t` should be
/// laid out with: a multiple of the block for a block-quantized copy, so that no block holds
/// elements of two parameters (each block's scale is then its own parameter's absmax; otherwise
/// a LayerNorm gain of 1.0 sets the scale of the 0.01-sized bias or weights it shares a block
/// with, and they are read with a quantum as large as themselves). 64, the layout's default,
/// for the others.
constexpr uint32_t ServingAlignElems(DType t) {
  return IsBlockQuantized(t) ? kWeightQuantBlock : uint32_t{64};
}

/// Bytes of the serving copy of a chunk of `n` elements.
constexpr uint64_t ServingBytes(DType t, uint64_t n) {
  return IsBlockQuantized(t) ? QuantizedBytes(ServingQuantFormat(t), n) : n * DTypeSize(t);
}

/// 16-bit words that hold a serving copy of `n` elements (shards and their store keep serving
/// copies as words; a quantized copy of an odd byte count ends with one pad byte).
constexpr uint64_t ServingWords(DType t, uint64_t n) { return (ServingBytes(t, n) + 1) / 2; }

/// The bytes of a chunk's serving copy (a chunk of `chunk_elems` elements) that a fetch of
/// elements [offset, offset + length) carries, and where element `offset` sits in them (`skip`,
/// 0 unless quantized). Requires length > 0 and offset + length <= chunk_elems.
inline QuantRange ServingRange(DType t, uint64_t chunk_elems, uint64_t offset, uint64_t length) {
  if (IsBlockQuantized(t)) {
    return QuantizedCovering(ServingQuantFormat(t), chunk_elems, offset, offset + length);
  }
  return {offset * DTypeSize(t), length * DTypeSize(t), 0};
}

}  // namespace zps
