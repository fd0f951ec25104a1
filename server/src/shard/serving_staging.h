// The staging buffers of fetches of spilled serving copies: a fixed set of chunk-sized
// buffers, and a cache of the latest copies read into them (several workers fetch the same chunk
// at the same version). Part of the serving tier (docs/nvme.md "Serving copies").
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

// A fixed set of chunk-sized staging buffers, and a cache of the latest copies read into them.
// A buffer handed out returns to the free list when the last owner lets go (the deleter), which
// may be on any thread (e.g. UCX's progress thread when a reply's send completes); the storage
// lives as long as any handed-out owner, even past the ShardState.
//
// Thread-safety: Get and the cache belong to the serving reader thread; Stop may be called from
// any thread; the deleters from any thread.
class ServingStaging {
 public:
  static Result<std::unique_ptr<ServingStaging>> Create(size_t count, uint64_t elems) {
    auto core = std::make_shared<Core>();
    MutexLock lock(&core->mu);  // not shared yet; for the analysis
    for (size_t i = 0; i < count; ++i) {
      ZPS_ASSIGN_OR_RETURN(auto b, AlignedBuffer<uint16_t>::Allocate(elems));
      core->bufs.push_back(std::move(b));
      core->free.push_back(i);
    }
    auto s = std::unique_ptr<ServingStaging>(new ServingStaging());
    s->core_ = std::move(core);
    s->bytes_ = count * elems * sizeof(uint16_t);
    return s;
  }

  /// The copy of store chunk `index` at serving generation `gen`, from the cache or read by
  /// `read` (which fills the whole chunk) into a free buffer, waiting for one. `*hit` tells which.
  /// Errors: from `read`; Cancelled after Stop.
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
    {
      MutexLock lock(&core_->mu);
      core_->stopped = true;
    }
    core_->cv.SignalAll();
  }

  uint64_t bytes() const { return bytes_; }

 private:
  struct Core {
    Mutex mu;
    CondVar cv;
    std::vector<AlignedBuffer<uint16_t>> bufs;  // fixed at Create
    std::vector<size_t> free GUARDED_BY(mu);
    bool stopped GUARDED_BY(mu) = false;
  };
  struct Entry {
    uint32_t index = 0;
    uint64_t gen = 0;
    std::shared_ptr<const uint16_t> data;
  };
  ServingStaging() = default;

  // A free buffer; evicts the oldest cache entries first, then waits for in-flight replies.
  Result<std::shared_ptr<uint16_t>> Acquire() {
    for (;;) {
      MutexLock lock(&core_->mu);
      if (core_->stopped) return Cancelled("the serving reader stopped");
      if (!core_->free.empty()) {
        const size_t i = core_->free.back();
        core_->free.pop_back();
        std::shared_ptr<Core> core = core_;
        return std::shared_ptr<uint16_t>(core->bufs[i].data(), [core, i](uint16_t*) {
          {
            MutexLock l(&core->mu);
            core->free.push_back(i);
          }
          core->cv.SignalAll();
        });
      }
      if (!cache_.empty()) {
        lock.Unlock();  // the entry's deleter takes core_->mu
        cache_.erase(cache_.begin());
        continue;
      }
      core_->cv.Wait(lock,
                     [&]() REQUIRES(core_->mu) { return core_->stopped || !core_->free.empty(); });
    }
  }

  std::shared_ptr<Core> core_;
  std::vector<Entry> cache_;  // oldest first; reader thread only
  uint64_t bytes_ = 0;
};

}  // namespace zps::server
