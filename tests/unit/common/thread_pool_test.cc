#include "zps/common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace zps {
namespace {

TEST(ThreadPool, RunsEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    auto pool = ThreadPool::Create({.name = "t", .threads = threads});
    ASSERT_TRUE(pool.ok());
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
  ASSERT_TRUE(pool.ok());
  std::atomic<long> sum{0};
  for (int round = 0; round < 2000; ++round) {
    (*pool)->ParallelFor(5, [&](size_t i) { sum += static_cast<long>(i); });
  }
  EXPECT_EQ(sum.load(), 2000L * 10);
}

TEST(ThreadPool, RejectsNegative) { EXPECT_FALSE(ThreadPool::Create({.threads = -1}).ok()); }

}  // namespace
}  // namespace zps
