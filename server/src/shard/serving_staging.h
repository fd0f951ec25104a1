// The staging buffers of fetches of spilled serving copies and of copies made on fetch: a set of
// chunk-sized buffers, a cache of the latest copies read or converted into them (several workers
// fetch the same chunk at the same version), and their lending to the replies, which are sent
// straight from them. Part of the serving tier (docs/nvme.md "Serving copies").
//
// Lock order: Core::mu is a leaf (the serving reader takes it without ShardState::mu_, and a
// deleter takes it on whatever thread drops the last owner).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "zps/common/aligned_buffer.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::server {

// Chunk-sized staging buffers, `count` of them kept, and a cache of the latest copies read into
// them. A buffer handed out returns to the set when its last owner lets go (the deleter), which
// may be on any thread (e.g. UCX's progress thread when a reply's send completes), and is freed
// then if more than `count` are allocated. When every buffer is held outside the cache (replies
// in flight, or a reply to a worker that vanished, whose send may never complete), a read gets a
// new buffer instead of waiting: a held buffer never stalls later fetches. The storage lives as
// long as any handed-out owner, even past the ShardState.
//
// Thread-safety: Get and the cache belong to the serving reader thread; Stop and bytes may be
// called from any thread; the deleters from any thread.
class ServingStaging {
 public:
  static Result<std::unique_ptr<ServingStaging>> Create(size_t count, uint64_t elems) {
    auto core = std::make_shared<Core>(count, elems);
    MutexLock lock(&core->mu);  // not shared yet; for the analysis
    for (size_t i = 0; i < count; ++i) {
      ZPS_ASSIGN_OR_RETURN(auto b, AlignedBuffer<uint16_t>::Allocate(elems));
      core->free.push_back(std::move(b));
    }
    core->allocated = count;
    auto s = std::unique_ptr<ServingStaging>(new ServingStaging());
    s->core_ = std::move(core);
    return s;
  }

  /// The copy of store chunk `index` at serving generation `gen`, from the cache or read by
  /// `read` (which fills the whole chunk) into a free buffer, or a new one when every buffer is
  /// held. `*hit` tells which. Errors: from `read`; ResourceExhausted (no memory for a new
  /// buffer); Cancelled after Stop.
  Result<std::shared_ptr<const uint16_t>> Get(uint32_t index, uint64_t gen,
                                              const std::function<Status(uint16_t*)>& read,
                                              bool* hit) {
    std::erase_if(cache_, [&](const Entry& e) { return e.gen != gen; });
    for (const Entry& e : cache_) {
      if (e.index == index) {
        *hit = true;
        return e.data;
      }
    }
    *hit = false;
    ZPS_ASSIGN_OR_RETURN(std::shared_ptr<uint16_t> buf, Acquire());
    ZPS_RETURN_IF_ERROR(read(buf.get()));
    cache_.push_back({index, gen, buf});
    return std::shared_ptr<const uint16_t>(std::move(buf));
  }

  void Stop() {
    MutexLock lock(&core_->mu);
    core_->stopped = true;
  }

  /// Bytes of the buffers allocated now: `count` of them, and more while replies hold them.
  uint64_t bytes() const {
    MutexLock lock(&core_->mu);
    return core_->allocated * core_->elems * sizeof(uint16_t);
  }

 private:
  struct Core {
    Core(size_t kept, uint64_t buffer_elems) : count(kept), elems(buffer_elems) {}
    const size_t count;    // buffers kept
    const uint64_t elems;  // per buffer
    Mutex mu;
    std::vector<AlignedBuffer<uint16_t>> free GUARDED_BY(mu);
    size_t allocated GUARDED_BY(mu) = 0;  // free, cached or held by replies
    bool stopped GUARDED_BY(mu) = false;
  };
  struct Entry {
    uint32_t index = 0;
    uint64_t gen = 0;
    std::shared_ptr<const uint16_t> data;
  };
  ServingStaging() = default;

  // A free buffer; evicts the oldest cache entries first, then allocates one more.
  Result<std::shared_ptr<uint16_t>> Acquire() {
    for (;;) {
      MutexLock lock(&core_->mu);
      if (core_->stopped) return Cancelled("the serving reader stopped");
      if (!core_->free.empty()) {
        AlignedBuffer<uint16_t> b = std::move(core_->free.back());
        core_->free.pop_back();
        return Lend(std::move(b));
      }
      if (cache_.empty()) {
        ++core_->allocated;  // every buffer is held by a reply
        break;
      }
      lock.Unlock();  // the entry's deleter takes core_->mu
      cache_.erase(cache_.begin());
    }
    auto b = AlignedBuffer<uint16_t>::Allocate(core_->elems);
    if (!b.ok()) {
      MutexLock lock(&core_->mu);
      --core_->allocated;
      return b.status();
    }
    return Lend(std::move(*b));
  }

  // A shared owner of `b`, whose last owner gives it back to the set (or frees it, when more
  // than `count` are allocated).
  std::shared_ptr<uint16_t> Lend(AlignedBuffer<uint16_t> b) {
    auto held = std::make_shared<AlignedBuffer<uint16_t>>(std::move(b));
    uint16_t* data = held->data();
    return std::shared_ptr<uint16_t>(data, [core = core_, held](uint16_t*) {
      MutexLock lock(&core->mu);
      if (core->allocated > core->count) {
        --core->allocated;  // freed with `held`
      } else {
        core->free.push_back(std::move(*held));
      }
    });
  }

  std::shared_ptr<Core> core_;
  std::vector<Entry> cache_;  // oldest first; reader thread only
};

}  // namespace zps::server
