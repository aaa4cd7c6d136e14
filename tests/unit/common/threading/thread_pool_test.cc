#include "common/threading/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexExactlyOnceAcrossManyCalls) {
  ThreadPool pool(4);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::atomic<int>> hits(97);
    pool.ParallelFor(97, [&](int64_t i) { hits[i].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  int64_t sum = 0;
  pool.ParallelFor(10, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum, 45);
}

}  // namespace
}  // namespace lamina

namespace lamina {
namespace {

TEST(ThreadPoolTest, ConcurrentCallersTakeTurnsAndEachGetsAllItsIndices) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> hits(31);
        pool.ParallelFor(31, [&](int64_t i) { hits[i].fetch_add(1); });
        for (auto& h : hits) failures += h.load() != 1;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace lamina
