// A shard's read-only queries for tools and tests (kChunkCrcs, kReadMaster), apart from the wire:
// shard_rpc_service.cc decodes the requests and encodes these answers. Tested in-process
// (tests/unit/shard/shard_queries_test.cc).
//
// Thread-safety: as ShardState's ChunkCrc and MasterOf (any thread).
#pragma once

#include "zps/common/messages.h"
#include "zps/common/status.h"

namespace zps::server {

class ShardState;

/// The CRC32C of every local chunk's fp32 master, ascending by chunk, once the shard reached
/// req.min_version. `st` is null until the shard loaded the job. Errors: Unavailable (no job
/// yet, or the shard's version is below min_version: retry); from ShardState::ChunkCrc.
Result<msg::ChunkCrcs> ChunkCrcsOf(const ShardState* st, const msg::ChunkCrcsRequest& req);

/// Elements [offset, offset + length) of a local chunk's fp32 master, once the shard reached
/// req.min_version. Errors: Unavailable (as above); OutOfRange (the chunk is not local, or the
/// range runs past it).
Result<msg::MasterRange> ReadMasterOf(const ShardState* st, const msg::ReadMasterRequest& req);

}  // namespace zps::server
