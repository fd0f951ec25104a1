// Copy-on-write snapshots of a shard's state for checkpoints written in the background. See
// ShardState::Snapshot in shard_state.h; the buffers it takes and hands back are the
// BufferPool's (buffer_pool.h). Lock order: ShardState::mu_ is never held while a
// snapshot's mu_ is taken (ApplyCommit and ResetTo take the snapshot pointer first, then
// release mu_ before Preserve).
#include <utility>

#include "shard/buffer_pool.h"
#include "shard/chunk_layout.h"
#include "shard/shard_chunk.h"
#include "zps/common/logging.h"
#include "zps/server/shard_state.h"

namespace zps::server {

struct ShardState::Snapshot::Entry {
  Phase phase = Phase::kLive;
  ChunkBuffers state;  // kCopied, kTaken
};

void ShardState::ReserveSnapshotBuffers() {
  if (store_) return;
  std::vector<size_t> masters, moments;
  for (const Chunk& c : chunks_) {
    masters.push_back(c.state.master.size());
    for (const auto* b : {&c.state.m, &c.state.v}) {
      if (b->size() > 0) moments.push_back(b->size());
    }
  }
  buffers_->Reserve(std::move(masters), std::move(moments), "shard " + std::to_string(ordinal_));
}

Result<std::shared_ptr<ShardState::Snapshot>> ShardState::BeginSnapshot() {
  MutexLock lock(&mu_);
  if (store_) {
    return FailedPrecondition(
        "a shard with a memory budget (state in the spill store) writes "
        "its checkpoints synchronously");
  }
  if (snapshot_.lock()) return FailedPrecondition("a snapshot is still open");
  if (chunks_.empty()) return FailedPrecondition("the shard holds no chunks");
  const int64_t version = chunks_.front().version;
  for (const Chunk& c : chunks_) {
    if (c.version != version) {
      return FailedPrecondition("chunks are at different versions (" + std::to_string(version) +
                                " and " + std::to_string(c.version) + ")");
    }
  }
  if (version < 0) return FailedPrecondition("the shard's chunks are not initialised yet");
  auto snap = std::make_shared<Snapshot>(this, version);
  snapshot_ = snap;
  return snap;
}

ShardState::Snapshot::Snapshot(ShardState* state, int64_t version)
    : state_(state), version_(version), entries_(state->chunks_.size()) {}

ShardState::Snapshot::~Snapshot() = default;

uint64_t ShardState::Snapshot::copied_on_write() const {
  MutexLock lock(&mu_);
  return cow_;
}

Status ShardState::Snapshot::CopyLive(size_t index, ChunkBuffers& to) const {
  const Chunk& c = state_->chunks_[index];
  // Every element is written below.
  ZPS_ASSIGN_OR_RETURN(to, state_->buffers_->TakeLike(c.state));
  to.CopyFrom(c.state);
  return Status::Ok();
}

void ShardState::Snapshot::Preserve(size_t index) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return;
  e.phase = Phase::kCopied;
  ++cow_;
  if (Status s = CopyLive(index, e.state); !s.ok() && error_.ok()) {
    error_ = s.WithContext("copy-on-write of chunk " + std::to_string(state_->chunks_[index].id) +
                           " for the checkpoint of step " + std::to_string(version_));
  }
}

bool ShardState::Snapshot::Live(size_t index) const {
  MutexLock lock(&mu_);
  return entries_[index].phase == Phase::kLive;
}

bool ShardState::Snapshot::Adopt(size_t index, ChunkBuffers& live) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return false;
  e.phase = Phase::kCopied;
  ++cow_;
  e.state = std::move(live);
  return true;
}

Status ShardState::Snapshot::Visit(const ChunkVisitor& fn) {
  const size_t n = state_->chunks_.size();  // entries_ is per chunk
  // First every chunk no step has changed yet is copied, at memory speed, into buffers of the
  // snapshot's own (from the pool the written buffers return to). From then on a step updates
  // that chunk in place (UpdateForSnapshot), as without a checkpoint: only the steps that come
  // before a chunk's copy pay for an out-of-place update, and the write itself (CRC, RocksDB,
  // disk), which takes far longer than the copies, runs beside steps that change nothing it
  // reads. Each copy holds mu_, so a step that wants to change that chunk waits for it.
  for (size_t i = 0; i < n; ++i) {
    MutexLock lock(&mu_);
    ZPS_RETURN_IF_ERROR(error_);
    Entry& e = entries_[i];
    if (e.phase != Phase::kLive) continue;
    ZPS_RETURN_IF_ERROR(CopyLive(i, e.state));
    e.phase = Phase::kTaken;
  }
  for (size_t i = 0; i < n; ++i) {
    Entry* e = nullptr;
    {
      MutexLock lock(&mu_);
      ZPS_RETURN_IF_ERROR(error_);
      e = &entries_[i];
    }
    // Read without mu_: a kCopied or kTaken entry is not touched by Preserve or Adopt any more.
    const ConstChunkState st = std::as_const(e->state).spans();
    Status s = fn(state_->chunks_[i].id, version_, st.master, st.m, st.v);
    {  // written: the buffers serve the next snapshot or out-of-place update
      MutexLock lock(&mu_);
      state_->buffers_->Give(std::move(e->state));
    }
    ZPS_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

}  // namespace zps::server
