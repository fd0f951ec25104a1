#include "zps/server/kv_store.h"

#include <pthread.h>

#include "zps/common/messages.h"

namespace zps::server {

namespace {
Status CheckKey(const std::string& key) {
  if (key.empty() || key.size() > msg::kMaxKvKeyBytes) {
    return InvalidArgument("kv key of " + std::to_string(key.size()) + " bytes (1.." +
                           std::to_string(msg::kMaxKvKeyBytes) + ")");
  }
  return Status::Ok();
}
Status StaleGeneration(uint64_t asked, uint64_t current) {
  return Unavailable("kv generation " + std::to_string(asked) + " ended (the job is at " +
                     std::to_string(current) + " after a recovery): rebuild the communicator");
}
}  // namespace

KvStore::KvStore(const KvStoreOptions& options) : opts_(options) {
  timer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kv-timer");
    TimerLoop();
  });
}

KvStore::~KvStore() {
  std::map<uint64_t, Waiter> failed;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    failed.swap(waiters_);
    by_key_.clear();
  }
  cv_.SignalAll();
  timer_.join();
  for (auto& [id, w] : failed) w.cb(Cancelled("the kv store is shutting down"));
}

void KvStore::Advance(uint64_t generation) {
  std::map<uint64_t, Waiter> failed;
  {
    MutexLock lock(&mu_);
    if (generation <= generation_) return;
    generation_ = generation;
    values_.clear();
    bytes_ = 0;
    failed.swap(waiters_);
    by_key_.clear();
  }
  for (auto& [id, w] : failed) w.cb(StaleGeneration(0, generation));
}

void KvStore::Fail(const Status& reason) {
  std::map<uint64_t, Waiter> failed;
  {
    MutexLock lock(&mu_);
    failed.swap(waiters_);
    by_key_.clear();
  }
  for (auto& [id, w] : failed) w.cb(reason);
}

uint64_t KvStore::generation() const {
  MutexLock lock(&mu_);
  return generation_;
}

size_t KvStore::size() const {
  MutexLock lock(&mu_);
  return values_.size();
}

size_t KvStore::waiters() const {
  MutexLock lock(&mu_);
  return waiters_.size();
}

Status KvStore::Set(uint64_t generation, const std::string& key, std::vector<std::byte> value) {
  ZPS_RETURN_IF_ERROR(CheckKey(key));
  if (value.size() > msg::kMaxKvValueBytes) {
    return InvalidArgument("kv value of " + std::to_string(value.size()) + " bytes (at most " +
                           std::to_string(msg::kMaxKvValueBytes) + ")");
  }
  std::vector<GetCallback> ready;
  std::vector<std::byte> answer;
  {
    MutexLock lock(&mu_);
    if (generation != generation_) return StaleGeneration(generation, generation_);
    auto it = values_.find(key);
    const size_t old = it == values_.end() ? 0 : it->second.size();
    if (it == values_.end() && values_.size() >= opts_.max_keys) {
      return ResourceExhausted("the kv store holds " + std::to_string(values_.size()) +
                               " keys, its bound");
    }
    if (bytes_ - old + value.size() > opts_.max_bytes) {
      return ResourceExhausted("the kv store would hold more than " +
                               std::to_string(opts_.max_bytes) + " bytes of values");
    }
    bytes_ = bytes_ - old + value.size();
    auto range = by_key_.equal_range(key);
    for (auto w = range.first; w != range.second; ++w) {
      auto node = waiters_.find(w->second);
      if (node == waiters_.end()) continue;
      ready.push_back(std::move(node->second.cb));
      waiters_.erase(node);
    }
    by_key_.erase(range.first, range.second);
    if (!ready.empty()) answer = value;  // a copy: the stored value may be replaced meanwhile
    values_[key] = std::move(value);
  }
  for (auto& cb : ready) cb(answer);
  return Status::Ok();
}

void KvStore::Get(uint64_t generation, const std::string& key, std::chrono::milliseconds wait,
                  GetCallback cb) {
  Status bad = CheckKey(key);
  if (bad.ok() && (wait.count() < 0 || wait.count() > msg::kMaxKvWaitMs)) {
    bad = InvalidArgument("kv wait of " + std::to_string(wait.count()) + " ms");
  }
  if (!bad.ok()) return cb(bad);
  Result<std::vector<std::byte>> now = NotFound("kv key '" + key + "' is not set");
  {
    MutexLock lock(&mu_);
    if (generation != generation_) {
      now = StaleGeneration(generation, generation_);
    } else if (auto it = values_.find(key); it != values_.end()) {
      now = it->second;
    } else if (wait.count() > 0) {
      if (waiters_.size() >= opts_.max_waiters) {
        now =
            ResourceExhausted(std::to_string(waiters_.size()) + " kv gets are waiting, the bound");
      } else {
        const uint64_t id = next_waiter_++;
        waiters_[id] = Waiter{id, key, Clock::now() + wait, std::move(cb)};
        by_key_.emplace(key, id);
        cv_.SignalAll();
        return;
      }
    }
  }
  cb(now);
}

void KvStore::TimerLoop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    auto next = Clock::time_point::max();
    for (const auto& [id, w] : waiters_) next = std::min(next, w.deadline);
    if (next == Clock::time_point::max()) {
      cv_.Wait(lock);
    } else {
      cv_.WaitUntil(lock, next);
    }
    const auto now = Clock::now();
    std::vector<std::pair<std::string, GetCallback>> expired;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline <= now) {
        auto range = by_key_.equal_range(it->second.key);
        for (auto k = range.first; k != range.second; ++k) {
          if (k->second == it->first) {
            by_key_.erase(k);
            break;
          }
        }
        expired.emplace_back(std::move(it->second.key), std::move(it->second.cb));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (expired.empty()) continue;
    lock.Unlock();
    for (auto& [key, cb] : expired)
      cb(DeadlineExceeded("kv key '" + key + "' was not set in time"));
    lock.Lock();
  }
}

}  // namespace zps::server
