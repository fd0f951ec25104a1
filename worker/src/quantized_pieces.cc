#include "zps/worker/quantized_pieces.h"

#include <string>

#include "zps/common/serving_quant.h"

namespace zps::worker {

Result<std::vector<QuantPiece>> QuantizedPieces(const Layout& layout, DType served, uint32_t param,
                                                uint64_t begin, uint64_t length) {
  if (!IsBlockQuantized(served)) {
    return InvalidArgument("quantized pieces of a " + std::string(DTypeName(served)) +
                           " serving copy");
  }
  std::vector<QuantPiece> out;
  if (length == 0) {
    if (param >= layout.num_params() || begin > layout.param_numel(param)) {
      return OutOfRange("parameter " + std::to_string(param) + " range at " +
                        std::to_string(begin));
    }
    return out;
  }
  ZPS_ASSIGN_OR_RETURN(auto pieces, layout.Pieces(param, begin, length));
  uint64_t offset = 0;
  for (const Piece& p : pieces) {
    const QuantRange r = ServingRange(served, layout.chunk_size(p.chunk), p.chunk_offset, p.length);
    out.push_back({p.length, r.skip, offset, r.bytes});
    offset += r.bytes;
  }
  return out;
}

uint64_t QuantizedPiecesBytes(std::span<const QuantPiece> pieces) {
  return pieces.empty() ? 0 : pieces.back().offset + pieces.back().bytes;
}

uint64_t QuantizedPiecesElems(std::span<const QuantPiece> pieces) {
  uint64_t n = 0;
  for (const QuantPiece& p : pieces) n += p.elems;
  return n;
}

void DequantizePieces(QuantFormat f, std::span<const QuantPiece> pieces, const std::byte* data,
                      DequantTarget target, void* out) {
  const size_t esize = target == DequantTarget::kF32 ? 4 : 2;
  auto* dst = static_cast<std::byte*>(out);
  for (const QuantPiece& p : pieces) {
    DequantizeRange(f, {data + p.offset, p.bytes}, p.skip, p.elems, target, dst);
    dst += p.elems * esize;
  }
}

Status DequantizeBuffer(const ParamBuffer& buffer, DType to, void* out) {
  if (!IsBlockQuantized(buffer.dtype)) {
    return InvalidArgument("parameter " + std::to_string(buffer.param) + "'s buffer is " +
                           std::string(DTypeName(buffer.dtype)) + ", not quantized");
  }
  if (IsBlockQuantized(to)) {
    return InvalidArgument("dequantize to " + std::string(DTypeName(to)));
  }
  const QuantFormat f = ServingQuantFormat(buffer.dtype);
  uint64_t end = 0;
  for (const QuantPiece& p : buffer.pieces) {
    // Each piece's records, and the run inside them, must lie in the buffer.
    const uint64_t blocks = (p.skip + p.elems + f.block - 1) / f.block;
    if (p.offset < end || p.bytes > buffer.memory.size() ||
        p.offset > buffer.memory.size() - p.bytes || p.skip >= f.block ||
        p.bytes < QuantizedBytes(f, p.skip + p.elems) ||
        p.bytes > blocks * QuantizedBlockStride(f)) {
      return DataLoss("parameter " + std::to_string(buffer.param) +
                      ": a quantized piece does not fit its buffer");
    }
    end = p.offset + p.bytes;
  }
  const DequantTarget target = to == DType::kF32    ? DequantTarget::kF32
                               : to == DType::kBF16 ? DequantTarget::kBF16
                                                    : DequantTarget::kF16;
  DequantizePieces(f, buffer.pieces, buffer.memory.data(), target, out);
  return Status::Ok();
}

}  // namespace zps::worker
