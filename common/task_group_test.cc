#include "common/task_group.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;

TaskGroup::Options GroupOptions(ThreadPool* pool, bool thread_per_task,
                                bool cancel_on_error) {
  TaskGroup::Options o;
  o.pool = pool;
  o.thread_per_task = thread_per_task;
  o.cancel_on_error = cancel_on_error;
  return o;
}

TEST(TaskGroupTest, ReturnsTheErrorWithItsContextAndCode) {
  ThreadPool pool(3);
  TaskGroup group(&pool);
  for (int i = 0; i < 10; ++i) {
    group.Run(absl::StrCat("rank 3 reading 'job/step-7/rank-", i, "'"),
              [i]() -> absl::Status {
                if (i == 6) return absl::NotFoundError("no such object");
                return absl::OkStatus();
              });
  }
  absl::Status s = group.Wait();
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kNotFound,
                       "rank 3 reading 'job/step-7/rank-6': no such object"));
  EXPECT_EQ(group.status(), s);
  EXPECT_THAT(group.AllErrors(), ::testing::ElementsAre(s));
}

TEST(TaskGroupTest, EmptyContextLeavesTheMessageAlone) {
  ThreadPool pool(2);
  TaskGroup group(&pool);
  group.Run([] { return absl::DataLossError("crc mismatch in 'model.wq'"); });
  EXPECT_EQ(group.Wait(), absl::DataLossError("crc mismatch in 'model.wq'"));
}

TEST(TaskGroupTest, CollectsEveryErrorInQueueOrder) {
  ThreadPool pool(4);
  TaskGroup group(&pool);
  std::vector<std::string> expected;
  for (int i = 0; i < 200; ++i) {
    if (i % 7 == 3) expected.push_back(absl::StrCat("item ", i, ": bad ", i));
    group.Run(absl::StrCat("item ", i), [i]() -> absl::Status {
      if (i % 7 == 3)
        return absl::InvalidArgumentError(absl::StrCat("bad ", i));
      return absl::OkStatus();
    });
  }
  absl::Status first = group.Wait();
  std::vector<std::string> got;
  for (const absl::Status& s : group.AllErrors()) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
    got.emplace_back(s.message());
  }
  EXPECT_EQ(got, expected);
  // The first error is one of them (which one depends on scheduling).
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(expected, ::testing::Contains(std::string(first.message())));
}

TEST(TaskGroupTest, WaitReturnsOnlyAfterEveryTaskFinishedEvenOnError) {
  // A fails at once; the others are still running when its error is
  // recorded (they start only when A is about to fail) and finish later.
  for (int round = 0; round < 50; ++round) {
    ThreadPool pool(4);
    std::vector<std::atomic<bool>> finished(4);
    absl::Notification a_failing;
    {
      TaskGroup group(&pool);
      for (int i = 1; i < 4; ++i) {
        group.Run([&, i] {
          a_failing.WaitForNotification();
          std::string work(1 << 16, 'x');  // something to do after A failed
          finished[i] = work.size() == (1 << 16);
          return absl::OkStatus();
        });
      }
      group.Run([&] {
        finished[0] = true;
        a_failing.Notify();
        return absl::UnavailableError("peer 2 is gone");
      });
      ASSERT_EQ(group.Wait(), absl::UnavailableError("peer 2 is gone"));
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(finished[i]) << "task " << i << " round " << round;
      }
    }
  }
}

TEST(TaskGroupTest, EveryTaskRunsExactlyOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  TaskGroup group(&pool);
  for (int i = 0; i < 1000; ++i) {
    group.Run([&hits, i]() -> absl::Status {
      hits[i]++;
      return i % 2 ? absl::InternalError("odd") : absl::OkStatus();
    });
  }
  EXPECT_THAT(group.Wait(), StatusIs(absl::StatusCode::kInternal));
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_EQ(group.AllErrors().size(), 500u);
}

TEST(TaskGroupTest, DestructorWaitsForEveryTask) {
  ThreadPool pool(2);
  std::atomic<int> done{0};
  {
    TaskGroup group(&pool);
    for (int i = 0; i < 100; ++i) {
      group.Run([&] {
        done++;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(done.load(), 100);
}

// Every task fans out again on the same pool and waits: with a pool of one
// thread, the pool thread and the test thread are all there is.
int NestedSum(ThreadPool* pool, int depth) {
  if (depth == 0) return 1;
  std::vector<int> sums(4, 0);
  TaskGroup group(pool);
  for (int i = 0; i < 4; ++i) {
    group.Run([&sums, pool, depth, i] {
      sums[i] = NestedSum(pool, depth - 1);
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(group.Wait().ok());
  int total = 0;
  for (int s : sums) total += s;
  return total;
}

TEST(TaskGroupTest, NestedGroupsOnABoundedPoolDoNotDeadlock) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    EXPECT_EQ(NestedSum(&pool, 4), 4 * 4 * 4 * 4) << threads << " threads";
  }
}

TEST(TaskGroupTest, WaitRunsQueuedTasksWhenEveryPoolThreadIsBusy) {
  absl::Notification release;  // outlives the pool thread that waits on it
  ThreadPool pool(1);
  pool.Schedule([&] { release.WaitForNotification(); });  // holds the pool
  TaskGroup group(&pool);
  std::vector<std::thread::id> ran_on(3);
  for (int i = 0; i < 3; ++i) {
    group.Run([&ran_on, i] {
      ran_on[i] = std::this_thread::get_id();
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(group.Wait().ok());
  for (const std::thread::id& id : ran_on) {
    EXPECT_EQ(id, std::this_thread::get_id());
  }
  release.Notify();
}

TEST(TaskGroupTest, TasksQueuedByTasksAreWaitedFor) {
  ThreadPool pool(2);
  std::atomic<int> leaves{0};
  TaskGroup group(&pool);
  for (int i = 0; i < 10; ++i) {
    group.Run([&] {
      for (int j = 0; j < 10; ++j) {
        group.Run([&] {
          leaves++;
          return absl::OkStatus();
        });
      }
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(group.Wait().ok());
  EXPECT_EQ(leaves.load(), 100);
}

TEST(TaskGroupTest, WithoutPoolRunsInsideRun) {
  TaskGroup group(nullptr);
  int calls = 0;
  group.Run("writing 'job/step-1/obj'", [&] {
    ++calls;
    return absl::ResourceExhaustedError("no space left");
  });
  EXPECT_EQ(calls, 1);  // before Wait()
  EXPECT_EQ(group.status(), absl::ResourceExhaustedError(
                                "writing 'job/step-1/obj': no space left"));
  group.Run([&] {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(group.Wait(), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(TaskGroupTest, RunInlineRunsOnTheCallingThreadNow) {
  ThreadPool pool(2);
  TaskGroup group(&pool);
  std::thread::id ran_on;
  group.RunInline("piece 0", [&] {
    ran_on = std::this_thread::get_id();
    return absl::AbortedError("stop");
  });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(group.status(), absl::AbortedError("piece 0: stop"));
  EXPECT_EQ(group.Wait(), absl::AbortedError("piece 0: stop"));
}

TEST(TaskGroupTest, ThreadPerTaskRunsAllTasksAtOnce) {
  // Eight tasks that each wait for all eight to arrive can only finish when
  // they run concurrently.
  constexpr int kTasks = 8;
  std::atomic<int> arrived{0};
  absl::Notification all_arrived;
  TaskGroup group(GroupOptions(nullptr, /*thread_per_task=*/true, false));
  for (int i = 0; i < kTasks; ++i) {
    group.Run(absl::StrCat("fetch from node ", i), [&, i]() -> absl::Status {
      if (++arrived == kTasks) all_arrived.Notify();
      all_arrived.WaitForNotification();
      if (i == 5) return absl::DeadlineExceededError("no answer");
      return absl::OkStatus();
    });
  }
  EXPECT_EQ(group.Wait(),
            absl::DeadlineExceededError("fetch from node 5: no answer"));
  EXPECT_EQ(arrived.load(), kTasks);
}

TEST(TaskGroupTest, CancelOnErrorDropsTasksNotStarted) {
  absl::Notification release;  // outlives the pool thread that waits on it
  ThreadPool pool(1);
  pool.Schedule([&] { release.WaitForNotification(); });  // holds the pool
  TaskGroup group(GroupOptions(&pool, false, /*cancel_on_error=*/true));
  std::atomic<int> ran{0};
  group.Run("rank 0", [&] {
    ran++;
    return absl::PermissionDeniedError("read-only store");
  });
  for (int i = 1; i < 10; ++i) {
    group.Run(absl::StrCat("rank ", i), [&] {
      ran++;
      return absl::OkStatus();
    });
  }
  // The test thread runs them in order: the first fails, the rest are dropped.
  EXPECT_EQ(group.Wait(),
            absl::PermissionDeniedError("rank 0: read-only store"));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(group.cancelled());
  group.Run([&] {
    ran++;
    return absl::OkStatus();
  });
  EXPECT_THAT(group.Wait(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(ran.load(), 1);  // a cancelled group runs nothing more
  release.Notify();
}

TEST(TaskGroupTest, RunningTasksSeeCancellationAndTheRootCauseIsReported) {
  TaskGroup group(GroupOptions(nullptr, true, true));
  absl::Notification long_started;
  group.Run("streaming to node 1", [&]() -> absl::Status {
    long_started.Notify();
    while (!group.cancelled()) std::this_thread::yield();
    return absl::CancelledError("stopped");
  });
  long_started.WaitForNotification();
  group.Run("persisting step 9", [] {
    return absl::DataLossError("short write of 'job/step-9/obj'");
  });
  EXPECT_EQ(group.Wait(),
            absl::DataLossError(
                "persisting step 9: short write of 'job/step-9/obj'"));
  EXPECT_THAT(group.AllErrors(),
              ::testing::ElementsAre(
                  absl::CancelledError("streaming to node 1: stopped"),
                  absl::DataLossError(
                      "persisting step 9: short write of 'job/step-9/obj'")));
}

TEST(TaskGroupTest, NoErrorMeansOk) {
  ThreadPool pool(2);
  TaskGroup group(&pool);
  for (int i = 0; i < 50; ++i) group.Run([] { return absl::OkStatus(); });
  EXPECT_TRUE(group.Wait().ok());
  EXPECT_TRUE(group.AllErrors().empty());
  EXPECT_FALSE(group.cancelled());
}

TEST(RunAllTest, RunsEveryClosureAndReturnsTheError) {
  for (ThreadPool* pool :
       {static_cast<ThreadPool*>(nullptr), new ThreadPool(3)}) {
    std::atomic<int> ran{0};
    std::vector<std::function<absl::Status()>> fns;
    for (int i = 0; i < 20; ++i) {
      fns.push_back([&ran, i]() -> absl::Status {
        ran++;
        if (i == 13) return absl::NotFoundError("object 13");
        return absl::OkStatus();
      });
    }
    EXPECT_EQ(RunAll(pool, std::move(fns)), absl::NotFoundError("object 13"));
    EXPECT_EQ(ran.load(), 20);
    delete pool;
  }
}

}  // namespace
}  // namespace cairn
