#include "core/parallel.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mend {
namespace {

TEST(ThreadPoolTest, EveryChunkRunsExactlyOnceJobAfterJob) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t chunks : {size_t{0}, size_t{1}, size_t{3}, size_t{257}}) {
      for (int job = 0; job < 50; ++job) {
        std::vector<std::atomic<int>> runs(chunks);
        pool.ParallelFor(chunks, [&](size_t c) { runs[c].fetch_add(1); });
        for (size_t c = 0; c < chunks; ++c)
          ASSERT_EQ(runs[c].load(), 1) << threads << " threads, chunk " << c << " of " << chunks;
      }
    }
  }
}

TEST(ThreadPoolTest, ChunksRunOnThePoolsThreadsAndTheCallers) {
  // Every chunk waits until all the pool's threads have taken one, so each
  // thread runs one: the caller among them.
  constexpr int kThreads = 3;
  ThreadPool pool(kThreads);
  std::atomic<int> started{0};
  std::vector<std::thread::id> ran(kThreads);
  pool.ParallelFor(kThreads, [&](size_t c) {
    ran[c] = std::this_thread::get_id();
    started.fetch_add(1);
    while (started.load() < kThreads) std::this_thread::yield();
  });
  std::set<std::thread::id> distinct(ran.begin(), ran.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 1u);
}

}  // namespace
}  // namespace mend
