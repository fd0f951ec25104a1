// ShardState's durability operations: visiting the state for a checkpoint, and rolling back to
// a restored one. See shard_state.h.
#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"
#include "zps/server/shard_state.h"

namespace zps::server {

Status ShardState::VisitChunkState(const ChunkVisitor& fn) const {
  int64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (chunks_.empty()) return Status::Ok();
    version = chunks_.front().version;
    for (const Chunk& c : chunks_) {
      if (c.version != version) {
        return FailedPrecondition("chunks are at different versions (" + std::to_string(version) +
                                  " and " + std::to_string(c.version) + ")");
      }
    }
  }
  if (version < 0) return FailedPrecondition("the shard's chunks are not initialised yet");
  // Only the caller's thread (the driver) changes master, m and v once initialised.
  for (const Chunk& c : chunks_) {
    ZPS_RETURN_IF_ERROR(fn(c.id, version, c.master.span(), c.m.span(), c.v.span()));
  }
  return Status::Ok();
}

void ShardState::FailWaiters(const Status& reason) {
  std::vector<Waiter> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : chunks_) {
      for (auto& w : c.waiters) failed.push_back(std::move(w));
      c.waiters.clear();
    }
  }
  for (auto& w : failed) w.cb(reason, -1, {});
}

Status ShardState::ResetTo(int64_t version, const ChunkLoader& load, const Status& reason) {
  if (version == 0 || version < -1) {
    return InvalidArgument("a shard rolls back to version -1 or >= 1, not " +
                           std::to_string(version));
  }
  std::vector<Waiter> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++epoch_;
    for (Chunk& c : chunks_) {
      for (auto& w : c.waiters) failed.push_back(std::move(w));
      c.waiters.clear();
      ResetCoverage(c);
      c.version = -1;  // nothing is served until the state is back
    }
  }
  for (auto& w : failed) w.cb(reason, -1, {});
  for (Chunk& c : chunks_) {
    if (version < 0) {
      std::fill(c.master.span().begin(), c.master.span().end(), 0.0f);
      std::fill(c.m.span().begin(), c.m.span().end(), 0.0f);
      std::fill(c.v.span().begin(), c.v.span().end(), 0.0f);
      std::fill(c.serving.begin(), c.serving.end(), uint16_t{0});
      continue;
    }
    ZPS_RETURN_IF_ERROR(load(c.id, c.master.span(), c.m.span(), c.v.span()));
    if (job_.serving_dtype == DType::kF16) ConvertF32ToF16(c.master.span(), c.serving);
    else ConvertF32ToBF16(c.master.span(), c.serving);
  }
  if (version >= 1) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Chunk& c : chunks_) c.version = version;
  }
  cv_.notify_all();
  return Status::Ok();
}

}  // namespace zps::server
