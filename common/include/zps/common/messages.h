// zps/common/messages.h — the message catalogue of the control plane (RPC types) and the data
// plane (UCX active-message ids), with their encodings. docs/protocol.md describes each one.
//
// Each message is declared once, as a field table (wire_codec.h): one row per member with its
// default, its meaning and its codec, which fixes the encoding and every bound the decoder checks.
// Encode and Decode come from the table, and so do the field tables in docs/protocol.md
// (tests/unit/common/protocol_doc_test.cc keeps them in step). Every Decode validates lengths,
// counts, bounds and enum values and returns InvalidArgument on anything malformed, trailing
// bytes included; nothing is read past the input. Changing a row changes the wire:
// tests/unit/common/messages_wire_test.cc pins the bytes of each message.
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"
#include "zps/common/wire_codec.h"

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
  // Online resharding, on a shard's reshard endpoint (docs/protocol.md, "Online resharding").
  kReshardInfo = 40,    ///< shard -> reshard peer: empty; reply ReshardInfo
  kReshardFetch = 41,   ///< shard -> reshard peer: ReshardFetch; reply ReshardValues
  kReshardReport = 42,  ///< shard/donor -> new shard 0: ReshardReport; reply ReshardStatus
};

// Bounds the decoders check (beside the ones next to their messages below).
inline constexpr size_t kMaxEndpoint = 512;     ///< host:port of a control plane
inline constexpr uint32_t kMaxShards = 4096;    ///< shards of a job
inline constexpr size_t kMaxSpec = 512u << 20;  ///< a job spec or layout blob
inline constexpr uint32_t kMaxChunksPerReport = 1u << 24;
inline constexpr uint32_t kMaxAccumulationSteps = 1024;  ///< micro-batches per step

/// Asks a shard for the CRC32C of every local chunk's state once it reached `min_version`
/// (Unavailable while it has not: retry).
struct ChunkCrcsRequest {
#define ZPS_MSG_CHUNK_CRCS_REQUEST(X) \
  X(min_version, 0, "the version the shard must reach first", wire::I64)
  ZPS_WIRE_MESSAGE(ChunkCrcsRequest, ZPS_MSG_CHUNK_CRCS_REQUEST)
};

/// Most elements one ReadMaster may ask for (8 MiB of fp32, under the frame bound).
inline constexpr uint64_t kMaxReadMaster = uint64_t{2} << 20;

/// Asks a shard for elements [offset, offset+length) of a local chunk's fp32 master once the
/// shard reached `min_version` (Unavailable while it has not: retry).
struct ReadMasterRequest {
#define ZPS_MSG_READ_MASTER_REQUEST(X)                                   \
  X(min_version, 0, "the version the shard must reach first", wire::I64) \
  X(chunk, 0, "a chunk of this shard", wire::U32)                        \
  X(offset, 0, "first element, within the chunk", wire::U64)             \
  X(length, 0, "elements", wire::Int<uint64_t, 0, kMaxReadMaster>)
  ZPS_WIRE_MESSAGE(ReadMasterRequest, ZPS_MSG_READ_MASTER_REQUEST)
};

struct MasterRange {
#define ZPS_MSG_MASTER_RANGE(X)                                     \
  X(version, 0, "the shard's version the values are at", wire::I64) \
  X(values, {}, "the chunk's fp32 master", wire::PodArray<float, kMaxReadMaster>)
  ZPS_WIRE_MESSAGE(MasterRange, ZPS_MSG_MASTER_RANGE)
};

struct ChunkCrcs {
#define ZPS_MSG_CHUNK_CRCS(X)                                                   \
  X(version, 0, "the shard's version the CRCs are at", wire::I64)               \
  X(crcs, {}, "(chunk, CRC32C over master, m, v and serving), ascending chunk", \
    wire::List<wire::Pair<wire::U32, wire::U32>>)
  ZPS_WIRE_MESSAGE(ChunkCrcs, ZPS_MSG_CHUNK_CRCS)
};

struct RegisterShard {
#define ZPS_MSG_REGISTER_SHARD(X)                 \
  X(ordinal, 0, "the shard's ordinal", wire::U32) \
  X(endpoint, {}, "host:port of the shard's control plane", wire::Str<kMaxEndpoint>)
  ZPS_WIRE_MESSAGE(RegisterShard, ZPS_MSG_REGISTER_SHARD)
};

struct Join {
#define ZPS_MSG_JOIN(X)                                    \
  X(rank, 0, "the worker's rank", wire::U32)               \
  X(job_hash, 0, "FNV-1a hash of the job spec", wire::U64) \
  X(job_spec, {}, "rank 0: the full spec; other ranks: empty", wire::Bytes<kMaxSpec>)
  ZPS_WIRE_MESSAGE(Join, ZPS_MSG_JOIN)
};

/// How a job's gradients reach the shards (the job's reduction mode; the values of
/// zps::server::ReductionMode).
enum class ReductionMode : uint8_t {
  kServerSum = 0,   ///< every rank pushes its gradient; the shard sums them
  kPreReduced = 1,  ///< the ranks reduce among themselves; each range is pushed once
};

/// What a worker needs to move data: the layout and the data-plane settings of the job.
struct JoinReply {
#define ZPS_MSG_JOIN_REPLY(X)                                                      \
  X(job_hash, 0, "FNV-1a hash of the job spec", wire::U64)                         \
  X(resume_step, 0, "the step the job is at", wire::I64)                           \
  X(loss_scale, 1.0, "the loss scale for that step", wire::F64)                    \
  X(shard_endpoints, {}, "host:port of each shard; index = shard ordinal",         \
    wire::List<wire::Str<kMaxEndpoint>, kMaxShards, 1>)                            \
  X(layout, {}, "Layout::Serialize()", wire::Bytes<kMaxSpec>)                      \
  X(reduction_mode, ReductionMode::kServerSum, "0 server-sum, 1 pre-reduced",      \
    wire::Enum<ReductionMode, ReductionMode::kPreReduced>)                         \
  X(world_size, 1, "ranks of the job", wire::U32)                                  \
  X(grad_dtype, DType::kF32, "DType, 0 .. 4", wire::Enum<DType, DType::kI4Block>)  \
  X(serving_dtype, DType::kBF16, "0 fp32, 1 fp16, 2 bf16, 3 int8-block",           \
    wire::Enum<DType, DType::kI8Block>)                                            \
  X(accumulation_steps, 1,                                                         \
    "micro-batches per step (ShardJob::accumulation_steps); sent only when not 1", \
    wire::Trailing<wire::Int<uint32_t, 1, kMaxAccumulationSteps>, 1>)
  ZPS_WIRE_MESSAGE(JoinReply, ZPS_MSG_JOIN_REPLY)
};

struct ChunkStat {
#define ZPS_MSG_CHUNK_STAT(X)                                      \
  X(chunk, 0, "a chunk of the reporting shard", wire::U32)         \
  X(sum_squares, 0.0, "sum of squares of its gradient", wire::F64) \
  X(non_finite, false, "its gradient holds Inf or NaN", wire::NonZeroBool)
  ZPS_WIRE_FIELDS(ChunkStat, ZPS_MSG_CHUNK_STAT)
};

struct Report {
#define ZPS_MSG_REPORT(X)                                        \
  X(step, 0, "the step whose gradients are complete", wire::I64) \
  X(ordinal, 0, "the reporting shard", wire::U32)                \
  X(chunks, {}, "per chunk", wire::List<wire::Struct<ChunkStat>, kMaxChunksPerReport>)
  ZPS_WIRE_MESSAGE(Report, ZPS_MSG_REPORT)
};

struct CommitInfo {
#define ZPS_MSG_COMMIT_INFO(X)                                                            \
  X(step, 0, "the step decided", wire::I64)                                               \
  X(skip, false, "the step is skipped (non-finite gradients)", wire::NonZeroBool)         \
  X(grad_scale, 0.0f, "what the shards multiply the gradient sum by", wire::F32)          \
  X(global_norm, 0.0, "the gradient's global norm", wire::F64)                            \
  X(loss_scale, 1.0, "used by this step's gradients", wire::F64)                          \
  X(next_loss_scale, 1.0, "to use for the next step", wire::F64)                          \
  X(optimizer_step, 0, "applied updates after this step", wire::I64)                      \
  X(good_steps, 0, "loss scaler: consecutive good steps after this step", wire::I64)      \
  X(checkpoint, false, "shards checkpoint the state at version step + 1", wire::Bool)     \
  X(protect_checkpoint, 0,                                                                \
    "newest checkpoint complete on every shard (0: none): shards keep it whatever their " \
    "garbage collection would drop",                                                      \
    wire::Int<int64_t, 0>)
  ZPS_WIRE_MESSAGE(CommitInfo, ZPS_MSG_COMMIT_INFO)
};

struct AwaitCommit {
#define ZPS_MSG_AWAIT_COMMIT(X) X(step, 0, "the step whose decision to wait for", wire::I64)
  ZPS_WIRE_MESSAGE(AwaitCommit, ZPS_MSG_AWAIT_COMMIT)
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

// A reply's `code` is a zps::Code as a u32 and stays a bare number on purpose: a code this build
// does not know (a newer peer's) must become Internal through StatusFromWire, not make the whole
// reply undecodable.

struct FetchHeader {
#define ZPS_MSG_FETCH_HEADER(X)                                         \
  X(session, 0, "the session token from the shard's hello", wire::U64)  \
  X(request, 0, "chosen by the worker; the reply echoes it", wire::U64) \
  X(chunk, 0, "a chunk of the shard", wire::U32)                        \
  X(offset, 0, "first element, within the chunk", wire::U64)            \
  X(length, 0, "elements", wire::U64)                                   \
  X(min_version, 0, "answered once the chunk is at this version or later", wire::I64)
  ZPS_WIRE_MESSAGE(FetchHeader, ZPS_MSG_FETCH_HEADER)
};

/// Reply to a fetch; the data (length x serving dtype bytes) follows when code == 0.
struct FetchReplyHeader {
#define ZPS_MSG_FETCH_REPLY_HEADER(X)                       \
  X(request, 0, "the fetch's request", wire::U64)           \
  X(code, 0, "a zps::Code; 0: the data follows", wire::U32) \
  X(version, -1, "the version of the data", wire::I64)      \
  X(message, {}, "the error's text", wire::CutStr<kMaxErrorMessage>)
  ZPS_WIRE_MESSAGE(FetchReplyHeader, ZPS_MSG_FETCH_REPLY_HEADER)
};

/// Reply to a kAmFetchRma, with no data: when code == 0 the requested range (length x serving
/// dtype bytes) is at `remote_address` in the shard's region whose packed rkey is `rkey`, and
/// stays unchanged at `version` until the worker's next push for that chunk (step protocol).
/// `bank_delta` (protocol 4): nonzero when the shard serves from two banks, the byte offset from
/// this range to the same range in the other bank, where versions of the other parity are
/// (version + 1 at remote_address + bank_delta, version + 2 at remote_address again, ...).
struct FetchRmaReplyHeader {
#define ZPS_MSG_FETCH_RMA_REPLY_HEADER(X)                                                     \
  X(request, 0, "the fetch's request", wire::U64)                                             \
  X(code, 0, "a zps::Code; 0: the range is at remote_address", wire::U32)                     \
  X(version, -1, "the version of the range", wire::I64)                                       \
  X(message, {}, "the error's text", wire::CutStr<kMaxErrorMessage>)                          \
  X(remote_address, 0, "the range's address in the shard's serving region", wire::U64)        \
  X(rkey, {}, "the region's packed rkey; empty unless code is 0", wire::Bytes<kMaxRkeyBytes>) \
  X(bank_delta, 0, "0: one bank; else the bytes from this range to the other bank's", wire::I64)
  ZPS_WIRE_MESSAGE(FetchRmaReplyHeader, ZPS_MSG_FETCH_RMA_REPLY_HEADER)
};

/// A push; the data (length x dtype bytes) follows.
struct PushHeader {
#define ZPS_MSG_PUSH_HEADER(X)                                                      \
  X(session, 0, "the session token from the shard's hello", wire::U64)              \
  X(request, 0, "chosen by the worker; the reply echoes it", wire::U64)             \
  X(step, 0, "the gradient's step; -1: initial values", wire::I64)                  \
  X(chunk, 0, "a chunk of the shard", wire::U32)                                    \
  X(offset, 0, "first element, within the chunk", wire::U64)                        \
  X(length, 0, "elements", wire::U64)                                               \
  X(rank, 0, "the contributor: rank × accumulation_steps + micro-batch", wire::U32) \
  X(dtype, DType::kF32, "of the data (DType, 0 .. 4)", wire::Enum<DType, DType::kI4Block>)
  ZPS_WIRE_MESSAGE(PushHeader, ZPS_MSG_PUSH_HEADER)
};

/// A push whose data the shard reads with RMA get: `push.length` x `push.dtype` bytes at
/// `remote_address` in the worker's region whose packed rkey is `rkey`. The bytes stay unchanged
/// until the worker gets the kAmPushReply (or the endpoint fails).
struct PushRmaHeader {
#define ZPS_MSG_PUSH_RMA_HEADER(X)                                             \
  X(push, {}, "the push, inline", wire::Struct<PushHeader>)                    \
  X(remote_address, 0, "the data's address in the worker's region", wire::U64) \
  X(rkey, {}, "the region's packed rkey", wire::Bytes<kMaxRkeyBytes, 1>)
  ZPS_WIRE_MESSAGE(PushRmaHeader, ZPS_MSG_PUSH_RMA_HEADER)
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
#define ZPS_MSG_SERVING_NOTICE_HEADER(X)                                        \
  X(session, 0, "the session token the shard issued to this worker", wire::U64) \
  X(version, kNoticeForget, "≥ 0: published; -1: forget", wire::Int<int64_t, kNoticeForget>)
  ZPS_WIRE_MESSAGE(ServingNoticeHeader, ZPS_MSG_SERVING_NOTICE_HEADER)
};

/// The error of every data-plane operation of a fenced session, whichever side notices first:
/// the shard's answer to a message that carries a fenced session token, and the worker's
/// failure of its endpoint to that shard on the forget notice (ServingNoticeHeader). Unavailable:
/// the worker re-joins.
inline Status SessionFencedError() {
  return Unavailable(
      "the shard ended this worker's session (it is rolling back to a checkpoint, or lost the "
      "coordinator); re-join");
}

struct PushReplyHeader {
#define ZPS_MSG_PUSH_REPLY_HEADER(X)                \
  X(request, 0, "the push's request", wire::U64)    \
  X(code, 0, "a zps::Code; 0: accepted", wire::U32) \
  X(message, {}, "the error's text", wire::CutStr<kMaxErrorMessage>)
  ZPS_WIRE_MESSAGE(PushReplyHeader, ZPS_MSG_PUSH_REPLY_HEADER)
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
#define ZPS_MSG_CHECKPOINT_REPORT(X)                                                            \
  X(ordinal, 0, "the reporting shard", wire::U32)                                               \
  X(steps, {}, "the shard's complete local checkpoints",                                        \
    wire::List<wire::Int<int64_t, 0>, kMaxCheckpointSteps, 0, wire::Order::kStrictlyAscending>) \
  X(has_result, false, "an attempt's outcome follows (false at registration)", wire::Bool)      \
  X(result_step, 0, "the attempt's step", wire::I64)                                            \
  X(result_code, 0, "the attempt's zps::Code (0: committed)", wire::U32)                        \
  X(result_message, {}, "the attempt's error text", wire::CutStr<kMaxErrorMessage>)
  ZPS_WIRE_MESSAGE(CheckpointReport, ZPS_MSG_CHECKPOINT_REPORT)
};

/// The loss-scaler and optimizer counters at a step boundary (kept in every checkpoint).
struct ResumeState {
#define ZPS_MSG_RESUME_STATE(X)                                                  \
  X(step, 0, "the version the state is at", wire::Int<int64_t, 0>)               \
  X(loss_scale, 1.0, "the loss scale for step `step`",                           \
    wire::Float<double, wire::FloatCheck::kPositiveFinite>)                      \
  X(good_steps, 0, "loss scaler: consecutive good steps", wire::Int<int64_t, 0>) \
  X(optimizer_step, 0, "applied updates before step `step`", wire::Int<int64_t, 0>)
  ZPS_WIRE_FIELDS(ResumeState, ZPS_MSG_RESUME_STATE)
};

/// A shard asks where the job stands; with `ready`, it says it restored `state` for `epoch`.
struct ShardSync {
#define ZPS_MSG_SHARD_SYNC(X)                                           \
  X(ordinal, 0, "the asking shard", wire::U32)                          \
  X(epoch, 0, "the coordinator epoch the shard knows", wire::U64)       \
  X(ready, false, "the shard restored `state` for `epoch`", wire::Bool) \
  X(state, {}, "what the shard restored, inline", wire::Struct<ResumeState>)
  ZPS_WIRE_MESSAGE(ShardSync, ZPS_MSG_SHARD_SYNC)
};

enum class JobPhase : uint8_t { kNoJob = 0, kRecovering = 1, kRunning = 2 };

struct ShardSyncReply {
#define ZPS_MSG_SHARD_SYNC_REPLY(X)                                                            \
  X(epoch, 0, "the coordinator's epoch", wire::U64)                                            \
  X(phase, JobPhase::kNoJob, "0 no job, 1 recovering, 2 running",                              \
    wire::Enum<JobPhase, JobPhase::kRunning>)                                                  \
  X(target_step, -1, "recovering: the step to restore (-1: not known yet); running: the step", \
    wire::I64)
  ZPS_WIRE_MESSAGE(ShardSyncReply, ZPS_MSG_SHARD_SYNC_REPLY)
};

/// The answer to kCheckpointNow: a global checkpoint complete on every shard.
struct CheckpointDone {
#define ZPS_MSG_CHECKPOINT_DONE(X)               \
  X(step, 0, "the checkpoint's step", wire::I64) \
  X(shards, 0, "shards that hold it", wire::U32)
  ZPS_WIRE_MESSAGE(CheckpointDone, ZPS_MSG_CHECKPOINT_DONE)
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
#define ZPS_MSG_KV_SET(X)                                                   \
  X(generation, 0, "the store's generation; 0: the current one", wire::U64) \
  X(key, {}, "the key", wire::Str<kMaxKvKeyBytes, 1>)                       \
  X(value, {}, "the value", wire::Bytes<kMaxKvValueBytes>)
  ZPS_WIRE_MESSAGE(KvSet, ZPS_MSG_KV_SET)
};

/// Waits up to `wait_ms` (<= kMaxKvWaitMs; 0 = do not wait) for `key` in `generation` (0 = the
/// current one) and returns its value.
struct KvGet {
#define ZPS_MSG_KV_GET(X)                                                   \
  X(generation, 0, "the store's generation; 0: the current one", wire::U64) \
  X(key, {}, "the key", wire::Str<kMaxKvKeyBytes, 1>)                       \
  X(wait_ms, 0, "how long to wait for the key; 0: do not wait",             \
    wire::Int<uint32_t, 0, kMaxKvWaitMs>)
  ZPS_WIRE_MESSAGE(KvGet, ZPS_MSG_KV_GET)
};

/// The answer to KvSet (value empty) and KvGet: the generation that served it.
struct KvReply {
#define ZPS_MSG_KV_REPLY(X)                                    \
  X(generation, 0, "the generation that served it", wire::U64) \
  X(value, {}, "the value; empty for KvSet", wire::Bytes<kMaxKvValueBytes>)
  ZPS_WIRE_MESSAGE(KvReply, ZPS_MSG_KV_REPLY)
};

// ---- online resharding (control plane, the reshard endpoint) ----

/// Bounds of the online reshard messages.
inline constexpr size_t kMaxStoredKey = 256;         ///< a checkpoint value's key
inline constexpr size_t kMaxStoredPage = 12u << 20;  ///< values in one ReshardValues
inline constexpr uint32_t kMaxStoredValuesPerPage = 1u << 16;

/// What a shard's old store holds: its identity, and the checkpoint the reshard moves.
struct ReshardInfo {
#define ZPS_MSG_RESHARD_INFO(X)                                                                \
  X(shard, 0, "the store's shard ordinal in the old job", wire::U32)                           \
  X(shards, 0, "the old job's shard count", wire::Int<uint32_t, 1, kMaxShards>)                \
  X(layout_hash, 0, "the old job's layout hash", wire::U64)                                    \
  X(job_hash, 0, "the old job's spec hash", wire::U64)                                         \
  X(step, 0, "the checkpoint the reshard moves (shard 0: the newest complete on every shard)", \
    wire::Int<int64_t, 0>)                                                                     \
  X(job, {}, "the old job spec (JobSpec::Serialize)", wire::Bytes<kMaxSpec, 1>)                \
  X(manifest, {}, "the checkpoint's manifest as stored", wire::Bytes<kMaxSpec, 1>)
  ZPS_WIRE_MESSAGE(ReshardInfo, ZPS_MSG_RESHARD_INFO)
};

/// Asks for the stored values of `chunk` (0xffffffff: the state blob) of checkpoint `step`, in
/// key order after key `after` (empty: from the first).
struct ReshardFetch {
#define ZPS_MSG_RESHARD_FETCH(X)                                  \
  X(step, 0, "the checkpoint", wire::Int<int64_t, 0>)             \
  X(chunk, 0, "the chunk; 0xffffffff: the state blob", wire::U32) \
  X(after, {}, "the last key already received; empty: from the first", wire::Bytes<kMaxStoredKey>)
  ZPS_WIRE_MESSAGE(ReshardFetch, ZPS_MSG_RESHARD_FETCH)
};

/// One page of a chunk's stored values: keys[i] holds values[i], framed as stored (CRC
/// included; the receiver checks it). Binary strings (the bytes of a `str` are not text): the
/// store's keys and values are std::string, so a page moves in and out of the message uncopied.
struct ReshardValues {
#define ZPS_MSG_RESHARD_VALUES(X)                                     \
  X(keys, {}, "the values' keys, ascending (binary)",                 \
    wire::List<wire::Str<kMaxStoredKey, 1>, kMaxStoredValuesPerPage>) \
  X(values, {}, "the framed values (binary)",                         \
    wire::List<wire::Str<kMaxStoredPage>, kMaxStoredValuesPerPage>)   \
  X(more, false, "values of the chunk follow the last one", wire::Bool)
  ZPS_WIRE_MESSAGE(ReshardValues, ZPS_MSG_RESHARD_VALUES)
};

/// A shard of the new job (`committed`: its new store of `step` is committed) or a donor
/// (`committed` false) asks the new shard 0 whether the job switched to `shards` shards.
struct ReshardReport {
#define ZPS_MSG_RESHARD_REPORT(X)                                                    \
  X(ordinal, 0, "the reporting shard's ordinal", wire::U32)                          \
  X(shards, 0, "the shard count it reshards to", wire::Int<uint32_t, 1, kMaxShards>) \
  X(step, 0, "the checkpoint it resharded", wire::Int<int64_t, 0>)                   \
  X(committed, false, "its new store is committed", wire::Bool)
  ZPS_WIRE_MESSAGE(ReshardReport, ZPS_MSG_RESHARD_REPORT)
};

struct ReshardStatus {
#define ZPS_MSG_RESHARD_STATUS(X)                                                         \
  X(shards, 0, "the shard count the job reshards to", wire::Int<uint32_t, 1, kMaxShards>) \
  X(step, 0, "the checkpoint it reshards", wire::I64)                                     \
  X(committed, 0, "shards whose new store is committed", wire::U32)                       \
  X(switched, false, "the coordinator's catalog holds the new job: swap the stores", wire::Bool)
  ZPS_WIRE_MESSAGE(ReshardStatus, ZPS_MSG_RESHARD_STATUS)
};

}  // namespace zps::msg
