#include "common/bounded_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace cairn {
namespace {

TEST(BoundedQueueTest, ValuesComeOutInOrderThenNothingAfterClose) {
  // Many capacities and producer paces: every value arrives, in order, and
  // the queue never holds more than its capacity.
  std::mt19937 rng(7);
  for (size_t capacity : {1u, 2u, 3u, 16u}) {
    BoundedQueue<std::unique_ptr<int>> queue(capacity);
    std::atomic<int> pushed{0};
    std::atomic<int> popped{0};
    int max_held = 0;
    std::vector<int> got;
    std::thread consumer([&] {
      while (std::optional<std::unique_ptr<int>> v = queue.Pop()) {
        const int n = popped.fetch_add(1) + 1;
        max_held = std::max(max_held, pushed.load() - n + 1);
        got.push_back(**v);
      }
    });
    const int count = 500 + static_cast<int>(rng() % 500);
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(queue.Push(std::make_unique<int>(i)));
      pushed.fetch_add(1);
    }
    queue.Close();
    consumer.join();
    ASSERT_EQ(static_cast<int>(got.size()), count) << capacity;
    for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], i) << capacity;
    // A value is counted as pushed only after Push returned, so the queue
    // held at most `capacity`, plus the one being pushed when counted.
    EXPECT_LE(max_held, static_cast<int>(capacity) + 1) << capacity;
    EXPECT_EQ(queue.Pop(), std::nullopt);  // closed and drained: at once
  }
}

TEST(BoundedQueueTest, PushWaitsWhileFull) {
  BoundedQueue<int> queue(2);
  ASSERT_TRUE(queue.Push(1));
  ASSERT_TRUE(queue.Push(2));
  absl::Notification third_pushed;
  std::thread producer([&] {
    EXPECT_TRUE(queue.Push(3));
    third_pushed.Notify();
  });
  // It cannot finish while the queue is full, however long it is given.
  EXPECT_FALSE(
      third_pushed.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(queue.Pop(), 1);
  third_pushed.WaitForNotification();
  producer.join();
  EXPECT_EQ(queue.Pop(), 2);
  EXPECT_EQ(queue.Pop(), 3);
}

TEST(BoundedQueueTest, StopReleasesAWaitingProducerAndRefusesLaterPushes) {
  BoundedQueue<int> queue(1);
  ASSERT_TRUE(queue.Push(1));
  std::optional<bool> waiting_push;
  std::thread producer([&] { waiting_push = queue.Push(2); });
  absl::SleepFor(absl::Milliseconds(20));  // let it wait on the full queue
  queue.Stop();
  producer.join();
  EXPECT_EQ(waiting_push, false);
  EXPECT_FALSE(queue.Push(3));
  queue.Close();
  EXPECT_EQ(queue.Pop(), std::nullopt);  // what was queued is dropped
}

TEST(BoundedQueueTest, PopWaitsForAValueOrClose) {
  BoundedQueue<int> queue(4);
  std::optional<int> first;
  std::optional<int> second = 0;
  std::thread consumer([&] {
    first = queue.Pop();
    second = queue.Pop();
  });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(queue.Push(42));
  queue.Close();
  consumer.join();
  EXPECT_EQ(first, 42);
  EXPECT_EQ(second, std::nullopt);
}

}  // namespace
}  // namespace cairn
