// zps/worker/staging_slots.h — the device-independent logic of the CUDA backend's staging
// (zps/worker/cuda_backend.h): a fixed pool of host slots (one region, first-fit runs of
// contiguous slots) and a bounded queue of copies in flight, each tracked by an event. Kept free of
// CUDA so that it is tested without a GPU (tests/unit/worker/staging_slots_test.cc, with a fake
// CopyEvents).
//
//   SlotPool pool(region, slot_bytes);            // the pinned slots, allocated at start
//   auto run = pool.TryAcquire(bytes);            // nullopt: no run of free slots fits
//   InflightCopies q(&events, max_inflight);
//   ZPS_ASSIGN_OR_RETURN(size_t ev, q.Acquire()); // waits for the oldest copy when q is full
//   ... record the copy and event `ev` ...
//   q.Push(ev, keep);                             // `keep` (e.g. the slot) lives until ev is done
//
// A slot is reused only after the copy that reads it completed: the copy's `keep` holds it (its
// release returns the slot to the pool), and InflightCopies drops `keep` only once the event is
// done. So the slot pool itself never waits.
//
// Thread-safety: SlotPool is thread-safe (a slot may be released on any thread).
// InflightCopies is not: its owner serialises calls (the CUDA backend holds its copy mutex).
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::worker {

/// A fixed number of equal host slots in one contiguous region; a request takes the first run
/// of contiguous free slots long enough for it (first fit), so small and large buffers share
/// one pool and one UCX registration.
class SlotPool {
 public:
  /// A run of `count` contiguous slots starting at slot `first`.
  struct Run {
    size_t first = 0;
    size_t count = 0;
  };
  /// `memory`: the region (owned by the caller, outliving the pool), cut into
  /// memory.size() / slot_bytes slots of `slot_bytes` (> 0).
  SlotPool(std::span<std::byte> memory, size_t slot_bytes)
      : memory_(memory), slot_bytes_(slot_bytes), used_(memory.size() / slot_bytes, false) {}
  /// The first run of free slots holding `bytes` (at least one slot), or nullopt when none is
  /// free (the caller then allocates outside the pool).
  std::optional<Run> TryAcquire(size_t bytes) {
    const size_t need = bytes == 0 ? 1 : (bytes + slot_bytes_ - 1) / slot_bytes_;
    MutexLock lock(&mu_);
    size_t start = 0, len = 0;
    for (size_t i = 0; i < used_.size(); ++i) {
      if (used_[i]) {
        len = 0;
        continue;
      }
      if (len++ == 0) start = i;
      if (len == need) {
        for (size_t k = start; k < start + need; ++k) used_[k] = true;
        free_ -= need;
        return Run{start, need};
      }
    }
    return std::nullopt;
  }
  /// Returns a run (from TryAcquire) to the pool.
  void Release(Run run) {
    MutexLock lock(&mu_);
    for (size_t k = run.first; k < run.first + run.count; ++k) used_[k] = false;
    free_ += run.count;
  }
  std::span<std::byte> memory(Run run) const {
    return memory_.subspan(run.first * slot_bytes_, run.count * slot_bytes_);
  }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t size() const {
    MutexLock lock(&mu_);
    return used_.size();
  }
  size_t free_count() const {
    MutexLock lock(&mu_);
    return free_;
  }

 private:
  const std::span<std::byte> memory_;
  const size_t slot_bytes_;
  mutable Mutex mu_;
  std::vector<bool> used_ GUARDED_BY(mu_);
  size_t free_ GUARDED_BY(mu_) = used_.size();
};

/// What InflightCopies needs of the events (cudaEvent_t in the backend, a fake in tests):
/// `max_inflight` events, named by index.
class CopyEvents {
 public:
  virtual ~CopyEvents() = default;
  /// Whether the work recorded on event `index` has completed (cudaEventQuery). Errors: the
  /// device's (the event then counts as failed).
  virtual Result<bool> Done(size_t index) = 0;
  /// Blocks until event `index` completed (cudaEventSynchronize).
  virtual Status Wait(size_t index) = 0;
};

/// A FIFO of copies in flight, at most `max_inflight`, each holding what it reads or writes.
class InflightCopies {
 public:
  InflightCopies(CopyEvents* events, size_t max_inflight) : events_(events) {
    for (size_t i = max_inflight; i > 0; --i) free_.push_back(i - 1);
  }
  ~InflightCopies() { (void)Drain(); }
  InflightCopies(const InflightCopies&) = delete;
  InflightCopies& operator=(const InflightCopies&) = delete;

  /// An event index to record the next copy on. Retires the completed copies first; when all
  /// `max_inflight` are still in flight, waits for the oldest. Errors: from the events (the
  /// failed copy is retired, its `keep` dropped).
  Result<size_t> Acquire() {
    ZPS_RETURN_IF_ERROR(Poll());
    if (free_.empty()) {
      ++waits_;
      Entry oldest = std::move(queue_.front());
      queue_.pop_front();
      Status s = events_->Wait(oldest.event);
      free_.push_back(oldest.event);
      if (!s.ok()) return s;
    }
    const size_t ev = free_.back();
    free_.pop_back();
    return ev;
  }
  /// Gives back an event from Acquire that was not recorded (the copy failed to start).
  void Abandon(size_t event) { free_.push_back(event); }
  /// Event `event` (from Acquire) was recorded after a copy that uses `keep`'s memory.
  void Push(size_t event, std::shared_ptr<const void> keep) {
    queue_.push_back({event, std::move(keep)});
  }
  /// Retires the completed copies, in order (copies on one stream complete in order).
  Status Poll() {
    while (!queue_.empty()) {
      auto done = events_->Done(queue_.front().event);
      if (done.ok() && !*done) break;
      free_.push_back(queue_.front().event);
      queue_.pop_front();
      if (!done.ok()) return done.status();
    }
    return Status::Ok();
  }
  /// Waits for every copy in flight. Returns the first error (all are retired regardless).
  Status Drain() {
    Status first;
    while (!queue_.empty()) {
      Status s = events_->Wait(queue_.front().event);
      if (first.ok() && !s.ok()) first = s;
      free_.push_back(queue_.front().event);
      queue_.pop_front();
    }
    return first;
  }
  size_t in_flight() const { return queue_.size(); }
  /// How many times Acquire had to wait for the oldest copy (the bound was reached).
  uint64_t waits() const { return waits_; }

 private:
  struct Entry {
    size_t event;
    std::shared_ptr<const void> keep;
  };
  CopyEvents* events_;
  std::deque<Entry> queue_;
  std::vector<size_t> free_;
  uint64_t waits_ = 0;
};

}  // namespace zps::worker
