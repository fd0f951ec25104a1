// zps/server/chunk_store.h — a shard's chunk state in RAM up to a memory budget, the rest spilled
// to NVMe (O_DIRECT files, io_uring), with a pipelined pass for the optimizer.
//
// Per chunk c of n elements the store keeps:
//   - the state record: fp32 master, then `moments` packed moments (m, then v) of
//     MomentBytes(state_dtype, n) bytes each (4n for fp32, about n for int8: compact state
//     spills, and is read and written back, in proportion), each starting at a 4 KiB boundary
//     of the record. Budget: `memory_budget`.
//   - the serving record: the 16-bit serving copy (fp16/bf16 bits). Budget:
//   `serving_memory_budget`.
// Placement is fixed at Create(): the pipeline's buffers are taken from each budget first, then
// chunks are made resident in id order while they fit; the rest live in two preallocated spill
// files (`<prefix>-state.zps`, `<prefix>-serving.zps`) in id order, so a pass in id order is a
// sequential scan of the disk.
//
// The pass (ForEachChunk) pipelines:
//
//   disk --read c+1, c+2 (read-ahead)--> slot   fn(c) on the caller's thread   slot --write c-1-->
//
// While fn runs on chunk c, up to `read_ahead` later spilled chunks are being read and up to
// `write_behind` earlier ones written. Requests are cut into `io_bytes` pieces with at most
// `queue_depth` in flight. Completions are reaped on the calling thread between fn calls and
// while it waits for a read. Resident chunks are handed over in place (no copy).
//
// Example — one optimizer step over a mostly spilled shard:
//
//   ChunkStoreOptions o;  o.memory_budget = 2ull << 30;  o.spill_dir = "/nvme/zps";
//   ZPS_ASSIGN_OR_RETURN(auto store, ChunkStore::Create(o, chunk_elems));
//   PassOptions pass;  pass.serving = true;            // the update writes the serving copy
//   ZPS_RETURN_IF_ERROR(store->ForEachChunk(ids, pass,
//       [&](uint32_t c, const ChunkSpans& s) -> Status {
//         UpdateParams p;  p.step = step;  p.out16 = s.serving;  p.out_dtype = DType::kBF16;
//         return optimizer->Update(s.state, GradView{grads[c], DType::kF32, s.state.master.size()},
//         p);
//       }));
//
// Errors and integrity: an I/O error stops the pass: in-flight requests are drained, and the
// error names the chunk, file and offset. A failed *read* leaves the chunk untouched (fn is not
// called for it). A failed *write* marks that record lost: later reads of it return DataLoss
// until it is rewritten in full (WriteChunk / WriteServing, e.g. from a checkpoint). A full disk
// is ResourceExhausted, normally at Create() (the files are fallocated). Chunks before the
// failure point in the pass were updated; chunks after it were not. The store never returns data
// it did not read back successfully.
//
// Thread-safety: every public method is thread-safe; calls are serialised by one internal mutex
// (a ReadServing during a pass waits for the pass). `fn` runs with that mutex held and must not
// call back into the store.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/spill_budget.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/nvme.h"
#include "zps/server/optimizer.h"

namespace zps::server {

struct ChunkStoreOptions {
  uint64_t memory_budget = 2ull << 30;            // Default: 2 GiB (master + moments + buffers).
  uint64_t serving_memory_budget = 512ull << 20;  // Default: 512 MiB (serving copies + buffers).
  std::string spill_dir = "/var/lib/zps/spill";   // Default: /var/lib/zps/spill. Must exist.
  std::string file_prefix = "zps-spill";          // Default: "zps-spill".
  uint32_t moments = 2;  // Default: 2 (Adam m, v). 1 = SGD momentum, 0 = plain SGD.
  StateDType state_dtype = StateDType::kF32;  // Default: fp32. How m and v are packed.
  bool direct_io = true;                      // Default: true (O_DIRECT).
  bool allow_buffered_fallback = false;       // Default: false. See SpillFileOptions.
  uint32_t queue_depth = 16;                  // Default: 16 requests in flight.
  uint32_t io_bytes = 1u << 20;               // Default: 1 MiB per request; a multiple of 4096.
  uint32_t read_ahead = kSpillReadAhead;      // Default: 2 chunks read ahead of the current; >= 1.
  uint32_t write_behind = kSpillWriteBehind;  // Default: 2 chunks written behind at most; >= 1.
  bool register_buffers = false;  // Default: false. Register the pipeline buffers with io_uring.
  bool sqpoll = false;            // Default: false. io_uring SQPOLL thread.
  /// Default: true. false: the store keeps no serving records at all (the owner keeps its serving
  /// copies elsewhere, as ShardState does); serving_memory_budget is then unused, and
  /// ReadServing / WriteServing / a pass with PassOptions::serving are FailedPrecondition.
  bool serving_records = true;
  /// The serving records' dtype: fp16/bf16 (one 16-bit word an element), fp32 (held as pairs of
  /// words) or int8-block (the quantized copy, zps/common/serving_quant.h). Every serving span,
  /// ReadServing/WriteServing length and ResidentServing span is ServingWords(serving_dtype,
  /// chunk_elems(c)) words.
  DType serving_dtype = DType::kBF16;  // Default: bf16
  /// Default: none (the store allocates them). When set, provides the memory of the RESIDENT
  /// serving records, in one call at Create: `bytes` bytes, 64-byte aligned, owned by the caller
  /// and kept alive (and unchanged by anyone else) for the store's lifetime. ShardState passes
  /// memory from ucx::Context::Allocate here so that workers can RMA-get resident serving copies
  /// (docs/data-plane.md). Not called when no serving copy is resident. Its errors are returned
  /// from Create as they are.
  std::function<Result<std::span<std::byte>>(size_t bytes)> serving_ram_alloc;
  /// Test hook: wraps the io_uring engine (e.g. in a fault injector). Default: none.
  std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)> wrap_engine;
};

/// What a pass moves. Default: read and write the state; leave the serving copy alone.
struct PassOptions {
  bool read_state = true;   // false: spilled state is NOT read; fn must overwrite all of it.
  bool write_state = true;  // false: the pass is read-only for the state (fn must not modify).
  bool serving = false;     // true: fn gets the serving copy and must overwrite all of it (it
                            // is never read from disk, only written behind).
};

/// What fn sees for one chunk. Spans are valid only during the call.
struct ChunkSpans {
  ChunkState state;             // master (n), m and v (n each, or empty per `moments`)
  std::span<uint16_t> serving;  // ServingWords(serving_dtype, n) words when PassOptions::serving
};

struct ChunkStoreStats {
  uint32_t chunks = 0;
  uint32_t state_resident = 0;        // chunks whose state is in RAM
  uint32_t serving_resident = 0;      // chunks whose serving copy is in RAM
  uint64_t state_ram_bytes = 0;       // resident state records
  uint64_t serving_ram_bytes = 0;     // resident serving records
  uint64_t buffer_bytes = 0;          // pipeline buffers (both budgets)
  uint64_t serving_buffer_bytes = 0;  // the serving budget's part of buffer_bytes
  uint64_t state_file_bytes = 0;
  uint64_t serving_file_bytes = 0;
  uint64_t bytes_read = 0;  // since Create (state and serving records)
  uint64_t bytes_written = 0;
  uint64_t serving_bytes_read = 0;  // the serving records' part of bytes_read / bytes_written
  uint64_t serving_bytes_written = 0;
  bool direct = true;  // false when the buffered fallback was taken
};

class ChunkStore {
 public:
  using ChunkFn = std::function<Status(uint32_t chunk, const ChunkSpans& spans)>;

  /// `chunk_elems[c]` = elements of chunk c (> 0). All state starts at zero.
  /// Errors: InvalidArgument for bad options (zero depth, io_bytes not a multiple of 4096,
  /// read_ahead/write_behind 0, moments > 2, no chunks, a zero-sized chunk); ResourceExhausted when
  /// a budget cannot hold the pipeline's buffers (CheckSpillPipeline's advice, after "chunk
  /// store: "), when RAM cannot be allocated, or when the disk cannot hold the spill files
  /// (SpillFile's "disk full"); FailedPrecondition /
  /// NotFound / IoError from the spill files and io_uring (see SpillFile, CreateUringEngine).
  static Result<std::unique_ptr<ChunkStore>> Create(const ChunkStoreOptions& options,
                                                    std::vector<uint64_t> chunk_elems);
  ~ChunkStore();
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  /// Calls fn(c, spans) for each c of `chunks`, in that order, pipelined as above.
  /// Errors: InvalidArgument for an unknown or repeated chunk id (nothing is done); the first
  /// error fn returns (the pass stops; that chunk's spilled copy is not written); IoError /
  /// ResourceExhausted for a failed read or write (see the header comment); DataLoss when a chunk
  /// of the pass was lost by an earlier failed write (the pass stops before it).
  Status ForEachChunk(std::span<const uint32_t> chunks, const PassOptions& pass, const ChunkFn& fn);

  /// Copies chunk c's state out / in. master must have chunk_elems(c) elements, m and v
  /// MomentBytes(state_dtype, chunk_elems(c)) bytes (or be empty when `moments` < 1 / < 2).
  /// WriteChunk rewrites the whole record and clears a lost mark. Errors: InvalidArgument (bad id
  /// or lengths), DataLoss (lost record), IoError, ResourceExhausted. On error the outputs / the
  /// stored record are unspecified only for WriteChunk, which then marks the record lost.
  Status ReadChunk(uint32_t c, std::span<float> master, std::span<std::byte> m,
                   std::span<std::byte> v);
  Status WriteChunk(uint32_t c, std::span<const float> master, std::span<const std::byte> m,
                    std::span<const std::byte> v);
  /// Calls fn(master) with chunk c's fp32 master (chunk_elems(c) elements): the resident record
  /// in place, or a spilled record's master alone read into a pipeline buffer (not m or v). The
  /// span is valid only during the call, which holds the store's mutex: fn must not call the
  /// store. For a shard whose serving copies are made on fetch from its master. Errors:
  /// InvalidArgument (bad id), DataLoss (lost record), IoError, ResourceExhausted; fn is then not
  /// called.
  Status VisitMaster(uint32_t c, const std::function<void(std::span<const float>)>& fn);
  /// As above for the serving copy (the fetch path for spilled serving copies).
  Status ReadServing(uint32_t c, std::span<uint16_t> out);
  Status WriteServing(uint32_t c, std::span<const uint16_t> in);

  uint32_t num_chunks() const { return static_cast<uint32_t>(chunks_.size()); }
  /// Elements of chunk c; c must be < num_chunks().
  uint64_t chunk_elems(uint32_t c) const { return chunks_[c].elems; }
  bool state_resident(uint32_t c) const { return chunks_[c].state_resident; }
  bool serving_resident(uint32_t c) const { return chunks_[c].serving_resident; }
  /// The in-RAM serving copy of chunk c (chunk_elems(c) elements) when it is resident; empty
  /// when it is spilled or there are no serving records. The span is stable for the store's
  /// lifetime; it is the memory a pass with PassOptions::serving hands to fn for that chunk and
  /// that Read/WriteServing copy from/to, so the caller must order its own reads and writes of it
  /// with those calls (ShardState does: only the update and restore passes write it).
  std::span<uint16_t> ResidentServing(uint32_t c) const;
  ChunkStoreStats stats() const;

 private:
  struct Chunk {
    uint64_t elems = 0;
    uint64_t state_bytes = 0;  // record size (4 KiB multiple)
    uint64_t serving_bytes = 0;
    uint64_t moment_bytes = 0;   // one packed moment (MomentBytes)
    uint64_t m_off = 0;          // bytes from the record's start to m (v: m_off + moment_stride)
    uint64_t moment_stride = 0;  // bytes from m to v
    bool state_resident = false;
    bool serving_resident = false;
    uint64_t state_off = 0;    // in state_ram_ or state_file_
    uint64_t serving_off = 0;  // in serving_ram_ or serving_file_
    std::string state_lost;    // non-empty: why the spilled record is lost (under mu_)
    std::string serving_lost;  // (under mu_; the layout fields above are fixed at Init)
  };
  struct Slot;
  explicit ChunkStore(const ChunkStoreOptions& options);
  Status Init(std::vector<uint64_t> chunk_elems);
  Status CheckId(uint32_t c) const;
  static Status NoServingRecords();
  Status Transfer(IoRequest::Op op, const SpillFile& file, uint64_t offset, std::byte* buf,
                  uint64_t bytes, const std::string& what, bool serving) REQUIRES(mu_);
  Status RecordLostError(uint32_t c, bool serving) const REQUIRES(mu_);
  // Chunk c's state record: the resident one in place, or the first `bytes` (a 4 KiB multiple)
  // of the spilled one read into pipeline buffer 0, valid until the next read under mu_.
  // Errors: DataLoss (lost record), IoError, ResourceExhausted (`what` names the read).
  Result<const std::byte*> StateRecord(uint32_t c, uint64_t bytes, const char* what) REQUIRES(mu_);

  ChunkStoreOptions options_;
  friend class ShardState;  // names mu_ in its lock order (ACQUIRED_BEFORE)
  mutable Mutex mu_;        // serialises every public call (see the header comment)
  std::vector<Chunk> chunks_;
  uint64_t state_stride_max_ = 0;                               // largest state record
  uint64_t serving_stride_max_ = 0;                             // largest serving record
  std::unique_ptr<AlignedBufferPool> state_ram_, serving_ram_;  // resident records
  std::byte* serving_ram_base_ = nullptr;  // serving_ram_ or options_.serving_ram_alloc memory
  size_t slot_count_ = 0;                  // pipeline slots (0 when nothing spills)
  std::unique_ptr<AlignedBufferPool> state_bufs_, serving_bufs_;  // pipeline slots
  std::unique_ptr<SpillFile> state_file_, serving_file_;
  std::unique_ptr<IoEngine> engine_;
  ChunkStoreStats stats_ GUARDED_BY(mu_);
};

}  // namespace zps::server
