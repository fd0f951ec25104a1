#include "checkpoint_db.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "zps/common/crc32c.h"
#include "zps/common/logging.h"

// RocksDB's own CRC32C, with the crc32 instruction. The distribution's librocksdb is a portable
// build: its crc32c::Extend is the table-driven Slow_CRC32 (~1 GB/s), and every blob record is
// CRC'd on write (BlobLogWriter) and on read (BlobFileReader::VerifyBlob) — measured as ~40% of a
// checkpoint's CPU time. server/CMakeLists.txt links with
// --wrap=_ZN7rocksdb6crc32c6ExtendEjPKcm, so the statically linked RocksDB calls this instead;
// the result is the same CRC32C (same pre/post conditioning), so files stay compatible both ways.
// (Against a shared librocksdb the option has no effect and RocksDB keeps its own.)
extern "C" uint32_t __wrap__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char* buf,
                                                           size_t size);
extern "C" uint32_t __wrap__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char* buf,
                                                           size_t size) {
  return zps::Crc32cExtend(
      crc, std::span<const std::byte>(reinterpret_cast<const std::byte*>(buf), size));
}

namespace zps::server::detail {

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string msg = std::string(what) + ": " + s.ToString();
  Status out;
  if (s.IsNoSpace()) {
    out = ResourceExhausted(msg + " (disk full)");
  } else if (s.IsCorruption()) {
    out = DataLoss(msg);
  } else if (s.IsNotFound()) {
    return NotFound(msg);  // an answer, not a failure: not logged
  } else if (s.IsIOError()) {
    out = IoError(msg);
  } else if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    out = Unavailable(msg);
  } else if (s.IsInvalidArgument() || s.IsNotSupported()) {
    out = InvalidArgument(msg);
  } else {
    out = Internal(msg);
  }
  ZPS_LOG(ERROR) << "rocksdb: " << out.ToString();
  return out;
}

void PutBe64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutBe32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetBe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint32_t GetBe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::array<char, 4> FrameCrc(std::string_view key, std::span<const std::byte> payload) {
  uint32_t crc = Crc32c(key.data(), key.size());
  crc = Crc32cExtend(crc, payload);
  std::array<char, 4> out;
  std::memcpy(out.data(), &crc, 4);
  return out;
}

Result<std::span<const std::byte>> Unframe(std::string_view key, std::string_view value) {
  if (value.size() < 4) {
    return DataLoss("value of key " + std::to_string(key.size()) + "-byte key is truncated (" +
                    std::to_string(value.size()) + " bytes)");
  }
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(value.data()) + 4,
                                     value.size() - 4);
  auto want = FrameCrc(key, payload);
  if (std::memcmp(want.data(), value.data(), 4) != 0) {
    return DataLoss("CRC32C mismatch in a stored value (" + std::to_string(payload.size()) +
                    " bytes)");
  }
  return payload;
}

void Db::Closer::operator()(rocksdb::DB* db) const {
  rocksdb::Status s = db->Close();
  if (!s.ok()) FromRocks(s, "close").IgnoreError();
  delete db;  // NOLINT: rocksdb::DB::Open hands out a raw owning pointer
}

Db::~Db() = default;

Result<std::unique_ptr<Db>> Db::Open(const std::string& dir, const CheckpointOptions& o) {
  ZPS_RETURN_IF_ERROR(o.Validate());
  rocksdb::Options opt;
  opt.create_if_missing = o.create_if_missing && !o.read_only;
  if (o.env != nullptr) opt.env = o.env;
  // Tensors are incompressible floats, and the catalog is small.
  opt.compression = rocksdb::kNoCompression;
  opt.bottommost_compression = rocksdb::kNoCompression;
  // Integrated BlobDB: tensor slices go to blob files written once, sequentially, at flush.
  opt.enable_blob_files = true;
  opt.min_blob_size = 4096;
  opt.blob_file_size = 256ull << 20;
  opt.blob_compression_type = rocksdb::kNoCompression;
  opt.write_buffer_size = o.write_buffer_bytes;
  opt.max_write_buffer_number = o.max_write_buffers;
  opt.min_write_buffer_number_to_merge = 1;
  opt.max_background_jobs = o.background_jobs;
  // Several memtables flush at once: more blob-file writes in flight (the disk wants depth).
  opt.max_background_flushes = std::max(1, o.background_jobs - 1);
  // Large writes per call, as fio's 1 MiB x depth 16.
  opt.writable_file_max_buffer_size = o.write_io_bytes;
  opt.use_direct_io_for_flush_and_compaction = o.direct_writes;
  opt.use_direct_reads = o.direct_reads;
  // Write back in the background as files grow, so the final fsync has little left to do.
  opt.bytes_per_sync = 8ull << 20;
  opt.rate_limiter = nullptr;
  opt.keep_log_file_num = 4;
  opt.max_manifest_file_size = 64ull << 20;
  // Not -1 (RocksDB's default): with -1, a read-only open of a database with at most one table
  // file per level takes RocksDB's CompactedDBImpl path, whose Get cannot resolve blob values
  // (facebook/rocksdb#12503): after a shard's compaction, zps-ckpt export and inspect found every
  // tensor of every checkpoint "missing".
  opt.max_open_files = 4096;
  if (o.low_priority) {
    rocksdb::Env* env = o.env != nullptr ? o.env : rocksdb::Env::Default();
    for (auto pool : {rocksdb::Env::Priority::HIGH, rocksdb::Env::Priority::LOW}) {
      rocksdb::Status ps = env->LowerThreadPoolCPUPriority(pool, rocksdb::CpuPriority::kIdle);
      if (!ps.ok()) ZPS_LOG(DEBUG) << "checkpoint store: " << ps.ToString();
    }
  }

  auto out = std::unique_ptr<Db>(new Db());
  out->dir_ = dir;
  out->read_only_ = o.read_only;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = o.read_only ? rocksdb::DB::OpenForReadOnly(opt, dir, &raw)
                                  : rocksdb::DB::Open(opt, dir, &raw);
  // A read-only open beside a live shard (zps-ckpt export of a running job) reads the MANIFEST,
  // then opens the table files it lists; a compaction of the shard can delete one in between
  // (RocksDB reports it as Corruption or PathNotFound: "No such file or directory"). Opening
  // again reads the newer MANIFEST. A value read later from a blob file that the shard's garbage
  // collection deleted since still fails, as an error of that read.
  auto file_vanished = [](const rocksdb::Status& st) {
    return st.IsPathNotFound() ||
           (st.IsCorruption() && st.ToString().find("No such file") != std::string::npos);
  };
  for (int attempt = 1; o.read_only && attempt < 5 && file_vanished(s); ++attempt) {
    ZPS_LOG(DEBUG) << "checkpoint store " << dir << ": " << s.ToString() << "; opening again";
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
    s = rocksdb::DB::OpenForReadOnly(opt, dir, &raw);
  }
  if (!s.ok()) {
    if (s.IsInvalidArgument() && s.ToString().find("does not exist") != std::string::npos) {
      return NotFound("checkpoint store " + dir + ": " + s.ToString());
    }
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return Unavailable("checkpoint store " + dir + " is open elsewhere: " + s.ToString());
    }
    return FromRocks(s, "open " + dir);
  }
  out->db_.reset(raw);
  return out;
}

Status Db::Write(rocksdb::WriteBatch& batch, bool sync, bool no_wal, std::string_view what) {
  if (read_only_) return FailedPrecondition("checkpoint store " + dir_ + " is open read-only");
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  wo.disableWAL = no_wal;
  return FromRocks(db_->Write(wo, &batch), std::string(what) + " in " + dir_);
}

namespace {
rocksdb::ReadOptions ReadOpts(const rocksdb::Snapshot* snap, bool rocks_checksums = true) {
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  ro.fill_cache = false;  // tensors are read once
  ro.verify_checksums = rocks_checksums;
  return ro;
}
}  // namespace

Result<std::vector<std::byte>> Db::GetFramed(std::string_view key, const rocksdb::Snapshot* snap) {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(ReadOpts(snap), db_->DefaultColumnFamily(),
                               rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return NotFound("no value for the key");
  ZPS_RETURN_IF_ERROR(FromRocks(s, "read from " + dir_));
  ZPS_ASSIGN_OR_RETURN(auto payload, Unframe(key, value.ToStringView()));
  return std::vector<std::byte>(payload.begin(), payload.end());
}

Status Db::GetFramedInto(std::string_view key, std::span<std::byte> out,
                         const rocksdb::Snapshot* snap) {
  rocksdb::PinnableSlice value;
  // RocksDB's blob-record CRC is skipped here: the value's own CRC32C over key and payload
  // (Unframe, below) checks the same bytes end to end, and a second pass costs read throughput.
  rocksdb::Status s =
      db_->Get(ReadOpts(snap, /*rocks_checksums=*/false), db_->DefaultColumnFamily(),
               rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return DataLoss("a value of the checkpoint is missing");
  ZPS_RETURN_IF_ERROR(FromRocks(s, "read from " + dir_));
  ZPS_ASSIGN_OR_RETURN(auto payload, Unframe(key, value.ToStringView()));
  if (payload.size() != out.size()) {
    return DataLoss("a stored value has " + std::to_string(payload.size()) + " bytes, expected " +
                    std::to_string(out.size()));
  }
  std::memcpy(out.data(), payload.data(), out.size());
  return Status::Ok();
}

Status Db::PutFramedSync(std::string_view key, std::span<const std::byte> payload) {
  auto crc = FrameCrc(key, payload);
  rocksdb::Slice kparts[1] = {rocksdb::Slice(key.data(), key.size())};
  rocksdb::Slice vparts[2] = {
      rocksdb::Slice(crc.data(), 4),
      rocksdb::Slice(reinterpret_cast<const char*>(payload.data()), payload.size())};
  rocksdb::WriteBatch batch;
  ZPS_RETURN_IF_ERROR(FromRocks(
      batch.Put(rocksdb::SliceParts(kparts, 1), rocksdb::SliceParts(vparts, 2)), "batch"));
  return Write(batch, /*sync=*/true, /*no_wal=*/false, "catalog write");
}

Result<std::vector<std::pair<std::string, std::string>>> Db::Scan(std::string_view begin,
                                                                  std::string_view end) {
  rocksdb::ReadOptions ro = ReadOpts(nullptr);
  rocksdb::Slice upper(end.data(), end.size());
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  std::vector<std::pair<std::string, std::string>> out;
  for (it->Seek(rocksdb::Slice(begin.data(), begin.size())); it->Valid(); it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  ZPS_RETURN_IF_ERROR(FromRocks(it->status(), "scan " + dir_));
  return out;
}

Status Db::ForEach(std::string_view begin, std::string_view end, const rocksdb::Snapshot* snap,
                   const std::function<Status(std::string_view key, std::string_view value)>& fn) {
  rocksdb::ReadOptions ro = ReadOpts(snap, /*rocks_checksums=*/false);
  rocksdb::Slice upper(end.data(), end.size());
  ro.iterate_upper_bound = &upper;
  ro.readahead_size = 8ull << 20;  // values are read in key order, which is file order
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek(rocksdb::Slice(begin.data(), begin.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key(), v = it->value();
    ZPS_RETURN_IF_ERROR(
        fn(std::string_view(k.data(), k.size()), std::string_view(v.data(), v.size())));
  }
  return FromRocks(it->status(), "read " + dir_);
}

Status Db::Flush() {
  if (read_only_) return FailedPrecondition("checkpoint store " + dir_ + " is open read-only");
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return FromRocks(db_->Flush(fo), "flush " + dir_);
}

Status Db::Compact(std::string_view begin, std::string_view end) {
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  rocksdb::Slice b(begin.data(), begin.size()), e(end.data(), end.size());
  return FromRocks(db_->CompactRange(co, &b, &e), "compact " + dir_);
}

uint64_t Db::LiveBytes() {
  uint64_t sst = 0, blob = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kLiveSstFilesSize, &sst);
  db_->GetIntProperty(rocksdb::DB::Properties::kLiveBlobFileSize, &blob);
  return sst + blob;
}

namespace {
// The table file writer's buffer: less than a tensor slice (4 MiB by default).
constexpr size_t kTableWriteBuffer = 1 << 20;
}  // namespace

Result<std::unique_ptr<TableFile>> TableFile::Create(Db* db, std::string path) {
  if (db->read_only()) {
    return FailedPrecondition("checkpoint store " + db->dir() + " is open read-only");
  }
  auto out = std::unique_ptr<TableFile>(new TableFile());
  out->db_ = db;
  out->path_ = std::move(path);
  // The database's own options: no compression, its Env (and so its faults in tests), and
  // direct writes when the store has them. Buffered, the writer's buffer is kept below a value's
  // size, so that a block of one 4 MiB value goes from the table builder to the file without a
  // copy into the buffer first (measured: docs/benchmarks.md, "Resharding (offline)"). Without
  // invalidate_page_cache: it would drop the file's whole page cache every MiB written;
  // bytes_per_sync already writes back as the file grows.
  rocksdb::Options options = db->raw()->GetOptions();
  if (!options.use_direct_io_for_flush_and_compaction) {
    options.writable_file_max_buffer_size =
        std::min<size_t>(options.writable_file_max_buffer_size, kTableWriteBuffer);
  }
  out->writer_ = std::make_unique<rocksdb::SstFileWriter>(rocksdb::EnvOptions(options), options,
                                                          db->raw()->DefaultColumnFamily(),
                                                          /*invalidate_page_cache=*/false);
  ZPS_RETURN_IF_ERROR(FromRocks(out->writer_->Open(out->path_), "create " + out->path_));
  return out;
}

TableFile::~TableFile() {
  if (ingested_) return;
  writer_.reset();
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

Status TableFile::Put(std::string_view key, std::string_view value) {
  return FromRocks(writer_->Put(rocksdb::Slice(key.data(), key.size()),
                                rocksdb::Slice(value.data(), value.size())),
                   "write " + path_);
}

Status TableFile::Ingest() {
  ZPS_RETURN_IF_ERROR(FromRocks(writer_->Finish(), "finish " + path_));  // synced
  rocksdb::IngestExternalFileOptions io;
  io.move_files = true;           // a hard link: the bytes are written once
  io.write_global_seqno = false;  // the file stays as written (its seqno is in the MANIFEST)
  io.verify_checksums_before_ingest = false;  // just written; values carry their own CRC
  ZPS_RETURN_IF_ERROR(
      FromRocks(db_->raw()->IngestExternalFile({path_}, io), "ingest into " + db_->dir()));
  ingested_ = true;
  return Status::Ok();
}

Snapshot::Snapshot(Db* db) : db_(db), snap_(db->raw()->GetSnapshot()) {}
Snapshot::~Snapshot() {
  if (snap_ != nullptr) db_->raw()->ReleaseSnapshot(snap_);
}

}  // namespace zps::server::detail
