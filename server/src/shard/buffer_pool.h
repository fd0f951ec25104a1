// The buffers of copy-on-write snapshots (background checkpoints): a snapshot hands back the
// buffers it wrote, and the next out-of-place update (or snapshot copy) takes them again, so
// that neither page-faults nor zeroes memory. Reserve fills the pool ahead of the first
// checkpoint from a low-priority thread of its own.
//
// Lock order: mu_ is a leaf. It is taken under ShardState::mu_ and under a snapshot's mutex,
// and nothing is called while it is held (annotated: ACQUIRED_AFTER(ShardState::mu_) here, and
// ShardSnapshot::mu_ ACQUIRED_BEFORE it).
// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "shard/chunk_layout.h"
#include "zps/common/aligned_buffer.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/shard_state.h"

namespace zps::server {

class BufferPool {
 public:
  BufferPool() = default;
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  /// Stops the reserving thread between two buffers and joins it.
  ~BufferPool();

  /// A pooled buffer of exactly `n` elements (masters), else a new uninitialised one (empty for
  /// n == 0). Errors: ResourceExhausted.
  Result<AlignedBuffer<float>> Take(size_t n) EXCLUDES(mu_);
  /// As Take, for packed moments of `n` bytes.
  Result<AlignedBuffer<std::byte>> TakeBytes(size_t n) EXCLUDES(mu_);
  /// Buffers sized as `like`'s (uninitialised). Errors: ResourceExhausted (none is kept then).
  Result<ChunkBuffers> TakeLike(const ChunkBuffers& like) EXCLUDES(mu_);
  /// Keeps `b` for a later Take (an empty one is dropped).
  void Give(AlignedBuffer<float> b) EXCLUDES(mu_);
  void Give(AlignedBuffer<std::byte> b) EXCLUDES(mu_);
  void Give(ChunkBuffers b) EXCLUDES(mu_);
  /// Allocates and faults in one master buffer per entry of `master_elems` and one moment buffer
  /// per entry of `moment_bytes`, on the "zps-reserve" thread at the lowest CPU priority, and
  /// returns at once; each joins the pool. Only the first call does anything. `who` prefixes its
  /// log lines.
  void Reserve(std::vector<size_t> master_elems, std::vector<size_t> moment_bytes, std::string who);
  /// Buffers pooled now.
  size_t pooled() const EXCLUDES(mu_);

 private:
  friend class ShardSnapshot;  // names mu_ in its lock order (ACQUIRED_BEFORE)
  mutable Mutex mu_ ACQUIRED_AFTER(ShardState::mu_);
  std::multimap<size_t, AlignedBuffer<float>> buffers_ GUARDED_BY(mu_);    // masters, by size
  std::multimap<size_t, AlignedBuffer<std::byte>> bytes_ GUARDED_BY(mu_);  // moments, by size
  std::thread reserve_thread_;                                             // "zps-reserve"
  std::atomic<bool> reserve_stop_{false};  // the destructor stops it between buffers
};

}  // namespace zps::server
