// zps/train/worker_access.h — ParamAccess over the zps worker library: parameters come from the
// shards through the trace-driven Prefetcher, gradients go out as asynchronous pushes.
//
// Thread-safety: one training thread drives it, like the Prefetcher.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "zps/train/param_access.h"
#include "zps/worker/client.h"
#include "zps/worker/prefetcher.h"

namespace zps::train {

class WorkerAccess final : public ParamAccess {
 public:
  /// `reduce` (not owned; null = server-sum): the `pre-reduced` mode. Each gradient is
  /// reduce-scattered among the ranks and this rank pushes only its slice
  /// worker::RankSlice(numel, world, rank), already summed. `prefetch.gather` selects the
  /// bandwidth-centric fetch strategy (zps/worker/prefetcher.h).
  WorkerAccess(worker::Client* client, const worker::PrefetchOptions& prefetch,
               worker::Collectives* reduce = nullptr);

  /// Starts step `step` (fetches ask for version >= step; pushes carry `step`).
  /// `inject_overflow`: replace element 0 of parameter 0's gradient with +Inf (test hook,
  /// mirroring ReferenceOptions::inject_overflow_step).
  void BeginStep(int64_t step, bool inject_overflow);
  void EndStep() { prefetcher_.EndStep(); }

  Result<std::vector<std::span<const float>>> Acquire(std::span<const uint32_t> ids) override;
  void Release(std::span<const uint32_t> ids) override;
  Status PushGrad(uint32_t param_id, std::span<const float> grad) override;

  const worker::PrefetchStats& prefetch_stats() const { return prefetcher_.stats(); }

 private:
  worker::Client* client_;
  worker::Prefetcher prefetcher_;
  int64_t step_ = 0;
  bool inject_ = false;
  std::unordered_map<uint32_t, std::vector<float>> views_;
  worker::Collectives* reduce_ = nullptr;
  std::vector<float> scratch_;  // pre-reduced: the gradient being reduce-scattered
};

}  // namespace zps::train
