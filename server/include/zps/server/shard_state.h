// zps/server/shard_state.h — one shard's chunks and the synchronous step protocol, apart from
// any wire. The UCX and RPC adapters call into it; tests drive it directly.
//
// Per chunk it keeps the fp32 master, Adam m and v, the serving copy, a version, and the
// gradient slots of the step in progress:
//   - server-sum: one slot per contributor (rank * k + micro, k = accumulation_steps; with
//     k = 1 one per rank). ReduceStep sums them IN CONTRIBUTOR ORDER (acc = g0; acc += g1; ...),
//     never arrival order, so results are reproducible.
//   - pre-reduced: one slot per micro-batch (one with k = 1); ranks push disjoint slices of it;
//     the slots are summed in micro order.
// Slots hold the job's grad_dtype: a 16-bit push lands as it is, with no conversion on the
// thread that completes the transfer (the UCX progress thread). With one slot the reduced
// gradient is that 16-bit slot itself: the norm and the fused update read it directly. With
// several, the reduction widens and sums them into the fp32 accumulator (slot 0 of `grads`),
// exactly as fp32 slots holding the widened values would sum (widening is exact). Initial
// values are fp32 and always land in that fp32 slot 0.
// Parameter groups and frozen parameters (ShardJob): the update runs the fused optimizer once per
// maximal run of a chunk whose elements share a group (padding takes the group of the parameter
// before it), with that group's (scheduled) lr and weight decay; a run of a frozen parameter is
// not updated at all (master, m, v and serving copy unchanged). Frozen parameters are pushed
// neither gradients (a push into one is InvalidArgument) nor counted in the coverage a step
// waits for, and their gradient elements are zero in the reduced gradient, so they add nothing
// to the norm. Their m and v are still allocated (per chunk, like everything else): a frozen
// parameter costs the same memory as a trained one, and its serving copy is served as usual.
// The lr of each update comes from the ShardJob's LrSchedule at CommitOrder::optimizer_step - 1.
// Serving copies are fp16/bf16 (one 16-bit word an element) or fp32 (two words an element; the
// `serving` spans below count words).
// A push names (step, chunk, element range, rank, dtype). Coverage is tracked per slot over
// element ranges: a range must lie inside one parameter's run in the chunk (padding is never
// pushed), and overlapping an already pushed range is a duplicate (AlreadyExists). A chunk is
// ready when every slot covers every parameter element of the chunk.
//
// Versions: a chunk is at version -1 until initialised (rank pushes with step == kInitStep land
// in gradient slot 0 and become the fp32 master when the chunk is complete), then 0. Step s
// pushes are accepted while the chunk is at version s; ApplyCommit(s) updates (or skips) and
// publishes s + 1, answering fetches waiting for it.
//
// Storage: by default master, m and v are per-chunk RAM buffers. Created with a spill
// configuration (a memory budget > 0), they live in a ChunkStore instead: RAM up to the budget,
// the rest in O_DIRECT spill files; ApplyCommit then runs the optimizer through
// ChunkStore::ForEachChunk (read-ahead / write-behind), checkpoints visit and restore the state
// through the store, and initial-value pushes land in gradient slot 0 and are written to the
// store when the chunk is complete. Gradient slots stay in RAM either way.
//
// Serving copies: in RAM (one block from the ServingAllocator) unless the spill configuration
// asks for serving records (ChunkStoreOptions::serving_records): then they live in the store
// too, under its serving_memory_budget. Resident ones are in the store's RAM, which the
// ServingAllocator provides (so RMA get works as before), and are served in place, exactly as
// without a store. Spilled ones are written behind by the update pass, and a fetch of one is
// queued to the "zps-serving-rd" thread, which reads the copy from NVMe into one of a few
// staging buffers (a small cache: several workers fetch the same chunk at the same version)
// and answers with the range in that buffer and its owner (FetchCallback), so the reply goes by
// AM from unregistered memory in both fetch modes and holds the buffer until it is sent; the
// reader takes another when every buffer is held (docs/nvme.md "Serving copies").
// Made on fetch (ServingCopies::kOnFetch): no serving copy is kept at all, in RAM or in the
// store. The update pass writes none, and a fetch is queued to the same reader, which converts
// the chunk's master into a staging buffer (the same cache: the other ranks' fetches of that
// chunk and version take it from there) and answers as for a spilled copy. With a store, the
// master is read through ChunkStore::VisitMaster: in place when resident, else the master alone
// from NVMe. A pass that writes or replaces masters (a commit's update or publish of speculated
// spares, a restore) waits for a conversion in progress, and conversions wait for it; a
// speculative update writes only its spare, never the live master a conversion reads
// (docs/state-bytes.md says what it costs).
//
// Serving banks (speculative updates with the state in RAM): the serving block holds two copies
// of every chunk's serving copy, bank 0 and bank 1, serving_bank_bytes() apart; version v is
// served from bank v % 2. The update of step s (speculative, redone, or at the commit) writes
// version s + 1 into the other bank while version s is still being fetched from its own, so the
// commit copies nothing: the publish flips. A skipped step copies each chunk's bank forward
// (its version advances, its bytes do not). The bank that step s writes holds version s - 1,
// which no one reads any more: a chunk is updated only once every worker pushed its step-s
// gradient, which a worker does after reading version s. With one bank the copy was rewritten
// one step earlier (at the commit of s - 1), under the same argument (docs/protocol.md,
// "One-sided fetch of a published version").
//
// Rollback fence: every ResetTo starts a new generation (epoch()). A push names the generation
// its session was admitted at (PushRequest::epoch) and is refused before anything is reserved if
// that is not the current one. A push already granted (a ticket) writes into the slot buffer the
// ticket holds; ResetTo gives every slot that a ticket still holds a fresh buffer, and zeroes the
// others, so a transfer still landing after a rollback never reaches the live gradient slots (and
// FinishPush refuses it).
//
// Lock order: mu_, then the store's internal mutex (never the reverse: no store callback takes
// mu_); callbacks run after release. The parts' locks (server/src/shard/, listed at mu_) state
// their place in it; clang checks the order where it is declared (mu_ ACQUIRED_BEFORE the
// store's, the SnapshotManager's and BufferPool's ACQUIRED_AFTER mu_; -Wthread-safety-beta).
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "zps/common/aligned_buffer.h"
#include "zps/common/dtype.h"
#include "zps/common/job_spec.h"
#include "zps/common/layout.h"
#include "zps/common/staging_pool.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/thread_pool.h"
#include "zps/server/chunk_store.h"
#include "zps/server/lr_schedule.h"
#include "zps/server/optimizer.h"
#include "zps/server/step_commit.h"

namespace zps::server {

/// The step value of initial-value pushes.
inline constexpr int64_t kInitStep = -1;

struct PushRequest {
  int64_t step = 0;
  uint32_t chunk = 0;
  uint64_t offset = 0;  // elements from the chunk start
  uint64_t length = 0;  // elements
  /// The contributor index: rank * accumulation_steps + micro (micro in [0, k)); with k = 1 (the
  /// default) simply the rank. Initial values (kInitStep) use micro 0.
  uint32_t rank = 0;
  DType dtype = DType::kF32;
  /// The ShardState::epoch() the pusher's session was admitted at: a push from an older
  /// generation (begun before a rollback) is refused. Not set: any generation (in-process callers
  /// that order their own rollbacks).
  std::optional<uint64_t> epoch;
  /// The rank of the pusher's session, when known (the data plane): rank / accumulation_steps
  /// must equal it. Not set: not checked (in-process callers).
  std::optional<uint32_t> session_rank;
};

/// A reserved push range. Move-only; pass it back to FinishPush exactly once.
class PushTicket {
 public:
  PushTicket() = default;
  PushTicket(PushTicket&&) = default;
  PushTicket& operator=(PushTicket&&) = default;
  /// Where the pushed bytes must be written (PushBytes(dtype, length): length x the dtype's size,
  /// or a block-quantized piece's encoding).
  std::span<std::byte> destination() const { return {dest_, bytes_}; }

 private:
  friend class ShardState;
  PushRequest req_;
  uint32_t slot_ = 0;
  std::byte* dest_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<std::byte[]> staging_;  // a push received to be dropped lands here
  // The slot buffer the push writes into (fp32: initial values, fp32 jobs; 16-bit: a 16-bit
  // job's step pushes; one of the two is set), kept alive while the transfer may still write:
  // after a rollback the chunk has a fresh one and this one goes with the last ticket holding it.
  std::shared_ptr<AlignedBuffer<float>> slot_buffer_;
  std::shared_ptr<AlignedBuffer<uint16_t>> slot16_buffer_;
  std::shared_ptr<std::vector<std::byte>> slot_quantized_;  // a block-quantized range's encoding
  uint64_t epoch_ = 0;    // ShardState's rollback count at BeginPush
  bool discard_ = false;  // pushed again (ShardState::BeginPush): received, then dropped
};

struct CommitOrder {
  int64_t step = 0;
  bool skip = false;
  float grad_scale = 1.0f;
  int64_t optimizer_step = 1;  // 1-based count of applied (not skipped) updates
};

struct FetchRequest {
  uint32_t chunk = 0;
  uint64_t offset = 0;  // elements
  uint64_t length = 0;  // elements
  int64_t min_version = 0;
};

/// Called once per fetch, maybe later from another thread. With a null `owner`, `data` points
/// into the resident serving copy and stays valid until the next update of that chunk, which
/// the step protocol orders after every fetch of the current version. With an `owner` (a
/// spilled serving copy read back from NVMe, or one made on fetch), `data` points into a staging
/// buffer that stays valid while any copy of `owner` is held: keep one until done with `data`
/// (e.g. as the keep_alive of the send). Holding it long keeps that buffer allocated; later
/// fetches use others, or a new one.
using FetchCallback =
    std::function<void(const Status&, int64_t version, std::span<const std::byte> data,
                       std::shared_ptr<const void> owner)>;

/// Supplies the memory for ALL serving copies of a shard, in one call at Create: `bytes` bytes,
/// 64-byte aligned, which the caller owns and keeps alive (and unchanged by anyone else) for
/// the ShardState's whole lifetime. The shard server passes memory from ucx::Context::Allocate,
/// so that workers can read serving copies with RMA get (docs/data-plane.md); ShardState itself
/// knows nothing of UCX. Errors are returned from Create as they are.
using ServingAllocator = std::function<Result<std::span<std::byte>>(size_t bytes)>;

/// The spill tier's figures (ShardState::storage_stats).
struct ShardStorageStats {
  bool spilled = false;           // false: master, m and v are in RAM buffers (no store)
  ChunkStoreStats store;          // valid when `spilled`
  uint64_t io_errors = 0;         // store operations that failed with IoError, ResourceExhausted or
                                  // DataLoss
  bool serving_in_store = false;  // serving copies are store records (a serving budget)
  bool serving_on_fetch = false;  // serving copies are made on fetch (ServingCopies::kOnFetch)
  uint64_t serving_staging_bytes = 0;   // staging buffers for fetches of spilled serving copies
                                        // or of copies made on fetch
  uint64_t spilled_fetches = 0;         // fetches answered from a spilled serving copy
  uint64_t spilled_fetch_reads = 0;     // NVMe reads for them (the rest were cache hits)
  uint64_t made_fetches = 0;            // fetches answered with a copy made on fetch
  uint64_t made_fetch_conversions = 0;  // conversions of a master for them (the rest: the cache)
};

/// Speculative updates (UpdateMode::kSpeculative), counted per chunk and commit since Create.
struct SpeculationStats {
  uint64_t published = 0;    // speculated, and the commit's order was the assumed one: published
  uint64_t redone = 0;       // speculated, but the step clipped (another scale): redone at commit
                             // from the untouched pre-update state
  uint64_t dropped = 0;      // speculated, but the step was skipped (overflow): the spare dropped
  uint64_t sync = 0;         // not speculated (no spare buffer free, not armed, or completed too
                             // late): updated at commit as in sync mode
  uint64_t beside = 0;       // of all the above: still being speculated when the commit came
                             // (RAM state: the commit's pass over the others ran beside it)
  uint32_t in_flight = 0;    // chunks speculated now, waiting for the commit
  uint32_t busy = 0;         // chunks the speculation thread is reducing or updating now
  uint32_t spares = 0;       // spare buffer sets (chunks that can be speculated in one step)
  uint64_t spare_bytes = 0;  // their memory (master, m, v and a stored serving copy per set)
};

/// Bytes of each kind of state a shard keeps, wherever it lives (RAM or the spill files): what
/// the state costs per parameter, not where it is (ShardStorageStats and zps_memory_bytes say
/// that). The zps_shard_state_bytes{kind} gauge and zps-train's "state bytes per parameter" line
/// come from here (docs/state-bytes.md).
struct ShardStateBytes {
  uint64_t master = 0;   // fp32 masters
  uint64_t m = 0;        // first moments (SGD: the momentum buffer), without their scales
  uint64_t v = 0;        // second moments, without their scales
  uint64_t scales = 0;   // the per-block scales of compact (int8) moments
  uint64_t serving = 0;  // serving copies (both banks with speculation and RAM state)
  uint64_t grad = 0;     // gradient slots of the step in progress
  /// What a parameter costs between steps: master, moments, scales and serving copies.
  uint64_t state() const { return master + m + v + scales + serving; }
};

/// Staging buffers for fetches of spilled serving copies (taken from the serving budget), or of
/// copies made on fetch.
inline constexpr uint32_t kServingStagingBuffers = 4;

/// Where a shard's serving copies come from (ShardServerOptions::serving_copies).
enum class ServingCopies : uint8_t {
  kStored,   // written by each update pass and kept (in RAM, or spilled under a serving budget)
  kOnFetch,  // not kept: each fetch converts the master (2 bytes a parameter fewer)
};

/// The ServingCopies a `--serving-copies` value names: "stored" or "on-fetch". Errors:
/// InvalidArgument naming the value. Thread-safe.
Result<ServingCopies> ParseServingCopies(std::string_view name);

// ShardState's parts (server/src/shard/).
class ChunkLayout;
struct ChunkBuffers;
class ShardSnapshot;  // a background checkpoint's snapshot (snapshot_manager.h)
class SnapshotManager;
class BufferPool;

class ShardState {
 public:
  /// `spill`: when set, master, m and v live in a ChunkStore made with these options (its
  /// `moments` are set here; its spill_dir must exist). With `serving_records` the serving copies
  /// live in the store as well, under `serving_memory_budget`, of which kServingStagingBuffers
  /// chunk-sized buffers are kept for fetches when any copy spills (see the header comment);
  /// `serving_ram_alloc` is replaced by `serving_alloc`. Not set (default):
  /// RAM buffers, the code path of a shard without a memory budget. A shard without chunks has no
  /// store. Errors: InvalidArgument for a bad job or ordinal; ResourceExhausted if memory runs
  /// out (or the budget cannot hold the store's buffers, or the disk the spill files); from
  /// ChunkStore::Create. `serving_alloc` (may be empty: then the serving copies live in
  /// ordinary aligned heap memory) provides the memory of every serving copy (see
  /// ServingAllocator); whatever it returns is returned. `serving` kOnFetch keeps no serving
  /// copies (see the header comment; a store then has no serving records, whatever `spill`
  /// says), with sync or speculative updates.
  static Result<std::unique_ptr<ShardState>> Create(
      const Layout& layout, uint32_t ordinal, const ShardJob& job, const OptimizerConfig& optimizer,
      ThreadPool* pool, const std::optional<ChunkStoreOptions>& spill = std::nullopt,
      const ServingAllocator& serving_alloc = {}, ServingCopies serving = ServingCopies::kStored);
  ~ShardState();

  const Layout& layout() const { return layout_; }
  const ShardJob& job() const { return job_; }
  uint32_t ordinal() const { return ordinal_; }
  const std::vector<uint32_t>& chunk_ids() const { return chunk_ids_; }
  /// The lowest version over local chunks (-1 while any is uninitialised).
  int64_t version() const;

  /// The rollback generation: 0 at Create, incremented by every ResetTo.
  uint64_t epoch() const;
  /// Validates and reserves a push range. Errors: Unavailable (req.epoch is an older
  /// generation), OutOfRange (chunk not here, range outside a parameter), InvalidArgument (dtype,
  /// rank, empty range), FailedPrecondition (stale or future step, initial values for a chunk
  /// updated already), AlreadyExists (overlaps a pushed range). Nothing changes on error.
  /// Pushed again, and dropped once received (the same bits are in place): a range of a sealed
  /// step (a restarted rank), and initial values for a chunk at version 0 (rank 0 joined again
  /// at step 0; its new session's hello dropped its initial pushes of chunks not complete yet,
  /// ForgetRank).
  Result<PushTicket> BeginPush(const PushRequest& req);
  /// Completes (transfer OK) or abandons (transfer failed: the range is released) a push.
  /// Errors: Unavailable (a rollback happened since BeginPush: the pushed data is dropped).
  Status FinishPush(PushTicket ticket, const Status& transfer);

  /// A rank's new session replaces its old one (the worker process restarted, or re-joined
  /// after an error): drops everything `rank` pushed for the step in progress, so that it pushes
  /// the step again (server-sum; in pre-reduced mode ranges have no per-rank owner and every
  /// rank restarts the step, so everything pushed of the step's incomplete chunks is dropped),
  /// and, on chunks still waiting for their initial values, what rank 0 pushed of them. A push
  /// the old session began is refused by FinishPush (its slot buffer was replaced). A chunk
  /// whose gradients are already complete (Sealed) is left as it is: they are being reduced,
  /// and a push into it that overlaps what was pushed before is received and dropped (OK: a
  /// restarted rank computes the same bits, and so do ranks redoing a reduce-scatter). Errors:
  /// ResourceExhausted (no memory for a fresh slot buffer). Returns the pushed elements dropped.
  Result<uint64_t> ForgetRank(uint32_t rank);
  /// The ranks whose gradients of `step` are incomplete on some local chunk (server-sum; empty
  /// in pre-reduced mode, where slices have no per-rank owner). For the step-timeout message.
  std::vector<uint32_t> MissingRanks(int64_t step) const;

  /// Blocks until every local chunk has all contributions of `step`; on OK the step is sealed
  /// (see ForgetRank) until it is published. Errors: DeadlineExceeded, Cancelled after Shutdown.
  Status WaitForGradients(int64_t step, std::chrono::milliseconds timeout);
  /// Reduces every local chunk of `step` and returns one report per local chunk, in chunk order.
  /// Called again for the same step before it is published, returns the same reports (the
  /// slots are reduced once). Errors: FailedPrecondition if the step is not complete.
  Result<std::vector<std::pair<uint32_t, ChunkReport>>> ReduceStep(int64_t step);
  /// Runs the fused update on every local chunk (unless skipped) and publishes step + 1.
  /// Speculative mode: a chunk speculated with exactly `order` (step, grad_scale bits,
  /// optimizer_step, not skipped) publishes its spare; any other speculated chunk is updated from
  /// its live (pre-update) state as in sync mode, or left as it is when skipped. `next`: the
  /// order to assume for step + 1 (ArmSpeculation), armed under the same lock as the publish so
  /// that no chunk of step + 1 completes before it.
  Status ApplyCommit(const CommitOrder& order, std::optional<CommitOrder> next = std::nullopt);

  /// Speculative mode: chunks of `assumed.step` that complete from now on are updated at once
  /// into spare buffers with `assumed` (the step's order if it neither clips nor skips). Any
  /// other mode: ignored. Thread-safe; normally called by the driver after a restore, and by
  /// ApplyCommit for the next step.
  void ArmSpeculation(const CommitOrder& assumed);
  SpeculationStats speculation_stats() const;
  /// Bytes from a chunk's serving copy in bank 0 to the same copy in bank 1 of the serving block
  /// (see "Serving banks"); 0 when there is one bank. Constant after Create; thread-safe.
  uint64_t serving_bank_bytes() const { return serving_bank_bytes_; }
  /// Test hook, called by the speculation thread after it speculated the first chunk of a step
  /// ("speculate", step): the shard's named kill point inside speculation; and before each
  /// chunk's speculative update, once its report is out ("speculating", step: unit tests hold
  /// the update there). Set before the first push.
  void SetTestHook(std::function<void(std::string_view point, int64_t step)> hook) {
    test_hook_ = std::move(hook);
  }

  // ---- snapshots for checkpoints written in the background (snapshot_manager.h) ----
  using Snapshot = ShardSnapshot;
  /// Takes a consistent snapshot of every chunk's master, m and v at the current version,
  /// copy-on-write per chunk: nothing is copied now; the first later change of a chunk (an
  /// update, a publish, a rollback) first hands that chunk's state to the snapshot, unless the
  /// snapshot's reader already copied it (Visit copies every chunk first, then writes). The
  /// snapshot's Visit may then run on another thread while steps go on. One snapshot at a time. RAM
  /// state only (no store). Errors: FailedPrecondition (a store, a snapshot still open, chunks at
  /// different versions or uninitialised), ResourceExhausted.
  Result<std::shared_ptr<Snapshot>> BeginSnapshot();
  /// Allocates and faults in one set of master, m and v buffers per chunk for the snapshots of
  /// background checkpoints, on a thread of its own at the lowest CPU priority
  /// ("zps-reserve"), and returns at once: the memory a first checkpoint would otherwise
  /// page-fault in beside the steps (its copies, or out-of-place updates). They join the
  /// buffer pool (the extra memory of background checkpoints is this one copy of the state).
  /// RAM state only: does nothing with a store, or when called again.
  void ReserveSnapshotBuffers();

  /// Answers now if the chunk is at >= min_version, else when it gets there. A chunk whose
  /// serving copy is spilled, or made on fetch, is answered from the serving reader thread once
  /// its copy is read back or made (with an owner, see FetchCallback). Errors (to the
  /// callback): OutOfRange, InvalidArgument, FailedPrecondition (version too far ahead),
  /// Cancelled on Shutdown; for a spilled copy also IoError / DataLoss (the read failed); for
  /// both the error of a failed update pass, or Unavailable (rolled back while queued).
  void Fetch(const FetchRequest& req, FetchCallback cb);

  /// Fails every waiting fetch and gradient wait with `reason`. Idempotent.
  void Shutdown(const Status& reason);

  /// CRC32C over every chunk's master, m, v, serving copy and version: "stored state".
  /// With a store, these three wait for an update pass in progress (the store's mutex), without
  /// holding mu_: fetches and pushes go on meanwhile.
  uint32_t StateCrc() const EXCLUDES(mu_);
  /// CRC32C over the step in progress: every gradient slot's bytes, reserved ranges and landed
  /// counts. A rejected push must leave it unchanged (tests; StateCrc does not cover the slots,
  /// which no push can reach until the step commits).
  uint32_t GradientCrc() const EXCLUDES(mu_);
  /// CRC32C over a local chunk's master, m, v and serving copy, in that order (as
  /// train::ReferenceTrainer::ChunkCrc). Errors: OutOfRange.
  Result<uint32_t> ChunkCrc(uint32_t chunk) const EXCLUDES(mu_);
  /// Copies the fp32 master of a local chunk (tests, checkpoints). Errors: OutOfRange; from the
  /// store.
  Result<std::vector<float>> MasterOf(uint32_t chunk) const EXCLUDES(mu_);
  /// The state dtype m and v are packed in (the job's optimizer.state_dtype). Thread-safe.
  StateDType state_dtype() const;
  /// The spill tier's figures. Waits for a store pass in progress: call it from the driver
  /// thread between steps (as the shard's metrics do).
  ShardStorageStats storage_stats() const;
  /// Bytes of each kind of state (ShardStateBytes). Fixed at Create; thread-safe.
  ShardStateBytes state_bytes() const;

  // ---- durability (shard_state_restore.cc) ----
  // Called by the one thread that also calls ReduceStep/ApplyCommit (the step driver), between
  // steps: the update is the only writer of master, m and v once they are initialised.
  using ChunkVisitor =
      std::function<Status(uint32_t chunk, int64_t version, std::span<const float> master,
                           std::span<const std::byte> m, std::span<const std::byte> v)>;
  /// Visits every local chunk's master, and m and v packed in the state dtype (an empty span for
  /// a state the optimizer does not keep), ascending. Errors: FailedPrecondition (chunks at
  /// different versions, or uninitialised), whatever `fn` returns (the visit stops).
  Status VisitChunkState(const ChunkVisitor& fn) const;
  using ChunkLoader = std::function<Status(uint32_t chunk, std::span<float> master,
                                           std::span<std::byte> m, std::span<std::byte> v)>;
  /// Rolls every local chunk back to `version`: fails waiting fetches with `reason`, forgets the
  /// gradients of the step in progress (zeroed slots; a push begun before writes into a buffer
  /// of its own and is refused by FinishPush: see "Rollback fence" above), then
  /// either (version >= 1) `load` fills each chunk's master, m and v, and the serving copies are
  /// recomputed from the masters, or (version -1) everything is zeroed: the chunks wait for
  /// their initial values again. Errors: InvalidArgument (version 0 or < -1), ResourceExhausted
  /// (no memory for a fresh slot buffer), from `load` (the state is then unspecified: call
  /// again).
  Status ResetTo(int64_t version, const ChunkLoader& load, const Status& reason);
  /// Fails every waiting fetch with `reason` (not a shutdown: later fetches are served).
  void FailWaiters(const Status& reason);

 private:
  // The parts (server/src/shard/), each with one job and its own lock or none:
  //   chunk_layout.h     what a chunk stores (kinds master/m/v/serving, dtypes, sizes)
  //   shard_chunk.h      the chunk table's entry (Chunk): versions, waiters, phase (mu_)
  //   gradient_slots.h   a chunk's gradient slots and coverage (mu_)
  //   update_policy.h    when the optimizer runs: sync or speculative (mu_)
  //   snapshot_manager.h background checkpoints' copy-on-write snapshots (its own lock, a
  //                      leaf; each snapshot's lock is never taken under mu_)
  //   buffer_pool.h      the snapshots' buffers, shared with out-of-place updates (a leaf lock)
  //   serving_tier.h     spilled serving copies or copies made on fetch, their reader (mu_)
  //   serving_staging.h  its staging buffers and read cache (a leaf lock)
  // Lock order: mu_, then the store's internal mutex (no store callback takes mu_) or a leaf
  // (the snapshot manager's); a snapshot's mu_ is never taken under mu_: the open snapshot is
  // read under mu_, the snapshot manager's write hooks are called after it is released.
  // Callbacks run after mu_ is released.
  struct Waiter {
    FetchRequest req;
    FetchCallback cb;
  };
  // A chunk's speculation (under mu_): queued when its gradient completes, busy while the
  // speculation thread (or ReduceStep) reduces and maybe updates it, then reduced (report valid)
  // or speculated (report and spare valid).
  // kQueuedLate: reduced by ReduceStep (the step completed before the speculation thread got to
  // it), queued to be speculated while the coordinator decides.
  // kBusy: being reduced (by the speculation thread or ReduceStep); kSpeculating: reduced, its
  // report set, the speculative update running (ReduceStep does not wait for it, nor does the
  // commit's pass over the other chunks with RAM state).
  enum class SpecPhase : uint8_t {
    kIdle,
    kQueued,
    kBusy,
    kReduced,
    kSpeculated,
    kQueuedLate,
    kSpeculating
  };
  struct Chunk;  // shard_chunk.h
  // When the optimizer runs (update_policy.h): sync or speculative.
  class UpdatePolicy;
  class SyncUpdate;
  class SpeculativeUpdate;
  class ServingTier;  // spilled serving copies and their reader (serving_tier.h)

  ShardState(const Layout& layout, uint32_t ordinal, const ShardJob& job,
             const OptimizerConfig& optimizer, ThreadPool* pool);
  Chunk* FindChunk(uint32_t id);
  const Chunk* FindChunk(uint32_t id) const;
  bool StepReady(int64_t step) const REQUIRES(mu_);
  // The chunk's gradients of the step in progress are complete and taken by the reduction (the
  // step is sealed, or the speculation thread queued or reduced the chunk, which sums the slots
  // in place): ForgetRank leaves its slots, and a rank's re-push is dropped.
  bool Sealed(const Chunk& c) const REQUIRES(mu_);
  // A ticket that receives the push into a staging buffer and is dropped by FinishPush.
  PushTicket DiscardedPush(const PushRequest& req, uint32_t slot) const REQUIRES(mu_);
  void Publish(Chunk& c, int64_t version, std::vector<std::pair<Waiter, Status>>& ready);
  // Answers ready waiters (after mu_ is released): in place, or queued to the serving reader.
  void Answer(std::vector<std::pair<Waiter, Status>>& ready, int64_t version);
  // The bytes of c's resident serving copy that a fetch of `req` carries (ServingRange: the
  // covering blocks of a quantized copy).
  std::span<const std::byte> ServingBytesOf(const Chunk& c, const FetchRequest& req) const;
  // The bytes of a serving copy of c held as words, without a quantized copy's pad byte (what
  // the CRCs cover, as the reference trainer's do).
  std::span<const std::byte> CopyBytes(const Chunk& c, std::span<const uint16_t> serving) const;
  // Whether fetches of c are answered by the serving tier (serving_tier.h): its copy is a
  // spilled store record, or made on fetch.
  bool ServedByTier(const Chunk& c) const;
  // Whether the serving tier answers any fetch (a serving budget, or copies made on fetch): an
  // update or a restore then tells it when masters and copies are rewritten.
  bool TierServes() const { return serving_in_store_ || serving_on_fetch_; }
  Status BuildRuns();  // at Create: the parameters' slots coverage and runs of every chunk
  // Store-backed helpers (shard_state_restore.cc).
  Status CountIo(Status s) const;   // counts a store I/O failure, returns s
  Status StoreInitChunk(Chunk& c);  // writes the initial values as master (m = v = 0) to the store
  Status StoreChunkCopy(const Chunk& c, std::vector<float>& master, std::vector<std::byte>& m,
                        std::vector<std::byte>& v) const;
  // The serving copy (kinds_->serving_words(n) words) of `master` (serving_tier.cc).
  void ToServing(std::span<const float> master, std::span<uint16_t> serving) const;
  // What every update policy runs on a chunk (update_policy.cc).
  // Reduces the chunk's slots (GradientSlots::Reduce), zeroes its frozen runs, computes the
  // report (with `opt`; null: optimizer_).
  Result<ChunkReport> ReduceChunk(Chunk& c, const Optimizer* opt = nullptr) const;
  // The fused update of one chunk, run by run (groups, frozen), writing `serving` (words).
  // `source` (out of place): the old state is read from there, `st` is written.
  // `opt`: the optimizer to run it with (null: optimizer_, on the pool).
  Status UpdateChunk(const Chunk& c, const ChunkState& st, std::span<uint16_t> serving,
                     const CommitOrder& order, const ConstChunkState* source = nullptr,
                     const Optimizer* opt = nullptr) const;
  // The sync update of chunk i while `snap` may still need its state
  // (SnapshotManager::UpdateOutOfPlace).
  Status UpdateForSnapshot(size_t i, Snapshot& snap, const CommitOrder& order,
                           std::span<uint16_t> serving);
  // Where version `version` of c's serving copy is written and served from: its bank (version
  // < 0: bank 0), or the one copy.
  static std::span<uint16_t> ServingFor(const Chunk& c, int64_t version);
  // With banks: copies c's current serving copy into the other bank (after it was written
  // outside a step, or for a skipped step, whose version advances over unchanged bytes).
  static void MirrorServing(const Chunk& c);
  size_t IndexOf(const Chunk& c) const;

  const Layout layout_;
  const uint32_t ordinal_;
  const ShardJob job_;
  ThreadPool* pool_;
  const std::unique_ptr<const ChunkLayout> kinds_;  // what a chunk stores
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<ParamGroup> groups_;  // the job's, or one from the OptimizerConfig
  LrSchedule schedule_;
  uint32_t accum_ = 1;  // accumulation_steps
  std::vector<uint32_t> chunk_ids_;
  std::vector<Chunk> chunks_;             // the chunk table, same order as chunk_ids_
  AlignedBuffer<std::byte> serving_own_;  // the serving copies when no allocator was given
  uint64_t serving_bank_bytes_ = 0;       // "Serving banks"; 0: one bank
  // Set at Create when spilling; store chunk i is chunks_[i]. Internally synchronised (lock
  // order above). When set, Chunk::state is empty.
  std::unique_ptr<ChunkStore> store_;
  std::vector<uint32_t> store_ids_;             // 0 .. chunks_.size() - 1 (a full pass)
  mutable std::atomic<uint64_t> io_errors_{0};  // failed store operations
  bool serving_in_store_ = false;               // set at Create: serving copies are store records
  bool serving_on_fetch_ = false;               // set at Create: ServingCopies::kOnFetch
  // Where pushes received to be dropped land before FinishPush: reused, not zeroed. Internally
  // synchronised, hence usable from const DiscardedPush. Keeps up to 64 MiB of released buffers
  // beyond those in flight.
  mutable StagingPool push_staging_{size_t{64} << 20};

  // The parts whose locks come after mu_ name it in their ACQUIRED_AFTER (lock order above).
  friend class SnapshotManager;
  friend class BufferPool;
  mutable Mutex mu_ ACQUIRED_BEFORE(ChunkStore::mu_);
  CondVar cv_;
  uint64_t epoch_ GUARDED_BY(mu_) = 0;               // ResetTo count (fences older push tickets)
  int64_t sealed_step_ GUARDED_BY(mu_) = INT64_MIN;  // complete, being reduced (ForgetRank)
  bool shutdown_ GUARDED_BY(mu_) = false;
  Status shutdown_reason_ GUARDED_BY(mu_);

  std::function<void(std::string_view, int64_t)> test_hook_;  // SetTestHook
  // Background checkpoints' snapshots and the buffer pool they share with out-of-place updates
  // and spares (snapshot_manager.h; its lock comes after mu_). Set at Create, once the chunk
  // table is.
  std::unique_ptr<SnapshotManager> snapshots_;
  // When the optimizer runs: sync, or speculative with its thread and spares (update_policy.h);
  // its fields are mu_'s. Declared after mu_ (destroyed first); the destructor stops it.
  std::unique_ptr<UpdatePolicy> policy_;
  // Spilled serving copies: the fetch queue and generation (mu_'s) and the "zps-serving-rd"
  // reader (serving_tier.h). After mu_; the destructor stops it.
  const std::unique_ptr<ServingTier> serving_;
};

}  // namespace zps::server
