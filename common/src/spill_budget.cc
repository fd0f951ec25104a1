#include "zps/common/spill_budget.h"

#include <algorithm>
#include <string>

namespace zps {

Status CheckSpillPipeline(const SpillTier& tier, uint64_t slots) {
  if (tier.total_bytes <= tier.budget) return Status::Ok();  // nothing spills: no buffers
  const uint64_t needed = slots * tier.max_record;
  if (needed <= tier.budget) return Status::Ok();
  return ResourceExhausted(std::string(tier.budget_name) + " " + std::to_string(tier.budget) +
                           " bytes cannot hold the spill pipeline's " + std::to_string(slots) +
                           " buffers of " + std::to_string(tier.max_record) +
                           " bytes (one per chunk in flight); raise the budget to at least " +
                           std::to_string(needed) + " bytes, or lower the chunk size");
}

uint32_t StateMoments(const OptimizerConfig& optimizer) {
  if (optimizer.kind != OptimizerKind::kSgd) return 2;
  return optimizer.momentum > 0.0f ? 1 : 0;
}

uint64_t StateRecordBytes(const OptimizerConfig& optimizer, uint64_t elems) {
  // As ChunkStore lays a record out: the fp32 master, then each moment packed in the job's state
  // dtype, each array starting on the record alignment.
  auto align = [](uint64_t b) {
    return (b + kSpillRecordAlign - 1) / kSpillRecordAlign * kSpillRecordAlign;
  };
  return align(elems * sizeof(float)) +
         StateMoments(optimizer) * align(MomentBytes(optimizer.state_dtype, elems));
}

Status CheckJobMemoryBudget(const JobSpec& job, uint64_t memory_budget) {
  if (memory_budget == 0) return Status::Ok();
  const uint64_t slots = uint64_t{kSpillReadAhead} + 1 + kSpillWriteBehind;
  const Layout& layout = job.layout;
  for (uint32_t s = 0; s < layout.options().num_shards; ++s) {
    SpillTier tier{"memory_budget", memory_budget, 0, 0};
    for (uint32_t c : layout.ChunksOfShard(s)) {
      const uint64_t record = StateRecordBytes(job.optimizer, layout.chunk_size(c));
      tier.total_bytes += record;
      tier.max_record = std::max(tier.max_record, record);
    }
    ZPS_RETURN_IF_ERROR(CheckSpillPipeline(tier, slots).WithContext("shard " + std::to_string(s)));
  }
  return Status::Ok();
}

}  // namespace zps
