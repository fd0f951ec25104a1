// ShardState's snapshot manager: copy-on-write snapshots of a shard's master, m and v for the
// checkpoints written in the background, and the buffer pool they and out-of-place updates share
// (buffer_pool.h). A snapshot (ShardSnapshot) is taken at one version and copies nothing then;
// the first later change of a chunk (an update, a speculative publish, a rollback) first hands
// the chunk's pre-update state to it, unless its reader copied the chunk already. Its reader
// (ShardSnapshot::Visit) runs on a thread of its own while steps go on.
//
// The manager knows chunks by their index in the shard's chunk table (0 .. size - 1) and reads
// their live state through the LiveState given at construction; it knows nothing of versions,
// the store or the step protocol: the shard checks those before Open (ShardState::BeginSnapshot)
// and calls the write hooks below before it changes a chunk.
//
// Lock order (a lock may be taken while holding the one before it, never the reverse):
//   ShardState::mu_ -> SnapshotManager::mu_          (Open and Current, from under the shard's)
//   ShardSnapshot::mu_ -> BufferPool's mutex          (a copy takes buffers from the pool)
// SnapshotManager::mu_ and the pool's are leaves. A ShardSnapshot's mu_ is never taken under
// ShardState::mu_ or SnapshotManager::mu_: the shard reads the open snapshot under its lock
// (Current), releases it, and only then calls the write hooks, which may wait for a chunk's
// copy by the reader. The two edges are annotated for clang (SnapshotManager::mu_
// ACQUIRED_AFTER(ShardState::mu_), ShardSnapshot::mu_ ACQUIRED_BEFORE(BufferPool::mu_)); "never
// under" has no annotation, so it rests on the write hooks' comment below.
//
// Thread-safety: every SnapshotManager method is thread-safe. The write hooks (UpdateOutOfPlace,
// Replace, PreserveAll) change the live state they are given: the caller is its only writer (the
// shard's step driver). A snapshot's reader reads the live state without any lock of the shard,
// which is safe because every write of a chunk is preceded by a write hook, and a hook waits for
// the reader's copy of that chunk (the snapshot's mu_): while the snapshot still needs the live
// buffers the hook does not write them (it updates out of place, or the snapshot takes them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shard/buffer_pool.h"
#include "shard/chunk_layout.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/shard_state.h"

namespace zps::server {

class SnapshotManager;

/// A consistent copy-on-write snapshot of a shard's master, m and v at one version
/// (ShardState::BeginSnapshot, SnapshotManager::Open), for a checkpoint written while later steps
/// run. Chunks not yet changed since the snapshot are read from the live state; a step that
/// changes one first gives its pre-update buffers here (the update runs out of place; a rollback
/// copies), so its memory cost is at most one copy of the state, only for chunks that change
/// before the reader gets to them; written buffers go back to the manager's pool.
/// Thread-safety: Visit on one thread at a time; copied_on_write from any. The manager (and the
/// live state it reads) must outlive Visit.
class ShardSnapshot {
 public:
  ShardSnapshot(const SnapshotManager* manager, int64_t version);  // use SnapshotManager::Open
  ~ShardSnapshot();
  ShardSnapshot(const ShardSnapshot&) = delete;
  ShardSnapshot& operator=(const ShardSnapshot&) = delete;

  int64_t version() const { return version_; }
  /// Visits every chunk ascending, as ShardState::VisitChunkState, with the state as of the
  /// snapshot; `fn` runs on the calling thread without any lock of the shard, spans valid during
  /// the call. It first copies every chunk not yet changed into buffers of its own (a step then
  /// updates that chunk in place), then calls `fn` for each. Call once. Errors:
  /// ResourceExhausted (a copy, here or a copy-on-write before, could not allocate), whatever
  /// `fn` returns (the visit stops).
  Status Visit(const ShardState::ChunkVisitor& fn) EXCLUDES(mu_);
  /// Chunks changed before the reader took them (kept for it: the copy-on-write count).
  uint64_t copied_on_write() const EXCLUDES(mu_);

 private:
  friend class SnapshotManager;
  enum class Phase : uint8_t {
    kLive,    // not changed yet, not copied: read from the live state
    kCopied,  // changed: holds the pre-update state it was handed (or a copy of it)
    kTaken,   // copied by the reader before any change: the live state is the shard's again
  };
  struct Entry {
    Phase phase = Phase::kLive;
    ChunkBuffers state;  // kCopied, kTaken
  };
  // Before chunk `index` changes in place: copies its live state (once).
  void Preserve(size_t index) EXCLUDES(mu_);
  // Before chunk `index`'s buffers are replaced: when the snapshot still needs the live state,
  // takes the buffers themselves (no copy) and returns true.
  bool Adopt(size_t index, ChunkBuffers& live) EXCLUDES(mu_);
  // Whether the snapshot still needs chunk `index`'s live state (no copy of its own yet).
  bool Live(size_t index) const EXCLUDES(mu_);
  // Copies chunk `index`'s live state into `to` (sized here, from the pool).
  Status CopyLive(size_t index, ChunkBuffers& to) const REQUIRES(mu_);

  const SnapshotManager* const manager_;
  const int64_t version_;
  mutable Mutex mu_ ACQUIRED_BEFORE(BufferPool::mu_);
  std::vector<Entry> entries_ GUARDED_BY(mu_);  // per chunk, in chunk-table order
  Status error_ GUARDED_BY(mu_);                // a copy-on-write that failed
  uint64_t cow_ GUARDED_BY(mu_) = 0;
};

class SnapshotManager {
 public:
  /// Chunk `index`'s live state (master, m, v). Called without any lock of the shard (see
  /// Thread-safety); the reference stays valid for the manager's lifetime.
  using LiveState = std::function<const ChunkBuffers&(size_t index)>;
  /// The update of one chunk: writes the new state to `out`; `source` (out of place) is where the
  /// old state is read from, or null when `out` is the live state itself (in place).
  using UpdateFn = std::function<Status(const ChunkState& out, const ConstChunkState* source)>;

  /// `chunk_ids`: the shard's chunks in chunk-table order (index i is chunk_ids[i]).
  SnapshotManager(std::vector<uint32_t> chunk_ids, LiveState live);
  ~SnapshotManager();
  SnapshotManager(const SnapshotManager&) = delete;
  SnapshotManager& operator=(const SnapshotManager&) = delete;

  /// Opens a snapshot of the live state, as of `version` (which the caller checked every chunk is
  /// at). It is open until its last reference is dropped. Errors: FailedPrecondition (a snapshot
  /// is still open).
  Result<std::shared_ptr<ShardSnapshot>> Open(int64_t version) EXCLUDES(mu_);
  /// The open snapshot, or null.
  std::shared_ptr<ShardSnapshot> Current() const EXCLUDES(mu_);

  // ---- write hooks: called before the live state changes, without the shard's lock ----
  /// Updates chunk `index`, whose live state is `live`, with `update`. When `snap` still needs
  /// the live state, out of place: into buffers from the pool, which then replace `live`, whose
  /// old buffers go to `snap`; otherwise in place. Errors: ResourceExhausted (no buffers), from
  /// `update` (`live` is then unchanged when the update ran out of place).
  Status UpdateOutOfPlace(ShardSnapshot& snap, size_t index, ChunkBuffers& live,
                          const UpdateFn& update);
  /// Makes `next` chunk `index`'s live state (a speculative publish): when `snap` (may be null)
  /// still needs the live state it takes `live`'s buffers and `next` is left empty; otherwise
  /// `live` and `next` swap (`next` gets the old buffers back, as a spare).
  void Replace(ShardSnapshot* snap, size_t index, ChunkBuffers& live, ChunkBuffers& next);
  /// Before every chunk changes in place (a rollback): `snap` copies each chunk it still needs.
  /// A copy that fails is reported by its Visit.
  void PreserveAll(ShardSnapshot& snap);

  /// Allocates and faults in one set of master, m and v buffers per chunk for the pool, on the
  /// "zps-reserve" thread at the lowest CPU priority, and returns at once (BufferPool::Reserve).
  /// Only the first call does anything. `who` prefixes its log lines.
  void Reserve(std::string who);
  /// The buffers snapshots hand back, shared with the shard's out-of-place updates and spares.
  BufferPool& buffers() const { return *buffers_; }
  size_t size() const { return chunk_ids_.size(); }

 private:
  friend class ShardSnapshot;

  const std::vector<uint32_t> chunk_ids_;
  const LiveState live_;
  const std::unique_ptr<BufferPool> buffers_;
  mutable Mutex mu_ ACQUIRED_AFTER(ShardState::mu_);
  std::weak_ptr<ShardSnapshot> open_ GUARDED_BY(mu_);
};

}  // namespace zps::server
