#include "server/coordinator/heap_releaser.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace cairn::coordinator {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HeapReleasePolicyTest, ReleasesWhatExceedsTheReserveWhenQuiet) {
  const HeapReleasePolicy policy{.threshold_bytes = 64 * kMiB,
                                 .quiet_bytes = 16 * kMiB,
                                 .keep_free_bytes = 256 * kMiB};
  EXPECT_EQ(policy.BytesToRelease(1024 * kMiB, 0), 768 * kMiB);
  EXPECT_EQ(policy.BytesToRelease(1024 * kMiB, 16 * kMiB - 1), 768 * kMiB);
  // Busy: the heap in use moved by 16 MiB or more since the last look.
  EXPECT_EQ(policy.BytesToRelease(1024 * kMiB, 16 * kMiB), 0u);
  // Under the reserve, or not the threshold above it: nothing.
  EXPECT_EQ(policy.BytesToRelease(100 * kMiB, 0), 0u);
  EXPECT_EQ(policy.BytesToRelease(256 * kMiB, 0), 0u);
  EXPECT_EQ(policy.BytesToRelease(256 * kMiB + 64 * kMiB - 1, 0), 0u);
  EXPECT_EQ(policy.BytesToRelease(256 * kMiB + 64 * kMiB, 0), 64 * kMiB);
}

TEST(HeapReleasePolicyTest, WithoutAReserveReleasesEverythingOverTheThreshold) {
  const HeapReleasePolicy policy{.keep_free_bytes = 0};
  EXPECT_EQ(policy.BytesToRelease(64 * kMiB, 0), 64 * kMiB);
  EXPECT_EQ(policy.BytesToRelease(5000 * kMiB, 0), 5000 * kMiB);
  EXPECT_EQ(policy.BytesToRelease(64 * kMiB - 1, 0), 0u);
}

// Has tcmalloc hold `bytes` free, faulted in, in 8 MiB spans it cannot
// coalesce: between the blocks freed, the 1 MiB ones it returns stay in use
// (as the memory a large round frees lies between what stays). tcmalloc
// releases whole free spans, so a reserve in one span would go whole.
std::vector<void*> HoldFreeInSpans(size_t bytes) {
  std::vector<void*> freed;
  std::vector<void*> kept;
  for (size_t done = 0; done < bytes; done += 8 * kMiB) {
    freed.push_back(std::malloc(8 * kMiB));
    kept.push_back(std::malloc(kMiB));
    std::memset(freed.back(), 1, 8 * kMiB);
  }
  for (void* b : freed) std::free(b);
  return kept;
}

// Waits (up to 60 s, so a broken releaser fails rather than hangs) until
// tcmalloc holds at most `bytes` free; returns what it holds then.
size_t WaitForFreeAtMost(size_t bytes) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (HeapReleaser::FreeBytes() > bytes && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return HeapReleaser::FreeBytes();
}

// On tcmalloc (this test links it where cairnd does), a releaser hands back
// what exceeds its reserve and keeps the reserve; one without a reserve
// hands back everything.
TEST(HeapReleaserTest, KeepsItsReserveAndReleasesTheRest) {
  if (!HeapReleaser::Available()) {
    GTEST_SKIP() << "not linked with tcmalloc";
  }
  const std::vector<void*> kept = HoldFreeInSpans(384 * kMiB);
  ASSERT_GE(HeapReleaser::FreeBytes(), 384 * kMiB);
  {
    const HeapReleaser releaser(
        HeapReleasePolicy{.keep_free_bytes = 128 * kMiB},
        absl::Milliseconds(10));
    const size_t left = WaitForFreeAtMost(128 * kMiB);
    EXPECT_LE(left, 128 * kMiB);
    // The reserve stays: the excess went in whole spans, no more.
    EXPECT_GE(left, 120 * kMiB);
  }
  {
    const HeapReleaser releaser(HeapReleasePolicy{.keep_free_bytes = 0},
                                absl::Milliseconds(10));
    EXPECT_LT(WaitForFreeAtMost(64 * kMiB), 64 * kMiB);
  }
  for (void* b : kept) std::free(b);
}

}  // namespace
}  // namespace cairn::coordinator
