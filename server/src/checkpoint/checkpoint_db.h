// checkpoint_db.h (private) — the one RocksDB owner shared by CheckpointStore and
// CoordinatorCatalog: options tuned for large sequential values, the rocksdb::Status → zps::Status
// conversion (the only one in the project), CRC-framed values and big-endian key encoding.
//
// Thread-safety: Db is as thread-safe as rocksdb::DB (every call may run concurrently).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"
#include "zps/server/checkpoint.h"

namespace rocksdb {
class DB;
class Status;
class WriteBatch;
class Snapshot;
class SstFileWriter;
}  // namespace rocksdb

namespace zps::server::detail {

/// The single conversion from rocksdb::Status. `what` names the operation and the directory.
/// NoSpace → ResourceExhausted, Corruption → DataLoss, IOError → IoError, NotFound → NotFound,
/// Busy/TimedOut/TryAgain → Unavailable, InvalidArgument/NotSupported → InvalidArgument,
/// everything else → Internal. Logs the error (this is where it is first decided).
Status FromRocks(const rocksdb::Status& s, std::string_view what);

/// Big-endian encoders: keys sort by number.
void PutBe64(std::string& out, uint64_t v);
void PutBe32(std::string& out, uint32_t v);
uint64_t GetBe64(const char* p);
uint32_t GetBe32(const char* p);

/// A stored value is crc32c(key ‖ payload) as 4 little-endian bytes, then the payload; the key in
/// the CRC catches a value written under the wrong key. Frame returns the 4-byte prefix.
std::array<char, 4> FrameCrc(std::string_view key, std::span<const std::byte> payload);
/// Checks a framed value and returns its payload (a view into `value`). Errors: DataLoss.
Result<std::span<const std::byte>> Unframe(std::string_view key, std::string_view value);

class Db {
 public:
  /// Opens (or creates, per options) the database in `dir`. Errors: as FromRocks, plus
  /// InvalidArgument for bad options.
  static Result<std::unique_ptr<Db>> Open(const std::string& dir, const CheckpointOptions& options);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  const std::string& dir() const { return dir_; }
  bool read_only() const { return read_only_; }
  rocksdb::DB* raw() { return db_.get(); }

  /// Writes a batch. `sync` fsyncs the WAL; `no_wal` skips it (durable only after Flush()).
  Status Write(rocksdb::WriteBatch& batch, bool sync, bool no_wal, std::string_view what);
  /// Reads a framed value. Errors: NotFound, DataLoss (CRC), IoError.
  Result<std::vector<std::byte>> GetFramed(std::string_view key, const rocksdb::Snapshot* snap);
  /// Reads a framed value into `out` (exactly out.size() payload bytes expected, else DataLoss).
  Status GetFramedInto(std::string_view key, std::span<std::byte> out,
                       const rocksdb::Snapshot* snap);
  /// Puts a framed value in a synced batch of its own.
  Status PutFramedSync(std::string_view key, std::span<const std::byte> payload);
  /// Keys (and raw values) in [begin, end), in order. Values are copied: use for small ones only.
  Result<std::vector<std::pair<std::string, std::string>>> Scan(std::string_view begin,
                                                                std::string_view end);
  /// Calls `fn(key, raw value)` for each key in [begin, end), in order, as of `snap` (nullptr:
  /// now), without copying; stops at fn's first error. RocksDB's own blob CRC is skipped: the
  /// caller checks the values' framing. Errors: fn's, IoError, DataLoss.
  Status ForEach(std::string_view begin, std::string_view end, const rocksdb::Snapshot* snap,
                 const std::function<Status(std::string_view key, std::string_view value)>& fn);
  /// Flushes the memtables and waits: everything written so far is in synced files.
  Status Flush();
  /// Compacts [begin, end) down to the bottom level (reclaims deleted ranges and blob files).
  Status Compact(std::string_view begin, std::string_view end);
  /// Bytes of SST and blob files of the live version.
  uint64_t LiveBytes();

 private:
  Db() = default;
  struct Closer {
    void operator()(rocksdb::DB* db) const;
  };
  std::string dir_;
  bool read_only_ = false;
  std::shared_ptr<void> keep_alive_;  // objects the options point at (rate limiter, ...)
  std::unique_ptr<rocksdb::DB, Closer> db_;
};

/// A table (SST) file of framed values, written beside the database and then moved into it
/// (IngestExternalFile): the values skip the write batch, the memtable and the flush. For values
/// copied in key order (resharding), which a shard's checkpoint writes are not. Until ingested the
/// file is the caller's: it is removed when the TableFile is destroyed. Not thread-safe.
///
/// Values stay inline in the table (no blob files): a store whose copied checkpoint is read by
/// Get and iterators alike, and a later compaction of a deleted step drops them.
class TableFile {
 public:
  /// Starts `path` (in the database's directory, named so that RocksDB ignores it). Errors: as
  /// FromRocks (IoError, ResourceExhausted).
  static Result<std::unique_ptr<TableFile>> Create(Db* db, std::string path);
  ~TableFile();
  TableFile(const TableFile&) = delete;
  TableFile& operator=(const TableFile&) = delete;

  /// Appends one value; keys must ascend strictly. Errors: InvalidArgument (order),
  /// ResourceExhausted (disk full), IoError.
  Status Put(std::string_view key, std::string_view value);
  /// Finishes and syncs the file and moves it into the database, at the lowest level it fits
  /// (nothing is rewritten). Errors: InvalidArgument (no values), ResourceExhausted, IoError.
  Status Ingest();

 private:
  TableFile() = default;
  Db* db_ = nullptr;
  std::string path_;
  bool ingested_ = false;
  std::unique_ptr<rocksdb::SstFileWriter> writer_;
};

/// RAII over a rocksdb snapshot.
class Snapshot {
 public:
  explicit Snapshot(Db* db);
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  const rocksdb::Snapshot* get() const { return snap_; }

 private:
  Db* db_;
  const rocksdb::Snapshot* snap_;
};

}  // namespace zps::server::detail
