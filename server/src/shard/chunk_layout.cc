#include "shard/chunk_layout.h"

#include <algorithm>
#include <cstring>

#include "zps/common/crc32c.h"
#include "zps/server/nvme.h"

namespace zps::server {

namespace {
// One element's code in a packed moment (without the int8 blocks' scales).
uint32_t CodeBytes(StateDType d) {
  return d == StateDType::kF32 ? 4 : (d == StateDType::kBF16 ? 2 : 1);
}
}  // namespace

ChunkLayout ChunkLayout::For(const OptimizerConfig& optimizer, DType serving_dtype) {
  const bool needs_v = optimizer.kind != OptimizerKind::kSgd;
  const bool needs_m = needs_v || optimizer.momentum > 0.0f;
  const uint32_t code = CodeBytes(optimizer.state_dtype);
  ChunkLayout l;
  l.state_dtype_ = optimizer.state_dtype;
  l.kinds_[static_cast<size_t>(StateKind::kMaster)] = {StateKind::kMaster, "master", true,
                                                       DType::kF32, 4};
  l.kinds_[static_cast<size_t>(StateKind::kM)] = {StateKind::kM, "m", needs_m, DType::kF32, code};
  l.kinds_[static_cast<size_t>(StateKind::kV)] = {StateKind::kV, "v", needs_v, DType::kF32, code};
  l.kinds_[static_cast<size_t>(StateKind::kServing)] = {
      StateKind::kServing, "serving", true, serving_dtype,
      static_cast<uint32_t>(DTypeSize(serving_dtype))};
  return l;
}

uint64_t ChunkLayout::bytes(StateKind k, uint64_t n) const {
  if (!has(k)) return 0;
  if (k == StateKind::kM || k == StateKind::kV) return MomentBytes(state_dtype_, n);
  if (k == StateKind::kServing) return ServingBytes(info(k).dtype, n);
  return n * info(k).element_bytes;
}

uint32_t ChunkLayout::moments() const {
  return has(StateKind::kV) ? 2 : (has(StateKind::kM) ? 1 : 0);
}

uint64_t ChunkLayout::spare_set_bytes(uint64_t n, bool with_serving) const {
  uint64_t total = 0;
  for (const StateKindInfo& k : kinds_) {
    if (k.kind != StateKind::kServing || with_serving) total += AlignUp(bytes(k.kind, n));
  }
  return total;
}

Result<ChunkBuffers> ChunkBuffers::Allocate(const ChunkLayout& layout, uint64_t n) {
  ChunkBuffers b;
  b.dtype = layout.state_dtype();
  ZPS_ASSIGN_OR_RETURN(b.master, AlignedBuffer<float>::Allocate(n));
  if (layout.has(StateKind::kM)) {
    ZPS_ASSIGN_OR_RETURN(b.m, AlignedBuffer<std::byte>::Allocate(layout.bytes(StateKind::kM, n)));
  }
  if (layout.has(StateKind::kV)) {
    ZPS_ASSIGN_OR_RETURN(b.v, AlignedBuffer<std::byte>::Allocate(layout.bytes(StateKind::kV, n)));
  }
  return b;
}

ChunkState ChunkBuffers::prefix(uint64_t n) {
  auto part = [&](AlignedBuffer<std::byte>& b) { return MomentRange(dtype, b.span(), 0, n); };
  return {master.span().subspan(0, n), part(m), part(v)};
}

uint64_t ChunkBuffers::bytes() const {
  uint64_t total = 0;
  ForEach([&](StateKind, std::span<const std::byte> b) { total += b.size(); });
  return total;
}

uint32_t ChunkBuffers::Crc(uint32_t crc) const {
  ForEach([&](StateKind, std::span<const std::byte> b) { crc = Crc32cExtend(crc, b); });
  return crc;
}

void ChunkBuffers::Zero() {
  ForEach([](StateKind, std::span<std::byte> b) { std::fill(b.begin(), b.end(), std::byte{0}); });
}

void ChunkBuffers::CopyFrom(const ChunkBuffers& from) {
  for (StateKind k : kOptimizerStateKinds) {
    const std::span<const std::byte> src = from.bytes_of(k);
    if (!src.empty()) std::memcpy(bytes_of(k).data(), src.data(), src.size());
  }
}

}  // namespace zps::server
