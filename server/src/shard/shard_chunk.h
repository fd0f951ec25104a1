// The chunk table's entry: what ShardState keeps per local chunk. What the state buffers hold is
// described in chunk_layout.h, the gradient slots in gradient_slots.h.
//
// Thread-safety: ShardState::mu_ guards every field after Create except where noted (a nested
// struct's annotation cannot name the enclosing object's mutex; the analysis checks them through
// the REQUIRES(mu_) functions that take a Chunk). master, m and v are written only by the
// update and ResetTo, on the step driver's thread; a speculative publish swaps them under mu_.
#pragma once

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "shard/chunk_layout.h"
#include "shard/gradient_slots.h"
#include "zps/server/shard_state.h"

namespace zps::server {

struct ShardState::Chunk {
  uint32_t id = 0;
  uint64_t size = 0;
  ChunkBuffers state;           // master, m, v; empty when they live in the store
  std::span<uint16_t> serving;  // from the ServingAllocator (or serving_own_, or the store's
                                // resident serving RAM), zeroed at Create; empty if spilled or made
                                // on fetch. With banks: banks[version % 2] (Publish sets it).
  std::span<uint16_t> banks[2];  // "Serving banks"; empty when there is one
  GradientSlots slots;           // the step in progress (see "Rollback fence")
  // [begin, end) of one group (or frozen), covering the chunk: the update's runs.
  struct Run {
    uint64_t begin = 0, end = 0;
    uint32_t group = 0;
    bool frozen = false;
  };
  std::vector<Run> runs;  // fixed at Create
  int64_t version = -1;
  std::vector<Waiter> waiters;
  SpecPhase spec = SpecPhase::kIdle;
  ChunkReport report;      // kReduced / kSpeculated
  CommitOrder spec_order;  // kSpeculated
  int spare = -1;          // index into the speculative policy's spares (kSpeculated)
};

inline bool ShardState::Sealed(const Chunk& c) const {
  return c.version == sealed_step_ || c.spec != SpecPhase::kIdle;
}

inline std::span<uint16_t> ShardState::ServingFor(const Chunk& c, int64_t version) {
  if (c.banks[0].empty()) return c.serving;
  return c.banks[std::max<int64_t>(version, 0) & 1];
}

inline void ShardState::MirrorServing(const Chunk& c) {
  if (c.banks[0].empty()) return;
  std::span<uint16_t> other = c.serving.data() == c.banks[0].data() ? c.banks[1] : c.banks[0];
  std::memcpy(other.data(), c.serving.data(), c.serving.size_bytes());
}

inline bool ShardState::ServedByTier(const Chunk& c) const {
  return TierServes() && c.serving.empty();
}

inline size_t ShardState::IndexOf(const Chunk& c) const {
  return static_cast<size_t>(&c - chunks_.data());
}

}  // namespace zps::server
