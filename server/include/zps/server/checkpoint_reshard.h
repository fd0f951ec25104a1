// zps/server/checkpoint_reshard.h — the stores of a job for another shard count, offline.
//
// Chunk c of a job lives on shard c % num_shards; chunk ids and sizes depend only on the
// parameters and chunk_elems, never on the shard count. So a job's checkpoint of step S on N
// shards becomes one on M shards by moving each chunk's stored values to the store of shard
// c % M, byte for byte (CheckpointWriter::CopyChunk: whatever dtypes the tensors are stored in;
// ReshardOptions::state_dtype converts the moments instead),
// with every store's identity rewritten (the layout with num_shards = M, the shard ordinal) and
// the state blob (step, loss scaler, optimizer step) copied as it is. Shards started with
// `--shards M` on the new stores resume the job at step S, and since every reduction runs in a
// fixed order whatever the placement, the job then computes exactly what it would have on N.
//
// The new shard 0 also gets a coordinator catalog (the job spec for M shards, the step, and the
// checkpoint of step S recorded complete on all M shards), so that the coordinator restores the
// job rather than waiting for a new one. docs/checkpoints.md, "Changing the shard count".
//
// Bad input changes nothing: the inputs are opened read-only, everything that can be checked is
// checked before the first write, and on any later error (a corrupt value, a full disk) the
// outputs written so far are removed again.
//
// Thread-safety: a free function; runs one thread per output store (at most `threads`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"

namespace zps::server {

struct ReshardOptions {
  /// The job's N checkpoint stores (`<shard --data-dir>/checkpoints`), in any order.
  std::vector<std::string> inputs;
  /// The M new stores: outputs[i] becomes shard i's. Each must not exist or be empty, and none
  /// may be one of the inputs.
  std::vector<std::string> outputs;
  /// Default: -1 = the newest checkpoint, which must be the newest on every input (a store left
  /// at another step is an error). Otherwise a step every input holds.
  int64_t step = -1;
  /// Default: "" = `<the directory holding outputs[0]>/coordinator`, where shard 0 started
  /// with `--data-dir <that directory>` looks for it. Must not exist or be empty.
  std::string coordinator_out;
  /// Default: 0 = keep. The job's worker count and micro-batches per rank and step from this
  /// step on (ShardJob::world_size, accumulation_steps): both or neither, and their product (the
  /// contributions to a step, the global batch in micro-batches) must stay the same, as the
  /// commit's grad_divisor does. docs/checkpoints.md says what a resumed job then computes.
  uint32_t world_size = 0;
  uint32_t accumulation_steps = 0;
  /// Default: unset = keep the checkpoint's state dtype (the moments are copied as stored).
  /// Another dtype converts them: each chunk's m and v are unpacked to fp32 and packed in the new
  /// dtype as PackMoment packs (bf16: both rounded to nearest even; int8: per block, as the
  /// update packs), and the job's optimizer.state_dtype becomes it. The masters, versions and
  /// state blob are kept. int8 needs the job's align_elems to be a multiple of its block.
  std::optional<StateDType> state_dtype;
  /// Default: 4 — output stores written at once.
  uint32_t threads = 4;
  /// Default: true. The inputs are read with O_DIRECT: each value is read once, and filling the
  /// page cache with it would cost the kernel a copy and its CPU for nothing. An input on a
  /// filesystem without O_DIRECT (tmpfs before Linux 6.6) is read through the page cache.
  bool direct_reads = true;
  /// Default: false. O_DIRECT writes of the outputs (the filesystem must support it). Slower
  /// than buffered writes where measured: each table file is written one buffer at a time.
  bool direct_writes = false;
};

struct ReshardStats {
  int64_t step = 0;
  uint32_t from_shards = 0;
  uint32_t to_shards = 0;
  uint32_t chunks = 0;
  uint64_t bytes = 0;                              // payload bytes copied (tensors and state blobs)
  StateDType from_state_dtype = StateDType::kF32;  // the inputs' moments
  StateDType state_dtype = StateDType::kF32;       // the outputs' (another one: converted)
  std::string coordinator_dir;
};

/// Writes the checkpoint of `options.step` of the job in `options.inputs` as a checkpoint of the
/// same step for options.outputs.size() shards, plus the coordinator catalog.
/// Errors (the message names the store and what is wrong):
///   InvalidArgument   no inputs or outputs, an output among the inputs, a world size and
///                     accumulation whose product differs from the job's, inputs of two jobs
///                     (layout or job spec), a shard's store missing or given twice, inputs whose
///                     newest checkpoints differ, inputs whose state blobs differ;
///   FailedPrecondition an output or the coordinator catalog exists and is not empty;
///   NotFound          an input without a store identity, or without checkpoint `step`;
///   DataLoss          a value or manifest of an input fails its CRC, or a value is missing;
///   ResourceExhausted a full disk while writing (the outputs are removed again);
///   IoError, Unavailable (an input is open writable elsewhere: stop its shard first).
Result<ReshardStats> ReshardCheckpoint(const ReshardOptions& options);

/// The job `job` on `shards` shards: its layout rebuilt with num_shards = `shards` (and so a new
/// layout hash); nothing else changes. Errors: InvalidArgument (shards 0, or Validate's).
Result<JobSpec> JobOnShards(const JobSpec& job, uint32_t shards);

/// Writes the coordinator catalog of `job` (on `shards` shards) resumed at checkpoint `step` in
/// `dir` (which must not hold one): the job spec, the step, the checkpoint recorded complete on
/// every shard, and the recovery epoch of the catalog in `old_dir` (if any; a new coordinator
/// never reuses an epoch). Each write is synced. Errors: as CoordinatorCatalog's.
Status WriteResumeCatalog(const std::string& dir, const JobSpec& job, int64_t step, uint32_t shards,
                          const std::string& old_dir);

/// For a process that reshards (zps-ckpt, zps-bench): glibc keeps freed memory of up to 64 MiB a
/// block in the heap instead of unmapping it, so that each new memtable reuses the pages of the
/// last one instead of faulting fresh ones in (a fifth of the CPU time of a reshard otherwise).
/// Process-wide (mallopt); call it once, before resharding.
void KeepFreedMemory();

}  // namespace zps::server
