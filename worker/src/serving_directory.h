// What a worker knows of its shards' serving regions, for one-sided fetches (protocol 3,
// docs/protocol.md "One-sided fetch of a published version"): per chunk, the address of its
// serving copy (learned from a kAmFetchRmaReply), the version known to be there (from that reply
// or a later kAmServingNotice), and per shard the region's packed rkey. A shard that serves from
// two banks (speculative updates, protocol 4) says how far the other bank is (bank_delta):
// versions of the learned one's parity are at the learned address, the others that far away.
//
// An entry is usable for a fetch at min_version m while m <= its version and this worker has not
// pushed a gradient for the chunk at a step >= that version (with pre-reduced pushes: for any
// chunk, since other ranks' slices may complete it). After such a push the shard may rewrite the
// copy (the update of that step needs this worker's contribution), so the fetch asks again.
//
// Thread-safety: every method is thread-safe (one mutex). Plain logic, no UCX: tested in-process
// (tests/unit/worker/serving_directory_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "zps/common/messages.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::worker {

class ServingDirectory {
 public:
  /// `shards` shards; `session[i]` the session token shard i issued (notices must carry it).
  /// `per_chunk_pushes`: true in server-sum mode (every rank pushes every chunk it trains, so a
  /// chunk's update waits for this worker's push of it); false (pre-reduced): any push at step
  /// s makes every entry at version <= s unusable.
  ServingDirectory(std::vector<uint64_t> session, bool per_chunk_pushes)
      : session_(std::move(session)), shards_(session_.size()), per_chunk_(per_chunk_pushes) {}

  struct Hit {
    int64_t version = -1;
    uint64_t address = 0;  // of the range asked for
    std::vector<std::byte> rkey;
  };

  /// From a kAmFetchRmaReply of `shard`: the range at element `offset` of `chunk` is at
  /// `address` (elements of `esize` bytes) at `version`, in the region whose rkey is `rkey`.
  /// A different rkey than the one known replaces it and forgets the shard's other entries
  /// (the region changed). `bank_delta`: FetchRmaReplyHeader::bank_delta (0: one bank).
  void Learn(uint32_t shard, uint32_t chunk, uint64_t offset, size_t esize, int64_t version,
             uint64_t address, std::span<const std::byte> rkey, int64_t bank_delta = 0) {
    if (shard >= session_.size() || rkey.empty() || version < 0) return;
    MutexLock lock(&mu_);
    Shard& s = shards_[shard];
    if (s.forgotten) return;
    if (!std::equal(s.rkey.begin(), s.rkey.end(), rkey.begin(), rkey.end())) {
      s.rkey.assign(rkey.begin(), rkey.end());
      s.chunks.clear();
    }
    Entry& e = s.chunks[chunk];
    e.base = address - offset * esize;
    e.base_version = version;
    e.bank_delta = bank_delta;
    e.version = std::max(e.version, version);
  }

  /// A kAmServingNotice from `shard`. Errors (nothing changes): Unauthenticated for a session
  /// token other than the shard's; FailedPrecondition for a version below one already known
  /// from a notice (a stale notice). kNoticeForget (-1) forgets the shard's entries.
  Status Notice(uint32_t shard, uint64_t session, int64_t version) {
    if (shard >= session_.size()) {
      return OutOfRange("serving notice from shard " + std::to_string(shard));
    }
    if (session != session_[shard]) {
      return Unauthenticated("serving notice with another session's token");
    }
    MutexLock lock(&mu_);
    Shard& s = shards_[shard];
    if (version < 0) {
      s.chunks.clear();
      s.noticed = -1;
      s.forgotten = true;
      return Status::Ok();
    }
    if (s.forgotten) return FailedPrecondition("serving notice after the session was fenced");
    if (version < s.noticed) {
      return FailedPrecondition("stale serving notice: version " + std::to_string(version) +
                                " after " + std::to_string(s.noticed));
    }
    s.noticed = version;
    for (auto& [chunk, e] : s.chunks) e.version = std::max(e.version, version);
    return Status::Ok();
  }

  /// This worker pushed (or is about to push) a gradient of `step` into `chunk`.
  void Pushed(uint32_t chunk, int64_t step) {
    MutexLock lock(&mu_);
    if (!per_chunk_) {
      any_pushed_ = std::max(any_pushed_, step);
      return;
    }
    auto [it, fresh] = pushed_.try_emplace(chunk, step);
    if (!fresh) it->second = std::max(it->second, step);
  }

  /// Where to RMA-get `bytes` bytes at element `offset` of `chunk` on `shard` at version >=
  /// min_version without asking, or nullopt (ask the shard).
  std::optional<Hit> Lookup(uint32_t shard, uint32_t chunk, uint64_t offset, size_t esize,
                            int64_t min_version) const {
    if (shard >= session_.size()) return std::nullopt;
    MutexLock lock(&mu_);
    const Shard& s = shards_[shard];
    if (s.forgotten) return std::nullopt;
    auto it = s.chunks.find(chunk);
    if (it == s.chunks.end() || it->second.version < min_version) return std::nullopt;
    int64_t pushed = any_pushed_;
    if (per_chunk_) {
      auto p = pushed_.find(chunk);
      pushed = p == pushed_.end() ? INT64_MIN : p->second;
    }
    const Entry& e = it->second;
    if (pushed >= e.version) return std::nullopt;  // the shard may be rewriting it
    // The bank of e.version: the learned one at the same parity, the other one otherwise.
    const bool other = ((e.version - e.base_version) & 1) != 0;
    const uint64_t base = e.base + (other ? static_cast<uint64_t>(e.bank_delta) : 0);
    return Hit{e.version, base + offset * esize, s.rkey};
  }

  /// Forgets what is known of `shard` (it failed, or answered a fetch with an error).
  void Forget(uint32_t shard) {
    if (shard >= session_.size()) return;
    MutexLock lock(&mu_);
    shards_[shard].chunks.clear();
  }

 private:
  struct Entry {
    uint64_t base = 0;          // the chunk's element 0, at base_version
    int64_t base_version = -1;  // the version of the reply that gave base
    int64_t bank_delta = 0;     // bytes to the other bank (0: one bank)
    int64_t version = -1;       // the highest version known published
  };
  struct Shard {
    std::vector<std::byte> rkey;
    std::unordered_map<uint32_t, Entry> chunks;
    int64_t noticed = -1;    // the highest notice so far
    bool forgotten = false;  // a kNoticeForget came: the session is over, learn nothing more
  };
  const std::vector<uint64_t> session_;
  mutable Mutex mu_;
  std::vector<Shard> shards_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, int64_t> pushed_ GUARDED_BY(mu_);  // chunk -> highest step
  int64_t any_pushed_ GUARDED_BY(mu_) = INT64_MIN;                // pre-reduced
  const bool per_chunk_;
};

}  // namespace zps::worker
