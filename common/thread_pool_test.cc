#include "common/thread_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

TEST(ThreadPoolTest, RunsEveryClosureExactlyOnce) {
  std::vector<std::atomic<int>> hits(1000);
  {
    ThreadPool pool(3);
    for (int i = 0; i < 1000; ++i) {
      pool.Schedule([&hits, i] { hits[i]++; });
    }
  }  // destructor drains
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPoolTest, ClosuresMayScheduleMoreWork) {
  std::atomic<int> done{0};
  absl::BlockingCounter counter(10);
  ThreadPool pool(2);
  for (int i = 0; i < 5; ++i) {
    pool.Schedule([&] {
      done++;
      counter.DecrementCount();
      pool.Schedule([&] {
        done++;
        counter.DecrementCount();
      });
    });
  }
  counter.Wait();
  EXPECT_EQ(done.load(), 10);
}

TEST(ThreadPoolTest, RunsConcurrently) {
  // Two closures that each wait for the other can only finish on >= 2 threads.
  ThreadPool pool(2);
  std::atomic<int> arrived{0};
  absl::BlockingCounter finished(2);
  for (int i = 0; i < 2; ++i) {
    pool.Schedule([&] {
      arrived++;
      while (arrived.load() < 2) absl::SleepFor(absl::Milliseconds(1));
      finished.DecrementCount();
    });
  }
  finished.Wait();
  EXPECT_EQ(arrived.load(), 2);
}

}  // namespace
}  // namespace cairn
