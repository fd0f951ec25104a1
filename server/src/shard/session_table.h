// SessionTable — a shard's worker sessions and the policy that admits, replaces and fences them,
// apart from the data plane (ShardServer keeps UCX endpoints in it; the unit tests keep ints:
// tests/unit/shard/session_table_test.cc).
//
// The policy (docs/protocol.md: "Hello roles", "Checkpoints and recovery", "Data plane"):
//  - A worker is admitted at its hello only while the shard serves (CheckAdmission). Its session
//    remembers ShardState::epoch() at admission; ShardState refuses pushes from an older epoch.
//  - A rank's new session replaces its old ones (TakeRank, then Add): a restarted or re-joined
//    worker's old connection may not have closed yet.
//  - SetServing(false) (a rollback begins, or the coordinator was lost) fences every session
//    (FenceAll): their tokens are answered Unavailable ("re-join") instead of Unauthenticated,
//    until the worker's control connection closes (Disconnect).
//  - A fetch parked while the shard does not serve belongs to a fenced session, and would wait
//    for a publish the rollback never makes: ParkedFetchError says to answer it at once.
//  - Any other token is unknown: Unauthenticated.
//
// Lock order: mu_ is a leaf, and apart from ShardState's: no table method is called under another
// lock of the shard, and the only call made under mu_ is the count observer's (a gauge: it must
// take no lock), so that counts are reported in the order they changed.
// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zps/common/messages.h"
#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::server {

template <typename Endpoint>
class SessionTable {
 public:
  struct Session {
    uint32_t rank = 0;
    Endpoint ep{};
    // ShardState::epoch() at admission: the session's pushes are refused after a rollback.
    uint64_t epoch = 0;
  };

  /// `count_changed` (may be empty) is told the number of live sessions after Add, FenceAll and
  /// Disconnect change it, under the table's mutex: it must not call into the table.
  explicit SessionTable(std::function<void(size_t)> count_changed = {})
      : count_changed_(std::move(count_changed)) {}

  /// Lets workers in (true), or stops admitting them (false: FenceAll does that and fences).
  void SetAccepting(bool accept) { accepting_.store(accept); }
  bool accepting() const { return accepting_.load(); }

  /// Whether a worker's hello may be admitted now. The caller reads ShardState::epoch() before
  /// this: the driver fences before it rolls back, so a session admitted across a rollback
  /// carries the old epoch and its pushes are refused. Errors: Unavailable while not serving.
  Status CheckAdmission() const {
    if (!accepting()) return Unavailable("this shard is restoring the job's state");
    return Status::Ok();
  }

  /// Drops every session of `rank` (the first half of admitting a new one) and returns their
  /// endpoints, for the caller to fail and close.
  std::vector<Endpoint> TakeRank(uint32_t rank) {
    std::vector<Endpoint> old;
    MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.rank == rank) {
        old.push_back(it->second.ep);
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    return old;
  }

  /// Adds the session of `token` (the second half of admitting it).
  void Add(uint64_t token, Session session) {
    MutexLock lock(&mu_);
    sessions_[token] = std::move(session);
    Counted();
  }

  /// The live session of `token`, if any.
  std::optional<Session> Find(uint64_t token) const {
    MutexLock lock(&mu_);
    auto it = sessions_.find(token);
    if (it == sessions_.end()) return std::nullopt;
    return it->second;
  }

  /// The answer to a data-plane message whose token has no live session: Unavailable for a
  /// fenced one (the worker re-joins), Unauthenticated for any other.
  Status SessionError(uint64_t token) const {
    MutexLock lock(&mu_);
    if (fenced_.count(token) != 0) return msg::SessionFencedError();
    return Unauthenticated("unknown session token");
  }

  /// Stops admitting workers and fences every session. Returns the fenced (token, endpoint)
  /// pairs, for the caller to answer their waiting fetches, notify and close.
  std::vector<std::pair<uint64_t, Endpoint>> FenceAll() {
    accepting_.store(false);
    std::vector<std::pair<uint64_t, Endpoint>> out;
    MutexLock lock(&mu_);
    for (auto& [token, session] : sessions_) {
      fenced_.insert(token);
      out.emplace_back(token, session.ep);
    }
    sessions_.clear();
    Counted();
    return out;
  }

  /// Called after a fetch was parked (it waits for a publish). FenceAll (another thread) may
  /// have fenced its session between the lookup and the parking; while not serving, every
  /// parked fetch belongs to a fenced session. Returns the error to answer every parked fetch
  /// with now (Unavailable), or OK when the shard serves.
  Status ParkedFetchError() const {
    if (accepting()) return Status::Ok();
    return Unavailable("this shard stopped serving (a rollback began); re-join");
  }

  /// A worker's control connection closed: forgets its fence, and returns the endpoint of its
  /// live session (now removed), if it had one.
  std::optional<Endpoint> Disconnect(uint64_t token) {
    MutexLock lock(&mu_);
    fenced_.erase(token);
    auto it = sessions_.find(token);
    if (it == sessions_.end()) return std::nullopt;
    Endpoint ep = it->second.ep;
    sessions_.erase(it);
    Counted();
    return ep;
  }

  /// Every live session's (token, endpoint).
  std::vector<std::pair<uint64_t, Endpoint>> Endpoints() const {
    std::vector<std::pair<uint64_t, Endpoint>> out;
    MutexLock lock(&mu_);
    for (const auto& [token, session] : sessions_) out.emplace_back(token, session.ep);
    return out;
  }

  /// The ranks in [0, world) with no live session.
  std::vector<uint32_t> AbsentRanks(uint32_t world) const {
    std::vector<bool> seen(world, false);
    {
      MutexLock lock(&mu_);
      for (const auto& [token, session] : sessions_) {
        if (session.rank < world) seen[session.rank] = true;
      }
    }
    std::vector<uint32_t> out;
    for (uint32_t r = 0; r < world; ++r) {
      if (!seen[r]) out.push_back(r);
    }
    return out;
  }

  size_t size() const {
    MutexLock lock(&mu_);
    return sessions_.size();
  }

 private:
  void Counted() REQUIRES(mu_) {
    if (count_changed_) count_changed_(sessions_.size());
  }

  const std::function<void(size_t)> count_changed_;
  std::atomic<bool> accepting_{false};
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Session> sessions_ GUARDED_BY(mu_);  // key = session token
  std::unordered_set<uint64_t> fenced_ GUARDED_BY(mu_);  // sessions from before a rollback
};

}  // namespace zps::server
