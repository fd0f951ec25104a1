#include "zps/server/checkpoint.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "checkpoint_codec.h"
#include "checkpoint_db.h"
#include "zps/common/bytes.h"
#include "zps/common/crc32c.h"
#include "zps/common/logging.h"
#include "zps/server/optimizer.h"

namespace zps::server {

using detail::Db;
using detail::FromRocks;
using detail::GetBe64;
using detail::PutBe32;
using detail::PutBe64;

namespace {

constexpr uint32_t kManifestMagic = 0x4d4b435a;  // "ZCKM"
// Format 1: fp32 moments. Format 2 adds the state dtype (a u8 after the state's CRC); an fp32
// checkpoint is still written as format 1, so older builds read it.
constexpr uint32_t kManifestFormat = 1;
constexpr uint32_t kManifestFormatStateDType = 2;
constexpr uint32_t kStateChunk = 0xffffffffu;
enum Kind : uint8_t { kMaster = 0, kM = 1, kV = 2, kState = 3 };
constexpr size_t kMaxCatalogName = 64;
// Table files of copied values (CopyChunk, PutStored) before they are moved into the store;
// RocksDB ignores the name, and a writable Open removes those a crash left behind.
constexpr std::string_view kTablePrefix = "copy-";

std::string CatalogKey(std::string_view name) { return "c" + std::string(name); }
std::string StepKey(char prefix, int64_t step) {
  std::string k(1, prefix);
  PutBe64(k, static_cast<uint64_t>(step));
  return k;
}
std::string DataKey(int64_t step, uint32_t chunk, uint8_t kind, uint32_t slice) {
  std::string k = StepKey('d', step);
  PutBe32(k, chunk);
  k.push_back(static_cast<char>(kind));
  PutBe32(k, slice);
  return k;
}

Status AddFramed(rocksdb::WriteBatch& batch, std::string_view key,
                 std::span<const std::byte> payload) {
  auto crc = detail::FrameCrc(key, payload);
  rocksdb::Slice kparts[1] = {rocksdb::Slice(key.data(), key.size())};
  rocksdb::Slice vparts[2] = {
      rocksdb::Slice(crc.data(), 4),
      rocksdb::Slice(reinterpret_cast<const char*>(payload.data()), payload.size())};
  return FromRocks(batch.Put(rocksdb::SliceParts(kparts, 1), rocksdb::SliceParts(vparts, 2)),
                   "batch put");
}

}  // namespace

namespace internal {
std::vector<std::byte> EncodeManifest(const Manifest& m) {
  const CheckpointInfo& info = m.info;
  ByteWriter w;
  const bool fp32 = info.state_dtype == StateDType::kF32;
  w.U32(kManifestMagic);
  w.U32(fp32 ? kManifestFormat : kManifestFormatStateDType);
  w.I64(info.step);
  w.I64(info.created_unix_ms);
  w.U64(info.layout_hash);
  w.U32(info.shard);
  w.U64(m.slice_bytes);
  w.U64(info.bytes);
  w.U8(m.has_state ? 1 : 0);
  w.U64(m.state_len);
  w.U32(m.state_crc);
  if (!fp32) w.U8(static_cast<uint8_t>(info.state_dtype));
  w.U32(static_cast<uint32_t>(info.chunks.size()));
  for (const auto& c : info.chunks) {
    w.U32(c.chunk);
    w.I64(c.version);
    w.U64(c.elems);
  }
  return w.Take();
}

Result<Manifest> DecodeManifest(int64_t key_step, std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  Manifest m;
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("magic"));
  ZPS_ASSIGN_OR_RETURN(uint32_t format, r.U32("format"));
  if (magic != kManifestMagic ||
      (format != kManifestFormat && format != kManifestFormatStateDType)) {
    return DataLoss("checkpoint manifest: bad magic or format");
  }
  ZPS_ASSIGN_OR_RETURN(m.info.step, r.I64("step"));
  ZPS_ASSIGN_OR_RETURN(m.info.created_unix_ms, r.I64("created"));
  ZPS_ASSIGN_OR_RETURN(m.info.layout_hash, r.U64("layout_hash"));
  ZPS_ASSIGN_OR_RETURN(m.info.shard, r.U32("shard"));
  ZPS_ASSIGN_OR_RETURN(m.slice_bytes, r.U64("slice_bytes"));
  ZPS_ASSIGN_OR_RETURN(m.info.bytes, r.U64("bytes"));
  ZPS_ASSIGN_OR_RETURN(uint8_t has_state, r.U8("has_state"));
  ZPS_ASSIGN_OR_RETURN(m.state_len, r.U64("state_len"));
  ZPS_ASSIGN_OR_RETURN(m.state_crc, r.U32("state_crc"));
  if (format == kManifestFormatStateDType) {
    ZPS_ASSIGN_OR_RETURN(uint8_t dtype, r.U8("state_dtype"));
    if (StateDTypeName(static_cast<StateDType>(dtype)) == "unknown") {
      return DataLoss("checkpoint manifest: unknown state dtype " + std::to_string(dtype));
    }
    m.info.state_dtype = static_cast<StateDType>(dtype);
  }
  ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("chunks"));
  if (n > bytes.size() / 20) return DataLoss("checkpoint manifest: chunk count too large");
  m.has_state = has_state != 0;
  m.info.chunks.resize(n);
  for (auto& c : m.info.chunks) {
    ZPS_ASSIGN_OR_RETURN(c.chunk, r.U32("chunk"));
    ZPS_ASSIGN_OR_RETURN(c.version, r.I64("version"));
    ZPS_ASSIGN_OR_RETURN(c.elems, r.U64("elems"));
  }
  for (size_t i = 1; i < m.info.chunks.size(); ++i) {
    if (m.info.chunks[i - 1].chunk >= m.info.chunks[i].chunk) {
      return DataLoss("checkpoint manifest: chunk ids not ascending");
    }
  }
  Status end = r.ExpectEnd("checkpoint manifest");
  if (!end.ok()) return DataLoss(end.message());
  if (m.info.step != key_step || m.slice_bytes == 0 || m.slice_bytes % 4 != 0) {
    return DataLoss("checkpoint manifest: inconsistent fields");
  }
  return m;
}
}  // namespace internal

namespace {
using internal::DecodeManifest;
using internal::EncodeManifest;
using internal::Manifest;

// Decoding errors of our own formats are corruption of stored data.
Status AsDataLoss(const Status& s, std::string_view what) {
  if (s.ok() || s.code() == Code::kDataLoss) return s.WithContext(what);
  if (s.code() == Code::kInvalidArgument) return DataLoss(std::string(what) + ": " + s.message());
  return s;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view VerificationName(Verification v) {
  switch (v) {
    case Verification::kManifestOk:
      return "manifest-ok";
    case Verification::kVerified:
      return "verified";
    case Verification::kCorrupt:
      return "CORRUPT";
  }
  return "?";
}

const ChunkEntry* CheckpointInfo::FindChunk(uint32_t chunk) const {
  auto it = std::lower_bound(chunks.begin(), chunks.end(), chunk,
                             [](const ChunkEntry& e, uint32_t c) { return e.chunk < c; });
  return it != chunks.end() && it->chunk == chunk ? &*it : nullptr;
}

Status CheckpointOptions::Validate() const {
  if (keep < 1) return InvalidArgument("checkpoint keep must be >= 1");
  if (slice_bytes < 4096 || slice_bytes > (64ull << 20) || slice_bytes % 4 != 0) {
    return InvalidArgument("checkpoint slice_bytes must be a multiple of 4 in [4 KiB, 64 MiB]");
  }
  if (write_buffer_bytes < (1ull << 20)) return InvalidArgument("write_buffer_bytes < 1 MiB");
  if (max_write_buffers < 2) return InvalidArgument("max_write_buffers must be >= 2");
  if (background_jobs < 2) return InvalidArgument("background_jobs must be >= 2");
  if (write_threads < 1 || write_threads > 64) {
    return InvalidArgument("checkpoint write_threads must be in [1, 64]");
  }
  if (write_io_bytes < 4096 || write_io_bytes > (256ull << 20)) {
    return InvalidArgument("write_io_bytes must be in [4 KiB, 256 MiB]");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- store

CheckpointStore::CheckpointStore(std::unique_ptr<Db> db, const CheckpointOptions& options)
    : db_(std::move(db)), options_(options) {}
CheckpointStore::~CheckpointStore() = default;

const std::string& CheckpointStore::dir() const { return db_->dir(); }

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const std::string& dir,
                                                               const CheckpointOptions& options) {
  ZPS_ASSIGN_OR_RETURN(auto db, Db::Open(dir, options));
  auto store = std::unique_ptr<CheckpointStore>(new CheckpointStore(std::move(db), options));
  if (!options.read_only && options.write_threads > 1) {
    // A low-priority store's helpers run at nice 19, as the background writer that calls them
    // does (RocksDB's own threads idle): at nice 0 one of them took half the framing work from
    // the training step's cores.
    ZPS_ASSIGN_OR_RETURN(store->write_pool_,
                         ThreadPool::Create({.name = "zps-ckpt-w",
                                             .threads = options.write_threads,
                                             .nice = options.low_priority ? 19 : 0}));
  }
  // No garbage collection here: the protected step (Protect) is not known yet, and removing
  // the job's last common checkpoint would be worse than keeping one too many until the next
  // Commit collects.
  if (!options.read_only) ZPS_RETURN_IF_ERROR(store->CleanUpIntents());
  return store;
}

Status CheckpointStore::CheckWritable() const {
  if (options_.read_only) return FailedPrecondition("checkpoint store " + dir() + " is read-only");
  return Status::Ok();
}

Status CheckpointStore::CleanUpIntents() {
  // Table files of a copy that a crash interrupted before they were moved in.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(kTablePrefix) && name.ends_with(".sst")) {
      ZPS_LOG(WARNING) << "checkpoint store " << dir() << ": removing " << name
                       << " (a copy never moved in)";
      std::filesystem::remove(e.path(), ec);
    }
  }
  ZPS_ASSIGN_OR_RETURN(auto intents, db_->Scan("p", "q"));
  if (intents.empty()) return Status::Ok();
  rocksdb::WriteBatch batch;
  for (const auto& [key, value] : intents) {
    if (key.size() != 9) return DataLoss("checkpoint store " + dir() + ": malformed intent key");
    const auto step = static_cast<int64_t>(GetBe64(key.data() + 1));
    ZPS_LOG(WARNING) << "checkpoint store " << dir() << ": removing uncommitted checkpoint " << step
                     << " (begun, never committed)";
    const std::string b = StepKey('d', step), e = StepKey('d', step + 1);
    ZPS_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(b, e), "batch"));
    ZPS_RETURN_IF_ERROR(FromRocks(batch.Delete(key), "batch"));
  }
  ZPS_RETURN_IF_ERROR(db_->Write(batch, true, false, "remove uncommitted checkpoints"));
  return db_->Compact("d", "e");
}

Status CheckpointStore::DeleteSteps(const std::vector<int64_t>& steps) {
  if (steps.empty()) return Status::Ok();
  rocksdb::WriteBatch batch;
  // Manifest and data go together in one synced batch: a checkpoint is never half deleted.
  for (int64_t s : steps) {
    ZPS_RETURN_IF_ERROR(FromRocks(batch.Delete(StepKey('m', s)), "batch"));
    ZPS_RETURN_IF_ERROR(
        FromRocks(batch.DeleteRange(StepKey('d', s), StepKey('d', s + 1)), "batch"));
  }
  ZPS_RETURN_IF_ERROR(db_->Write(batch, true, false, "delete checkpoints"));
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  return db_->Compact(StepKey('d', *lo), StepKey('d', *hi + 1));
}

void CheckpointStore::Protect(int64_t step) {
  MutexLock lock(&mu_);
  protected_ = step;
}

Status CheckpointStore::CollectGarbage() {
  ZPS_ASSIGN_OR_RETURN(auto manifests, db_->Scan("m", "n"));
  if (manifests.size() <= options_.keep) return Status::Ok();
  int64_t keep_also = -1;
  {
    MutexLock lock(&mu_);
    keep_also = protected_;
  }
  std::vector<int64_t> old;
  for (size_t i = 0; i + options_.keep < manifests.size(); ++i) {
    if (manifests[i].first.size() != 9) return DataLoss("malformed manifest key in " + dir());
    const auto step = static_cast<int64_t>(GetBe64(manifests[i].first.data() + 1));
    if (step != keep_also) old.push_back(step);
  }
  return DeleteSteps(old);
}

Status CheckpointStore::SetIdentity(const Layout& layout, uint32_t shard) {
  ZPS_RETURN_IF_ERROR(CheckWritable());
  if (shard >= layout.options().num_shards) {
    return InvalidArgument("shard " + std::to_string(shard) + " >= num_shards " +
                           std::to_string(layout.options().num_shards));
  }
  auto have = GetLayout();
  if (have.ok()) {
    ZPS_ASSIGN_OR_RETURN(uint32_t have_shard, GetShard());
    if (have->Hash() != layout.Hash() || have_shard != shard) {
      return FailedPrecondition("checkpoint store " + dir() +
                                " belongs to another layout or shard (shard " +
                                std::to_string(have_shard) + ")");
    }
    return Status::Ok();
  }
  if (have.status().code() != Code::kNotFound) return have.status();
  rocksdb::WriteBatch batch;
  const auto bytes = layout.Serialize();
  ZPS_RETURN_IF_ERROR(AddFramed(batch, CatalogKey("layout"), bytes));
  ByteWriter w;
  w.U32(shard);
  ZPS_RETURN_IF_ERROR(AddFramed(batch, CatalogKey("shard"), w.buffer()));
  return db_->Write(batch, true, false, "record identity");
}

Result<Layout> CheckpointStore::GetLayout() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, GetCatalog("layout"));
  auto l = Layout::Deserialize(bytes);
  if (!l.ok()) return AsDataLoss(l.status(), "stored layout of " + dir());
  return l;
}

Result<uint32_t> CheckpointStore::GetShard() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, GetCatalog("shard"));
  ByteReader r(bytes);
  auto s = r.U32("shard");
  if (!s.ok()) return AsDataLoss(s.status(), "stored shard of " + dir());
  return *s;
}

Status CheckpointStore::PutJobSpec(const JobSpec& spec) {
  return PutCatalog("job", spec.Serialize());
}

Result<JobSpec> CheckpointStore::GetJobSpec() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, GetCatalog("job"));
  auto j = JobSpec::Deserialize(bytes);
  if (!j.ok()) return AsDataLoss(j.status(), "stored job spec of " + dir());
  return j;
}

Status CheckpointStore::PutChunkVersions(std::span<const std::pair<uint32_t, int64_t>> versions) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(versions.size()));
  for (const auto& [c, v] : versions) {
    w.U32(c);
    w.I64(v);
  }
  return PutCatalog("versions", w.buffer());
}

Result<std::vector<std::pair<uint32_t, int64_t>>> CheckpointStore::GetChunkVersions() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, GetCatalog("versions"));
  ByteReader r(bytes);
  auto decode = [&]() -> Result<std::vector<std::pair<uint32_t, int64_t>>> {
    ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("count"));
    if (n > bytes.size() / 12) return InvalidArgument("count too large");
    std::vector<std::pair<uint32_t, int64_t>> out(n);
    for (auto& [c, v] : out) {
      ZPS_ASSIGN_OR_RETURN(c, r.U32("chunk"));
      ZPS_ASSIGN_OR_RETURN(v, r.I64("version"));
    }
    ZPS_RETURN_IF_ERROR(r.ExpectEnd("chunk versions"));
    return out;
  };
  auto out = decode();
  if (!out.ok()) return AsDataLoss(out.status(), "stored chunk versions of " + dir());
  return out;
}

Status CheckpointStore::PutCatalog(std::string_view name, std::span<const std::byte> value) {
  ZPS_RETURN_IF_ERROR(CheckWritable());
  if (name.empty() || name.size() > kMaxCatalogName) {
    return InvalidArgument("catalog name must be 1.." + std::to_string(kMaxCatalogName) + " bytes");
  }
  return db_->PutFramedSync(CatalogKey(name), value);
}

Result<std::vector<std::byte>> CheckpointStore::GetCatalog(std::string_view name) const {
  auto v = db_->GetFramed(CatalogKey(name), nullptr);
  if (!v.ok() && v.status().code() == Code::kNotFound) {
    return NotFound("catalog entry '" + std::string(name) + "' not in " + dir());
  }
  if (!v.ok()) return v.status().WithContext("catalog entry '" + std::string(name) + "'");
  return v;
}

Result<std::vector<std::string>> CheckpointStore::ListCatalog(std::string_view prefix) const {
  std::string begin = CatalogKey(prefix), end = begin;
  // The smallest key above every key with this prefix: drop trailing 0xff bytes, increment.
  while (!end.empty() && static_cast<uint8_t>(end.back()) == 0xff) end.pop_back();
  end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
  ZPS_ASSIGN_OR_RETURN(auto kvs, db_->Scan(begin, end));
  std::vector<std::string> out;
  out.reserve(kvs.size());
  for (auto& kv : kvs) out.push_back(kv.first.substr(1));
  return out;
}

Status CheckpointStore::DeleteCatalog(std::span<const std::string> names) {
  ZPS_RETURN_IF_ERROR(CheckWritable());
  rocksdb::WriteBatch batch;
  for (const auto& n : names) ZPS_RETURN_IF_ERROR(FromRocks(batch.Delete(CatalogKey(n)), "batch"));
  return db_->Write(batch, true, false, "catalog delete");
}

Result<std::unique_ptr<CheckpointWriter>> CheckpointStore::BeginCheckpoint(int64_t step,
                                                                           StateDType state_dtype) {
  ZPS_RETURN_IF_ERROR(CheckWritable());
  if (step < 0) return InvalidArgument("checkpoint step must be >= 0");
  auto layout = GetLayout();
  if (!layout.ok() && layout.status().code() == Code::kNotFound) {
    return FailedPrecondition("checkpoint store " + dir() + ": SetIdentity before checkpoints");
  }
  if (!layout.ok()) return layout.status();
  ZPS_ASSIGN_OR_RETURN(uint32_t shard, GetShard());
  {
    MutexLock lock(&mu_);
    if (writer_open_) return FailedPrecondition("a checkpoint is already being written");
    writer_open_ = true;
  }
  auto release = [&] {
    MutexLock lock(&mu_);
    writer_open_ = false;
  };
  auto existing = db_->GetFramed(StepKey('m', step), nullptr);
  if (existing.ok() || existing.status().code() != Code::kNotFound) {
    release();
    if (!existing.ok() && existing.status().code() != Code::kDataLoss) return existing.status();
    return AlreadyExists("checkpoint " + std::to_string(step) + " already exists in " + dir());
  }
  // The intent marks the step's data for removal if we never get to commit.
  rocksdb::WriteBatch batch;
  Status s = FromRocks(batch.Put(StepKey('p', step), ""), "batch");
  if (s.ok()) s = db_->Write(batch, true, false, "begin checkpoint");
  if (!s.ok()) {
    release();
    return s;
  }
  return std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(this, step, std::move(*layout), shard, state_dtype));
}

Result<std::unique_ptr<CheckpointReader>> CheckpointStore::OpenCheckpoint(int64_t step) const {
  auto* self = const_cast<CheckpointStore*>(this);  // readers only read
  auto snap = std::make_unique<detail::Snapshot>(self->db_.get());
  auto bytes = db_->GetFramed(StepKey('m', step), snap->get());
  const std::string what = "checkpoint " + std::to_string(step) + " in " + dir();
  if (!bytes.ok() && bytes.status().code() == Code::kNotFound) return NotFound(what + " not found");
  if (!bytes.ok()) return bytes.status().WithContext(what + " manifest");
  auto m = DecodeManifest(step, *bytes);
  if (!m.ok()) return AsDataLoss(m.status(), what);
  auto reader = std::unique_ptr<CheckpointReader>(new CheckpointReader(self, m->info));
  reader->snapshot_ = std::move(snap);
  reader->slice_bytes_ = m->slice_bytes;
  reader->manifest_ = std::make_unique<Manifest>(*m);
  reader->has_state_ = m->has_state;
  reader->state_len_ = m->state_len;
  reader->state_crc_ = m->state_crc;
  return reader;
}

Status CheckpointStore::LoadChunk(int64_t step, uint32_t chunk, const ChunkTensorsOut& out) const {
  ZPS_ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(step));
  return reader->ReadChunk(chunk, out);
}

Result<std::vector<CheckpointInfo>> CheckpointStore::ListCheckpoints(bool verify) const {
  ZPS_ASSIGN_OR_RETURN(auto manifests, db_->Scan("m", "n"));
  std::vector<CheckpointInfo> out;
  for (const auto& [key, value] : manifests) {
    if (key.size() != 9) return DataLoss("malformed manifest key in " + dir());
    const auto step = static_cast<int64_t>(GetBe64(key.data() + 1));
    auto reader = OpenCheckpoint(step);
    if (!reader.ok() && reader.status().code() == Code::kNotFound) continue;  // deleted meanwhile
    if (!reader.ok() && reader.status().code() != Code::kDataLoss) return reader.status();
    if (!reader.ok()) {
      CheckpointInfo bad;
      bad.step = step;
      bad.verification = Verification::kCorrupt;
      bad.problem = reader.status().message();
      out.push_back(std::move(bad));
      continue;
    }
    CheckpointInfo info = (*reader)->info();
    if (verify) {
      Status v = (*reader)->Verify();
      if (v.code() == Code::kDataLoss) {
        info.verification = Verification::kCorrupt;
        info.problem = v.message();
      } else if (!v.ok()) {
        return v;
      } else {
        info.verification = Verification::kVerified;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<CheckpointInfo> CheckpointStore::LatestComplete(bool verify) const {
  ZPS_ASSIGN_OR_RETURN(auto list, ListCheckpoints(false));
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    if (it->verification == Verification::kCorrupt) {
      ZPS_LOG(WARNING) << "checkpoint " << it->step << " in " << dir()
                       << " is corrupt, falling back: " << it->problem;
      continue;
    }
    if (verify) {
      ZPS_ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(it->step));
      Status v = reader->Verify();
      if (v.code() == Code::kDataLoss) {
        ZPS_LOG(WARNING) << "checkpoint " << it->step << " in " << dir()
                         << " is corrupt, falling back: " << v.message();
        continue;
      }
      ZPS_RETURN_IF_ERROR(v);
      it->verification = Verification::kVerified;
    }
    return *it;
  }
  return NotFound("no usable checkpoint in " + dir());
}

Status CheckpointStore::DropCheckpointsAfter(int64_t step) {
  ZPS_RETURN_IF_ERROR(CheckWritable());
  {
    MutexLock lock(&mu_);
    if (writer_open_) return FailedPrecondition("a checkpoint is being written");
  }
  ZPS_ASSIGN_OR_RETURN(auto manifests, db_->Scan(StepKey('m', step + 1), "n"));
  std::vector<int64_t> steps;
  for (const auto& kv : manifests)
    steps.push_back(static_cast<int64_t>(GetBe64(kv.first.data() + 1)));
  return DeleteSteps(steps);
}

uint64_t CheckpointStore::DiskBytes() const { return db_->LiveBytes(); }

// ---------------------------------------------------------------- writer

CheckpointWriter::CheckpointWriter(CheckpointStore* store, int64_t step, Layout layout,
                                   uint32_t shard, StateDType state_dtype)
    : store_(store),
      step_(step),
      state_dtype_(state_dtype),
      layout_(std::move(layout)),
      shard_(shard),
      batches_(static_cast<size_t>(store->options_.write_threads)) {
  for (auto& b : batches_)
    b = std::make_unique<rocksdb::WriteBatch>(store->options_.slice_bytes + 256);
  local_ = layout_.ChunksOfShard(shard_);
  added_.assign(local_.size(), false);
}

CheckpointWriter::~CheckpointWriter() {
  if (state_ != State::kCommitted) Abort();
  MutexLock lock(&store_->mu_);
  store_->writer_open_ = false;
}

void CheckpointWriter::Abort() {
  rocksdb::WriteBatch batch;
  Status s = FromRocks(batch.DeleteRange(StepKey('d', step_), StepKey('d', step_ + 1)), "batch");
  if (s.ok()) s = FromRocks(batch.Delete(StepKey('p', step_)), "batch");
  if (s.ok()) s = store_->db_->Write(batch, true, false, "abort checkpoint");
  if (!s.ok()) {
    // The intent stays; the next Open removes the data.
    ZPS_LOG(WARNING) << "abort of checkpoint " << step_ << ": " << s.ToString();
  }
}

std::vector<CheckpointWriter::Slice> CheckpointWriter::CutSlices(
    uint32_t chunk, uint8_t kind, std::span<const std::byte> data) const {
  const uint64_t slice = store_->options_.slice_bytes;
  const uint64_t n = (data.size() + slice - 1) / slice;
  std::vector<Slice> out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    out.push_back({chunk, kind, static_cast<uint32_t>(i),
                   data.subspan(i * slice, std::min<uint64_t>(slice, data.size() - i * slice))});
  }
  return out;
}

Status CheckpointWriter::PutSlices(const std::vector<Slice>& slices) {
  // Thread t writes slices t, t + T, t + 2T, ... with its own batch: the CRC, the copy into the
  // batch and RocksDB's concurrent memtable insert run on T cores at once.
  const size_t threads = std::min(batches_.size(), slices.size());
  std::vector<Status> results(threads);
  auto stripe = [&](size_t t) {
    rocksdb::WriteBatch& batch = *batches_[t];
    for (size_t i = t; i < slices.size(); i += threads) {
      const Slice& sl = slices[i];
      batch.Clear();
      Status s = AddFramed(batch, DataKey(step_, sl.chunk, sl.kind, sl.index), sl.data);
      // No WAL: Commit() flushes before the manifest makes anything visible.
      if (s.ok()) s = store_->db_->Write(batch, false, true, "checkpoint data");
      if (!s.ok()) {
        results[t] = std::move(s);
        return;
      }
    }
  };
  if (threads > 1 && store_->write_pool_ != nullptr) {
    store_->write_pool_->ParallelFor(threads, stripe);
  } else {
    for (size_t t = 0; t < threads; ++t) stripe(t);
  }
  for (auto& r : results) ZPS_RETURN_IF_ERROR(r);
  for (const auto& sl : slices) bytes_ += sl.data.size();
  return Status::Ok();
}

Status CheckpointWriter::AddChunk(uint32_t chunk, int64_t version, const ChunkTensors& t) {
  if (state_ != State::kOpen) return FailedPrecondition("checkpoint writer is not open");
  if (like_) return InvalidArgument("copied and added chunks cannot be mixed");
  auto it = std::lower_bound(local_.begin(), local_.end(), chunk);
  if (it == local_.end() || *it != chunk) {
    return OutOfRange("chunk " + std::to_string(chunk) + " is not on shard " +
                      std::to_string(shard_));
  }
  const size_t idx = static_cast<size_t>(it - local_.begin());
  const uint64_t elems = layout_.chunk_size(chunk);
  const uint64_t moment = MomentBytes(state_dtype_, elems);
  if (t.master.size() != elems || t.m.size() != moment || t.v.size() != moment) {
    return InvalidArgument("chunk " + std::to_string(chunk) + ": the master must have " +
                           std::to_string(elems) + " elements, m and v " + std::to_string(moment) +
                           " bytes of " + std::string(StateDTypeName(state_dtype_)) + " moments");
  }
  if (added_[idx]) return InvalidArgument("chunk " + std::to_string(chunk) + " added twice");
  const std::span<const std::byte> parts[3] = {std::as_bytes(t.master), t.m, t.v};
  std::vector<Slice> slices;
  for (uint8_t k = 0; k < 3; ++k) {
    auto more = CutSlices(chunk, k, parts[k]);
    slices.insert(slices.end(), more.begin(), more.end());
  }
  if (Status s = PutSlices(slices); !s.ok()) {
    state_ = State::kFailed;
    return s;
  }
  added_[idx] = true;
  chunks_.push_back({chunk, version, elems});
  return Status::Ok();
}

Status CheckpointWriter::SetState(std::span<const std::byte> state) {
  if (state_ != State::kOpen) return FailedPrecondition("checkpoint writer is not open");
  if (has_state_) return InvalidArgument("checkpoint state set twice");
  if (state.size() > store_->options_.slice_bytes) {
    return InvalidArgument("checkpoint state larger than slice_bytes");
  }
  Status s = PutSlices(CutSlices(kStateChunk, kState, state));
  if (!s.ok()) {
    state_ = State::kFailed;
    return s;
  }
  has_state_ = true;
  state_len_ = state.size();
  state_crc_ = Crc32c(state);
  return Status::Ok();
}

Status CheckpointWriter::AdoptFormat(const Manifest& src, const std::string& where) {
  if (state_ != State::kOpen) return FailedPrecondition("checkpoint writer is not open");
  if (src.info.step != step_) {
    return InvalidArgument("checkpoint " + std::to_string(step_) + ": cannot copy from step " +
                           std::to_string(src.info.step));
  }
  if (!like_) {
    if (!chunks_.empty() || has_state_) {
      return InvalidArgument("checkpoint " + std::to_string(step_) +
                             ": copied and added chunks cannot be mixed");
    }
    like_ = std::make_unique<Manifest>(src);
    return Status::Ok();
  }
  if (src.slice_bytes != like_->slice_bytes) {
    return InvalidArgument("checkpoint " + std::to_string(step_) + ": " + where +
                           " was written with " + std::to_string(src.slice_bytes) +
                           "-byte slices, earlier copies with " +
                           std::to_string(like_->slice_bytes));
  }
  return Status::Ok();
}

Result<ChunkEntry> CheckpointWriter::CheckCopy(const Manifest& src, uint32_t chunk,
                                               const std::string& where) {
  ZPS_RETURN_IF_ERROR(AdoptFormat(src, where));
  auto it = std::lower_bound(local_.begin(), local_.end(), chunk);
  if (it == local_.end() || *it != chunk) {
    return OutOfRange("chunk " + std::to_string(chunk) + " is not on shard " +
                      std::to_string(shard_));
  }
  const size_t idx = static_cast<size_t>(it - local_.begin());
  if (added_[idx]) return InvalidArgument("chunk " + std::to_string(chunk) + " added twice");
  const ChunkEntry* e = src.info.FindChunk(chunk);
  if (e == nullptr) {
    return NotFound("chunk " + std::to_string(chunk) + " not in checkpoint " +
                    std::to_string(step_) + " of " + where);
  }
  if (e->elems != layout_.chunk_size(chunk)) {
    return InvalidArgument("chunk " + std::to_string(chunk) + " has " + std::to_string(e->elems) +
                           " elements in " + where + ", " +
                           std::to_string(layout_.chunk_size(chunk)) + " in this layout");
  }
  return *e;
}

Status CheckpointWriter::CopyChunk(const CheckpointReader& from, uint32_t chunk) {
  ZPS_ASSIGN_OR_RETURN(ChunkEntry entry, CheckCopy(*from.manifest_, chunk, from.store_->dir()));
  Status s = CopyValues(from, chunk);
  if (!s.ok()) {
    state_ = State::kFailed;
    return s;
  }
  added_[static_cast<size_t>(std::lower_bound(local_.begin(), local_.end(), chunk) -
                             local_.begin())] = true;
  chunks_.push_back(entry);
  return Status::Ok();
}

Status CheckpointWriter::CopyState(const CheckpointReader& from) {
  ZPS_RETURN_IF_ERROR(AdoptFormat(*from.manifest_, from.store_->dir()));
  if (has_state_) return InvalidArgument("checkpoint state set twice");
  const Manifest& src = *from.manifest_;
  if (src.has_state) {
    Status s = CopyValues(from, kStateChunk);
    if (!s.ok()) {
      state_ = State::kFailed;
      return s;
    }
  }
  has_state_ = src.has_state;
  state_len_ = src.state_len;
  state_crc_ = src.state_crc;
  return Status::Ok();
}

namespace {
// The keys of `chunk`'s values in checkpoint `step`: [begin, end).
std::pair<std::string, std::string> ChunkKeyRange(int64_t step, uint32_t chunk) {
  std::string begin = StepKey('d', step), end = begin;
  PutBe32(begin, chunk);
  if (chunk == kStateChunk) {
    end = StepKey('d', step + 1);
  } else {
    PutBe32(end, chunk + 1);
  }
  return {std::move(begin), std::move(end)};
}
}  // namespace

class CheckpointWriter::CopySink {
 public:
  CopySink(Db* db, rocksdb::WriteBatch* batch, uint64_t batch_bytes,
           std::unique_ptr<detail::TableFile> table)
      : db_(db), batch_(batch), batch_bytes_(batch_bytes), table_(std::move(table)) {
    batch_->Clear();
  }
  ~CopySink() { batch_->Clear(); }
  CopySink(const CopySink&) = delete;
  CopySink& operator=(const CopySink&) = delete;

  // Keys ascending (a table file takes no other order).
  Status Put(std::string_view key, std::string_view value) {
    if (table_) return table_->Put(key, value);
    ZPS_RETURN_IF_ERROR(FromRocks(batch_->Put(rocksdb::Slice(key.data(), key.size()),
                                              rocksdb::Slice(value.data(), value.size())),
                                  "batch put"));
    if (batch_->GetDataSize() < batch_bytes_) return Status::Ok();
    return WriteBatch();
  }
  Status Finish() { return table_ ? table_->Ingest() : WriteBatch(); }

 private:
  Status WriteBatch() {
    Status s = Status::Ok();
    // No WAL: Commit() flushes before the manifest makes anything visible.
    if (batch_->Count() > 0) s = db_->Write(*batch_, false, true, "checkpoint data");
    batch_->Clear();
    return s;
  }
  Db* db_;
  rocksdb::WriteBatch* batch_;
  uint64_t batch_bytes_;
  std::unique_ptr<detail::TableFile> table_;
};

Result<std::unique_ptr<CheckpointWriter::CopySink>> CheckpointWriter::OpenCopy(uint32_t chunk) {
  std::unique_ptr<detail::TableFile> table;
  if (store_->options_.ingest_copies) {
    ZPS_ASSIGN_OR_RETURN(
        table,
        detail::TableFile::Create(
            store_->db_.get(), store_->dir() + "/" + std::string(kTablePrefix) +
                                   std::to_string(step_) + "-" + std::to_string(chunk) + ".sst"));
  }
  return std::make_unique<CopySink>(store_->db_.get(), batches_[0].get(),
                                    store_->options_.slice_bytes, std::move(table));
}

Status CheckpointWriter::CopyValues(const CheckpointReader& from, uint32_t chunk) {
  // The key holds the step, chunk, kind and slice, none of them the shard: a value is stored
  // under the same key in the new store, and its framed bytes (CRC included) stay valid. The
  // values come in key order, as a table file takes them (CheckpointOptions::ingest_copies).
  auto [begin, end] = ChunkKeyRange(step_, chunk);
  ZPS_ASSIGN_OR_RETURN(auto sink, OpenCopy(chunk));
  uint64_t payload = 0;
  ZPS_RETURN_IF_ERROR(from.store_->db_->ForEach(
      begin, end, from.snapshot_->get(),
      [&](std::string_view key, std::string_view value) -> Status {
        auto p = detail::Unframe(key, value);
        if (!p.ok()) {
          return p.status().WithContext("checkpoint " + std::to_string(step_) + " in " +
                                        from.store_->dir() + ", chunk " + std::to_string(chunk));
        }
        payload += p->size();
        return sink->Put(key, value);
      }));
  if (payload == 0) {
    return DataLoss("checkpoint " + std::to_string(step_) + " in " + from.store_->dir() +
                    ": no value stored for chunk " + std::to_string(chunk));
  }
  ZPS_RETURN_IF_ERROR(sink->Finish());
  bytes_ += payload;
  return Status::Ok();
}

Status CheckpointWriter::PutStored(std::span<const std::byte> manifest, uint32_t chunk,
                                   std::span<const StoredValue> values) {
  const std::string where = "a peer's checkpoint " + std::to_string(step_);
  auto src = DecodeManifest(step_, manifest);
  if (!src.ok()) return src.status().WithContext(where);
  ChunkEntry entry;
  if (chunk == kStateChunk) {
    ZPS_RETURN_IF_ERROR(AdoptFormat(*src, where));
    if (has_state_) return InvalidArgument("checkpoint state set twice");
  } else {
    ZPS_ASSIGN_OR_RETURN(entry, CheckCopy(*src, chunk, where));
  }
  // Named references, not a structured binding: clang 14 cannot capture those in the lambda.
  const auto range = ChunkKeyRange(step_, chunk);
  const std::string& begin = range.first;
  const std::string& end = range.second;
  uint64_t payload = 0;
  auto put = [&]() -> Status {
    if (values.empty()) {
      return DataLoss(where + ": no value stored for chunk " + std::to_string(chunk));
    }
    ZPS_ASSIGN_OR_RETURN(auto sink, OpenCopy(chunk));
    for (size_t i = 0; i < values.size(); ++i) {
      const StoredValue& v = values[i];
      if (v.key < begin || v.key >= end) {
        return DataLoss(where + ": a value for chunk " + std::to_string(chunk) +
                        " has a key of another step or chunk");
      }
      if (i > 0 && v.key <= values[i - 1].key) {
        return DataLoss(where + ": the values for chunk " + std::to_string(chunk) +
                        " are not in key order");
      }
      auto p = detail::Unframe(v.key, v.value);
      if (!p.ok()) return p.status().WithContext(where + ", chunk " + std::to_string(chunk));
      payload += p->size();
      ZPS_RETURN_IF_ERROR(sink->Put(v.key, v.value));
    }
    if (payload == 0) {
      return DataLoss(where + ": no value stored for chunk " + std::to_string(chunk));
    }
    return sink->Finish();
  };
  Status s = put();
  if (!s.ok()) {
    state_ = State::kFailed;
    return s;
  }
  bytes_ += payload;
  if (chunk == kStateChunk) {
    has_state_ = src->has_state;
    state_len_ = src->state_len;
    state_crc_ = src->state_crc;
  } else {
    added_[static_cast<size_t>(std::lower_bound(local_.begin(), local_.end(), chunk) -
                               local_.begin())] = true;
    chunks_.push_back(entry);
  }
  return Status::Ok();
}

Status CheckpointWriter::Commit() {
  if (state_ != State::kOpen) return FailedPrecondition("checkpoint writer is not open");
  for (size_t i = 0; i < local_.size(); ++i) {
    if (!added_[i]) {
      return FailedPrecondition("checkpoint " + std::to_string(step_) + ": chunk " +
                                std::to_string(local_[i]) + " was not added");
    }
  }
  state_ = State::kFailed;  // until the commit batch is written
  // 1. The data reaches synced SST and blob files.
  ZPS_RETURN_IF_ERROR(store_->db_->Flush());
  // 2. One synced batch makes it visible.
  CheckpointInfo info;
  info.step = step_;
  info.created_unix_ms = NowUnixMs();
  info.layout_hash = layout_.Hash();
  info.shard = shard_;
  info.bytes = bytes_;
  info.chunks = chunks_;
  info.state_dtype = state_dtype_;
  std::sort(info.chunks.begin(), info.chunks.end(),
            [](const ChunkEntry& a, const ChunkEntry& b) { return a.chunk < b.chunk; });
  Manifest m;
  if (like_) m = *like_;  // copied chunks keep their source's format fields
  m.info = std::move(info);
  if (!like_) m.slice_bytes = store_->options_.slice_bytes;
  m.has_state = has_state_;
  m.state_len = state_len_;
  m.state_crc = state_crc_;
  auto manifest = EncodeManifest(m);
  rocksdb::WriteBatch batch;
  ZPS_RETURN_IF_ERROR(AddFramed(batch, StepKey('m', step_), manifest));
  ZPS_RETURN_IF_ERROR(FromRocks(batch.Delete(StepKey('p', step_)), "batch"));
  ZPS_RETURN_IF_ERROR(store_->db_->Write(batch, true, false, "commit checkpoint"));
  state_ = State::kCommitted;
  // 3. Older checkpoints go.
  Status gc = store_->CollectGarbage();
  if (!gc.ok()) {
    ZPS_LOG(WARNING) << "checkpoint " << step_
                     << " committed; garbage collection failed: " << gc.ToString();
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- reader

CheckpointReader::CheckpointReader(CheckpointStore* store, CheckpointInfo info)
    : store_(store), info_(std::move(info)) {}
CheckpointReader::~CheckpointReader() = default;

std::vector<uint32_t> CheckpointReader::chunks() const {
  std::vector<uint32_t> out;
  out.reserve(info_.chunks.size());
  for (const auto& c : info_.chunks) out.push_back(c.chunk);
  return out;
}

Status CheckpointReader::ReadSlices(uint32_t chunk, uint8_t kind, std::span<std::byte> out) const {
  const uint64_t n = (out.size() + slice_bytes_ - 1) / slice_bytes_;
  for (uint64_t i = 0; i < n; ++i) {
    auto part = out.subspan(i * slice_bytes_,
                            std::min<uint64_t>(slice_bytes_, out.size() - i * slice_bytes_));
    Status s = store_->db_->GetFramedInto(
        DataKey(info_.step, chunk, kind, static_cast<uint32_t>(i)), part, snapshot_->get());
    if (!s.ok()) {
      static constexpr const char* kNames[] = {"master", "m", "v", "state"};
      return s.WithContext("checkpoint " + std::to_string(info_.step) + " in " + store_->dir() +
                           ", chunk " + std::to_string(chunk) + " " + kNames[kind] + " slice " +
                           std::to_string(i));
    }
  }
  return Status::Ok();
}

Status CheckpointReader::ReadChunk(uint32_t chunk, const ChunkTensorsOut& out) const {
  const ChunkEntry* it = info_.FindChunk(chunk);
  if (it == nullptr) {
    return NotFound("chunk " + std::to_string(chunk) + " not in checkpoint " +
                    std::to_string(info_.step));
  }
  const uint64_t moment = MomentBytes(info_.state_dtype, it->elems);
  const std::span<std::byte> parts[3] = {std::as_writable_bytes(out.master), out.m, out.v};
  const uint64_t want[3] = {it->elems * sizeof(float), moment, moment};
  for (uint8_t k = 0; k < 3; ++k) {
    if (parts[k].empty()) continue;
    if (parts[k].size() != want[k]) {
      return InvalidArgument("chunk " + std::to_string(chunk) + " of checkpoint " +
                             std::to_string(info_.step) + " has " + std::to_string(it->elems) +
                             " elements (m and v: " + std::to_string(moment) + " bytes of " +
                             std::string(StateDTypeName(info_.state_dtype)) + " moments)");
    }
    ZPS_RETURN_IF_ERROR(ReadSlices(chunk, k, parts[k]));
  }
  return Status::Ok();
}

std::vector<std::byte> CheckpointReader::EncodedManifest() const {
  return internal::EncodeManifest(*manifest_);
}

Result<std::vector<StoredValue>> CheckpointReader::ReadStored(uint32_t chunk,
                                                              std::string_view after,
                                                              size_t max_bytes, bool* more) const {
  if (chunk != kStateChunk) {
    if (info_.FindChunk(chunk) == nullptr) {
      return NotFound("chunk " + std::to_string(chunk) + " not in checkpoint " +
                      std::to_string(info_.step) + " of " + store_->dir());
    }
  }
  auto [begin, end] = ChunkKeyRange(info_.step, chunk);
  if (!after.empty()) {
    if (after < begin || after >= end) {
      return InvalidArgument("key to resume after is not one of chunk " + std::to_string(chunk));
    }
    begin = std::string(after);
    begin.push_back('\0');  // the next key after `after`
  }
  std::vector<StoredValue> out;
  size_t bytes = 0;
  bool full = false;
  Status s = store_->db_->ForEach(
      begin, end, snapshot_->get(), [&](std::string_view key, std::string_view value) -> Status {
        if (full) {
          return Cancelled("page full");  // one value beyond the page: more follow
        }
        auto p = detail::Unframe(key, value);
        if (!p.ok()) {
          return p.status().WithContext("checkpoint " + std::to_string(info_.step) + " in " +
                                        store_->dir() + ", chunk " + std::to_string(chunk));
        }
        out.push_back({std::string(key), std::string(value)});
        bytes += key.size() + value.size();
        full = bytes >= max_bytes;
        return Status::Ok();
      });
  if (!s.ok() && !(full && s.code() == Code::kCancelled)) return s;
  *more = !s.ok();
  return out;
}

Result<std::vector<std::byte>> CheckpointReader::ReadState() const {
  std::vector<std::byte> out(has_state_ ? state_len_ : 0);
  if (!has_state_) return out;
  ZPS_RETURN_IF_ERROR(ReadSlices(kStateChunk, kState, out));
  if (Crc32c(out) != state_crc_) return DataLoss("checkpoint state does not match its manifest");
  return out;
}

Status CheckpointReader::Verify() const {
  std::vector<std::byte> buf;
  for (const auto& c : info_.chunks) {
    for (uint8_t k = 0; k < 3; ++k) {
      buf.resize(k == kMaster ? c.elems * sizeof(float) : MomentBytes(info_.state_dtype, c.elems));
      ZPS_RETURN_IF_ERROR(ReadSlices(c.chunk, k, buf));
    }
  }
  return ReadState().status();
}

}  // namespace zps::server
