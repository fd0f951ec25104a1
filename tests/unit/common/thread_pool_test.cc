#include "zps/common/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

TEST(ThreadPool, RunsEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    auto pool = ThreadPool::Create({.name = "t", .threads = threads});
    ASSERT_THAT(pool, IsOk());
    EXPECT_EQ((*pool)->size(), threads);
    for (size_t n : {0u, 1u, 3u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      (*pool)->ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
    }
  }
}

TEST(ThreadPool, ManyRounds) {
  auto pool = ThreadPool::Create({.name = "t", .threads = 3});
  ASSERT_THAT(pool, IsOk());
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round) {
    (*pool)->ParallelFor(5, [&](size_t i) { sum += static_cast<long>(i); });
  }
  EXPECT_EQ(sum.load(), 2000L * 10);
}

TEST(ThreadPool, RejectsNegative) { EXPECT_FALSE(ThreadPool::Create({.threads = -1}).ok()); }

TEST(ThreadPool, RejectsANiceValueOutOfRange) {
  EXPECT_FALSE(ThreadPool::Create({.threads = 2, .nice = 20}).ok());
  EXPECT_FALSE(ThreadPool::Create({.threads = 2, .nice = -21}).ok());
}

// Each pool thread runs at the nice value asked for; the caller keeps its own.
TEST(ThreadPool, PoolThreadsTakeTheNiceValue) {
  const int caller_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  auto pool = ThreadPool::Create({.name = "t", .threads = 3, .nice = 19});
  ASSERT_THAT(pool, IsOk());
  std::mutex mu;
  std::vector<std::pair<std::thread::id, int>> seen;
  std::atomic<int> started{0};
  // Three tasks that wait for each other: each of the three threads runs exactly one.
  (*pool)->ParallelFor(3, [&](size_t) {
    started.fetch_add(1);
    while (started.load() < 3) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(std::this_thread::get_id(),
                      ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())));
  });
  ASSERT_EQ(seen.size(), 3u);
  int pool_threads = 0;
  for (const auto& [id, nice] : seen) {
    if (id == std::this_thread::get_id()) {
      EXPECT_EQ(nice, caller_nice);
    } else {
      EXPECT_EQ(nice, 19);
      ++pool_threads;
    }
  }
  EXPECT_EQ(pool_threads, 2);
}

}  // namespace
}  // namespace zps
