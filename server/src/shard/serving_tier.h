// ShardState's serving copies that are not served in place: spilled ones (a shard whose serving
// copies are store records, under a serving budget) and ones made on fetch (ServingCopies::
// kOnFetch). Their placement in the store, the "zps-serving-rd" thread that answers fetches of
// them, reading spilled copies from NVMe or converting the master, through the staging buffers
// and read cache (serving_staging.h), and the generation that keeps a read from racing a
// rewrite. See shard_state.h "Serving copies" and docs/nvme.md "Serving copies".
//
// Lock order: no lock of its own. ShardState::mu_ guards its queue and generation (GUARDED_BY
// names it through s_); the staging's lock is a leaf, taken without mu_; the store's mutex is
// taken without mu_ (a read of a spilled copy). The hooks marked "mu_ held" are called by
// ShardState under mu_ and assert it. Fetch callbacks run without mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "shard/serving_staging.h"
#include "shard/shard_chunk.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/shard_state.h"

namespace zps::server {

class ShardState::ServingTier {
 public:
  explicit ServingTier(ShardState* state) : s_(state) {}
  ~ServingTier() { Stop(); }
  ServingTier(const ServingTier&) = delete;
  ServingTier& operator=(const ServingTier&) = delete;

  /// After the store is made (serving records): points each chunk's serving span at its
  /// resident copy (empty: spilled) and, when any copy spilled, makes the staging buffers and
  /// starts the reader. Made on fetch (no store, no serving spans): makes them and starts it.
  /// Errors: ResourceExhausted.
  Status Start();
  /// Stops and joins the reader (the staging buffers outlive it while replies hold them).
  void Stop();

  // ---- mu_ held ----
  /// Queues a fetch of a spilled copy or one made on fetch, answered by the reader.
  void Queue(Waiter w);
  /// Takes every queued fetch (to fail them).
  std::vector<Waiter> TakeQueued();
  /// The update pass that rewrote the serving copies is published with its new version: the
  /// generation is even again, and the reader goes on.
  void Published();

  // ---- mu_ not held ----
  /// A pass begins rewriting masters and serving copies: the reader waits, and a read or
  /// conversion in progress ends first (takes mu_).
  void BeginRewrite();
  /// The pass ended without publishing; `result` fails later spilled fetches (takes mu_).
  void EndRewrite(const Status& result);
  /// Wakes the reader (after Shutdown set shutdown_).
  void Wake() { cv_.SignalAll(); }
  /// Writes chunk `c`'s serving copy of `master` into its spilled record (made on fetch:
  /// nothing).
  Status Write(const Chunk& c, std::span<const float> master) const;
  /// A copy of chunk `c`'s serving copy (a spilled one read from the store; made on fetch:
  /// converted from the master, taking mu_, or read through the store's VisitMaster).
  Status Copy(const Chunk& c, std::vector<uint16_t>& out) const;
  uint64_t staging_bytes() const { return staging_ ? staging_->bytes() : 0; }
  uint64_t fetches() const { return fetches_.load(std::memory_order_relaxed); }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }

 private:
  void Loop();
  // Made on fetch: the serving copy of `master` into `out`, in pieces across the shard's pool
  // (never beside an update pass, which waits for it) where it has 2 threads or more. The
  // conversion is elementwise, so the pieces give the bits of one ToServing call; a
  // block-quantized copy is made whole (its blocks count from the chunk's first element).
  void Convert(std::span<const float> master, std::span<uint16_t> out) const;
  // Made on fetch: Convert of chunk `index`'s master, the RAM state's `master` or, with a store,
  // the store's (VisitMaster: in place if resident, else read back). Errors: the store's.
  Status Make(uint32_t index, std::span<const float> master, std::span<uint16_t> out) const;

  ShardState* const s_;
  std::unique_ptr<ServingStaging> staging_;  // set at Start when a serving copy spills, or none
                                             // is kept
  std::thread reader_;                       // "zps-serving-rd"
  std::atomic<uint64_t> fetches_{0};         // answered by the reader
  std::atomic<uint64_t> reads_{0};  // of those, read from NVMe or converted (the rest: the cache)
  std::deque<Waiter> queue_ GUARDED_BY(s_->mu_);  // fetches of spilled copies to answer
  // Odd while a pass rewrites serving copies (update, restore); a read of a spilled copy is
  // valid only if the generation was even and the same before and after it.
  uint64_t gen_ GUARDED_BY(s_->mu_) = 0;
  Status error_ GUARDED_BY(s_->mu_);  // a failed update pass: spilled fetches fail
  bool stop_ GUARDED_BY(s_->mu_) = false;
  bool reading_ GUARDED_BY(s_->mu_) = false;  // the reader reads or converts without mu_
  CondVar cv_;                                // the reader waits on it (with mu_)
};

}  // namespace zps::server
