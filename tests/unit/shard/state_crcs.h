// state_crcs.h — the comparison the ShardState tests end on: two shards hold the same bits,
// chunk by chunk (ChunkCrc: master, m, v and serving copy) and as a whole (StateCrc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {

/// Every chunk of `a` has the CRC (master, m, v, serving copy) of the same chunk of `b`. `where`
/// ("after step 3") goes into each failure's message.
inline void ExpectSameChunkCrcs(const ShardState& a, const ShardState& b,
                                const std::string& where) {
  for (uint32_t id : a.chunk_ids()) {
    auto x = a.ChunkCrc(id);
    auto y = b.ChunkCrc(id);
    ASSERT_THAT(x, IsOk());
    ASSERT_THAT(y, IsOk());
    EXPECT_EQ(*x, *y) << "chunk " << id << " " << where;
  }
}

/// ExpectSameChunkCrcs, and the same CRC of the whole state.
inline void ExpectSameState(const ShardState& a, const ShardState& b, const std::string& where) {
  ExpectSameChunkCrcs(a, b, where);
  EXPECT_EQ(a.StateCrc(), b.StateCrc()) << where;
}

}  // namespace zps::server::testing
