// zps/common/staging_pool.h — reusable host buffers for the copies a transfer holds: a
// worker's pushes (the API returns before the transfer), and, on a shard, pushes that are
// received only to be dropped (a range pushed again after a restart).
//
// Allocating such a buffer fresh every time costs a page fault per 4 KiB page (glibc maps
// large blocks with mmap and unmaps them on free), and zeroing it when made with
// std::make_unique<std::byte[]>: on shared memory that doubled the cost of a worker's push,
// and held a shard's fp16 pushes at 64 MiB to about 1 GB/s (docs/benchmarks.md, "Staging
// copies"). The pool keeps released buffers, up to `cache_bytes` in total, and hands one back
// for a request of n bytes when its size is in [n, 2n].
//
// Thread-safety: Acquire may be called from any thread; a buffer may be released (its last
// shared_ptr copy dropped) on any thread, also after the pool is destroyed (it is then freed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <new>

#include "zps/common/thread_annotations.h"

namespace zps {

class StagingPool {
 public:
  /// Default: 256 MiB of released buffers kept for reuse.
  explicit StagingPool(size_t cache_bytes = size_t{256} << 20) : state_(std::make_shared<State>()) {
    state_->cache_bytes = cache_bytes;
  }

  /// A 64-byte aligned buffer of at least `bytes` bytes (not initialised), returned to the pool
  /// when the last copy of the shared_ptr goes. Throws std::bad_alloc like new when memory runs
  /// out.
  std::shared_ptr<std::byte[]> Acquire(size_t bytes) {
    Buffer buf;
    size_t size = bytes;
    {
      MutexLock lock(&state_->mu);
      auto it = state_->free.lower_bound(bytes);
      if (it != state_->free.end() && it->first <= 2 * bytes) {
        size = it->first;
        buf = std::move(it->second);
        state_->cached -= size;
        state_->free.erase(it);
      }
    }
    if (!buf) {
      buf.reset(static_cast<std::byte*>(::operator new(std::max<size_t>(size, 1), kAlign)));
    }
    std::weak_ptr<State> weak = state_;
    return std::shared_ptr<std::byte[]>(buf.release(), [weak, size](std::byte* p) {
      Buffer owned(p);
      if (auto st = weak.lock()) st->Release(std::move(owned), size);
    });
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete(p, kAlign); }
  };
  using Buffer = std::unique_ptr<std::byte, AlignedDelete>;
  struct State {
    Mutex mu;
    size_t cache_bytes = 0;  // const after construction
    size_t cached GUARDED_BY(mu) = 0;
    std::multimap<size_t, Buffer> free GUARDED_BY(mu);  // size -> buffer
    void Release(Buffer p, size_t size) {
      MutexLock lock(&mu);
      if (cached + size > cache_bytes) return;  // freed as `p` goes out of scope
      cached += size;
      free.emplace(size, std::move(p));
    }
  };
  std::shared_ptr<State> state_;
};

}  // namespace zps
