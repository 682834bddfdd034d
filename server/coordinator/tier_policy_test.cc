#include "server/coordinator/tier_policy.h"

#include <map>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::IsOk;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobPolicy Policy(int64_t n, int64_t m, int k, int keep_memory = 2) {
  v1::JobPolicy p;
  p.set_job("llama");
  p.set_memory_every(n);
  p.set_persist_every(m);
  p.set_replicas(k);
  p.set_keep_memory(keep_memory);
  return p;
}

std::map<int, TierAsk> Asks(int world, v1::Tier tier, bool agent,
                            int replicas = 1) {
  std::map<int, TierAsk> asks;
  for (int r = 0; r < world; ++r) asks[r] = TierAsk{tier, agent, replicas};
  return asks;
}

TEST(ChooseTierTest, PolicyDecidesByStepUnlessARankNamesATier) {
  const v1::JobPolicy p = Policy(10, 50, 2);
  auto at = [&](int64_t step, v1::Tier asked) {
    return ChooseTier("llama", step, Asks(4, asked, true), &p, 4);
  };
  absl::StatusOr<TierChoice> c = at(10, v1::TIER_UNSPECIFIED);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_MEMORY);
  EXPECT_EQ(c->replicas, 2);  // the policy's, not the agents' 1
  c = at(50, v1::TIER_UNSPECIFIED);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_PERSISTENT);
  c = at(50, v1::TIER_MEMORY);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_MEMORY);
  c = at(10, v1::TIER_PERSISTENT);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_PERSISTENT);
  // Without a policy: persistent unless asked, k from the agents.
  c = ChooseTier("llama", 10, Asks(2, v1::TIER_UNSPECIFIED, true), nullptr, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_PERSISTENT);
  c = ChooseTier("llama", 10, Asks(2, v1::TIER_MEMORY, true, 2), nullptr, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_MEMORY);
  EXPECT_EQ(c->replicas, 2);
}

TEST(ChooseTierTest, RefusesWhatCannotBeKeptInMemory) {
  std::map<int, TierAsk> asks = Asks(4, v1::TIER_UNSPECIFIED, true);
  asks[1].tier = v1::TIER_MEMORY;
  asks[3].tier = v1::TIER_PERSISTENT;
  EXPECT_THAT(ChooseTier("llama", 7, asks, nullptr, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job 'llama' step 7"),
                             HasSubstr("rank 1"), HasSubstr("rank 3"))));
  asks = Asks(3, v1::TIER_MEMORY, true);
  asks[2].agent_holds = false;
  EXPECT_THAT(ChooseTier("llama", 7, asks, nullptr, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 2 saves directly")));
  // By the policy alone: persisted instead.
  asks = Asks(3, v1::TIER_UNSPECIFIED, true);
  asks[2].agent_holds = false;
  const v1::JobPolicy p = Policy(1, 10, 1);
  absl::StatusOr<TierChoice> c = ChooseTier("llama", 7, asks, &p, 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tier, v1::TIER_PERSISTENT);
  EXPECT_THAT(
      ChooseTier("llama", 7, Asks(2, v1::TIER_MEMORY, true, 2), nullptr, 2),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("2 replicas needs 3"), HasSubstr("2 report"))));
}

TEST(ValidatePolicyTest, MalformedAndUnmeetablePoliciesNameTheNumbers) {
  PolicyContext ctx{.live_nodes = 4, .budget_bytes = 4000, .job_bytes = 500};
  EXPECT_THAT(ValidatePolicy(Policy(10, 100, 1, 2), ctx), IsOk());
  EXPECT_THAT(ValidatePolicy(Policy(0, 100, 1), ctx),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("memory_every must be >= 1, got 0")));
  EXPECT_THAT(ValidatePolicy(Policy(10, 25, 1), ctx),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("persist_every (25)")));
  EXPECT_THAT(ValidatePolicy(Policy(10, 100, -1), ctx),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      ValidatePolicy(Policy(10, 100, 1, 0), ctx),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep_memory")));
  EXPECT_THAT(
      ValidatePolicy(Policy(10, 100, 4), ctx),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("4 replicas need 5"), HasSubstr("4 report"))));
  // 3 kept x 3 copies x 500 bytes = 4500 > 4000.
  EXPECT_THAT(ValidatePolicy(Policy(10, 100, 2, 3), ctx),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("need 4500 bytes"),
                             HasSubstr("add up to 4000"))));
  // Every save persisted: nothing to hold, nothing to check.
  EXPECT_THAT(ValidatePolicy(Policy(10, 10, 9, 1), ctx), IsOk());
}

TEST(CheckHoldersTest, DistinctNodesInRangeAndEnoughOfThem) {
  google::protobuf::RepeatedField<int32_t> nodes;
  nodes.Add(3);
  nodes.Add(0);
  absl::StatusOr<std::vector<int>> got = CheckHolders("rank 1", nodes, 1, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre(3, 0));
  EXPECT_THAT(CheckHolders("rank 1", nodes, 2, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 1"), HasSubstr("2 node(s) (3, 0)"),
                             HasSubstr("needs 3"))));
  nodes.Add(3);
  EXPECT_THAT(
      CheckHolders("rank 1", nodes, 1, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  nodes.Set(2, 4);
  EXPECT_THAT(CheckHolders("rank 1", nodes, 1, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("outside [0, 4)")));
}

}  // namespace
}  // namespace cairn::coordinator
