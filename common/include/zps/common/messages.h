// zps/common/messages.h — the message catalogue of the control plane (RPC types) and the data
// plane (UCX active-message ids), with their encodings. docs/protocol.md describes each one.
//
// Every Decode validates lengths, counts and enum values and returns InvalidArgument on
// anything malformed; nothing is read past the input.
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"

namespace zps::msg {

// ---- control plane (rpc types; replies are type | 0x8000) ----
enum RpcType : uint16_t {
  kRegisterShard = 10,  ///< shard -> coordinator: RegisterShard; reply empty
  kAwaitJob = 11,       ///< shard -> coordinator: empty; reply: the job spec bytes (long-poll)
  kJoin = 12,           ///< worker -> coordinator: Join; reply JoinReply
  kReport = 13,         ///< shard -> coordinator: Report; reply CommitInfo (long-poll)
  kAwaitCommit = 14,    ///< worker -> coordinator: AwaitCommit; reply CommitInfo (long-poll)
  kStatus = 15,         ///< anyone -> any server: empty; reply: a JSON status document
  kChunkCrcs = 16,      ///< anyone -> shard: ChunkCrcsRequest; reply ChunkCrcs
  kReadMaster = 17,     ///< worker/tool -> shard: ReadMasterRequest; reply MasterRange
  // Durability (docs/protocol.md, "Checkpoints and recovery").
  kCheckpointReport = 20,  ///< shard -> coordinator: CheckpointReport; reply empty
  kShardSync = 21,         ///< shard -> coordinator: ShardSync; reply ShardSyncReply
  kCheckpointNow = 22,     ///< tool -> coordinator: empty; reply CheckpointDone (long-poll)
  // Rendezvous for the workers' collectives (docs/protocol.md, "Key-value rendezvous").
  kKvSet = 30,  ///< worker/tool -> coordinator: KvSet; reply KvReply (empty value)
  kKvGet = 31,  ///< worker/tool -> coordinator: KvGet; reply KvReply (long-poll until set)
};

/// Asks a shard for the CRC32C of every local chunk's state once it reached `min_version`
/// (Unavailable while it has not: retry).
struct ChunkCrcsRequest {
  int64_t min_version = 0;
  std::vector<std::byte> Encode() const;
  static Result<ChunkCrcsRequest> Decode(std::span<const std::byte> b);
};

/// Asks a shard for elements [offset, offset+length) of a local chunk's fp32 master once the
/// shard reached `min_version` (Unavailable while it has not: retry). length <= kMaxReadMaster.
struct ReadMasterRequest {
  int64_t min_version = 0;
  uint32_t chunk = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::byte> Encode() const;
  static Result<ReadMasterRequest> Decode(std::span<const std::byte> b);
};

/// Most elements one ReadMaster may ask for (8 MiB of fp32, under the frame bound).
inline constexpr uint64_t kMaxReadMaster = uint64_t{2} << 20;

struct MasterRange {
  int64_t version = 0;  // the shard's version the values are at
  std::vector<float> values;
  std::vector<std::byte> Encode() const;
  static Result<MasterRange> Decode(std::span<const std::byte> b);
};

struct ChunkCrcs {
  int64_t version = 0;
  std::vector<std::pair<uint32_t, uint32_t>> crcs;  // (chunk, crc), ascending chunk
  std::vector<std::byte> Encode() const;
  static Result<ChunkCrcs> Decode(std::span<const std::byte> b);
};

/// Roles in the hello.
enum Role : uint32_t { kRoleWorker = 1, kRoleShard = 2, kRoleTool = 3 };

struct RegisterShard {
  uint32_t ordinal = 0;
  std::string endpoint;  // host:port of the shard's control plane
  std::vector<std::byte> Encode() const;
  static Result<RegisterShard> Decode(std::span<const std::byte> b);
};

struct Join {
  uint32_t rank = 0;
  uint64_t job_hash = 0;
  std::vector<std::byte> job_spec;  // rank 0: the full spec; other ranks: empty
  std::vector<std::byte> Encode() const;
  static Result<Join> Decode(std::span<const std::byte> b);
};

/// What a worker needs to move data: the layout and the data-plane settings of the job.
struct JoinReply {
  uint64_t job_hash = 0;
  int64_t resume_step = 0;
  double loss_scale = 1.0;
  std::vector<std::string> shard_endpoints;  // index = shard ordinal
  std::vector<std::byte> layout;             // Layout::Serialize()
  uint8_t reduction_mode = 0;                // 0 server-sum, 1 pre-reduced
  uint32_t world_size = 1;
  DType grad_dtype = DType::kF32;
  DType serving_dtype = DType::kBF16;
  /// Micro-batches per step (the job's ShardJob::accumulation_steps). Trailing and optional on the
  /// wire: written only when != 1, and a reply without it decodes as 1.
  uint32_t accumulation_steps = 1;
  std::vector<std::byte> Encode() const;
  static Result<JoinReply> Decode(std::span<const std::byte> b);
};

struct ChunkStat {
  uint32_t chunk = 0;
  double sum_squares = 0.0;
  bool non_finite = false;
};

struct Report {
  int64_t step = 0;
  uint32_t ordinal = 0;
  std::vector<ChunkStat> chunks;
  std::vector<std::byte> Encode() const;
  static Result<Report> Decode(std::span<const std::byte> b);
};

struct CommitInfo {
  int64_t step = 0;
  bool skip = false;
  float grad_scale = 0.0f;
  double global_norm = 0.0;
  double loss_scale = 1.0;         // used by this step's gradients
  double next_loss_scale = 1.0;    // to use for the next step
  int64_t optimizer_step = 0;      // applied updates after this step
  int64_t good_steps = 0;          // loss scaler: consecutive good steps after this step
  bool checkpoint = false;         // shards checkpoint the state at version step + 1
  int64_t protect_checkpoint = 0;  // newest checkpoint complete on every shard (0: none): shards
                                   // keep it whatever their garbage collection would drop
  std::vector<std::byte> Encode() const;
  static Result<CommitInfo> Decode(std::span<const std::byte> b);
};

struct AwaitCommit {
  int64_t step = 0;
  std::vector<std::byte> Encode() const;
  static Result<AwaitCommit> Decode(std::span<const std::byte> b);
};

// ---- data plane (UCX active messages) ----
// kAmFetchRma asks, with a FetchHeader, to be answered with kAmFetchRmaReply (where the serving
// copy is: the worker then reads it with RMA get) instead of the data. A shard whose serving
// copy is not in a UCX region answers it with an ordinary kAmFetchReply carrying the data.
// kAmPushRma is a push without data: the shard reads the gradient with RMA get from the
// worker's UCX region (PushRmaHeader), then answers with kAmPushReply as for kAmPush.
enum AmId : uint16_t {
  kAmFetch = 1,
  kAmFetchReply = 2,
  kAmPush = 3,
  kAmPushReply = 4,
  kAmFetchRma = 5,
  kAmFetchRmaReply = 6,
  kAmPushRma = 7,
  kAmServingNotice = 8,  // shard -> worker, protocol 3: see ServingNoticeHeader
};

/// Upper bound on a packed rkey in a kAmFetchRmaReply (UCX 1.13 posix/cma rkeys are < 200 B).
inline constexpr size_t kMaxRkeyBytes = 4096;

inline constexpr size_t kMaxErrorMessage = 1024;

struct FetchHeader {
  uint64_t session = 0;  // the session token from the shard's hello
  uint64_t request = 0;
  uint32_t chunk = 0;
  uint64_t offset = 0;  // elements
  uint64_t length = 0;  // elements
  int64_t min_version = 0;
  std::vector<std::byte> Encode() const;
  static Result<FetchHeader> Decode(std::span<const std::byte> b);
};

/// Reply to a fetch; the data (length x serving dtype bytes) follows when code == 0.
struct FetchReplyHeader {
  uint64_t request = 0;
  uint32_t code = 0;  // zps::Code
  int64_t version = -1;
  std::string message;
  std::vector<std::byte> Encode() const;
  static Result<FetchReplyHeader> Decode(std::span<const std::byte> b);
};

/// Reply to a kAmFetchRma, with no data: when code == 0 the requested range (length x serving
/// dtype bytes) is at `remote_address` in the shard's region whose packed rkey is `rkey`, and
/// stays unchanged at `version` until the worker's next push for that chunk (step protocol).
/// `bank_delta` (protocol 4): nonzero when the shard serves from two banks, the byte offset from
/// this range to the same range in the other bank, where versions of the other parity are
/// (version + 1 at remote_address + bank_delta, version + 2 at remote_address again, ...).
struct FetchRmaReplyHeader {
  uint64_t request = 0;
  uint32_t code = 0;  // zps::Code
  int64_t version = -1;
  std::string message;
  uint64_t remote_address = 0;
  std::vector<std::byte> rkey;  // <= kMaxRkeyBytes; empty unless code == 0
  int64_t bank_delta = 0;
  std::vector<std::byte> Encode() const;
  static Result<FetchRmaReplyHeader> Decode(std::span<const std::byte> b);
};

/// A push; the data (length x dtype bytes) follows.
struct PushHeader {
  uint64_t session = 0;
  uint64_t request = 0;
  int64_t step = 0;  // -1 = initial values
  uint32_t chunk = 0;
  uint64_t offset = 0;  // elements
  uint64_t length = 0;  // elements
  uint32_t rank = 0;
  DType dtype = DType::kF32;
  std::vector<std::byte> Encode() const;
  static Result<PushHeader> Decode(std::span<const std::byte> b);
};

/// A push whose data the shard reads with RMA get: `push.length` x `push.dtype` bytes at
/// `remote_address` in the worker's region whose packed rkey is `rkey`. The bytes stay unchanged
/// until the worker gets the kAmPushReply (or the endpoint fails).
struct PushRmaHeader {
  PushHeader push;
  uint64_t remote_address = 0;
  std::vector<std::byte> rkey;  // 1..kMaxRkeyBytes
  std::vector<std::byte> Encode() const;
  static Result<PushRmaHeader> Decode(std::span<const std::byte> b);
};

/// Shard -> worker (protocol 3), no data, no reply. `version` >= 0: this shard has published
/// `version` (its update pass is over and every local chunk is at `version` or later), and the
/// serving copies are where the worker's earlier kAmFetchRmaReply said: the worker may RMA-get a
/// range of a chunk it learned that way at this version without asking (a one-sided fetch),
/// until it pushes a gradient for that chunk at a step >= `version`. `version` == kNoticeForget
/// (-1): forget every address learned from this shard (the session was fenced: a rollback or a
/// lost coordinator; the serving region is about to be rewritten). `session` is the session
/// token the shard issued to this worker: a notice with another token is refused.
struct ServingNoticeHeader {
  static constexpr int64_t kNoticeForget = -1;
  uint64_t session = 0;
  int64_t version = kNoticeForget;
  std::vector<std::byte> Encode() const;
  static Result<ServingNoticeHeader> Decode(std::span<const std::byte> b);
};

struct PushReplyHeader {
  uint64_t request = 0;
  uint32_t code = 0;
  std::string message;
  std::vector<std::byte> Encode() const;
  static Result<PushReplyHeader> Decode(std::span<const std::byte> b);
};

/// Turns a reply's (code, message) into a Status; unknown codes become Internal.
Status StatusFromWire(uint32_t code, std::string message);

// ---- durability: checkpoints and recovery (control plane) ----

/// Most checkpoint steps one report may list.
inline constexpr size_t kMaxCheckpointSteps = 4096;

/// A shard's complete, verified local checkpoints (all of them, ascending), sent at registration
/// and after each checkpoint attempt; `result_*` describe that attempt (has_result false at
/// registration).
struct CheckpointReport {
  uint32_t ordinal = 0;
  std::vector<int64_t> steps;
  bool has_result = false;
  int64_t result_step = 0;
  uint32_t result_code = 0;  // Code of the attempt (0 = committed)
  std::string result_message;
  std::vector<std::byte> Encode() const;
  static Result<CheckpointReport> Decode(std::span<const std::byte> b);
};

/// The loss-scaler and optimizer counters at a step boundary (kept in every checkpoint).
struct ResumeState {
  int64_t step = 0;         // the version the state is at
  double loss_scale = 1.0;  // the scale for step `step`
  int64_t good_steps = 0;
  int64_t optimizer_step = 0;  // applied updates before step `step`
};

/// A shard asks where the job stands; with `ready`, it says it restored `state` for `epoch`.
struct ShardSync {
  uint32_t ordinal = 0;
  uint64_t epoch = 0;
  bool ready = false;
  ResumeState state;
  std::vector<std::byte> Encode() const;
  static Result<ShardSync> Decode(std::span<const std::byte> b);
};

enum class JobPhase : uint8_t { kNoJob = 0, kRecovering = 1, kRunning = 2 };

struct ShardSyncReply {
  uint64_t epoch = 0;
  JobPhase phase = JobPhase::kNoJob;
  int64_t target_step = -1;  // while recovering: the step to restore (-1: not known yet)
  std::vector<std::byte> Encode() const;
  static Result<ShardSyncReply> Decode(std::span<const std::byte> b);
};

/// The answer to kCheckpointNow: a global checkpoint complete on every shard.
struct CheckpointDone {
  int64_t step = 0;
  uint32_t shards = 0;
  std::vector<std::byte> Encode() const;
  static Result<CheckpointDone> Decode(std::span<const std::byte> b);
};

// ---- key-value rendezvous (control plane) ----

/// Bounds of the coordinator's key-value store (validated by the decoders and the store).
inline constexpr size_t kMaxKvKeyBytes = 512;
inline constexpr size_t kMaxKvValueBytes = 4u << 20;      // 4 MiB per value
inline constexpr uint32_t kMaxKvWaitMs = 10 * 60 * 1000;  // 10 min per KvGet

/// Sets `key` to `value` in the store of `generation` (0 = the current one). Keys live in one
/// generation of the job: the coordinator's epoch + 1, so a rollback or a recovery starts an
/// empty store and a communicator built before it cannot meet one built after.
struct KvSet {
  uint64_t generation = 0;
  std::string key;               // 1..kMaxKvKeyBytes
  std::vector<std::byte> value;  // 0..kMaxKvValueBytes
  std::vector<std::byte> Encode() const;
  static Result<KvSet> Decode(std::span<const std::byte> b);
};

/// Waits up to `wait_ms` (<= kMaxKvWaitMs; 0 = do not wait) for `key` in `generation` (0 = the
/// current one) and returns its value.
struct KvGet {
  uint64_t generation = 0;
  std::string key;
  uint32_t wait_ms = 0;
  std::vector<std::byte> Encode() const;
  static Result<KvGet> Decode(std::span<const std::byte> b);
};

/// The answer to KvSet (value empty) and KvGet: the generation that served it.
struct KvReply {
  uint64_t generation = 0;
  std::vector<std::byte> value;
  std::vector<std::byte> Encode() const;
  static Result<KvReply> Decode(std::span<const std::byte> b);
};

}  // namespace zps::msg
