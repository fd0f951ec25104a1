// zps/server/kv_store.h — the coordinator's small key-value store, the rendezvous of the workers'
// collectives (Gloo on CPU): apart from the wire (the KvSet/KvGet handlers in shard_server.cc are
// thin adapters over it; docs/protocol.md, "Key-value rendezvous").
//
// Keys live in one *generation* (the coordinator's epoch + 1): when the generation moves on (a
// shard lost, a rollback), every key is dropped and every parked Get fails with Unavailable, so a
// communicator is always built from the addresses of one incarnation of the job.
//
// Bounds (every one checked before anything is stored): key 1..msg::kMaxKvKeyBytes bytes, value at
// most msg::kMaxKvValueBytes, at most `max_keys` keys and `max_bytes` of values, at most
// `max_waiters` parked Gets, each for at most msg::kMaxKvWaitMs.
//
// Callbacks run on the thread that completes them: the caller of Get (key present), of Set (the
// key a waiter wanted), of Advance (the generation moved on) or the store's own timer thread
// ("kv-timer": the wait expired). Never under the internal lock.
// Thread-safety: all public methods are thread-safe. Lock order: mu_ only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps::server {

struct KvStoreOptions {
  size_t max_keys = 65536;  // Default: 64 Ki keys per generation.
  // Gloo's full-mesh rendezvous stores world^2 x 192 B: 1 GiB covers about 2,300 ranks.
  size_t max_bytes = size_t{1} << 30;  // Default: 1 GiB of values per generation.
  size_t max_waiters = 65536;          // Default: 64 Ki parked Gets.
};

class KvStore {
 public:
  using GetCallback = std::function<void(const Result<std::vector<std::byte>>&)>;

  explicit KvStore(const KvStoreOptions& options = {});
  ~KvStore();  // fails every parked Get with Cancelled
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  /// Moves the store to `generation` if it is newer: drops every key, fails every parked Get with
  /// Unavailable. An older or equal generation changes nothing.
  void Advance(uint64_t generation);
  uint64_t generation() const;
  /// The job stopped: fails every parked Get with `reason` (the generation stays; the caller
  /// refuses later calls itself).
  void Fail(const Status& reason);

  /// Sets `key` (replacing an older value) in `generation` and answers the Gets waiting for it.
  /// Errors: Unavailable (`generation` is not the current one: the job moved on, rebuild the
  /// communicator), InvalidArgument (empty or oversized key or value), ResourceExhausted (the
  /// key count or byte bound of the generation).
  Status Set(uint64_t generation, const std::string& key, std::vector<std::byte> value);
  /// Calls cb with the value of `key` in `generation` as soon as it is set, or with
  /// DeadlineExceeded once `wait` passed (wait 0: at once, NotFound if absent).
  /// Errors (to cb): Unavailable (not the current generation, or it moved on while waiting),
  /// InvalidArgument (key; wait over msg::kMaxKvWaitMs), ResourceExhausted (too many waiters),
  /// Cancelled (the store is destroyed), DeadlineExceeded.
  void Get(uint64_t generation, const std::string& key, std::chrono::milliseconds wait,
           GetCallback cb);

  size_t size() const;
  size_t waiters() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Waiter {
    uint64_t id = 0;
    std::string key;
    Clock::time_point deadline;
    GetCallback cb;
  };
  void TimerLoop();

  const KvStoreOptions opts_;
  mutable Mutex mu_;
  CondVar cv_;
  uint64_t generation_ GUARDED_BY(mu_) = 1;
  std::map<std::string, std::vector<std::byte>> values_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
  std::multimap<std::string, uint64_t> by_key_ GUARDED_BY(mu_);  // key -> waiter id
  std::map<uint64_t, Waiter> waiters_ GUARDED_BY(mu_);           // by id
  uint64_t next_waiter_ GUARDED_BY(mu_) = 1;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace zps::server
