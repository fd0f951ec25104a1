// zps/common/thread_annotations.h — clang thread-safety annotations, and a Mutex, MutexLock and
// CondVar that carry them (libstdc++'s std::mutex does not). Modelled on Abseil's
// thread_annotations.h and Mutex.
//
//   class Cache {
//     zps::Mutex mu_;
//     std::map<int, int> entries_ GUARDED_BY(mu_);
//     void Evict() REQUIRES(mu_);
//   };
//   void Cache::Put(int k, int v) {
//     zps::MutexLock lock(&mu_);
//     entries_[k] = v;
//   }
//
// clang with -Wthread-safety (on for every clang build, an error with ZPS_WERROR) checks at
// compile time that each GUARDED_BY member is touched only with its mutex held, that REQUIRES
// functions are called with it, and that EXCLUDES functions are not. With GCC the macros expand
// to nothing. A lambda that reads guarded state under a lock it did not take (a CondVar
// predicate) says so: `[&]() REQUIRES(mu_) { return ready_; }`.
//
// Thread-safety: Mutex and CondVar are thread-safe; a MutexLock belongs to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define ZPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ZPS_THREAD_ANNOTATION(x)
#endif

/// The member is read and written only with the given mutex held.
#define GUARDED_BY(x) ZPS_THREAD_ANNOTATION(guarded_by(x))
/// The pointee of this pointer member is accessed only with the given mutex held.
#define PT_GUARDED_BY(x) ZPS_THREAD_ANNOTATION(pt_guarded_by(x))
/// Lock order: this mutex is taken after (or before) the ones named, never the other way round.
#define ACQUIRED_AFTER(...) ZPS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) ZPS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
/// The caller must hold the mutex(es).
#define REQUIRES(...) ZPS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
/// The caller must not hold the mutex(es) (the function takes them itself).
#define EXCLUDES(...) ZPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) ZPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ZPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) ZPS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) ZPS_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) ZPS_THREAD_ANNOTATION(lock_returned(x))
#define CAPABILITY(x) ZPS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY ZPS_THREAD_ANNOTATION(scoped_lockable)
/// Turns the analysis off for one function (say why beside it).
#define NO_THREAD_SAFETY_ANALYSIS ZPS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace zps {

class CondVar;
class MutexLock;

/// A std::mutex the analysis knows about. Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  /// Tells the analysis the caller holds the mutex (for code it cannot follow); checks nothing.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

/// Holds a Mutex for its scope; Unlock() and Lock() release and retake it inside the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

/// A condition variable over a MutexLock. Waits release the mutex while they block and hold it
/// again when they return (as std::condition_variable).
class CondVar {
 public:
  void Wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  template <typename Pred>
  void Wait(MutexLock& lock, Pred pred) {
    cv_.wait(lock.lock_, pred);
  }
  /// True when `pred` holds on return, false on timeout.
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(MutexLock& lock, std::chrono::duration<Rep, Period> d, Pred pred) {
    return cv_.wait_for(lock.lock_, d, pred);
  }
  template <typename Clock, typename Duration, typename Pred>
  bool WaitUntil(MutexLock& lock, std::chrono::time_point<Clock, Duration> t, Pred pred) {
    return cv_.wait_until(lock.lock_, t, pred);
  }
  /// std::cv_status::timeout when `t` passed.
  template <typename Rep, typename Period>
  std::cv_status WaitFor(MutexLock& lock, std::chrono::duration<Rep, Period> d) {
    return cv_.wait_for(lock.lock_, d);
  }
  template <typename Clock, typename Duration>
  std::cv_status WaitUntil(MutexLock& lock, std::chrono::time_point<Clock, Duration> t) {
    return cv_.wait_until(lock.lock_, t);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace zps
