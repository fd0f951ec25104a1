// zps/server/checkpoint.h — one shard's durable catalog and step-aligned checkpoints, in one
// RocksDB database per shard directory. A plain class: the shard process decides when to
// checkpoint (every K steps, on demand, at shutdown) and what to restore; this class only stores.
//
// What is stored (keys sort by step, so a checkpoint is one contiguous key range):
//   catalog   "c<name>"                         layout, shard ordinal, job spec, chunk versions...
//   intent    "p<step>"                         written (synced) by BeginCheckpoint
//   data      "d<step><chunk><kind><slice>"     master / m / v in slices of ≤ slice_bytes, and
//                                               an opaque state blob (optimizer, loss scaler)
//   manifest  "m<step>"                         the commit record: chunk ids, versions, sizes,
//                                               and the state dtype m and v are packed in
// m and v are stored as the shard keeps them, packed in the job's state dtype
// (zps/server/optimizer.h, MomentBytes): an fp32 checkpoint stores 4 bytes per element each, an
// int8 one about 1. The manifest records the dtype; a reader hands back the packed bytes, and
// the shard refuses to restore a checkpoint of another dtype (ShardCheckpoints::Restore).
// Every value carries a CRC32C over its key and payload, checked on every read (DataLoss).
// Large values go to integrated BlobDB blob files. A copied checkpoint (CopyChunk, PutStored:
// resharding) in a store opened with ingest_copies is written instead as one table file per
// chunk, moved into the database (IngestExternalFile) with its values inline; readers see no
// difference.
//
// Crash consistency: data is written without the WAL; Commit() flushes the memtables (the data is
// then in synced SST/blob files) and only then writes ONE synced WriteBatch that puts the manifest
// and removes the intent. Killed before that batch: the checkpoint never existed, and the next
// Open() deletes its leftovers (the intent says which step). Killed after: it is complete. Older
// checkpoints are removed (manifest first, in a synced batch, then DeleteRange + compaction), so
// at every kill point the last complete checkpoint stays loadable.
//
// Restoring after a crash:
//   ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(dir, {}));
//   ZPS_ASSIGN_OR_RETURN(auto info, store->LatestComplete(/*verify=*/true));  // falls back
//   ZPS_ASSIGN_OR_RETURN(auto reader, store->OpenCheckpoint(info.step));
//   // m and v: MomentBytes(reader->info().state_dtype, elems) bytes each
//   for (uint32_t c : reader->chunks()) reader->ReadChunk(c, {master, m, v});
// Rolling back to an older step S (the coordinator's choice): DropCheckpointsAfter(S) first, so
// the steps after S can be checkpointed again.
//
// Thread-safety: CheckpointStore's methods are thread-safe. At most one CheckpointWriter is open
// at a time; a writer and a reader are used by one thread each (a reader's const methods may be
// called from several threads at once). Writers and readers must not outlive their store.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/job_spec.h"
#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/thread_pool.h"
#include "zps/server/job.h"

namespace rocksdb {
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace zps::server {

namespace detail {
class Db;
class Snapshot;
}  // namespace detail
namespace internal {
struct Manifest;
}  // namespace internal

struct CheckpointOptions {
  uint32_t keep = 2;                          // Default: 2 — committed checkpoints kept (≥ 1).
  uint64_t slice_bytes = 4ull << 20;          // Default: 4 MiB — largest tensor value.
  uint64_t write_buffer_bytes = 64ull << 20;  // Default: 64 MiB — one memtable.
  int max_write_buffers = 8;                  // Default: 8 memtables (flushes overlap writes).
  int background_jobs = 8;                    // Default: 8 flush/compaction threads (up to
                                              // background_jobs - 1 flushes at once).
  uint64_t write_io_bytes = 8ull << 20;       // Default: 8 MiB per write call of a file.
  bool direct_writes = false;                 // Default: off — O_DIRECT flush/compaction
                                              // (needs a filesystem that supports it).
  bool direct_reads = false;                  // Default: off — O_DIRECT reads.
  int write_threads = 2;                      // Default: 2 — threads that frame and insert a
                                              // chunk's slices at once (1..64; includes the
                                              // caller of AddChunk).
  /// Default: false. true: the values CopyChunk and PutStored copy go into the store as one
  /// table file per chunk, moved in whole (IngestExternalFile), instead of through write
  /// batches, the memtables and their flush: each byte is copied fewer times, on the calling
  /// thread (zps-ckpt reshard's outputs; docs/checkpoints.md, "Changing the shard count").
  bool ingest_copies = false;
  bool create_if_missing = true;  // Default: true.
  bool read_only = false;         // Default: false — true for inspect/export
                                  // (works beside a live writer; sees state at
                                  // open). Writing calls return FailedPrecondition.
  /// Default: false. true: the store's own threads (write_threads helpers, and RocksDB's
  /// flush and compaction pools of its Env, process-wide) run at the lowest CPU priority, for a
  /// checkpoint written in the background beside training: they then take the CPU the step
  /// leaves idle.
  bool low_priority = false;
  rocksdb::Env* env = nullptr;  // Default: nullptr = rocksdb::Env::Default().
                                // Tests inject faults here; not owned.
  /// Errors: InvalidArgument.
  Status Validate() const;
};

/// The tensors of one chunk: the fp32 master (the chunk's size), and m and v packed in the
/// checkpoint's state dtype (MomentBytes(state_dtype, chunk size) bytes each). An empty span is
/// skipped on reading (read only the master for export).
struct ChunkTensors {
  std::span<const float> master;
  std::span<const std::byte> m, v;
};
struct ChunkTensorsOut {
  std::span<float> master;
  std::span<std::byte> m, v;
};

enum class Verification : uint8_t {
  kManifestOk = 0,  ///< the commit record parsed and its CRC matched; values not read
  kVerified = 1,    ///< every value read back and matched its CRC
  kCorrupt = 2,     ///< a bad manifest, or a value missing or failing its CRC (see `problem`)
};
std::string_view VerificationName(Verification v);

struct ChunkEntry {
  uint32_t chunk = 0;
  int64_t version = 0;  // the chunk's version when checkpointed
  uint64_t elems = 0;
};

struct CheckpointInfo {
  int64_t step = 0;
  int64_t created_unix_ms = 0;
  uint64_t layout_hash = 0;
  uint32_t shard = 0;
  uint64_t bytes = 0;  // payload bytes: tensors and state
  /// Ascending by chunk id, each id once (the writer sorts them; decoding a manifest checks it).
  std::vector<ChunkEntry> chunks;
  /// How m and v are packed (MomentBytes). Checkpoints written before state dtypes existed (and
  /// every fp32 one, whose manifest is unchanged) read as fp32.
  StateDType state_dtype = StateDType::kF32;
  Verification verification = Verification::kManifestOk;
  std::string problem;  // why kCorrupt

  /// The entry of `chunk` (a binary search of `chunks`), or nullptr when the checkpoint lacks it.
  const ChunkEntry* FindChunk(uint32_t chunk) const;
};

class CheckpointStore;
class CheckpointReader;

/// One value of a committed checkpoint as it is stored: its key (which names the step, chunk,
/// kind and slice, never the shard) and its framed bytes, CRC included. What CopyChunk copies,
/// carried between processes when shards reshard online (online_reshard.h).
struct StoredValue {
  std::string key;
  std::string value;
};
/// The chunk id under which a checkpoint's state blob is stored (ReadStored, PutStored).
inline constexpr uint32_t kStoredStateChunk = 0xffffffffu;

/// An open, uncommitted checkpoint. Destroying it without Commit() aborts it (its data is
/// deleted). Not thread-safe: one thread drives it (AddChunk spreads a chunk's slices over the
/// store's `write_threads` internally).
class CheckpointWriter {
 public:
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  int64_t step() const { return step_; }

  /// Adds one local chunk. master must have the chunk's size (from the layout), m and v
  /// MomentBytes(state dtype, chunk size) bytes; all three are required. Errors: OutOfRange (not a
  /// chunk of this shard), InvalidArgument (sizes, chunk added twice), FailedPrecondition
  /// (committed/aborted/failed writer), ResourceExhausted (disk full), IoError. After an error the
  /// writer is failed: only destruction (abort) remains.
  Status AddChunk(uint32_t chunk, int64_t version, const ChunkTensors& tensors);
  /// Stores an opaque state blob (optimizer step, loss scaler, ...), at most slice_bytes.
  /// Errors: as AddChunk; InvalidArgument when too large or set twice.
  Status SetState(std::span<const std::byte> state);
  /// Makes the checkpoint durable and visible atomically, then removes checkpoints beyond
  /// `keep`. Errors: FailedPrecondition (a local chunk of the layout was not added, or the writer
  /// is not open), ResourceExhausted, IoError. On error nothing became visible; the writer is
  /// failed. A failure of the clean-up after the commit is logged, not returned (the checkpoint
  /// is committed and the next Commit retries it).
  Status Commit();
  /// Bytes of payload added so far.
  uint64_t bytes() const { return bytes_; }

  /// Copies chunk `chunk` of the committed checkpoint `from` (of another store, the same step)
  /// into this one: every stored value of the chunk, byte for byte, whatever its tensors'
  /// dtypes, each value's CRC checked on the way. The manifest this writer commits then keeps
  /// `from`'s format fields (slice size and the rest), with this store's shard, layout and
  /// chunks (resharding, checkpoint_reshard.h). Errors: OutOfRange (not a chunk of this shard),
  /// NotFound (not in `from`), InvalidArgument (chunk added twice, another step, sizes or a
  /// format that differs from earlier copies, or chunks added with AddChunk),
  /// FailedPrecondition (writer not open), DataLoss (a value of `from` is corrupt),
  /// ResourceExhausted, IoError. After an error the writer is failed.
  Status CopyChunk(const CheckpointReader& from, uint32_t chunk);
  /// Copies `from`'s state blob byte for byte (as SetState would have stored it). Errors: as
  /// CopyChunk; InvalidArgument when set twice.
  Status CopyState(const CheckpointReader& from);
  /// CopyChunk (CopyState for chunk kStoredStateChunk) from values read elsewhere: `manifest`
  /// is the source checkpoint's (CheckpointReader::EncodedManifest) and `values` are every
  /// value of the chunk (CheckpointReader::ReadStored). Each value's CRC is checked and its key
  /// must name this writer's step and `chunk`. Errors: as CopyChunk, and DataLoss for a value
  /// that fails its CRC, a key of another step or chunk, keys not in ascending order (as
  /// ReadStored hands them out), a manifest that does not decode, or no values at all.
  Status PutStored(std::span<const std::byte> manifest, uint32_t chunk,
                   std::span<const StoredValue> values);

 private:
  friend class CheckpointStore;
  CheckpointWriter(CheckpointStore* store, int64_t step, Layout layout, uint32_t shard,
                   StateDType state_dtype);
  struct Slice {
    uint32_t chunk;
    uint8_t kind;
    uint32_t index;
    std::span<const std::byte> data;
  };
  std::vector<Slice> CutSlices(uint32_t chunk, uint8_t kind, std::span<const std::byte> data) const;
  // Frames and writes `slices` (without WAL), striped over the store's write threads.
  Status PutSlices(const std::vector<Slice>& slices);
  // Adopts the source manifest's format for CopyChunk/CopyState/PutStored (the first call) or
  // checks it; `where` names the source in errors.
  Status AdoptFormat(const internal::Manifest& src, const std::string& where);
  // Checks that `chunk` of the source manifest may be copied here and returns its entry.
  Result<ChunkEntry> CheckCopy(const internal::Manifest& src, uint32_t chunk,
                               const std::string& where);
  // The copied values of one chunk on their way into the store (CopyChunk, PutStored): a table
  // file moved in whole with options().ingest_copies, write batches without the WAL otherwise.
  class CopySink;
  Result<std::unique_ptr<CopySink>> OpenCopy(uint32_t chunk);
  // Copies the framed values of `chunk` (every kind and slice) verbatim, checking each CRC.
  Status CopyValues(const CheckpointReader& from, uint32_t chunk);
  void Abort();

  CheckpointStore* store_;
  int64_t step_;
  StateDType state_dtype_;
  Layout layout_;
  uint32_t shard_ = 0;
  std::vector<uint32_t> local_;  // the shard's chunks, ascending
  enum class State { kOpen, kCommitted, kFailed } state_ = State::kOpen;
  std::vector<ChunkEntry> chunks_;
  std::vector<bool> added_;  // by local chunk index
  bool has_state_ = false;
  uint32_t state_crc_ = 0;
  uint64_t state_len_ = 0;
  uint64_t bytes_ = 0;
  // Set by the first CopyChunk/CopyState: the source manifest whose format fields are kept.
  std::unique_ptr<internal::Manifest> like_;
  // One per write thread, reused for every slice (a fresh 4+ MiB buffer per slice costs a page
  // fault and a zeroed page per 4 KiB).
  std::vector<std::unique_ptr<rocksdb::WriteBatch>> batches_;
};

/// A committed checkpoint, pinned by a RocksDB snapshot: garbage collection cannot remove it
/// while the reader lives. Const methods are thread-safe.
class CheckpointReader {
 public:
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointInfo& info() const { return info_; }
  /// Chunk ids in the checkpoint, ascending.
  std::vector<uint32_t> chunks() const;
  /// Reads a chunk's tensors into `out` (empty spans skipped; master must have the chunk's size,
  /// m and v MomentBytes(info().state_dtype, size) bytes).
  /// The output is unspecified on error. Errors: NotFound (chunk not in the checkpoint),
  /// InvalidArgument (sizes), DataLoss (CRC mismatch or missing value), IoError.
  Status ReadChunk(uint32_t chunk, const ChunkTensorsOut& out) const;
  /// The state blob (empty if none was set). Errors: DataLoss, IoError.
  Result<std::vector<std::byte>> ReadState() const;
  /// Reads every value and checks its CRC. Errors: DataLoss naming the first bad value, IoError.
  Status Verify() const;
  /// The checkpoint's manifest as stored (its format fields and chunk list), for PutStored.
  std::vector<std::byte> EncodedManifest() const;
  /// The values of `chunk` (kStoredStateChunk: the state blob) as stored, in key order, starting
  /// after key `after` ("" = from the first), up to about `max_bytes` (at least one value);
  /// `*more` says whether values follow. Each value's CRC is checked. Errors: NotFound (a chunk
  /// not in the checkpoint), DataLoss (a corrupt value), IoError.
  Result<std::vector<StoredValue>> ReadStored(uint32_t chunk, std::string_view after,
                                              size_t max_bytes, bool* more) const;

 private:
  friend class CheckpointStore;
  friend class CheckpointWriter;  // CopyChunk reads the values as stored
  CheckpointReader(CheckpointStore* store, CheckpointInfo info);
  Status ReadSlices(uint32_t chunk, uint8_t kind, std::span<std::byte> out) const;

  CheckpointStore* store_;
  CheckpointInfo info_;
  std::unique_ptr<internal::Manifest> manifest_;  // as decoded (CheckpointWriter::CopyChunk)
  std::unique_ptr<detail::Snapshot> snapshot_;
  uint64_t slice_bytes_ = 0;  // as written
  bool has_state_ = false;
  uint64_t state_len_ = 0;
  uint32_t state_crc_ = 0;
};

class CheckpointStore {
 public:
  /// Opens the database in `dir` (created if missing and allowed) and deletes the leftovers of
  /// checkpoints that were begun but never committed. Errors: InvalidArgument (options),
  /// NotFound (missing, not create_if_missing and not read_only), DataLoss (RocksDB found
  /// corruption), ResourceExhausted (disk full), IoError (also a missing store opened read_only,
  /// as zps-ckpt does: RocksDB reports "<dir>/CURRENT: No such file or directory"), Unavailable
  /// (another process holds the lock).
  static Result<std::unique_ptr<CheckpointStore>> Open(const std::string& dir,
                                                       const CheckpointOptions& options);
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  const std::string& dir() const;
  const CheckpointOptions& options() const { return options_; }

  // ---- catalog (every write is one synced batch) ----
  /// Records the layout and which shard this database belongs to. Required before
  /// BeginCheckpoint. Errors: InvalidArgument (shard ≥ num_shards), FailedPrecondition (a
  /// different layout or shard is already recorded, or read-only), ResourceExhausted, IoError.
  Status SetIdentity(const Layout& layout, uint32_t shard);
  /// Errors: NotFound (never set), DataLoss, IoError.
  Result<Layout> GetLayout() const;
  Result<uint32_t> GetShard() const;
  /// The job spec (also records nothing else). Errors: as PutCatalog / GetCatalog.
  Status PutJobSpec(const JobSpec& spec);
  Result<JobSpec> GetJobSpec() const;
  /// Current chunk versions (chunk id, version), e.g. written after each applied step.
  Status PutChunkVersions(std::span<const std::pair<uint32_t, int64_t>> versions);
  Result<std::vector<std::pair<uint32_t, int64_t>>> GetChunkVersions() const;
  /// Any other catalog entry (name: 1..64 bytes). Errors: InvalidArgument (name),
  /// FailedPrecondition (read-only), ResourceExhausted, IoError; Get: NotFound, DataLoss.
  Status PutCatalog(std::string_view name, std::span<const std::byte> value);
  Result<std::vector<std::byte>> GetCatalog(std::string_view name) const;
  /// Names of catalog entries starting with `prefix`, ascending. Errors: IoError.
  Result<std::vector<std::string>> ListCatalog(std::string_view prefix) const;
  /// Deletes entries in one synced batch (absent names are fine). Errors: as PutCatalog.
  Status DeleteCatalog(std::span<const std::string> names);

  // ---- checkpoints ----
  /// Starts checkpoint `step` (≥ 0), whose m and v are packed in `state_dtype`. Errors:
  /// FailedPrecondition (no identity, read-only, another writer open), AlreadyExists (a committed
  /// checkpoint of this step: DropCheckpointsAfter first), ResourceExhausted, IoError.
  Result<std::unique_ptr<CheckpointWriter>> BeginCheckpoint(
      int64_t step, StateDType state_dtype = StateDType::kF32);
  /// Committed checkpoints, oldest first. With `verify`, every value is read and checked (slow:
  /// reads the whole checkpoint); otherwise only the manifests. A corrupt one is listed with
  /// kCorrupt, not an error. Errors: IoError (a read failed for a reason other than corruption).
  Result<std::vector<CheckpointInfo>> ListCheckpoints(bool verify) const;
  /// The newest checkpoint that is not corrupt (with `verify`: whose every value checks out),
  /// falling back to older ones with a warning. Errors: NotFound (none usable), IoError.
  Result<CheckpointInfo> LatestComplete(bool verify) const;
  /// Opens a committed checkpoint for reading. Errors: NotFound, DataLoss (bad manifest), IoError.
  Result<std::unique_ptr<CheckpointReader>> OpenCheckpoint(int64_t step) const;
  /// Convenience: OpenCheckpoint(step) then ReadChunk. Errors: as both.
  Status LoadChunk(int64_t step, uint32_t chunk, const ChunkTensorsOut& out) const;
  /// Garbage collection (after each Commit) keeps checkpoint `step` besides the
  /// `keep` newest: the newest checkpoint complete on every shard of the job, which newer local
  /// ones do not replace while another shard lacks them (e.g. its disk is full). -1 (the
  /// default) or a step not stored: nothing extra is kept.
  void Protect(int64_t step);
  /// Deletes every committed checkpoint with a step > `step` (a rollback). Errors:
  /// FailedPrecondition (read-only or a writer open), ResourceExhausted, IoError.
  Status DropCheckpointsAfter(int64_t step);
  /// Bytes of the database's live SST and blob files.
  uint64_t DiskBytes() const;

 private:
  friend class CheckpointWriter;
  friend class CheckpointReader;
  CheckpointStore(std::unique_ptr<detail::Db> db, const CheckpointOptions& options);
  Status CleanUpIntents();
  Status DeleteSteps(const std::vector<int64_t>& steps);
  Status CollectGarbage();
  Status CheckWritable() const;

  std::unique_ptr<detail::Db> db_;
  CheckpointOptions options_;
  std::unique_ptr<ThreadPool> write_pool_;  // write_threads > 1 and writable only
  Mutex mu_;
  bool writer_open_ GUARDED_BY(mu_) = false;
  int64_t protected_ GUARDED_BY(mu_) = -1;  // see Protect
};

}  // namespace zps::server
