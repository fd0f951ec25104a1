// zps/worker/prefetcher.h — just-in-time parameter access with trace-driven prefetch.
//
// The first step records the order in which parameters are acquired (the trace). In later steps,
// each Acquire advances a cursor along the trace and starts fetches for the parameters that come
// next, up to `prefetch_bytes` in flight and `max_live_bytes` held, wrapping into the next step's
// first parameters (at the next version). When the order differs from the trace (dynamic control
// flow), prefetching stops for that step and the trace is rebuilt from it: a wrong guess costs
// bandwidth, never correctness, and nothing waits on a fetch that was not asked for.
//
// Buffers are kept per (parameter, version) and reused while held: a parameter fetched for the
// forward pass serves the backward pass too when it is still live. Released buffers beyond
// `max_live_bytes` are freed, least recently used first.
//
// Parameters come from a ParamSource (zps/worker/param_source.h): a Client in training, a fake in
// the unit tests (tests/unit/worker/prefetcher_test.cc).
//
// Thread-safety: one thread drives a Prefetcher (the training loop). The source it uses (a
// Client) may be shared with other threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "zps/common/status.h"
#include "zps/worker/collectives.h"
#include "zps/worker/fetch_op.h"
#include "zps/worker/param_source.h"

namespace zps::worker {

struct PrefetchOptions {
  uint64_t prefetch_bytes = 256ull << 20;  // Default: 256 MiB in flight ahead; 0 = no prefetch.
  uint64_t max_live_bytes = 1ull << 30;    // Default: 1 GiB of fetched buffers held.
  /// The `bandwidth-centric` fetch strategy when set: this rank fetches only its slice
  /// RankSlice(numel, world, rank) of each parameter from the shards (ahead, along the trace, as
  /// in `direct`), and each Acquire all-gathers, in one collective, the slices of its
  /// parameters that are not gathered yet (a layer's parameters in one go). Every rank must then
  /// acquire the same parameters in the same order (the same model), and use the same budgets, so
  /// that the all-gathers match. Not owned; must outlive the Prefetcher. Default: null = `direct`
  /// (each rank fetches whole parameters).
  Collectives* gather = nullptr;
};

struct PrefetchStats {
  uint64_t acquires = 0;
  uint64_t hits = 0;        // already fetched or in flight when acquired
  uint64_t prefetches = 0;  // fetches started ahead of use
  uint64_t trace_rebuilds = 0;
  uint64_t gathers = 0;              // bandwidth-centric: parameters all-gathered from slices
  std::chrono::nanoseconds wait{0};  // time Acquire spent waiting for data
};

class Prefetcher {
 public:
  /// `source` (not owned; a Client) must outlive the Prefetcher.
  Prefetcher(ParamSource* source, const PrefetchOptions& options);

  /// Starts step `step`: parameters are needed at version >= step.
  void BeginStep(int64_t step);
  /// Returns one buffer per id (in order), fetching what is not live yet, then prefetches ahead.
  /// Errors: from the fetch (Unavailable, DeadlineExceeded, OutOfRange...), or from the
  /// all-gather (bandwidth-centric). On error nothing stays acquired.
  Result<std::vector<std::shared_ptr<const ParamBuffer>>> Acquire(std::span<const uint32_t> ids);
  /// Ends the use of `ids` (the buffers may be kept for reuse within the budget).
  void Release(std::span<const uint32_t> ids);
  /// Ends the step: adopts the recorded order as the trace if it changed.
  void EndStep();

  const PrefetchStats& stats() const { return stats_; }
  uint64_t live_bytes() const { return live_bytes_; }

 private:
  struct Entry {
    FetchOp op;
    std::shared_ptr<const ParamBuffer> buffer;  // once waited
    uint64_t bytes = 0;
    int refs = 0;
    uint64_t last_use = 0;
  };

  Entry& Start(uint32_t param, int64_t version);
  using Key = std::pair<uint32_t, int64_t>;  // (param, version)
  // bandwidth-centric: waits for this rank's slices of `keys` and all-gathers them (one
  // collective) into whole parameters, set as the entries' buffers.
  Status Gather(const std::vector<Key>& keys);
  void PrefetchAhead();
  void Evict();
  uint64_t ParamBytes(uint32_t param) const;

  ParamSource* source_;
  PrefetchOptions options_;
  PrefetchStats stats_;
  int64_t step_ = 0;
  std::vector<uint32_t> trace_;      // acquire order of the last recorded step
  std::vector<uint32_t> recording_;  // acquire order of this step
  size_t cursor_ = 0;                // next trace position expected
  bool following_ = false;           // this step matches the trace so far
  size_t ahead_ = 0;                 // trace positions already prefetched (may wrap: >= size)
  std::map<Key, Entry> entries_;
  uint64_t live_bytes_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace zps::worker
