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
#include "zps/worker/checked_collectives.h"
#include "zps/worker/collectives.h"
#include "zps/worker/fetch_op.h"
#include "zps/worker/param_source.h"

namespace zps::worker {

struct PrefetchOptions {
  uint64_t prefetch_bytes = 256ull << 20;  // Default: 256 MiB in flight ahead; 0 = no prefetch.
  uint64_t max_live_bytes = 1ull << 30;    // Default: 1 GiB of fetched buffers held.
  /// The `bandwidth-centric` fetch strategy when set, for what every rank fetches alike: at the
  /// end of each step (EndStep) the ranks exchange the groups they acquired (one Acquire call
  /// each) and agree on a plan for the next step, a common subsequence of their groups in
  /// order, and of the last step's (all of them where the ranks do the same thing every step;
  /// not an expert whose tokens come and go). In the next step each rank
  /// fetches only its slice RankSlice(numel, world, rank) of a planned group's parameters from
  /// the shards (ahead, along its own trace) and all-gathers the group, one collective per plan
  /// position, in plan order: an Acquire of the group at plan position j first takes part in
  /// every position it skipped before j, and EndStep in the ones left. Everything else (the
  /// first step, a group outside the plan, one acquired again after its position) is fetched
  /// whole from the shards, as in `direct`, and waits for no other rank. Ranks may therefore
  /// acquire different parameters, in different orders, any number of times: a mixture of
  /// experts, a rank-0-only evaluation forward. The ranks must call EndStep once per step, at
  /// the same step. Not owned; must outlive the Prefetcher. Default: null = `direct` (each
  /// rank fetches whole parameters).
  Collectives* gather = nullptr;
  /// bandwidth-centric: the ranks are known to acquire the same groups in the same order in
  /// the first step too (zps-train: one model, every rank alike), so the first step all-gathers
  /// each Acquire as it comes (as the plan would) instead of fetching whole. Default: false.
  bool same_first_step = false;
  /// Quantized weights (a source whose wire_dtype() is block-quantized): Acquire returns the
  /// buffers as fetched, quantized (ParamSource::FetchQuantizedAsync), for a reader that
  /// dequantizes them itself (zps.torch, on the parameters' device). false: fetched buffers are
  /// dequantized by the source, as serving_dtype() says. Either way, bandwidth-centric
  /// all-gathers the quantized slices (the block records, not the values) and dequantizes them
  /// after the gather where the buffers are not kept quantized. Default: false.
  bool keep_quantized = false;
};

struct PrefetchStats {
  uint64_t acquires = 0;
  uint64_t hits = 0;        // already fetched or in flight when acquired
  uint64_t prefetches = 0;  // fetches started ahead of use
  uint64_t trace_rebuilds = 0;
  uint64_t gathers = 0;              // bandwidth-centric: parameters all-gathered from slices
  uint64_t plan_groups = 0;          // bandwidth-centric: groups in the current plan
  uint64_t unplanned = 0;            // bandwidth-centric: groups fetched whole (outside the plan)
  uint64_t gather_bytes = 0;         // bandwidth-centric: bytes of the parameter all-gathers'
                                     // buffers (world x each rank's block)
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
  /// all-gather (bandwidth-centric; FailedPrecondition naming the plan position, the ranks and
  /// the sizes when the ranks' collectives differ). On error nothing stays acquired.
  Result<std::vector<std::shared_ptr<const ParamBuffer>>> Acquire(std::span<const uint32_t> ids);
  /// Ends the use of `ids` (the buffers may be kept for reuse within the budget).
  void Release(std::span<const uint32_t> ids);
  /// Ends the step: adopts the recorded order as this rank's trace if it changed (no other rank
  /// is involved). bandwidth-centric: first takes part in the plan positions left, then agrees
  /// on the next step's plan with the other ranks (collectives: every rank calls EndStep once
  /// per step). Errors: from those collectives (the plan is then empty: the next step fetches
  /// everything whole).
  Status EndStep();

  const PrefetchStats& stats() const { return stats_; }
  uint64_t live_bytes() const { return live_bytes_; }

 private:
  struct Entry {
    FetchOp op;
    bool slice = false;                         // op fetches this rank's slice only
    std::shared_ptr<const ParamBuffer> buffer;  // once waited
    // A quantized wire dtype: this rank's slice as block records, kept for a later plan
    // position of the same parameter (the other ranks need it again).
    std::shared_ptr<const ParamBuffer> quant_slice;
    uint64_t bytes = 0;
    int refs = 0;
    uint64_t last_use = 0;
  };

  // The entry of (param, version), started if there is none: a slice fetch where `slice`, else
  // a whole one. A slice fetch not gathered yet is replaced by a whole one where !slice.
  Entry& Start(uint32_t param, int64_t version, bool slice);
  using Key = std::pair<uint32_t, int64_t>;  // (param, version)
  using Group = std::vector<uint32_t>;
  using HeldBuffer = std::shared_ptr<const ParamBuffer>;
  bool Gathering() const;
  // bandwidth-centric: this rank's slices of plan position `pos`'s parameters (from a whole
  // buffer where there is one) all-gathered (one collective) into whole parameters.
  Status Gather(size_t pos);
  // bandwidth-centric: the plan positions up to `end` (exclusive) not taken part in yet.
  Status GatherUpTo(size_t end);
  // bandwidth-centric: all-gathers every rank's groups of this step; the next plan.
  Status AgreePlan();
  void PrefetchAhead();
  void Evict();
  uint64_t ParamBytes(uint32_t param) const;
  // The fetch of elements [begin, begin + length) of `param`, quantized where `quantized` and
  // the wire dtype is block-quantized.
  FetchOp Fetch(uint32_t param, uint64_t begin, uint64_t length, int64_t version, bool quantized);
  bool KeepQuantized() const;
  bool WireQuantized() const;
  // Gather for a block-quantized wire dtype: the ranks' slices as block records.
  Status GatherQuantized(size_t pos);
  // Waits for `e`'s fetch (the entry under `key`); on an error, forgets the entry if nothing
  // holds it (its bytes leave the live window).
  Result<std::shared_ptr<const ParamBuffer>> AwaitFetch(Entry& e, const Key& key);
  // The walk both all-gathers share: each parameter of plan position `pos` once, in plan order,
  // its slice fetch started (Start) and waited for (AwaitFetch; an error ends the walk). Calls
  // `visit(id, entry, held)` -> Status, where `held` is the whole parameter if entry.buffer is
  // set (fetched whole, now or before), else this rank's slice as fetched. The first error
  // from `visit` ends the walk and is returned.
  template <typename Visit>
  Status WalkSlices(size_t pos, Visit&& visit);

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
  std::unique_ptr<CheckedCollectives> checked_;  // over options_.gather (bandwidth-centric)
  std::vector<Group> groups_;                    // this step's Acquire calls, in order
  std::vector<Group> plan_;                      // groups every rank all-gathers this step
  std::vector<char> planned_;                    // per parameter: in plan_
  size_t plan_done_ = 0;                         // plan positions taken part in
  bool plan_agreed_ = false;                     // an EndStep agreed on a plan
  std::vector<Group> last_common_;               // what the ranks did alike in the last step
  uint64_t live_bytes_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace zps::worker
