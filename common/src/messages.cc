#include "zps/common/messages.h"

#include <cmath>
#include <cstring>

#include "zps/common/bytes.h"

namespace zps::msg {
namespace {
constexpr size_t kMaxEndpoint = 512;
constexpr uint32_t kMaxShards = 4096;
constexpr size_t kMaxSpec = 512u << 20;
constexpr uint32_t kMaxChunksPerReport = 1u << 24;
}  // namespace

std::vector<std::byte> ReadMasterRequest::Encode() const {
  ByteWriter w;
  w.I64(min_version);
  w.U32(chunk);
  w.U64(offset);
  w.U64(length);
  return w.Take();
}
Result<ReadMasterRequest> ReadMasterRequest::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ReadMasterRequest m;
  ZPS_ASSIGN_OR_RETURN(m.min_version, r.I64("min_version"));
  ZPS_ASSIGN_OR_RETURN(m.chunk, r.U32("chunk"));
  ZPS_ASSIGN_OR_RETURN(m.offset, r.U64("offset"));
  ZPS_ASSIGN_OR_RETURN(m.length, r.U64("length"));
  if (m.length > kMaxReadMaster) return InvalidArgument("ReadMaster.length over the bound");
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ReadMasterRequest"));
  return m;
}

std::vector<std::byte> MasterRange::Encode() const {
  ByteWriter w;
  w.I64(version);
  w.Blob(std::as_bytes(std::span<const float>(values)));
  return w.Take();
}
Result<MasterRange> MasterRange::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  MasterRange m;
  ZPS_ASSIGN_OR_RETURN(m.version, r.I64("version"));
  ZPS_ASSIGN_OR_RETURN(auto raw, r.Blob("values", kMaxReadMaster * sizeof(float)));
  if (raw.size() % sizeof(float) != 0) return InvalidArgument("MasterRange.values not fp32");
  m.values.resize(raw.size() / sizeof(float));
  // memcpy of 0 bytes from an empty span's null pointer is undefined (fuzz_messages, UBSan).
  if (!raw.empty()) std::memcpy(m.values.data(), raw.data(), raw.size());
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("MasterRange"));
  return m;
}

std::vector<std::byte> RegisterShard::Encode() const {
  ByteWriter w;
  w.U32(ordinal);
  w.Str(endpoint);
  return w.Take();
}
Result<RegisterShard> RegisterShard::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  RegisterShard m;
  ZPS_ASSIGN_OR_RETURN(m.ordinal, r.U32("ordinal"));
  ZPS_ASSIGN_OR_RETURN(m.endpoint, r.Str("endpoint", kMaxEndpoint));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("RegisterShard"));
  return m;
}

std::vector<std::byte> Join::Encode() const {
  ByteWriter w;
  w.U32(rank);
  w.U64(job_hash);
  w.Blob(job_spec);
  return w.Take();
}
Result<Join> Join::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  Join m;
  ZPS_ASSIGN_OR_RETURN(m.rank, r.U32("rank"));
  ZPS_ASSIGN_OR_RETURN(m.job_hash, r.U64("job_hash"));
  ZPS_ASSIGN_OR_RETURN(auto spec, r.Blob("job_spec", kMaxSpec));
  m.job_spec.assign(spec.begin(), spec.end());
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("Join"));
  return m;
}

std::vector<std::byte> JoinReply::Encode() const {
  ByteWriter w;
  w.U64(job_hash);
  w.I64(resume_step);
  w.F64(loss_scale);
  w.U32(static_cast<uint32_t>(shard_endpoints.size()));
  for (const auto& e : shard_endpoints) w.Str(e);
  w.Blob(layout);
  w.U8(reduction_mode);
  w.U32(world_size);
  w.U8(static_cast<uint8_t>(grad_dtype));
  w.U8(static_cast<uint8_t>(serving_dtype));
  if (accumulation_steps != 1) w.U32(accumulation_steps);
  return w.Take();
}
Result<JoinReply> JoinReply::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  JoinReply m;
  ZPS_ASSIGN_OR_RETURN(m.job_hash, r.U64("job_hash"));
  ZPS_ASSIGN_OR_RETURN(m.resume_step, r.I64("resume_step"));
  ZPS_ASSIGN_OR_RETURN(m.loss_scale, r.F64("loss_scale"));
  ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("num_shards"));
  if (n == 0 || n > kMaxShards) return InvalidArgument("shard count out of range");
  for (uint32_t i = 0; i < n; ++i) {
    ZPS_ASSIGN_OR_RETURN(auto e, r.Str("endpoint", kMaxEndpoint));
    m.shard_endpoints.push_back(std::move(e));
  }
  ZPS_ASSIGN_OR_RETURN(auto layout, r.Blob("layout", kMaxSpec));
  m.layout.assign(layout.begin(), layout.end());
  ZPS_ASSIGN_OR_RETURN(m.reduction_mode, r.U8("reduction_mode"));
  if (m.reduction_mode > 1) return InvalidArgument("unknown reduction mode");
  ZPS_ASSIGN_OR_RETURN(m.world_size, r.U32("world_size"));
  ZPS_ASSIGN_OR_RETURN(uint8_t g, r.U8("grad_dtype"));
  ZPS_ASSIGN_OR_RETURN(m.grad_dtype, DTypeFromByte(g));
  ZPS_ASSIGN_OR_RETURN(uint8_t s, r.U8("serving_dtype"));
  ZPS_ASSIGN_OR_RETURN(m.serving_dtype, DTypeFromByte(s));
  if (r.remaining() > 0) {
    ZPS_ASSIGN_OR_RETURN(m.accumulation_steps, r.U32("accumulation_steps"));
    if (m.accumulation_steps == 0 || m.accumulation_steps > 1024) {
      return InvalidArgument("accumulation_steps out of range");
    }
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("JoinReply"));
  return m;
}

std::vector<std::byte> Report::Encode() const {
  ByteWriter w;
  w.I64(step);
  w.U32(ordinal);
  w.U32(static_cast<uint32_t>(chunks.size()));
  for (const auto& c : chunks) {
    w.U32(c.chunk);
    w.F64(c.sum_squares);
    w.U8(c.non_finite ? 1 : 0);
  }
  return w.Take();
}
Result<Report> Report::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  Report m;
  ZPS_ASSIGN_OR_RETURN(m.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(m.ordinal, r.U32("ordinal"));
  ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("count"));
  if (n > kMaxChunksPerReport || n * 13ull > r.remaining()) {
    return InvalidArgument("report chunk count out of range");
  }
  m.chunks.resize(n);
  for (auto& c : m.chunks) {
    ZPS_ASSIGN_OR_RETURN(c.chunk, r.U32("chunk"));
    ZPS_ASSIGN_OR_RETURN(c.sum_squares, r.F64("sum_squares"));
    ZPS_ASSIGN_OR_RETURN(uint8_t nf, r.U8("non_finite"));
    c.non_finite = nf != 0;
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("Report"));
  return m;
}

std::vector<std::byte> CommitInfo::Encode() const {
  ByteWriter w;
  w.I64(step);
  w.U8(skip ? 1 : 0);
  w.F32(grad_scale);
  w.F64(global_norm);
  w.F64(loss_scale);
  w.F64(next_loss_scale);
  w.I64(optimizer_step);
  w.I64(good_steps);
  w.U8(checkpoint ? 1 : 0);
  w.I64(protect_checkpoint);
  return w.Take();
}
Result<CommitInfo> CommitInfo::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  CommitInfo m;
  ZPS_ASSIGN_OR_RETURN(m.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(uint8_t skip, r.U8("skip"));
  m.skip = skip != 0;
  ZPS_ASSIGN_OR_RETURN(m.grad_scale, r.F32("grad_scale"));
  ZPS_ASSIGN_OR_RETURN(m.global_norm, r.F64("global_norm"));
  ZPS_ASSIGN_OR_RETURN(m.loss_scale, r.F64("loss_scale"));
  ZPS_ASSIGN_OR_RETURN(m.next_loss_scale, r.F64("next_loss_scale"));
  ZPS_ASSIGN_OR_RETURN(m.optimizer_step, r.I64("optimizer_step"));
  ZPS_ASSIGN_OR_RETURN(m.good_steps, r.I64("good_steps"));
  ZPS_ASSIGN_OR_RETURN(uint8_t ckpt, r.U8("checkpoint"));
  if (ckpt > 1) return InvalidArgument("CommitInfo.checkpoint must be 0 or 1");
  m.checkpoint = ckpt != 0;
  ZPS_ASSIGN_OR_RETURN(m.protect_checkpoint, r.I64("protect_checkpoint"));
  if (m.protect_checkpoint < 0) return InvalidArgument("CommitInfo.protect_checkpoint < 0");
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("CommitInfo"));
  return m;
}

std::vector<std::byte> AwaitCommit::Encode() const {
  ByteWriter w;
  w.I64(step);
  return w.Take();
}
Result<AwaitCommit> AwaitCommit::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  AwaitCommit m;
  ZPS_ASSIGN_OR_RETURN(m.step, r.I64("step"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("AwaitCommit"));
  return m;
}

std::vector<std::byte> FetchHeader::Encode() const {
  ByteWriter w;
  w.U64(session);
  w.U64(request);
  w.U32(chunk);
  w.U64(offset);
  w.U64(length);
  w.I64(min_version);
  return w.Take();
}
Result<FetchHeader> FetchHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  FetchHeader m;
  ZPS_ASSIGN_OR_RETURN(m.session, r.U64("session"));
  ZPS_ASSIGN_OR_RETURN(m.request, r.U64("request"));
  ZPS_ASSIGN_OR_RETURN(m.chunk, r.U32("chunk"));
  ZPS_ASSIGN_OR_RETURN(m.offset, r.U64("offset"));
  ZPS_ASSIGN_OR_RETURN(m.length, r.U64("length"));
  ZPS_ASSIGN_OR_RETURN(m.min_version, r.I64("min_version"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("FetchHeader"));
  return m;
}

std::vector<std::byte> FetchReplyHeader::Encode() const {
  ByteWriter w;
  w.U64(request);
  w.U32(code);
  w.I64(version);
  w.Str(message.substr(0, kMaxErrorMessage));
  return w.Take();
}
Result<FetchReplyHeader> FetchReplyHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  FetchReplyHeader m;
  ZPS_ASSIGN_OR_RETURN(m.request, r.U64("request"));
  ZPS_ASSIGN_OR_RETURN(m.code, r.U32("code"));
  ZPS_ASSIGN_OR_RETURN(m.version, r.I64("version"));
  ZPS_ASSIGN_OR_RETURN(m.message, r.Str("message", kMaxErrorMessage));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("FetchReplyHeader"));
  return m;
}

std::vector<std::byte> FetchRmaReplyHeader::Encode() const {
  ByteWriter w;
  w.U64(request);
  w.U32(code);
  w.I64(version);
  w.Str(message.substr(0, kMaxErrorMessage));
  w.U64(remote_address);
  w.Blob(rkey);
  w.I64(bank_delta);
  return w.Take();
}
Result<FetchRmaReplyHeader> FetchRmaReplyHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  FetchRmaReplyHeader m;
  ZPS_ASSIGN_OR_RETURN(m.request, r.U64("request"));
  ZPS_ASSIGN_OR_RETURN(m.code, r.U32("code"));
  ZPS_ASSIGN_OR_RETURN(m.version, r.I64("version"));
  ZPS_ASSIGN_OR_RETURN(m.message, r.Str("message", kMaxErrorMessage));
  ZPS_ASSIGN_OR_RETURN(m.remote_address, r.U64("remote_address"));
  ZPS_ASSIGN_OR_RETURN(auto key, r.Blob("rkey", kMaxRkeyBytes));
  m.rkey.assign(key.begin(), key.end());
  ZPS_ASSIGN_OR_RETURN(m.bank_delta, r.I64("bank_delta"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("FetchRmaReplyHeader"));
  return m;
}

std::vector<std::byte> ServingNoticeHeader::Encode() const {
  ByteWriter w;
  w.U64(session);
  w.I64(version);
  return w.Take();
}
Result<ServingNoticeHeader> ServingNoticeHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ServingNoticeHeader m;
  ZPS_ASSIGN_OR_RETURN(m.session, r.U64("session"));
  ZPS_ASSIGN_OR_RETURN(m.version, r.I64("version"));
  if (m.version < kNoticeForget) {
    return InvalidArgument("serving notice version " + std::to_string(m.version));
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ServingNoticeHeader"));
  return m;
}

namespace {
void WritePush(ByteWriter& w, const PushHeader& m) {
  w.U64(m.session);
  w.U64(m.request);
  w.I64(m.step);
  w.U32(m.chunk);
  w.U64(m.offset);
  w.U64(m.length);
  w.U32(m.rank);
  w.U8(static_cast<uint8_t>(m.dtype));
}
Result<PushHeader> ReadPush(ByteReader& r) {
  PushHeader m;
  ZPS_ASSIGN_OR_RETURN(m.session, r.U64("session"));
  ZPS_ASSIGN_OR_RETURN(m.request, r.U64("request"));
  ZPS_ASSIGN_OR_RETURN(m.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(m.chunk, r.U32("chunk"));
  ZPS_ASSIGN_OR_RETURN(m.offset, r.U64("offset"));
  ZPS_ASSIGN_OR_RETURN(m.length, r.U64("length"));
  ZPS_ASSIGN_OR_RETURN(m.rank, r.U32("rank"));
  ZPS_ASSIGN_OR_RETURN(uint8_t d, r.U8("dtype"));
  ZPS_ASSIGN_OR_RETURN(m.dtype, DTypeFromByte(d));
  return m;
}
}  // namespace

std::vector<std::byte> PushHeader::Encode() const {
  ByteWriter w;
  WritePush(w, *this);
  return w.Take();
}
Result<PushHeader> PushHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ZPS_ASSIGN_OR_RETURN(PushHeader m, ReadPush(r));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("PushHeader"));
  return m;
}

std::vector<std::byte> PushRmaHeader::Encode() const {
  ByteWriter w;
  WritePush(w, push);
  w.U64(remote_address);
  w.Blob(rkey);
  return w.Take();
}
Result<PushRmaHeader> PushRmaHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  PushRmaHeader m;
  ZPS_ASSIGN_OR_RETURN(m.push, ReadPush(r));
  ZPS_ASSIGN_OR_RETURN(m.remote_address, r.U64("remote_address"));
  ZPS_ASSIGN_OR_RETURN(auto key, r.Blob("rkey", kMaxRkeyBytes));
  if (key.empty()) return InvalidArgument("PushRmaHeader: empty rkey");
  m.rkey.assign(key.begin(), key.end());
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("PushRmaHeader"));
  return m;
}

std::vector<std::byte> PushReplyHeader::Encode() const {
  ByteWriter w;
  w.U64(request);
  w.U32(code);
  w.Str(message.substr(0, kMaxErrorMessage));
  return w.Take();
}
Result<PushReplyHeader> PushReplyHeader::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  PushReplyHeader m;
  ZPS_ASSIGN_OR_RETURN(m.request, r.U64("request"));
  ZPS_ASSIGN_OR_RETURN(m.code, r.U32("code"));
  ZPS_ASSIGN_OR_RETURN(m.message, r.Str("message", kMaxErrorMessage));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("PushReplyHeader"));
  return m;
}

std::vector<std::byte> ChunkCrcsRequest::Encode() const {
  ByteWriter w;
  w.I64(min_version);
  return w.Take();
}
Result<ChunkCrcsRequest> ChunkCrcsRequest::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ChunkCrcsRequest m;
  ZPS_ASSIGN_OR_RETURN(m.min_version, r.I64("min_version"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ChunkCrcsRequest"));
  return m;
}

std::vector<std::byte> ChunkCrcs::Encode() const {
  ByteWriter w;
  w.I64(version);
  w.U32(static_cast<uint32_t>(crcs.size()));
  for (const auto& [c, crc] : crcs) {
    w.U32(c);
    w.U32(crc);
  }
  return w.Take();
}
Result<ChunkCrcs> ChunkCrcs::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ChunkCrcs m;
  ZPS_ASSIGN_OR_RETURN(m.version, r.I64("version"));
  ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("count"));
  if (n * 8ull > r.remaining()) return InvalidArgument("chunk crc count out of range");
  for (uint32_t i = 0; i < n; ++i) {
    ZPS_ASSIGN_OR_RETURN(uint32_t c, r.U32("chunk"));
    ZPS_ASSIGN_OR_RETURN(uint32_t crc, r.U32("crc"));
    m.crcs.emplace_back(c, crc);
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ChunkCrcs"));
  return m;
}

Status StatusFromWire(uint32_t code, std::string message) {
  return StatusFromCode(code, std::move(message), "peer reply");
}

// ---- durability ----

std::vector<std::byte> CheckpointReport::Encode() const {
  ByteWriter w;
  w.U32(ordinal);
  w.U32(static_cast<uint32_t>(steps.size()));
  for (int64_t s : steps) w.I64(s);
  w.U8(has_result ? 1 : 0);
  w.I64(result_step);
  w.U32(result_code);
  w.Str(result_message.substr(0, kMaxErrorMessage));
  return w.Take();
}
Result<CheckpointReport> CheckpointReport::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  CheckpointReport m;
  ZPS_ASSIGN_OR_RETURN(m.ordinal, r.U32("ordinal"));
  ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("steps"));
  if (n > kMaxCheckpointSteps) return InvalidArgument("CheckpointReport: too many steps");
  int64_t prev = -1;
  for (uint32_t i = 0; i < n; ++i) {
    ZPS_ASSIGN_OR_RETURN(int64_t s, r.I64("step"));
    if (s <= prev) return InvalidArgument("CheckpointReport: steps must ascend and be >= 0");
    m.steps.push_back(prev = s);
  }
  ZPS_ASSIGN_OR_RETURN(uint8_t has, r.U8("has_result"));
  if (has > 1) return InvalidArgument("CheckpointReport.has_result must be 0 or 1");
  m.has_result = has != 0;
  ZPS_ASSIGN_OR_RETURN(m.result_step, r.I64("result_step"));
  ZPS_ASSIGN_OR_RETURN(m.result_code, r.U32("result_code"));
  ZPS_ASSIGN_OR_RETURN(m.result_message, r.Str("result_message", kMaxErrorMessage));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("CheckpointReport"));
  return m;
}

std::vector<std::byte> ShardSync::Encode() const {
  ByteWriter w;
  w.U32(ordinal);
  w.U64(epoch);
  w.U8(ready ? 1 : 0);
  w.I64(state.step);
  w.F64(state.loss_scale);
  w.I64(state.good_steps);
  w.I64(state.optimizer_step);
  return w.Take();
}
Result<ShardSync> ShardSync::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ShardSync m;
  ZPS_ASSIGN_OR_RETURN(m.ordinal, r.U32("ordinal"));
  ZPS_ASSIGN_OR_RETURN(m.epoch, r.U64("epoch"));
  ZPS_ASSIGN_OR_RETURN(uint8_t ready, r.U8("ready"));
  if (ready > 1) return InvalidArgument("ShardSync.ready must be 0 or 1");
  m.ready = ready != 0;
  ZPS_ASSIGN_OR_RETURN(m.state.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(m.state.loss_scale, r.F64("loss_scale"));
  ZPS_ASSIGN_OR_RETURN(m.state.good_steps, r.I64("good_steps"));
  ZPS_ASSIGN_OR_RETURN(m.state.optimizer_step, r.I64("optimizer_step"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ShardSync"));
  if (m.state.step < 0 || m.state.good_steps < 0 || m.state.optimizer_step < 0 ||
      !(m.state.loss_scale > 0.0) || !std::isfinite(m.state.loss_scale)) {
    return InvalidArgument("ShardSync: bad resume state");
  }
  return m;
}

std::vector<std::byte> ShardSyncReply::Encode() const {
  ByteWriter w;
  w.U64(epoch);
  w.U8(static_cast<uint8_t>(phase));
  w.I64(target_step);
  return w.Take();
}
Result<ShardSyncReply> ShardSyncReply::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  ShardSyncReply m;
  ZPS_ASSIGN_OR_RETURN(m.epoch, r.U64("epoch"));
  ZPS_ASSIGN_OR_RETURN(uint8_t phase, r.U8("phase"));
  if (phase > 2) return InvalidArgument("ShardSyncReply: unknown phase");
  m.phase = static_cast<JobPhase>(phase);
  ZPS_ASSIGN_OR_RETURN(m.target_step, r.I64("target_step"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("ShardSyncReply"));
  return m;
}

std::vector<std::byte> CheckpointDone::Encode() const {
  ByteWriter w;
  w.I64(step);
  w.U32(shards);
  return w.Take();
}
Result<CheckpointDone> CheckpointDone::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  CheckpointDone m;
  ZPS_ASSIGN_OR_RETURN(m.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(m.shards, r.U32("shards"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("CheckpointDone"));
  return m;
}

namespace {
Status CheckKvKey(const std::string& key) {
  if (key.empty()) return InvalidArgument("kv key is empty");
  return Status::Ok();
}
}  // namespace

std::vector<std::byte> KvSet::Encode() const {
  ByteWriter w;
  w.U64(generation);
  w.Str(key);
  w.Blob(value);
  return w.Take();
}
Result<KvSet> KvSet::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  KvSet m;
  ZPS_ASSIGN_OR_RETURN(m.generation, r.U64("generation"));
  ZPS_ASSIGN_OR_RETURN(m.key, r.Str("key", kMaxKvKeyBytes));
  ZPS_RETURN_IF_ERROR(CheckKvKey(m.key));
  ZPS_ASSIGN_OR_RETURN(auto v, r.Blob("value", kMaxKvValueBytes));
  m.value.assign(v.begin(), v.end());
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("KvSet"));
  return m;
}

std::vector<std::byte> KvGet::Encode() const {
  ByteWriter w;
  w.U64(generation);
  w.Str(key);
  w.U32(wait_ms);
  return w.Take();
}
Result<KvGet> KvGet::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  KvGet m;
  ZPS_ASSIGN_OR_RETURN(m.generation, r.U64("generation"));
  ZPS_ASSIGN_OR_RETURN(m.key, r.Str("key", kMaxKvKeyBytes));
  ZPS_RETURN_IF_ERROR(CheckKvKey(m.key));
  ZPS_ASSIGN_OR_RETURN(m.wait_ms, r.U32("wait_ms"));
  if (m.wait_ms > kMaxKvWaitMs) {
    return InvalidArgument("kv wait of " + std::to_string(m.wait_ms) + " ms is over the bound of " +
                           std::to_string(kMaxKvWaitMs));
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("KvGet"));
  return m;
}

std::vector<std::byte> KvReply::Encode() const {
  ByteWriter w;
  w.U64(generation);
  w.Blob(value);
  return w.Take();
}
Result<KvReply> KvReply::Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  KvReply m;
  ZPS_ASSIGN_OR_RETURN(m.generation, r.U64("generation"));
  ZPS_ASSIGN_OR_RETURN(auto v, r.Blob("value", kMaxKvValueBytes));
  m.value.assign(v.begin(), v.end());
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("KvReply"));
  return m;
}

}  // namespace zps::msg
