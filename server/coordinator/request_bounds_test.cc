// Request validation and bounds: the checks alone (request_bounds.h), then
// through the coordinator (no gRPC).
#include "server/coordinator/request_bounds.h"

#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(RequestBoundsTest, JobStepAndRankOfWorldAreValidated) {
  EXPECT_TRUE(ValidateJobStep("job", 0).ok());
  absl::Status s = ValidateJobStep("../etc", 1);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("../etc")));
  EXPECT_THAT(ValidateJobStep("job", -1),
              StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_TRUE(ValidateRankOfWorld(3, 4, 8, "rank 3 of x").ok());
  s = ValidateRankOfWorld(0, 9, 8, "rank 0 of job 'j' step 2");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument,
                  "rank 0 of job 'j' step 2: world_size 9 is not in [1, 8]"));
  s = ValidateRankOfWorld(0, 0, 8, "who");
  EXPECT_THAT(std::string(s.message()), HasSubstr("world_size 0"));
  s = ValidateRankOfWorld(4, 4, 8, "rank 4 of job 'j' step 2");
  EXPECT_THAT(
      s,
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "rank 4 of job 'j' step 2: rank is out of range for world_size 4"));
  EXPECT_THAT(ValidateRankOfWorld(-1, 4, 8, "who"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RequestBoundsTest, TruncatedMarksWhatItCut) {
  EXPECT_EQ(Truncated("abc", 3), "abc");
  EXPECT_EQ(Truncated("abcdef", 2), "ab...(truncated, 6 bytes)");
  EXPECT_EQ(Truncated("", 0), "");
}

TEST(RequestBoundsTest, LocalPlanItemsAndFqnsAreBounded) {
  CoordinatorOptions options;
  options.max_plan_items_per_rank = 3;
  options.max_fqn_bytes = 8;
  v1::LocalSavePlan plan = RankPlan(0, 1);  // w, b, rng
  EXPECT_TRUE(CheckLocalPlanBounds(plan, options, "rank 0").ok());
  v1::LocalSavePlan more = plan;
  *more.add_items() = plan.items(0);
  absl::Status s = CheckLocalPlanBounds(more, options, "rank 0 of job 'j'");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kResourceExhausted,
                  HasSubstr("rank 0 of job 'j': the local plan has 4 items; at "
                            "most 3")));
  // A tensor fqn and a bytes fqn are both measured.
  v1::LocalSavePlan tensor = plan;
  tensor.mutable_items(0)->mutable_tensor()->set_fqn("model.layer.weight");
  s = CheckLocalPlanBounds(tensor, options, "rank 2");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument,
                  HasSubstr("rank 2: fqn 'model.layer.weight' is 18 bytes; at "
                            "most 8")));
  v1::LocalSavePlan bytes = plan;
  bytes.mutable_items(2)->set_bytes_fqn(std::string(9, 'r'));
  EXPECT_THAT(CheckLocalPlanBounds(bytes, options, "rank 2"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A huge fqn is cut in the message.
  bytes.mutable_items(2)->set_bytes_fqn(std::string(1 << 16, 'r'));
  s = CheckLocalPlanBounds(bytes, options, "rank 2");
  EXPECT_LT(s.message().size(), 256u);
  EXPECT_THAT(std::string(s.message()), HasSubstr("(truncated, 65536 bytes)"));
}

TEST(RequestBoundsTest, LoadRequestsAreBoundedByChunksBytesAndFqns) {
  CoordinatorOptions options;
  options.max_plan_items_per_rank = 2;
  options.max_fqn_bytes = 4;
  v1::PlanLoadRequest load;
  load.set_job("job");
  load.set_rank(5);
  load.add_wanted()->mutable_tensor()->set_fqn("w");
  load.add_wanted_bytes("rng");
  EXPECT_TRUE(CheckLoadRequestBounds(load, options).ok());
  load.add_wanted_bytes("rng");
  load.add_wanted_bytes("rng");
  absl::Status s = CheckLoadRequestBounds(load, options);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kResourceExhausted,
                  HasSubstr("rank 5 loading job 'job': 1 chunks and 3 bytes "
                            "entries; at most 2")));
  load.clear_wanted_bytes();
  load.mutable_wanted(0)->mutable_tensor()->set_fqn("model.w");
  s = CheckLoadRequestBounds(load, options);
  EXPECT_THAT(
      s, StatusIs(
             absl::StatusCode::kInvalidArgument,
             HasSubstr("rank 5 loading job 'job': fqn 'model.w' is 7 bytes")));
  load.clear_wanted();
  // The short form: 2 offsets and sizes of 8 dims per tensor at most.
  for (int i = 0; i < 32; ++i) load.add_wanted_boxes(i);
  EXPECT_TRUE(CheckLoadRequestBounds(load, options).ok());
  load.add_wanted_boxes(0);
  s = CheckLoadRequestBounds(load, options);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kResourceExhausted,
                  HasSubstr("rank 5 loading job 'job': wanted_boxes holds 33 "
                            "values; at most 32")));
  load.clear_wanted_boxes();
  load.set_tensors_digest(std::string(65, 'd'));
  s = CheckLoadRequestBounds(load, options);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("tensors_digest is 65")));

  v1::VerifyLoadRequest verify;
  verify.set_job("job");
  verify.set_rank(1);
  for (int i = 0; i < 3; ++i) verify.add_pieces()->set_fqn("w");
  s = CheckLoadRequestBounds(verify, options);
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("rank 1 verifying its load of job 'job': 3 chunks")));
  verify.mutable_pieces()->RemoveLast();
  verify.mutable_pieces(0)->set_fqn("longer");
  EXPECT_THAT(CheckLoadRequestBounds(verify, options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinatorTest, LocalPlansAreBoundedPerRankAndPerSave) {
  options_.max_plan_items_per_rank = 3;
  options_.max_plan_items_per_save = 5;
  options_.max_fqn_bytes = 16;
  Start();
  v1::LocalSavePlan big = RankPlan(0, 1);
  *big.add_items() = big.items(0);
  BeginResult r = Begin("job", 1, 0, 1, big).get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("rank 0 of job 'job' step 1"),
                                HasSubstr("4 items"))));

  v1::LocalSavePlan long_fqn = RankPlan(0, 1);
  long_fqn.mutable_items(2)->set_bytes_fqn(std::string(100, 'f'));
  r = Begin("job", 1, 0, 1, long_fqn).get();
  EXPECT_THAT(
      r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("100 bytes")));

  r = Begin("job", 1, 0, 1, std::nullopt, std::string(1 << 20, 'z')).get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("fingerprint")));

  // Two ranks of 3 items each exceed 5 items per save: the second is refused.
  auto first = Begin("job", 2, 0, 2, RankPlan(0, 2));
  r = Begin("job", 2, 1, 2, RankPlan(1, 2)).get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("rank 1 of job 'job' step 2"),
                                HasSubstr("at most 5"))));
  coordinator_.reset();
  EXPECT_THAT(first.get(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(CoordinatorTest, LoadRequestsAreBoundedAndLoadPlansCachedByBytes) {
  options_.max_plan_items_per_rank = 4;
  options_.max_fqn_bytes = 16;
  options_.load_plan_cache_bytes = 64;  // smaller than any answer
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse one = PlanColumns(0, 0, 4);
  PlanColumns(0, 0, 4);  // a layout's second ask would cache its answer
  PlanColumns(0, 0, 4);
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 0);

  v1::PlanLoadRequest req;
  req.set_job("job");
  req.set_step(1);
  req.set_rank(3);
  for (int i = 0; i < 5; ++i) req.add_wanted_bytes("rng");
  auto r = coordinator_->PlanLoad(req);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("rank 3 loading job 'job'"),
                                HasSubstr("at most 4"))));
  req.clear_wanted_bytes();
  req.add_wanted_bytes(std::string(1000, 'r'));
  r = coordinator_->PlanLoad(req);
  EXPECT_THAT(
      r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1000 bytes")));

  v1::VerifyLoadRequest verify;
  verify.set_job("job");
  verify.set_step(1);
  verify.set_rank(1);
  verify.set_world_size(2);
  for (int i = 0; i < 5; ++i) verify.add_pieces()->set_fqn("w");
  VerifyResult v = Verify(verify).get();
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kResourceExhausted,
                          HasSubstr("rank 1 verifying its load of job 'job'")));
}

}  // namespace
}  // namespace cairn::coordinator
