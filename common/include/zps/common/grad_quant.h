// zps/common/grad_quant.h — block-quantized gradient pushes (grad_dtype int8 / int4 blocks):
// the one place workers and shards agree on the push format.
//
// A quantized push piece (one chunk's part of a parameter range, layout.h Pieces) is encoded on
// its own, with blocks starting at the piece's first element (block_quant.h: one fp32 scale per
// block, then the codes), so a shard dequantizes any piece without its neighbours. The block is
// fixed: kGradQuantBlock elements; a piece's last block may be shorter.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zps/common/block_quant.h"
#include "zps/common/dtype.h"

namespace zps {

/// Elements per quantization block of a gradient push. With one 4-byte scale per block, int8
/// pushes carry 1 + 4/256 bytes an element (0.508x of 16-bit), int4 0.5 + 4/256 (0.258x).
/// 256, not 2048: with int4 a block's scale is set by its largest element and elements under
/// 1/14 of it are sent as 0 (the residual carries them), and blocks of 2048 left zps-train's
/// small LM 3.7% behind fp32 gradients in held-out loss after 1,000 steps where blocks of 256
/// are 1% behind (docs/benchmarks.md, "Training quality").
inline constexpr uint32_t kGradQuantBlock = 256;

/// The block format of a quantized grad dtype (IsBlockQuantized(t), dtype.h, must hold).
constexpr QuantFormat GradQuantFormat(DType t) {
  return {static_cast<uint8_t>(t == DType::kI4Block ? 4 : 8), kGradQuantBlock};
}

/// The bytes a push piece of `elems` elements of `t` carries: elems x the element size, or the
/// quantized encoding of a piece that long.
inline size_t PushBytes(DType t, uint64_t elems) {
  if (IsBlockQuantized(t)) return QuantizedBytes(GradQuantFormat(t), elems);
  return elems * DTypeSize(t);
}

}  // namespace zps
