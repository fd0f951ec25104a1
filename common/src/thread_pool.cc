#include "zps/common/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include "zps/common/logging.h"

namespace zps {

Result<std::unique_ptr<ThreadPool>> ThreadPool::Create(const ThreadPoolOptions& options) {
  if (options.threads < 0) return InvalidArgument("thread count must be >= 0");
  if (options.nice < -20 || options.nice > 19) {
    return InvalidArgument("pool nice value must be in [-20, 19], got " +
                           std::to_string(options.nice));
  }
  ThreadPoolOptions opts = options;
  if (opts.threads == 0)
    opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<ThreadPool> pool(new ThreadPool(opts));
  try {
    for (int i = 1; i < opts.threads; ++i) {
      pool->workers_.emplace_back([p = pool.get(), i] { p->WorkerLoop(i); });
    }
  } catch (const std::system_error& e) {
    return Internal(std::string("cannot start pool thread: ") + e.what());
  }
  return pool;
}

ThreadPool::ThreadPool(ThreadPoolOptions options) : options_(std::move(options)) {}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  for (;;) {
    size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) break;
    (*fn_)(i);
  }
}

void ThreadPool::WorkerLoop(int index) {
  log::SetThreadName(options_.name + "-" + std::to_string(index));
  if (options_.pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<unsigned>(index) % CPU_SETSIZE, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  if (options_.nice != 0 &&
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), options_.nice) != 0) {
    ZPS_LOG(DEBUG) << "pool thread " << options_.name << "-" << index << ": setpriority("
                   << options_.nice << ") refused; it runs at the process's priority";
  }
  uint64_t seen = 0;
  for (;;) {
    {
      MutexLock lock(&mu_);
      work_cv_.Wait(lock, [&]() REQUIRES(mu_) { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
    {
      MutexLock lock(&mu_);
      if (--active_ == 0) done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  MutexLock call(&call_mu_);
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.SignalAll();
  RunTasks();
  MutexLock lock(&mu_);
  done_cv_.Wait(lock, [&]() REQUIRES(mu_) { return active_ == 0; });
  fn_ = nullptr;
}

}  // namespace zps
