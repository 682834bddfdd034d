// Deletion and retention through the coordinator (no gRPC): DeleteCheckpoint,
// GarbageCollect, retention after a commit, and crashes at every storage
// mutation of a deletion.
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, DeleteRefusesASaveInProgressAndRetentionKeepsNewest) {
  options_.keep_last = 2;
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  auto pending = Begin("job", 3, 0, 2, RankPlan(0, 2));  // waits for rank 1
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(3);
  EXPECT_THAT(coordinator_->DeleteCheckpoint(del),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  auto other = Begin("job", 3, 1, 2, RankPlan(1, 2));
  BeginResult p0 = pending.get(), p1 = other.get();
  ASSERT_TRUE(p0.ok() && p1.ok());
  auto c0 = Commit(Write("job", 3, 0, *p0));
  ASSERT_TRUE(Commit(Write("job", 3, 1, *p1)).get().ok());
  ASSERT_TRUE(c0.get().ok());
  v1::ListCheckpointsRequest list;
  list.set_job("job");
  auto l = coordinator_->ListCheckpoints(list);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->checkpoints_size(), 2);  // step 1 fell to retention
  EXPECT_EQ(l->checkpoints(0).step(), 2);
  EXPECT_EQ(l->checkpoints(1).step(), 3);
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(0);
  EXPECT_THAT(coordinator_->GarbageCollect(gc),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Kills storage at every mutation of a `cairn rm` of the newest step, and of
// a commit whose retention deletes the older one: while cairnd runs on, no
// listed checkpoint or `latest` is one that cannot load, and after a restart
// catalog and storage agree with nothing left over.
TEST_F(CoordinatorTest, CrashAtEveryStorageMutationOfADeleteOrRetention) {
  for (bool retention : {false, true}) {
    for (int64_t n = 1;; ++n) {
      SCOPED_TRACE(absl::StrCat(retention ? "retention" : "rm",
                                ", crash at mutation ", n));
      UsePosix(/*faulty=*/true);
      options_.keep_last = retention ? 1 : 0;
      Start();
      Save("job", 1, 1);
      if (!retention) Save("job", 2, 1);
      g_faults->CrashAtMutation(n);
      if (retention) {
        BeginResult b = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
        ASSERT_TRUE(b.ok()) << b.status();
        (void)Commit(Write("job", 2, 0, *b)).get();
      } else {
        v1::DeleteCheckpointRequest del;
        del.set_job("job");
        del.set_step(2);
        (void)coordinator_->DeleteCheckpoint(del);
      }
      const bool crashed = g_faults->crashed();
      // (`latest` is the newest listed step; loading it needs the storage
      // that just "died", so only the MANIFEST is checked, on the disk.)
      for (int64_t step : ListedSteps("job")) {
        auto m = storage::ReadManifest(Disk(), "job", step);
        EXPECT_TRUE(m.ok()) << "listed step " << step << ": " << m.status();
      }
      Restart();
      ExpectCatalogAndStorageAgree("job");
      if (!retention) {
        EXPECT_EQ(LatestStep("job"), 1);
      }
      if (HasFailure() || !crashed) break;  // every crash point was tried
    }
  }
}

TEST_F(CoordinatorTest, GcAndCommitRemoveTempFilesAndOtherAttemptsObjects) {
  UsePosix();
  Start();
  std::vector<v1::BeginSaveResponse> plans = Save("job", 1, 2);
  const std::string step1 = storage::StepPrefix("job", 1);
  // A rank that died mid-write (its 64 MiB temp file), and a zombie of an
  // aborted attempt writing after that attempt's cleanup.
  DeadWriter(step1 + AttemptOf(plans[0]) + "/data-9");
  ASSERT_TRUE(Disk()
                  .Put(step1 + "attempt-00000000dead/data-0",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_EQ(TempFiles(), 1);
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(1);
  ASSERT_TRUE(coordinator_->GarbageCollect(gc).ok());
  ExpectCatalogAndStorageAgree("job");
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/" + step1 +
                                       "attempt-00000000dead"));

  // The same garbage in a step before its commit goes with the commit.
  BeginResult b = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(b.ok());
  const std::string step2 = storage::StepPrefix("job", 2);
  DeadWriter(step2 + "attempt-00000000dead/data-0");
  ASSERT_TRUE(Disk()
                  .Put(step2 + "attempt-00000000dead/data-1",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_TRUE(Commit(Write("job", 2, 0, *b)).get().ok());
  ExpectCatalogAndStorageAgree("job");
  EXPECT_EQ(LatestStep("job"), 2);
}

TEST_F(CoordinatorTest,
       DeletingStepIsNeverListedLoadedOrSavedAndRestartEndsIt) {
  UsePosix(/*faulty=*/true);
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  // The data of step 2 cannot be deleted: `cairn rm` fails half-way.
  storage::FaultRule rule;
  rule.ops = storage::kFaultDelete;
  rule.key_contains = "0000000000000002/";
  rule.count = -1;
  rule.status = absl::UnavailableError("disk went away");
  g_faults->AddRule(rule);
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(2);
  absl::Status s = coordinator_->DeleteCheckpoint(del);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk went away")));
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_DELETING);
  EXPECT_THAT(ListedSteps("job"), ::testing::ElementsAre(1));
  EXPECT_EQ(LatestStep("job"), 1);
  v1::PlanLoadRequest load;
  load.set_job("job");
  load.set_step(2);
  EXPECT_THAT(coordinator_->PlanLoad(load),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  BeginResult again = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("job 'job' step 2 is being deleted")));
  // A restart finishes the deletion.
  Restart();
  EXPECT_THAT(Record("job", 2), StatusIs(absl::StatusCode::kNotFound));
  ExpectCatalogAndStorageAgree("job");
}

}  // namespace
}  // namespace cairn::coordinator
