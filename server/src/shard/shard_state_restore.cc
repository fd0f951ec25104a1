// ShardState's durability operations: visiting the state for a checkpoint, opening a snapshot of
// it for one written in the background (snapshot_manager.h), and rolling back to a restored one.
// See shard_state.h.
#include <algorithm>
#include <cstring>

#include "shard/chunk_layout.h"
#include "shard/serving_tier.h"
#include "shard/shard_chunk.h"
#include "shard/snapshot_manager.h"
#include "shard/update_policy.h"
#include "zps/common/logging.h"
#include "zps/server/shard_state.h"

namespace zps::server {

Status ShardState::VisitChunkState(const ChunkVisitor& fn) const {
  int64_t version = 0;
  {
    MutexLock lock(&mu_);
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
  if (store_) {  // a read-only pipelined pass over the store
    PassOptions pass;
    pass.write_state = false;
    return CountIo(
        store_->ForEachChunk(store_ids_, pass, [&](uint32_t i, const ChunkSpans& s) -> Status {
          return fn(chunks_[i].id, version, s.state.master, s.state.m, s.state.v);
        }));
  }
  for (const Chunk& c : chunks_) {
    const ConstChunkState st = c.state.spans();
    ZPS_RETURN_IF_ERROR(fn(c.id, version, st.master, st.m, st.v));
  }
  return Status::Ok();
}

void ShardState::FailWaiters(const Status& reason) {
  std::vector<Waiter> failed;
  {
    MutexLock lock(&mu_);
    for (auto& c : chunks_) {
      for (auto& w : c.waiters) failed.push_back(std::move(w));
      c.waiters.clear();
    }
    for (auto& w : serving_->TakeQueued()) failed.push_back(std::move(w));
  }
  for (auto& w : failed) w.cb(reason, -1, {}, nullptr);
}

void ShardState::ReserveSnapshotBuffers() {
  if (store_) return;
  snapshots_->Reserve("shard " + std::to_string(ordinal_));
}

Result<std::shared_ptr<ShardSnapshot>> ShardState::BeginSnapshot() {
  MutexLock lock(&mu_);
  if (store_) {
    return FailedPrecondition(
        "a shard with a memory budget (state in the spill store) writes "
        "its checkpoints synchronously");
  }
  if (chunks_.empty()) return FailedPrecondition("the shard holds no chunks");
  const int64_t version = chunks_.front().version;
  for (const Chunk& c : chunks_) {
    if (c.version != version) {
      return FailedPrecondition("chunks are at different versions (" + std::to_string(version) +
                                " and " + std::to_string(c.version) + ")");
    }
  }
  if (version < 0) return FailedPrecondition("the shard's chunks are not initialised yet");
  return snapshots_->Open(version);
}

Status ShardState::ResetTo(int64_t version, const ChunkLoader& load, const Status& reason) {
  if (version == 0 || version < -1) {
    return InvalidArgument("a shard rolls back to version -1 or >= 1, not " +
                           std::to_string(version));
  }
  std::vector<Waiter> failed;
  Status slots;
  std::shared_ptr<Snapshot> snap;
  {
    MutexLock lock(&mu_);
    ++epoch_;
    // The chunk being speculated reads the live state and the gradient slots: let it finish.
    cv_.Wait(lock, [&]() REQUIRES(mu_) { return shutdown_ || policy_->Idle(); });
    policy_->Reset();
    snap = snapshots_->Current();
    sealed_step_ = INT64_MIN;
    for (Chunk& c : chunks_) {
      c.spec = SpecPhase::kIdle;
      c.spare = -1;
      for (auto& w : c.waiters) failed.push_back(std::move(w));
      c.waiters.clear();
      c.slots.ResetCoverage();
      if (slots.ok()) slots = c.slots.Fresh();
      c.version = -1;  // nothing is served until the state is back
    }
    for (auto& w : serving_->TakeQueued()) failed.push_back(std::move(w));
  }
  for (auto& w : failed) w.cb(reason, -1, {}, nullptr);
  ZPS_RETURN_IF_ERROR(slots);
  if (snap) snapshots_->PreserveAll(*snap);
  // The tier's reader waits while masters and copies are rewritten (and a conversion of a master
  // in progress ends first).
  if (TierServes()) serving_->BeginRewrite();
  Status loaded;
  if (store_) {
    // An initialising pass: nothing is read; every record is overwritten (and a record lost by
    // a failed write becomes valid again).
    // With serving records the pass also rewrites every serving copy (spilled ones behind).
    PassOptions pass;
    pass.read_state = false;
    pass.serving = serving_in_store_;
    loaded = CountIo(
        store_->ForEachChunk(store_ids_, pass, [&](uint32_t i, const ChunkSpans& s) -> Status {
          Chunk& c = chunks_[i];
          const std::span<uint16_t> serving = serving_in_store_ ? s.serving : c.serving;
          if (version < 0) {
            std::fill(s.state.master.begin(), s.state.master.end(), 0.0f);
            std::fill(s.state.m.begin(), s.state.m.end(), std::byte{0});  // zero moments
            std::fill(s.state.v.begin(), s.state.v.end(), std::byte{0});
            std::fill(serving.begin(), serving.end(), uint16_t{0});
            return Status::Ok();
          }
          if (Status st = load(c.id, s.state.master, s.state.m, s.state.v); !st.ok()) return st;
          if (!serving.empty()) ToServing(s.state.master, serving);  // empty: made on fetch
          return Status::Ok();
        }));
  } else {
    for (Chunk& c : chunks_) {
      c.serving = ServingFor(c, version);  // the bank of the version restored (empty: on fetch)
      if (version < 0) {
        c.state.Zero();
        std::fill(c.serving.begin(), c.serving.end(), uint16_t{0});
        MirrorServing(c);
        continue;
      }
      const ChunkState st = c.state.spans();
      loaded = load(c.id, st.master, st.m, st.v);
      if (!loaded.ok()) break;
      if (!c.serving.empty()) ToServing(st.master, c.serving);
      MirrorServing(c);  // frozen runs are never rewritten: both banks hold them
    }
  }
  // The versions stay -1 until the end, so nothing is served from a half-restored copy; a
  // failed restore is retried by the caller (ResetTo again), which clears the tier's error.
  if (TierServes()) serving_->EndRewrite(Status::Ok());
  ZPS_RETURN_IF_ERROR(loaded);
  if (version >= 1) {
    MutexLock lock(&mu_);
    for (Chunk& c : chunks_) c.version = version;
  }
  cv_.SignalAll();
  return Status::Ok();
}

// ---- the store-backed path (a shard with a memory budget) --------------------------------------

Status ShardState::CountIo(Status s) const {
  if (s.code() == Code::kIoError || s.code() == Code::kResourceExhausted ||
      s.code() == Code::kDataLoss) {
    io_errors_.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

Status ShardState::StoreInitChunk(Chunk& c) {
  // Zeroed bytes are zero moments in every state dtype.
  const std::vector<std::byte> m(kinds_->bytes(StateKind::kM, c.size), std::byte{0});
  const std::vector<std::byte> v(kinds_->bytes(StateKind::kV, c.size), std::byte{0});
  return CountIo(
      store_->WriteChunk(static_cast<uint32_t>(IndexOf(c)), c.slots.initial_values(), m, v));
}

Status ShardState::StoreChunkCopy(const Chunk& c, std::vector<float>& master,
                                  std::vector<std::byte>& m, std::vector<std::byte>& v) const {
  master.assign(c.size, 0.0f);
  m.assign(kinds_->bytes(StateKind::kM, c.size), std::byte{0});
  v.assign(kinds_->bytes(StateKind::kV, c.size), std::byte{0});
  return CountIo(store_->ReadChunk(static_cast<uint32_t>(IndexOf(c)), master, m, v));
}

StateDType ShardState::state_dtype() const { return kinds_->state_dtype(); }

ShardStorageStats ShardState::storage_stats() const {
  ShardStorageStats out;
  out.spilled = store_ != nullptr;
  if (store_) out.store = store_->stats();
  out.io_errors = io_errors_.load(std::memory_order_relaxed);
  out.serving_in_store = serving_in_store_;
  out.serving_on_fetch = serving_on_fetch_;
  out.serving_staging_bytes = serving_->staging_bytes();
  // The tier's reader answers either spilled copies or copies made on fetch, never both.
  if (serving_on_fetch_) {
    out.made_fetches = serving_->fetches();
    out.made_fetch_conversions = serving_->reads();
  } else {
    out.spilled_fetches = serving_->fetches();
    out.spilled_fetch_reads = serving_->reads();
  }
  return out;
}

ShardStateBytes ShardState::state_bytes() const {
  ShardStateBytes out;
  const uint64_t banks = serving_bank_bytes_ > 0 ? 2 : 1;
  MutexLock lock(&mu_);  // the slots' buffers (their sizes never change)
  for (const Chunk& c : chunks_) {
    out.master += kinds_->bytes(StateKind::kMaster, c.size);
    const uint64_t m_scales = kinds_->scale_bytes(StateKind::kM, c.size);
    const uint64_t v_scales = kinds_->scale_bytes(StateKind::kV, c.size);
    out.m += kinds_->bytes(StateKind::kM, c.size) - m_scales;
    out.v += kinds_->bytes(StateKind::kV, c.size) - v_scales;
    out.scales += m_scales + v_scales;
    if (!serving_on_fetch_) out.serving += banks * kinds_->bytes(StateKind::kServing, c.size);
    out.grad += c.slots.bytes();
  }
  return out;
}

}  // namespace zps::server
