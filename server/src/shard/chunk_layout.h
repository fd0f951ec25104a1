// What one chunk of a shard stores, described once: the kinds of state (master, Adam m and v,
// the serving copy), their dtypes and sizes, and the buffers that hold a chunk's optimizer
// state. The master is fp32; m and v are packed in the job's state dtype (MomentBytes in
// zps/server/optimizer.h: fp32, bf16, or int8 blocks with their scales), so they are bytes. Buffer
// sizes, the store's options, spare sets, CRCs and copies are derived from here; a new kind or
// dtype of state changes this file and the optimizer kernel.
//
// Thread-safety: ChunkLayout is immutable after For(). ChunkBuffers is a plain value: its owner
// synchronises it (ShardState::mu_ for the live state, the snapshot's mutex for its copies).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "zps/common/aligned_buffer.h"
#include "zps/common/dtype.h"
#include "zps/common/serving_quant.h"
#include "zps/common/status.h"
#include "zps/server/optimizer.h"

namespace zps::server {

/// A packed fp32 moment as its floats (only for state known to be fp32: tests).
inline std::span<float> Fp32Moment(std::span<std::byte> packed) {
  return {reinterpret_cast<float*>(packed.data()), packed.size() / sizeof(float)};
}
inline std::span<const float> Fp32Moment(std::span<const std::byte> packed) {
  return {reinterpret_cast<const float*>(packed.data()), packed.size() / sizeof(float)};
}

/// The kinds of state a chunk stores. The first three are the optimizer's state (kStateKinds);
/// the serving copy is what workers fetch, derived from the master.
enum class StateKind : uint8_t { kMaster = 0, kM = 1, kV = 2, kServing = 3 };
inline constexpr size_t kNumStateKinds = 4;
/// The optimizer-state kinds, in the order every CRC, copy and store record lists them.
inline constexpr std::array<StateKind, 3> kOptimizerStateKinds = {StateKind::kMaster, StateKind::kM,
                                                                  StateKind::kV};

struct StateKindInfo {
  StateKind kind = StateKind::kMaster;
  std::string_view name;       // "master", "m", "v", "serving"
  bool present = false;        // the optimizer keeps it (master and serving: always)
  DType dtype = DType::kF32;   // master and serving (m and v: ChunkLayout::state_dtype)
  uint32_t element_bytes = 4;  // master, serving: DTypeSize(dtype) (0 for an int8-block serving
                               // copy: ServingBytes); m, v: one element's code (4, 2 or 1 byte),
                               // without the int8 blocks' scales
};

/// The per-element description of a chunk's state for one job.
class ChunkLayout {
 public:
  /// m is kept by Adam-family optimizers and SGD with momentum, v by Adam-family ones, both
  /// packed in optimizer.state_dtype; the serving copy has `serving_dtype` (fp16, bf16, fp32, or
  /// int8-block: zps/common/serving_quant.h).
  static ChunkLayout For(const OptimizerConfig& optimizer, DType serving_dtype);

  const StateKindInfo& info(StateKind k) const { return kinds_[static_cast<size_t>(k)]; }
  bool has(StateKind k) const { return info(k).present; }
  /// The optimizer's moments as the ChunkStore counts them: 0, 1 (m) or 2 (m and v).
  uint32_t moments() const;
  /// 16-bit words of the serving copy of a chunk of `n` elements: serving spans count words.
  uint64_t serving_words(uint64_t n) const { return ServingWords(serving_dtype(), n); }
  /// The bytes of a chunk's serving copy (of `n` elements) that a fetch of elements
  /// [offset, offset + length) carries (ServingRange).
  QuantRange serving_range(uint64_t n, uint64_t offset, uint64_t length) const {
    return ServingRange(serving_dtype(), n, offset, length);
  }
  DType serving_dtype() const { return info(StateKind::kServing).dtype; }
  StateDType state_dtype() const { return state_dtype_; }
  /// Bytes of `n` elements of kind `k` (0 when absent); m and v packed (MomentBytes).
  uint64_t bytes(StateKind k, uint64_t n) const;
  /// Of bytes(k, n) for m or v, those that are not the elements' codes: the int8 blocks' scales
  /// (and the unused codes of a last partial block); 0 for fp32 and bf16 moments.
  uint64_t scale_bytes(StateKind k, uint64_t n) const {
    return has(k) ? bytes(k, n) - n * info(k).element_bytes : 0;
  }
  /// Bytes of one chunk of `n` elements in the serving block: 64-byte aligned, so that every
  /// serving copy starts on a cache line.
  uint64_t serving_stride(uint64_t n) const {
    return (bytes(StateKind::kServing, n) + 63) / 64 * 64;
  }
  /// Bytes of a spare set for a chunk of `n` elements (speculation with a store): every kind
  /// present, each rounded up to the store's direct-I/O alignment; the serving copy only if
  /// `with_serving` (a shard that makes its copies on fetch keeps none).
  uint64_t spare_set_bytes(uint64_t n, bool with_serving) const;

 private:
  std::array<StateKindInfo, kNumStateKinds> kinds_;
  StateDType state_dtype_ = StateDType::kF32;
};

/// A chunk's optimizer state: the fp32 master and m and v packed in `dtype` (MomentBytes bytes
/// each); an empty buffer for a kind the optimizer does not keep. Zeroed bytes are zero moments
/// in every state dtype. Move-only.
struct ChunkBuffers {
  AlignedBuffer<float> master;
  AlignedBuffer<std::byte> m, v;
  StateDType dtype = StateDType::kF32;

  /// Zeroed buffers of `n` elements for every optimizer-state kind `layout` keeps. Errors:
  /// ResourceExhausted.
  static Result<ChunkBuffers> Allocate(const ChunkLayout& layout, uint64_t n);

  /// The bytes of kind k's buffer (empty when absent).
  std::span<std::byte> bytes_of(StateKind k) {
    return k == StateKind::kMaster ? std::as_writable_bytes(master.span())
                                   : (k == StateKind::kM ? m.span() : v.span());
  }
  std::span<const std::byte> bytes_of(StateKind k) const {
    return const_cast<ChunkBuffers*>(this)->bytes_of(k);
  }
  /// Calls fn(kind, bytes) for master, m and v, in that order.
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (StateKind k : kOptimizerStateKinds) fn(k, bytes_of(k));
  }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (StateKind k : kOptimizerStateKinds) fn(k, bytes_of(k));
  }

  ChunkState spans() { return {master.span(), m.span(), v.span()}; }
  ConstChunkState spans() const { return {master.span(), m.span(), v.span()}; }
  /// The first `n` elements of each buffer (a spare sized for the largest chunk).
  ChunkState prefix(uint64_t n);
  /// Bytes held.
  uint64_t bytes() const;
  /// Extends `crc` over master, m and v, in that order (absent kinds add nothing).
  uint32_t Crc(uint32_t crc) const;
  /// Sets every element to zero.
  void Zero();
  /// Copies `from` into these buffers, which must have the same sizes.
  void CopyFrom(const ChunkBuffers& from);
  void swap(ChunkBuffers& other) noexcept {
    std::swap(master, other.master);
    std::swap(m, other.m);
    std::swap(v, other.v);
    std::swap(dtype, other.dtype);
  }
};

}  // namespace zps::server
