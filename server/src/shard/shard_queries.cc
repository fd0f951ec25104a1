#include "shard/shard_queries.h"

#include <cstddef>
#include <string>

#include "zps/server/shard_state.h"

namespace zps::server {

Result<msg::ChunkCrcs> ChunkCrcsOf(const ShardState* st, const msg::ChunkCrcsRequest& req) {
  if (st == nullptr) return Unavailable("the shard has no job yet");
  msg::ChunkCrcs out;
  out.version = st->version();
  if (out.version < req.min_version) {
    return Unavailable("shard at version " + std::to_string(out.version));
  }
  for (uint32_t c : st->chunk_ids()) {
    ZPS_ASSIGN_OR_RETURN(uint32_t crc, st->ChunkCrc(c));
    out.crcs.emplace_back(c, crc);
  }
  return out;
}

Result<msg::MasterRange> ReadMasterOf(const ShardState* st, const msg::ReadMasterRequest& req) {
  if (st == nullptr) return Unavailable("the shard has no job yet");
  msg::MasterRange out;
  out.version = st->version();
  if (out.version < req.min_version) {
    return Unavailable("shard at version " + std::to_string(out.version));
  }
  ZPS_ASSIGN_OR_RETURN(auto master, st->MasterOf(req.chunk));  // OutOfRange: not local
  if (req.offset > master.size() || req.length > master.size() - req.offset) {
    return OutOfRange("ReadMaster range past chunk " + std::to_string(req.chunk));
  }
  out.values.assign(master.begin() + static_cast<ptrdiff_t>(req.offset),
                    master.begin() + static_cast<ptrdiff_t>(req.offset + req.length));
  return out;
}

}  // namespace zps::server
