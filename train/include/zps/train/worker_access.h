// zps/train/worker_access.h — ParamAccess over the zps worker library: parameters come from the
// shards through the trace-driven Prefetcher, gradients go out as asynchronous pushes.
//
// Thread-safety: one training thread drives it, like the Prefetcher.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "zps/train/param_access.h"
#include "zps/worker/checked_collectives.h"
#include "zps/worker/client.h"
#include "zps/worker/prefetcher.h"

namespace zps::train {

class ViewBuffers;

class WorkerAccess final : public ParamAccess {
 public:
  /// `reduce` (not owned; null = server-sum): the `pre-reduced` mode. Each gradient is
  /// reduce-scattered among the ranks and this rank pushes only its slice
  /// worker::RankSlice(numel, world, rank), already summed. `prefetch.gather` selects the
  /// bandwidth-centric fetch strategy (zps/worker/prefetcher.h).
  ///
  /// `bucket_elems` (pre-reduced only): gradients are gathered, in push order, into a bucket of
  /// at least this many fp32 elements before one reduce-scatter covers them all (RankSlice of the
  /// bucket; this rank then pushes the part of each parameter inside its slice); 0 = one
  /// reduce-scatter per parameter. Every rank must use the same value. The last, partial bucket
  /// goes out at FlushGradients.
  WorkerAccess(worker::Client* client, const worker::PrefetchOptions& prefetch,
               worker::Collectives* reduce = nullptr, uint64_t bucket_elems = 0);
  ~WorkerAccess() override;

  /// Starts step `step` (fetches ask for version >= step; pushes carry `step`).
  /// `inject_overflow`: replace element 0 of parameter 0's gradient with +Inf (test hook,
  /// mirroring ReferenceOptions::inject_overflow_step).
  void BeginStep(int64_t step, bool inject_overflow);
  /// Ends the step's fetches (Prefetcher::EndStep). Errors: bandwidth-centric collectives.
  Status EndStep() { return prefetcher_.EndStep(); }
  /// pre-reduced: reduce-scatters and pushes what is left in the bucket (call after the step's
  /// last PushGrad, before Client::FlushPushes). Errors: from the collective or the push.
  Status FlushGradients();

  Result<std::vector<std::span<const float>>> Acquire(std::span<const uint32_t> ids) override;
  void Release(std::span<const uint32_t> ids) override;
  Status PushGrad(uint32_t param_id, std::span<const float> grad) override;

  const worker::PrefetchStats& prefetch_stats() const { return prefetcher_.stats(); }
  /// Test hook: runs after each successful PushGrad with the step and the count of this step's
  /// pushes so far (zps-train's ZPS_TEST_CRASH_AT=worker-push:<step>).
  void set_after_push(std::function<void(int64_t step, int pushes)> hook) {
    after_push_ = std::move(hook);
  }
  /// Test hook, pre-reduced: runs after each slice push of a reduced bucket with the step and
  /// the count of this step's slice pushes so far (ZPS_TEST_CRASH_AT=worker-slice:<step>).
  void set_after_slice(std::function<void(int64_t step, int slices)> hook) {
    after_slice_ = std::move(hook);
  }
  /// Test hook, pre-reduced: asked before each bucket's reduce-scatter with the step and the
  /// bucket's index in it; true = this rank skips that collective (and its slice pushes), to
  /// feed the ranks mismatched collectives (ZPS_TEST_SKIP_BUCKET).
  void set_skip_bucket(std::function<bool(int64_t step, uint32_t bucket)> hook) {
    skip_bucket_ = std::move(hook);
  }

 private:
  Status PushGradNow(uint32_t param_id, std::span<const float> grad);

  worker::Client* client_;
  worker::Prefetcher prefetcher_;
  int64_t step_ = 0;
  int pushes_ = 0;  // PushGrad calls in this step
  std::function<void(int64_t, int)> after_push_;
  int slices_ = 0;  // slice pushes in this step (pre-reduced)
  std::function<void(int64_t, int)> after_slice_;
  std::function<bool(int64_t, uint32_t)> skip_bucket_;
  bool inject_ = false;
  std::unique_ptr<ViewBuffers> views_;  // what the acquired views point into
  worker::Collectives* reduce_ = nullptr;
  std::unique_ptr<worker::CheckedCollectives> checked_;  // over reduce_
  uint32_t buckets_ = 0;                                 // reduce-scattered in this step
  uint64_t bucket_elems_ = 0;
  // pre-reduced: the bucket being filled (gradients back to back, in push order) and where each
  // parameter's gradient sits in it.
  struct BucketEntry {
    uint32_t param = 0;
    uint64_t offset = 0;
    uint64_t numel = 0;
  };
  std::vector<float> bucket_;
  std::vector<BucketEntry> entries_;
};

}  // namespace zps::train
