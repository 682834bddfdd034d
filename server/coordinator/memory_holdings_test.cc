#include "server/coordinator/memory_holdings.h"

#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kLease = absl::Seconds(5);

v1::ReportHoldingsRequest Report(
    int node, uint64_t incarnation,
    const std::vector<std::tuple<std::string, int64_t, int>>& held) {
  v1::ReportHoldingsRequest r;
  r.set_node_id(node);
  r.set_num_nodes(8);
  r.set_incarnation(incarnation);
  r.set_budget_bytes(1000);
  for (const auto& [job, step, rank] : held) {
    v1::HeldShards* h = r.add_held();
    h->set_job(job);
    h->set_step(step);
    h->set_rank(rank);
    h->set_memory_tier(true);
  }
  return r;
}

TEST(MemoryHoldingsTest, ReportsSayWhoHoldsWhatWhileTheyKeepComing) {
  MemoryHoldings h(kLease, kStart);
  h.Report(Report(0, 1, {{"j", 10, 0}, {"j", 10, 1}}), kStart);
  h.Report(Report(1, 2, {{"j", 10, 1}, {"j", 10, 0}, {"j", 20, 0}}),
           kStart + absl::Seconds(1));
  MemoryHoldings::Copies c = h.CopiesOf("j", 10, 2, kStart + absl::Seconds(2));
  EXPECT_EQ(c.fewest, 2);
  EXPECT_THAT(c.nodes, ElementsAre(0, 1));
  EXPECT_THAT(c.ranks_without, IsEmpty());
  // Step 20 has rank 1 nowhere; another job nothing.
  c = h.CopiesOf("j", 20, 2, kStart + absl::Seconds(2));
  EXPECT_EQ(c.fewest, 0);
  EXPECT_THAT(c.ranks_without, ElementsAre(1));
  EXPECT_THAT(h.CopiesOf("k", 10, 2, kStart).ranks_without, ElementsAre(0, 1));
  // Node 0 stops reporting: past its lease its copies are gone.
  c = h.CopiesOf("j", 10, 2, kStart + kLease + absl::Milliseconds(1));
  EXPECT_EQ(c.fewest, 1);
  EXPECT_THAT(c.nodes, ElementsAre(1));
  EXPECT_EQ(h.LiveNodes(kStart + kLease + absl::Milliseconds(1)), 1);
  // It comes back (thawed) with the same sets: live again.
  h.Report(Report(0, 1, {{"j", 10, 0}}), kStart + absl::Seconds(8));
  h.Report(Report(1, 2, {{"j", 10, 1}, {"j", 10, 0}}),
           kStart + absl::Seconds(8));
  c = h.CopiesOf("j", 10, 2, kStart + absl::Seconds(8));
  EXPECT_THAT(c.by_rank[0], ElementsAre(0, 1));
  EXPECT_THAT(c.by_rank[1], ElementsAre(1));
}

TEST(MemoryHoldingsTest, CommitCountsUntilReportsConfirmButARestartForgets) {
  MemoryHoldings h(kLease, kStart);
  h.Report(Report(0, 1, {}), kStart);
  h.Report(Report(1, 2, {}), kStart);
  const absl::Time t = kStart + absl::Seconds(1);
  h.Committed("j", 5, {{0, 1}, {1, 0}}, t);
  EXPECT_EQ(h.CopiesOf("j", 5, 2, t).fewest, 2);
  // A report sent before the agent kept the set does not erase it...
  h.Report(Report(1, 2, {}), t + absl::Milliseconds(10));
  EXPECT_EQ(h.CopiesOf("j", 5, 2, t + absl::Milliseconds(10)).fewest, 2);
  // ... but one a lease later does, and a restarted agent at once.
  h.Report(Report(1, 2, {}), t + kLease + absl::Milliseconds(1));
  h.Report(Report(0, 99, {}), t + kLease + absl::Milliseconds(1));
  EXPECT_EQ(h.CopiesOf("j", 5, 2, t + kLease + absl::Milliseconds(1)).fewest,
            0);
}

TEST(MemoryHoldingsTest, SettledOnceExpectedNodesReportedOrTheLeasePassed) {
  MemoryHoldings h(kLease, kStart);
  EXPECT_TRUE(h.Settled({}, kStart));
  EXPECT_FALSE(h.Settled({0, 3}, kStart + absl::Seconds(1)));
  h.Report(Report(3, 1, {}), kStart + absl::Seconds(1));
  EXPECT_FALSE(h.Settled({0, 3}, kStart + absl::Seconds(1)));
  // A commit alone is not a report.
  h.Committed("j", 1, {{0}}, kStart + absl::Seconds(1));
  EXPECT_FALSE(h.Settled({0, 3}, kStart + absl::Seconds(1)));
  h.Report(Report(0, 1, {}), kStart + absl::Seconds(2));
  EXPECT_TRUE(h.Settled({0, 3}, kStart + absl::Seconds(2)));
  EXPECT_TRUE(h.Settled({7}, h.SettleDeadline()));
}

// Against a brute-force oracle: random reports, commits and clocks.
TEST(MemoryHoldingsTest, RandomHistoriesMatchAnOracle) {
  std::mt19937 rng(20261204);
  for (int trial = 0; trial < 200; ++trial) {
    MemoryHoldings h(kLease, kStart);
    constexpr int kNodes = 5, kWorld = 4, kSteps = 3;
    struct Oracle {
      absl::Time last = absl::InfinitePast();
      uint64_t inc = 0;
      bool reported = false;
      std::map<std::pair<int, int>, absl::Time> held;  // (step, rank) -> commit
    };
    std::vector<Oracle> o(kNodes);
    absl::Time now = kStart;
    for (int op = 0; op < 60; ++op) {
      now += absl::Milliseconds(std::uniform_int_distribution<>(0, 3000)(rng));
      const int node = std::uniform_int_distribution<>(0, kNodes - 1)(rng);
      if (rng() % 3 == 0) {
        const int step = static_cast<int>(rng() % kSteps);
        std::vector<std::vector<int>> holders(kWorld);
        for (int r = 0; r < kWorld; ++r) {
          for (int n = 0; n < kNodes; ++n) {
            if (rng() % 3 == 0) holders[r].push_back(n);
          }
        }
        h.Committed("j", step, holders, now);
        for (int r = 0; r < kWorld; ++r) {
          for (int n : holders[r]) {
            if (!o[n].reported) o[n].last = now;
            o[n].held[{step, r}] = now;
          }
        }
      } else {
        const uint64_t inc = rng() % 5 == 0 ? o[node].inc + 1 : o[node].inc;
        std::vector<std::tuple<std::string, int64_t, int>> held;
        std::map<std::pair<int, int>, absl::Time> next;
        for (int s = 0; s < kSteps; ++s) {
          for (int r = 0; r < kWorld; ++r) {
            if (rng() % 2 == 0) {
              held.emplace_back("j", s, r);
              next[{s, r}] = absl::InfinitePast();
            }
          }
        }
        const bool restarted = o[node].reported && inc != o[node].inc;
        if (!restarted) {
          for (const auto& [k, c] : o[node].held) {
            if (now - c < kLease && next.count(k) == 0) next[k] = c;
          }
        }
        o[node] = Oracle{now, inc, true, next};
        h.Report(Report(node, inc, held), now);
      }
      const int step = static_cast<int>(rng() % kSteps);
      MemoryHoldings::Copies c = h.CopiesOf("j", step, kWorld, now);
      int fewest = INT32_MAX;
      for (int r = 0; r < kWorld; ++r) {
        std::vector<int> want;
        for (int n = 0; n < kNodes; ++n) {
          if (now - o[n].last <= kLease && o[n].held.count({step, r}) > 0) {
            want.push_back(n);
          }
        }
        ASSERT_EQ(c.by_rank[r], want) << "trial " << trial << " op " << op;
        fewest = std::min<int>(fewest, want.size());
      }
      ASSERT_EQ(c.fewest, fewest);
    }
  }
}

}  // namespace
}  // namespace cairn::coordinator
