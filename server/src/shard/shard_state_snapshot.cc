// Copy-on-write snapshots of a shard's state for checkpoints written in the background. See
// ShardState::Snapshot in shard_state.h. Lock order: ShardState::mu_ is never held while a
// snapshot's mu_ is taken (ApplyCommit and ResetTo take the snapshot pointer first, then
// release mu_ before Preserve).
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>

#include "zps/common/logging.h"
#include "zps/server/shard_state.h"

namespace zps::server {

Result<AlignedBuffer<float>> ShardState::TakeBuffer(size_t n) {
  if (n == 0) return AlignedBuffer<float>();
  {
    MutexLock lock(&buffers_mu_);
    auto it = buffers_.find(n);
    if (it != buffers_.end()) {
      AlignedBuffer<float> b = std::move(it->second);
      buffers_.erase(it);
      return b;
    }
  }
  return AlignedBuffer<float>::AllocateUninitialized(n);
}

void ShardState::GiveBuffer(AlignedBuffer<float> b) {
  if (b.size() == 0) return;
  MutexLock lock(&buffers_mu_);
  buffers_.emplace(b.size(), std::move(b));
}

void ShardState::ReserveSnapshotBuffers() {
  if (store_ || reserve_thread_.joinable()) return;
  std::vector<size_t> sizes;
  uint64_t bytes = 0;
  for (const Chunk& c : chunks_) {
    for (size_t n : {c.master.size(), c.m.size(), c.v.size()}) {
      if (n == 0) continue;
      sizes.push_back(n);
      bytes += n * sizeof(float);
    }
  }
  ZPS_LOG(INFO) << "shard " << ordinal_ << ": reserving " << bytes
                << " bytes for the snapshots of background checkpoints";
  reserve_thread_ = std::thread([this, sizes = std::move(sizes)] {
    log::SetThreadName("zps-reserve");
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);  // best effort
    for (size_t n : sizes) {
      if (reserve_stop_.load(std::memory_order_relaxed)) return;
      auto b = AlignedBuffer<float>::Allocate(n);  // zeroed: every page faulted in here
      if (!b.ok()) {
        ZPS_LOG(WARNING) << "shard " << ordinal_
                         << ": snapshot buffers not reserved: " << b.status().ToString();
        return;
      }
      GiveBuffer(std::move(*b));
    }
  });
}

Status ShardState::UpdateForSnapshot(size_t i, Snapshot& snap, const CommitOrder& order,
                                     std::span<uint16_t> serving) {
  Chunk& c = chunks_[i];
  if (!snap.Live(i)) {  // the snapshot has its own copy: the live state is ours again
    return UpdateChunk(c, {c.master.span(), c.m.span(), c.v.span()}, serving, order);
  }
  ZPS_ASSIGN_OR_RETURN(AlignedBuffer<float> master, TakeBuffer(c.master.size()));
  ZPS_ASSIGN_OR_RETURN(AlignedBuffer<float> m, TakeBuffer(c.m.size()));
  ZPS_ASSIGN_OR_RETURN(AlignedBuffer<float> v, TakeBuffer(c.v.size()));
  // The live state is not written (the reader may copy it meanwhile); the new state goes to the
  // fresh buffers, which then replace it.
  const ConstChunkState live{c.master.span(), c.m.span(), c.v.span()};
  Status s = UpdateChunk(c, {master.span(), m.span(), v.span()}, serving, order, &live);
  if (!s.ok()) {
    GiveBuffer(std::move(master));
    GiveBuffer(std::move(m));
    GiveBuffer(std::move(v));
    return s;
  }
  if (!snap.Adopt(i, c.master, c.m, c.v)) {  // the reader took the chunk already
    GiveBuffer(std::move(c.master));
    GiveBuffer(std::move(c.m));
    GiveBuffer(std::move(c.v));
  }
  c.master = std::move(master);
  c.m = std::move(m);
  c.v = std::move(v);
  return Status::Ok();
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

uint64_t ShardState::Snapshot::copied_on_write() const {
  MutexLock lock(&mu_);
  return cow_;
}

Status ShardState::Snapshot::CopyLive(size_t index, AlignedBuffer<float>& master,
                                      AlignedBuffer<float>& m, AlignedBuffer<float>& v) const {
  const Chunk& c = state_->chunks_[index];
  auto copy = [this](const AlignedBuffer<float>& from, AlignedBuffer<float>& to) -> Status {
    if (to.size() != from.size()) {
      ZPS_ASSIGN_OR_RETURN(to, state_->TakeBuffer(from.size()));  // every element written below
    }
    if (from.size() > 0) std::memcpy(to.data(), from.data(), from.size() * sizeof(float));
    return Status::Ok();
  };
  ZPS_RETURN_IF_ERROR(copy(c.master, master));
  ZPS_RETURN_IF_ERROR(copy(c.m, m));
  return copy(c.v, v);
}

void ShardState::Snapshot::Preserve(size_t index) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return;
  e.phase = Phase::kCopied;
  ++cow_;
  if (Status s = CopyLive(index, e.master, e.m, e.v); !s.ok() && error_.ok()) {
    error_ = s.WithContext("copy-on-write of chunk " + std::to_string(state_->chunks_[index].id) +
                           " for the checkpoint of step " + std::to_string(version_));
  }
}

bool ShardState::Snapshot::Live(size_t index) const {
  MutexLock lock(&mu_);
  return entries_[index].phase == Phase::kLive;
}

bool ShardState::Snapshot::Adopt(size_t index, AlignedBuffer<float>& master,
                                 AlignedBuffer<float>& m, AlignedBuffer<float>& v) {
  MutexLock lock(&mu_);
  Entry& e = entries_[index];
  if (e.phase != Phase::kLive) return false;
  e.phase = Phase::kCopied;
  ++cow_;
  e.master = std::move(master);
  e.m = std::move(m);
  e.v = std::move(v);
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
    ZPS_RETURN_IF_ERROR(CopyLive(i, e.master, e.m, e.v));
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
    Status s = fn(state_->chunks_[i].id, version_, e->master.span(), e->m.span(), e->v.span());
    {  // written: the buffers serve the next snapshot or out-of-place update
      MutexLock lock(&mu_);
      state_->GiveBuffer(std::move(e->master));
      state_->GiveBuffer(std::move(e->m));
      state_->GiveBuffer(std::move(e->v));
    }
    ZPS_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

}  // namespace zps::server
