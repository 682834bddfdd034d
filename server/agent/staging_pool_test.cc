#include "server/agent/staging_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using Segment = std::shared_ptr<shm::ShmSegment>;

constexpr uint64_t kG = StagingPool::kSegmentGranule;

// A node id no other test process of this run uses (the pool claims the
// node's segment names).
int TestNode() { return 7000 + static_cast<int>(getpid() % 1000); }

bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::unique_ptr<StagingPool> NewPool(uint64_t budget,
                                     std::function<bool()> evict = nullptr) {
  StagingPool::Options o;
  o.node_id = TestNode();
  o.budget_bytes = budget;
  o.evict = std::move(evict);
  absl::StatusOr<std::unique_ptr<StagingPool>> p = StagingPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(StagingPoolTest, SegmentSizeRoundsUpToGranules) {
  EXPECT_EQ(StagingPool::SegmentSize(0), kG);
  EXPECT_EQ(StagingPool::SegmentSize(1), kG);
  EXPECT_EQ(StagingPool::SegmentSize(kG), kG);
  EXPECT_EQ(StagingPool::SegmentSize(kG + 1), 2 * kG);
  EXPECT_EQ(StagingPool::SegmentSize(5 * kG - 3), 5 * kG);
}

TEST(StagingPoolTest, AllocatesWritableSegmentsNamedAfterTheNode) {
  auto pool = NewPool(8 * kG);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<Segment> s = pool->Allocate(kG + 10, Soon());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->size(), 2 * kG);
  EXPECT_THAT((*s)->name(),
              HasSubstr(absl::StrCat("cairn-agent-", TestNode(), "-")));
  (*s)->data()[0] = 1;
  (*s)->data()[2 * kG - 1] = 2;
  EXPECT_TRUE(SegmentExists((*s)->name()));
  EXPECT_EQ(pool->stats().used_bytes, 2 * kG);
  EXPECT_EQ(pool->budget(), 8 * kG);
}

TEST(StagingPoolTest, MoreThanTheWholeBudgetFailsAtOnce) {
  int evictions = 0;
  auto pool = NewPool(4 * kG, [&] {
    ++evictions;
    return false;
  });
  ASSERT_NE(pool, nullptr);
  EXPECT_THAT(pool->Allocate(4 * kG + 1, absl::InfiniteFuture()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("do not fit the staging budget of 16384")));
  EXPECT_EQ(evictions, 0);
  EXPECT_EQ(pool->stats().used_bytes, 0u);
}

TEST(StagingPoolTest, ReleasedSegmentIsKeptAndReusedBySize) {
  auto pool = NewPool(8 * kG);
  ASSERT_NE(pool, nullptr);
  std::string name;
  {
    absl::StatusOr<Segment> s = pool->Allocate(3 * kG, Soon());
    ASSERT_TRUE(s.ok()) << s.status();
    name = (*s)->name();
    (*s)->data()[5] = 42;
  }
  // Kept: still counted and still there.
  EXPECT_EQ(pool->stats().used_bytes, 3 * kG);
  EXPECT_TRUE(SegmentExists(name));
  absl::StatusOr<Segment> again = pool->Allocate(3 * kG - 7, Soon());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->name(), name);
  EXPECT_EQ(pool->stats().used_bytes, 3 * kG);
  // Another size gets a new segment beside it.
  absl::StatusOr<Segment> other = pool->Allocate(kG, Soon());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->name(), name);
  EXPECT_EQ(pool->stats().used_bytes, 4 * kG);
  EXPECT_EQ(pool->stats().peak_used_bytes, 4 * kG);
}

TEST(StagingPoolTest, KeptSegmentsAreDestroyedWhenSpaceIsNeeded) {
  auto pool = NewPool(4 * kG);
  ASSERT_NE(pool, nullptr);
  std::string a_name, b_name;
  {
    absl::StatusOr<Segment> a = pool->Allocate(2 * kG, Soon());
    absl::StatusOr<Segment> b = pool->Allocate(kG, Soon());
    ASSERT_TRUE(a.ok() && b.ok());
    a_name = (*a)->name();
    b_name = (*b)->name();
  }
  EXPECT_EQ(pool->stats().used_bytes, 3 * kG);
  absl::StatusOr<Segment> big = pool->Allocate(4 * kG, Soon());
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(pool->stats().used_bytes, 4 * kG);
  EXPECT_FALSE(SegmentExists(a_name));
  EXPECT_FALSE(SegmentExists(b_name));
}

TEST(StagingPoolTest, EvictsHeldSetsToMakeRoom) {
  std::vector<Segment> held;  // what the agent holds (tier 0, replicas)
  int evictions = 0;
  auto pool = NewPool(4 * kG, [&] {
    if (held.empty()) return false;
    ++evictions;
    held.erase(held.begin());
    return true;
  });
  ASSERT_NE(pool, nullptr);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Segment> s = pool->Allocate(kG, Soon());
    ASSERT_TRUE(s.ok()) << s.status();
    held.push_back(*std::move(s));
  }
  EXPECT_EQ(evictions, 0);
  // Released-but-kept 1-granule segments do not fit 3 granules: the pool
  // evicts until three are free, then reuses their space.
  absl::StatusOr<Segment> s = pool->Allocate(3 * kG, Soon());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(evictions, 3);
  EXPECT_EQ(held.size(), 1u);
  EXPECT_EQ(pool->stats().used_bytes, 4 * kG);
}

TEST(StagingPoolTest, WaitsForAReleaseUntilTheDeadline) {
  auto pool = NewPool(2 * kG);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<Segment> full = pool->Allocate(2 * kG, Soon());
  ASSERT_TRUE(full.ok());
  EXPECT_THAT(
      pool->Allocate(kG, absl::Now() + absl::Milliseconds(150)).status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("no staging space for 4096 bytes within the wait "
                         "(budget 8192 bytes, 8192 in use")));

  // Released from another thread while Allocate waits: it gets the space.
  Segment holder = *std::move(full);
  std::atomic<bool> waiting{false};
  std::thread releaser([&] {
    while (!waiting) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(50));
    holder.reset();
  });
  waiting = true;
  absl::StatusOr<Segment> s = pool->Allocate(kG, Soon());
  releaser.join();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(pool->stats().used_bytes, kG);
}

TEST(StagingPoolTest, CallerThatGaveUpStopsTheWait) {
  auto pool = NewPool(kG);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<Segment> full = pool->Allocate(kG, Soon());
  ASSERT_TRUE(full.ok());
  std::atomic<int> asked{0};
  auto gone = [&] { return ++asked >= 3; };
  EXPECT_THAT(pool->Allocate(kG, absl::InfiniteFuture(), gone).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("the rank gave up waiting for 4096")));
  EXPECT_GE(asked.load(), 3);
}

TEST(StagingPoolTest, DiscardedSegmentIsDestroyedOnRelease) {
  auto pool = NewPool(4 * kG);
  ASSERT_NE(pool, nullptr);
  std::string name;
  {
    absl::StatusOr<Segment> s = pool->Allocate(2 * kG, Soon());
    ASSERT_TRUE(s.ok());
    name = (*s)->name();
    pool->Discard(s->get());
  }
  EXPECT_EQ(pool->stats().used_bytes, 0u);
  EXPECT_EQ(pool->stats().peak_used_bytes, 2 * kG);
  EXPECT_FALSE(SegmentExists(name));
  absl::StatusOr<Segment> next = pool->Allocate(2 * kG, Soon());
  ASSERT_TRUE(next.ok());
  EXPECT_NE((*next)->name(), name);
}

TEST(StagingPoolTest, SegmentMayOutliveThePool) {
  Segment s;
  std::string kept_name;
  {
    auto pool = NewPool(4 * kG);
    ASSERT_NE(pool, nullptr);
    absl::StatusOr<Segment> a = pool->Allocate(kG, Soon());
    absl::StatusOr<Segment> b = pool->Allocate(kG, Soon());
    ASSERT_TRUE(a.ok() && b.ok());
    kept_name = (*b)->name();
    b->reset();  // kept by the pool
    s = *std::move(a);
  }
  s->data()[0] = 7;  // still mapped
  const std::string name = s->name();
  s.reset();  // released after the pool is gone: destroyed, not leaked
  EXPECT_FALSE(SegmentExists(name));
  EXPECT_FALSE(SegmentExists(kept_name));
}

TEST(StagingPoolTest, ConcurrentAllocationsStayWithinTheBudget) {
  constexpr uint64_t kBudget = 64 * kG;
  absl::Mutex mu;
  std::vector<Segment> held;  // evictable, shared by the threads
  auto pool = NewPool(kBudget, [&] {
    absl::MutexLock l(&mu);
    if (held.empty()) return false;
    held.pop_back();
    return true;
  });
  ASSERT_NE(pool, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 200; ++i) {
        const uint64_t bytes = 1 + rng() % (16 * kG);
        absl::StatusOr<Segment> s = pool->Allocate(bytes, Soon());
        if (!s.ok()) {
          ++failures;
          continue;
        }
        (*s)->data()[bytes - 1] = static_cast<char>(i);
        if (rng() % 3 == 0) {
          absl::MutexLock l(&mu);
          held.push_back(*std::move(s));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(pool->stats().peak_used_bytes, kBudget);
  EXPECT_LE(pool->stats().used_bytes, kBudget);
  EXPECT_GT(pool->stats().peak_used_bytes, kBudget / 2);
}

}  // namespace
}  // namespace cairn::agent
