// zps/common/thread_pool.h — a fixed pool of named worker threads for data-parallel passes
// (the optimizer, gradient statistics, bulk conversion).
//
// ParallelFor(n, fn) runs fn(0..n-1) across the pool and the calling thread, and returns when all
// have run. Which thread runs which index is not fixed, so callers that need bit-identical
// results whatever the thread count must cut work into a fixed number of tasks and combine the
// partial results in task order (the optimizer does).
//
// Thread-safety: ParallelFor may be called from several threads; calls are serialised.
// Ownership: the destructor joins all threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"

namespace zps {

struct ThreadPoolOptions {
  std::string name = "zps-pool";  // Default: "zps-pool"; threads are named name-0, name-1, ...
  int threads = 0;                // Default: 0 = one per online CPU. Includes the calling thread.
  bool pin = false;  // Default: false. Pin thread i to CPU i (the caller is not pinned).
  // Default: 0. The nice value each pool thread sets for itself when it starts (setpriority on
  // its own thread id; best effort: a refusal is logged at DEBUG and the thread runs on). The
  // caller of ParallelFor keeps its own. In [-20, 19]; below 0 needs CAP_SYS_NICE.
  int nice = 0;
};

class ThreadPool {
 public:
  /// Errors: InvalidArgument for threads < 0 or nice outside [-20, 19]; Internal if a thread
  /// cannot be started.
  static Result<std::unique_ptr<ThreadPool>> Create(const ThreadPoolOptions& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that run tasks, counting the caller of ParallelFor.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs fn(i) for every i in [0, n). fn must not throw and must not call ParallelFor.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

 private:
  explicit ThreadPool(ThreadPoolOptions options);
  void WorkerLoop(int index);
  void RunTasks();

  ThreadPoolOptions options_;
  Mutex call_mu_;  // serialises ParallelFor
  Mutex mu_ ACQUIRED_AFTER(call_mu_);
  CondVar work_cv_;
  CondVar done_cv_;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  int active_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  // Written under mu_ before a generation starts and read without it by that generation's
  // tasks (RunTasks): the generation's mu_ handoff orders the two.
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  // Lock-free task cursor for the current generation.
  std::atomic<size_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace zps
