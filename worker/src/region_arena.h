// region_arena.h (worker internal) — push staging inside ONE UCX-allocated region, so that a
// shard can read a gradient with RMA get (kAmPushRma) through a single rkey.
//
// On shared memory a get from memory that UCX allocated (Context::Allocate) is a plain copy out
// of a mapped posix segment, where the AM rendezvous a push otherwise uses goes through cma on
// the shard's progress thread (docs/data-plane.md). One region for every push keeps the shard's
// per-endpoint rkey cache at one entry (a region per buffer would make the shard map, and keep
// mapped, every region the worker ever freed).
//
// First-fit over the region in 64-byte units; freed blocks merge with their neighbours.
// Acquire returns null when no free block is large enough (the caller then pushes by AM).
//
// Thread-safety: Acquire may be called from any thread; a block may be released (its last
// shared_ptr copy dropped) on any thread, also after the arena is destroyed (then a no-op; the
// region itself lives as long as the arena's state, which every block holds).
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include "zps/common/thread_annotations.h"
#include "zps/common/ucx.h"

namespace zps::worker {

class RegionArena {
 public:
  explicit RegionArena(std::unique_ptr<ucx::MemoryRegion> region)
      : state_(std::make_shared<State>()) {
    state_->region = std::move(region);
    state_->free.emplace(0, state_->region->memory().size() / kAlign * kAlign);
  }

  /// A block of at least `bytes` bytes inside region(), or null when none is free. The block
  /// returns to the arena when the last copy of the shared_ptr goes.
  std::shared_ptr<std::byte[]> Acquire(size_t bytes) {
    const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    size_t offset = 0;
    {
      MutexLock lock(&state_->mu);
      auto it = state_->free.begin();
      while (it != state_->free.end() && it->second < size) ++it;
      if (it == state_->free.end()) return nullptr;
      offset = it->first;
      const size_t left = it->second - size;
      state_->free.erase(it);
      if (left > 0) state_->free.emplace(offset + size, left);
    }
    std::byte* p = state_->region->memory().data() + offset;
    return std::shared_ptr<std::byte[]>(
        p, [st = state_, offset, size](std::byte*) { st->Release(offset, size); });
  }

  const ucx::MemoryRegion& region() const { return *state_->region; }

 private:
  static constexpr size_t kAlign = 64;
  struct State {
    std::unique_ptr<ucx::MemoryRegion> region;  // const after construction
    Mutex mu;
    std::map<size_t, size_t> free GUARDED_BY(mu);  // offset -> size, disjoint, not adjacent
    void Release(size_t offset, size_t size) {
      MutexLock lock(&mu);
      auto next = free.lower_bound(offset);
      if (next != free.end() && offset + size == next->first) {
        size += next->second;
        next = free.erase(next);
      }
      if (next != free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += size;
          return;
        }
      }
      free.emplace_hint(next, offset, size);
    }
  };
  std::shared_ptr<State> state_;
};

}  // namespace zps::worker
