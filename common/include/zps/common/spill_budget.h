// zps/common/spill_budget.h — whether a shard's memory budget can hold its spill pipeline.
//
// A shard whose optimizer state does not fit its --memory-budget spills it to disk through a
// pipeline of (read_ahead + 1 + write_behind) buffers, each as large as the shard's largest state
// record (docs/nvme.md). A budget smaller than those buffers cannot work at all. The shard's
// ChunkStore refuses it at Create with the advice built here, and the launchers (zps-train's local
// mode, zps.torch's embedded cluster through libzps_c) refuse it with the very same advice before
// any process starts, by calling CheckJobMemoryBudget on the job they are about to run.
//
// Thread-safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <string_view>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"

namespace zps {

/// The spill pipeline's depth a shard runs with: chunks read ahead of the one being updated, and
/// chunks written behind it (ChunkStoreOptions' defaults).
inline constexpr uint32_t kSpillReadAhead = 2;
inline constexpr uint32_t kSpillWriteBehind = 2;
/// Spill records start and end on this boundary (O_DIRECT).
inline constexpr uint64_t kSpillRecordAlign = 4096;

/// One budget of a chunk store and what it has to hold.
struct SpillTier {
  std::string_view budget_name;  // "memory_budget" or "serving_memory_budget"
  uint64_t budget = 0;           // bytes
  uint64_t total_bytes = 0;      // every record of the tier
  uint64_t max_record = 0;       // the largest record: the size of one pipeline buffer
};

/// OK when the tier's records all fit its budget (nothing spills) or when the budget holds the
/// pipeline's `slots` buffers of `max_record` bytes. Otherwise ResourceExhausted with the advice
/// the user sees, e.g. "memory_budget 16777216 bytes cannot hold the spill pipeline's 5 buffers
/// of 50331648 bytes (one per chunk in flight); raise the budget to at least 251658240 bytes, or
/// lower the chunk size". The caller adds where it was decided ("chunk store: ", "shard 1: ").
Status CheckSpillPipeline(const SpillTier& tier, uint64_t slots);

/// The optimizer's fp32 moment arrays per element: 2 (Adam, AdamW: m and v), 1 (SGD with
/// momentum: m), 0 (plain SGD).
uint32_t StateMoments(const OptimizerConfig& optimizer);

/// Bytes of the state record of a chunk of `elems` elements: the fp32 master and each moment
/// array, each rounded up to kSpillRecordAlign (ChunkStore's record layout).
uint64_t StateRecordBytes(const OptimizerConfig& optimizer, uint64_t elems);

/// The state tier's check (CheckSpillPipeline with the default pipeline depth) for every shard of
/// `job` with `memory_budget` bytes each (0 = no budget: OK): what each shard's store decides at
/// Create, decided before any shard starts. The first shard that fails names itself in the
/// message ("shard 1: memory_budget ..."). In speculative update mode a shard sets a quarter of its
/// budget aside for spare sets first, so a budget close to the limit can still fail there, with the
/// same advice from the shard itself.
Status CheckJobMemoryBudget(const JobSpec& job, uint64_t memory_budget);

}  // namespace zps
