// Request validation and bounds, through the coordinator (no gRPC).
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, LocalPlansAreBoundedPerRankAndPerSave) {
  options_.max_plan_items_per_rank = 3;
  options_.max_plan_items_per_save = 5;
  options_.max_fqn_bytes = 16;
  Start();
  v1::LocalSavePlan big = RankPlan(0, 1);
  *big.add_items() = big.items(0);
  BeginResult r = Begin("job", 1, 0, 1, big).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 0 of job 'job' step 1"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("4 items"));

  v1::LocalSavePlan long_fqn = RankPlan(0, 1);
  long_fqn.mutable_items(2)->set_bytes_fqn(std::string(100, 'f'));
  r = Begin("job", 1, 0, 1, long_fqn).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("100 bytes"));

  r = Begin("job", 1, 0, 1, std::nullopt, std::string(1 << 20, 'z')).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("fingerprint"));

  // Two ranks of 3 items each exceed 5 items per save: the second is refused.
  auto first = Begin("job", 2, 0, 2, RankPlan(0, 2));
  r = Begin("job", 2, 1, 2, RankPlan(1, 2)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 1 of job 'job' step 2"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at most 5"));
  coordinator_.reset();
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorTest, LoadRequestsAreBoundedAndLoadPlansCachedByBytes) {
  options_.max_plan_items_per_rank = 4;
  options_.max_fqn_bytes = 16;
  options_.load_plan_cache_bytes = 64;  // smaller than any answer
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse one = PlanColumns(0, 0, 4);
  PlanColumns(0, 0, 4);
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 0);

  v1::PlanLoadRequest req;
  req.set_job("job");
  req.set_step(1);
  req.set_rank(3);
  for (int i = 0; i < 5; ++i) req.add_wanted_bytes("rng");
  auto r = coordinator_->PlanLoad(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 3 loading job 'job'"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at most 4"));
  req.clear_wanted_bytes();
  req.add_wanted_bytes(std::string(1000, 'r'));
  r = coordinator_->PlanLoad(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("1000 bytes"));

  v1::VerifyLoadRequest verify;
  verify.set_job("job");
  verify.set_step(1);
  verify.set_rank(1);
  verify.set_world_size(2);
  for (int i = 0; i < 5; ++i) verify.add_pieces()->set_fqn("w");
  VerifyResult v = Verify(verify).get();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("rank 1 verifying its load of job 'job'"));
}

}  // namespace
}  // namespace cairn::coordinator
