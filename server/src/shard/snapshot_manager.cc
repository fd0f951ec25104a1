#include "shard/snapshot_manager.h"

#include <utility>

namespace zps::server {

SnapshotManager::SnapshotManager(std::vector<uint32_t> chunk_ids, LiveState live)
    : chunk_ids_(std::move(chunk_ids)),
      live_(std::move(live)),
      buffers_(std::make_unique<BufferPool>()) {}

SnapshotManager::~SnapshotManager() = default;

Result<std::shared_ptr<ShardSnapshot>> SnapshotManager::Open(int64_t version) {
  MutexLock lock(&mu_);
  if (open_.lock()) return FailedPrecondition("a snapshot is still open");
  auto snap = std::make_shared<ShardSnapshot>(this, version);
  open_ = snap;
  return snap;
}

std::shared_ptr<ShardSnapshot> SnapshotManager::Current() const {
  MutexLock lock(&mu_);
  return open_.lock();
}

Status SnapshotManager::UpdateOutOfPlace(ShardSnapshot& snap, size_t index, ChunkBuffers& live,
                                         const UpdateFn& update) {
  if (!snap.Live(index)) {  // the snapshot has its own copy: the live state is ours again
    return update(live.spans(), nullptr);
  }
  ZPS_ASSIGN_OR_RETURN(ChunkBuffers fresh, buffers_->TakeLike(live));
  // The live state is not written (the reader may copy it meanwhile); the new state goes to the
  // fresh buffers, which then replace it.
  const ConstChunkState old = std::as_const(live).spans();
  if (Status s = update(fresh.spans(), &old); !s.ok()) {
    buffers_->Give(std::move(fresh));
    return s;
  }
  if (!snap.Adopt(index, live)) buffers_->Give(std::move(live));  // the reader took it already
  live = std::move(fresh);
  return Status::Ok();
}

void SnapshotManager::Replace(ShardSnapshot* snap, size_t index, ChunkBuffers& live,
                              ChunkBuffers& next) {
  if (snap && snap->Adopt(index, live)) {
    // The snapshot still needs the pre-update state: it took the live buffers themselves; `next`'s
    // become the live ones.
    live = std::move(next);
    return;
  }
  live.swap(next);
}

void SnapshotManager::PreserveAll(ShardSnapshot& snap) {
  for (size_t i = 0; i < chunk_ids_.size(); ++i) snap.Preserve(i);
}

void SnapshotManager::Reserve(std::string who) {
  std::vector<size_t> masters, moments;
  for (size_t i = 0; i < chunk_ids_.size(); ++i) {
    const ChunkBuffers& c = live_(i);
    masters.push_back(c.master.size());
    for (const auto* b : {&c.m, &c.v}) {
      if (b->size() > 0) moments.push_back(b->size());
    }
  }
  buffers_->Reserve(std::move(masters), std::move(moments), std::move(who));
}

// ---- ShardSnapshot

ShardSnapshot::ShardSnapshot(const SnapshotManager* manager, int64_t version)
    : manager_(manager), version_(version), entries_(manager->size()) {}

ShardSnapshot::~ShardSnapshot() = default;

uint64_t ShardSnapshot::copied_on_write() const {
  MutexLock lock(&mu_);
  return cow_;
}

Status ShardSnapshot::CopyLive(size_t index, ChunkBuffers& to) const {
  const ChunkBuffers& live = manager_->live_(index);
  // Every element is written below.
  ZPS_ASSIGN_OR_RETURN(to, manager_->buffers_->TakeLike(live));
  to.CopyFrom(live);
  return Status::Ok();
}

void ShardSnapshot::Preserve(size_t index) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return;
  e.phase = Phase::kCopied;
  ++cow_;
  if (Status s = CopyLive(index, e.state); !s.ok() && error_.ok()) {
    error_ = s.WithContext("copy-on-write of chunk " + std::to_string(manager_->chunk_ids_[index]) +
                           " for the checkpoint of step " + std::to_string(version_));
  }
}

bool ShardSnapshot::Live(size_t index) const {
  MutexLock lock(&mu_);
  return entries_[index].phase == Phase::kLive;
}

bool ShardSnapshot::Adopt(size_t index, ChunkBuffers& live) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return false;
  e.phase = Phase::kCopied;
  ++cow_;
  e.state = std::move(live);
  return true;
}

Status ShardSnapshot::Visit(const ShardState::ChunkVisitor& fn) {
  const size_t n = manager_->size();  // entries_ is per chunk
  // First every chunk no step has changed yet is copied, at memory speed, into buffers of the
  // snapshot's own (from the pool the written buffers return to). From then on a step updates
  // that chunk in place (UpdateOutOfPlace), as without a checkpoint: only the steps that come
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
    Status s = fn(manager_->chunk_ids_[i], version_, st.master, st.m, st.v);
    {  // written: the buffers serve the next snapshot or out-of-place update
      MutexLock lock(&mu_);
      manager_->buffers_->Give(std::move(e->state));
    }
    ZPS_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

}  // namespace zps::server
