#include "shard/chunk_layout.h"

#include <algorithm>
#include <cstring>

#include "zps/common/crc32c.h"
#include "zps/server/nvme.h"

namespace zps::server {

ChunkLayout ChunkLayout::For(const OptimizerConfig& optimizer, DType serving_dtype) {
  const bool needs_v = optimizer.kind != OptimizerKind::kSgd;
  const bool needs_m = needs_v || optimizer.momentum > 0.0f;
  ChunkLayout l;
  l.kinds_[static_cast<size_t>(StateKind::kMaster)] = {StateKind::kMaster, "master", true,
                                                       DType::kF32, 4};
  l.kinds_[static_cast<size_t>(StateKind::kM)] = {StateKind::kM, "m", needs_m, DType::kF32, 4};
  l.kinds_[static_cast<size_t>(StateKind::kV)] = {StateKind::kV, "v", needs_v, DType::kF32, 4};
  l.kinds_[static_cast<size_t>(StateKind::kServing)] = {
      StateKind::kServing, "serving", true, serving_dtype,
      static_cast<uint32_t>(DTypeSize(serving_dtype))};
  return l;
}

uint32_t ChunkLayout::moments() const {
  return has(StateKind::kV) ? 2 : (has(StateKind::kM) ? 1 : 0);
}

uint64_t ChunkLayout::spare_set_bytes(uint64_t n) const {
  uint64_t total = 0;
  for (const StateKindInfo& k : kinds_) {
    if (k.present) total += AlignUp(n * k.element_bytes);
  }
  return total;
}

Result<ChunkBuffers> ChunkBuffers::Allocate(const ChunkLayout& layout, uint64_t n) {
  ChunkBuffers b;
  for (StateKind k : kOptimizerStateKinds) {
    if (!layout.has(k)) continue;
    ZPS_ASSIGN_OR_RETURN(b.of(k), AlignedBuffer<float>::Allocate(n));
  }
  return b;
}

ChunkState ChunkBuffers::prefix(uint64_t n) {
  auto part = [n](AlignedBuffer<float>& b) {
    return b.size() == 0 ? std::span<float>() : b.span().subspan(0, n);
  };
  return {part(master), std::as_writable_bytes(part(m)), std::as_writable_bytes(part(v))};
}

uint64_t ChunkBuffers::bytes() const {
  uint64_t total = 0;
  ForEach([&](StateKind, const AlignedBuffer<float>& b) { total += b.size() * sizeof(float); });
  return total;
}

uint32_t ChunkBuffers::Crc(uint32_t crc) const {
  ForEach([&](StateKind, const AlignedBuffer<float>& b) {
    crc = Crc32cExtend(crc, std::as_bytes(b.span()));
  });
  return crc;
}

void ChunkBuffers::Zero() {
  ForEach([](StateKind, AlignedBuffer<float>& b) {
    std::fill(b.span().begin(), b.span().end(), 0.0f);
  });
}

void ChunkBuffers::CopyFrom(const ChunkBuffers& from) {
  for (StateKind k : kOptimizerStateKinds) {
    const AlignedBuffer<float>& src = from.of(k);
    if (src.size() > 0) std::memcpy(of(k).data(), src.data(), src.size() * sizeof(float));
  }
}

}  // namespace zps::server
