#include "engine/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace kvpr {
namespace {

// Runs pool.parallel_for(n, grain) and checks that every index was visited exactly once; each
// chunk first busies its thread for `work` (so that calls from several threads overlap).
::testing::AssertionResult covers_once(ThreadPool& pool, int64_t n, int64_t grain,
                                       std::chrono::microseconds work = {}) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    const auto until = std::chrono::steady_clock::now() + work;
    while (std::chrono::steady_clock::now() < until) {
    }
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i) {
    int h = hits[static_cast<size_t>(i)].load();
    if (h != 1) return ::testing::AssertionFailure() << "n " << n << " grain " << grain << ": index " << i
                                                     << " visited " << h << " times";
  }
  return ::testing::AssertionSuccess();
}

TEST(ThreadPool, EveryIndexOnceOverManyCallsAndSizes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    // Calls back to back, so workers are still polling from the call before (the case the
    // generation counter must get right), with shapes from one chunk to more chunks than threads.
    for (int round = 0; round < 400; ++round) {
      int64_t n = 1 + (round * 37) % 301;
      int64_t grain = 1 + round % 7;
      ASSERT_TRUE(covers_once(pool, n, grain)) << threads << " threads, round " << round;
    }
    EXPECT_TRUE(covers_once(pool, 0, 1));
  }
}

TEST(ThreadPool, CallsAfterTheWorkersSleptStillRunOnThem) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    // Longer than the poll: the workers are asleep on the condition variable by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int> chunks{0};
    std::vector<std::thread::id> ids(3);
    pool.parallel_for(3, 1, [&](int64_t b, int64_t) {
      ids[static_cast<size_t>(b)] = std::this_thread::get_id();
      chunks.fetch_add(1);
      // Hold each chunk long enough that one thread cannot take all three first.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
    EXPECT_EQ(chunks.load(), 3);
    int others = 0;
    for (const auto& id : ids) others += id != std::this_thread::get_id();
    EXPECT_GE(others, 1) << "round " << round << ": the workers took no chunk";
  }
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirWholeRange) {
  ThreadPool pool(3);
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < 300; ++round)
        if (!covers_once(pool, 17 + (round * (t + 3)) % 200, 1 + t, std::chrono::microseconds(20)))
          failures.fetch_add(1);
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPool, ATaskCallingItsPoolRunsItsLoopInline) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(64 * 50);
  pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(50, 1, [&](int64_t ib, int64_t ie) {
        for (int64_t j = ib; j < ie; ++j) hits[static_cast<size_t>(i * 50 + j)].fetch_add(1);
      });
  });
  for (size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k].load(), 1) << k;
}

TEST(ThreadPool, DestroyedWhileItsWorkersPollOrSleep) {
  // Right after a call (workers polling) and after they slept: the destructor must wake and join
  // them either way.
  for (int round = 0; round < 50; ++round) {
    auto pool = std::make_unique<ThreadPool>(4);
    ASSERT_TRUE(covers_once(*pool, 100, 1));
    if (round % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pool.reset();
  }
}

}  // namespace
}  // namespace kvpr
