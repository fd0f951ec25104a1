// zps/worker/quantized_pieces.h — the layout of a quantized ParamBuffer (fetch_op.h): which block
// records of which chunks a run of a parameter's elements is fetched as, and their
// dequantization. One place for both, so that the Client that lays a quantized fetch out, the
// Prefetcher that all-gathers quantized slices and the readers that dequantize them agree.
//
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/block_quant.h"
#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/worker/fetch_op.h"

namespace zps::worker {

/// The pieces elements [begin, begin + length) of parameter `param` are fetched as from a
/// block-quantized serving copy of dtype `served`: one per Layout piece (in element order), its
/// covering blocks, back to back from offset 0. length 0 gives none. Errors: OutOfRange (id or
/// range), InvalidArgument (`served` is not block-quantized).
Result<std::vector<QuantPiece>> QuantizedPieces(const Layout& layout, DType served, uint32_t param,
                                                uint64_t begin, uint64_t length);

/// Bytes the pieces take: the end of the last one (0 for none).
uint64_t QuantizedPiecesBytes(std::span<const QuantPiece> pieces);

/// Elements the pieces hold.
uint64_t QuantizedPiecesElems(std::span<const QuantPiece> pieces);

/// Dequantizes the pieces (their block records in `data`, at the pieces' offsets) into `out`,
/// QuantizedPiecesElems(pieces) elements of `target`, in order: the CPU (SIMD) codec of
/// block_quant.h, so the bits are DequantizeRange's. Preconditions (not checked): `data` holds
/// QuantizedPiecesBytes(pieces) bytes laid out as QuantizedPieces says for format `f`.
void DequantizePieces(QuantFormat f, std::span<const QuantPiece> pieces, const std::byte* data,
                      DequantTarget target, void* out);

/// A quantized ParamBuffer's elements into `out` as `to` (fp32, fp16 or bf16). Errors:
/// InvalidArgument (the buffer is not quantized, or `to` is not a 16- or 32-bit float type),
/// DataLoss (its pieces do not fit its memory).
Status DequantizeBuffer(const ParamBuffer& buffer, DType to, void* out);

}  // namespace zps::worker
