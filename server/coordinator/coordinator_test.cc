// The coordinator facade in-process (no gRPC): a whole save by several
// ranks, shutdown, many ranks of two jobs at once, and GetCheckpoint of
// `latest`.
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

TEST_F(CoordinatorTest, ReplicatedItemsAreWrittenOnceAndCommitted) {
  Start();
  std::vector<v1::BeginSaveResponse> plans = Save("job", 1, 3);
  int bias_writers = 0, rng_writers = 0, w_chunks = 0;
  for (const auto& p : plans) {
    for (const auto& w : p.rank_plan().writes()) {
      if (w.item().kind() == v1::WriteItem::KIND_BYTES) ++rng_writers;
      if (w.item().tensor().fqn() == "b") ++bias_writers;
      if (w.item().tensor().fqn() == "w") ++w_chunks;
      EXPECT_THAT(w.location().object_key(), HasSubstr("attempt-"));
      EXPECT_EQ(w.location().offset() % 4096, 0u);
    }
  }
  EXPECT_EQ(bias_writers, 1);
  EXPECT_EQ(rng_writers, 1);
  EXPECT_EQ(w_chunks, 3);
  v1::GetCheckpointRequest get;
  get.set_job("job");
  get.set_step(1);
  auto got = coordinator_->GetCheckpoint(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(got->manifest().tensors_size(), 2);
  EXPECT_EQ(got->manifest().bytes_entries_size(), 1);
  EXPECT_EQ(LatestStep("job"), 1);
}

TEST_F(CoordinatorTest, ShutdownAnswersParkedRanksUnavailable) {
  Start();
  auto parked = Begin("job", 1, 0, 2, RankPlan(0, 2));
  coordinator_->Shutdown();
  BeginResult r = parked.get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(CoordinatorTest, ThousandRanksOfTwoJobsSaveConcurrently) {
  Start();
  constexpr int kWorld = 1024;
  std::vector<std::future<BeginResult>> begins;
  for (int r = 0; r < kWorld; ++r) {
    for (const char* job : {"a", "b"}) {
      begins.push_back(Begin(job, 7, r, kWorld, RankPlan(r, kWorld, 2048)));
    }
  }
  std::vector<std::future<CommitResult>> commits;
  for (int i = 0; i < static_cast<int>(begins.size()); ++i) {
    BeginResult b = begins[i].get();
    ASSERT_TRUE(b.ok()) << b.status();
    commits.push_back(Commit(Write(i % 2 ? "b" : "a", 7, i / 2, *b)));
  }
  for (auto& c : commits) ASSERT_TRUE(c.get().ok());
  EXPECT_EQ(LatestStep("a"), 7);
  EXPECT_EQ(LatestStep("b"), 7);
  v1::GetCheckpointRequest get;
  get.set_job("b");
  get.set_step(7);
  auto got = coordinator_->GetCheckpoint(get);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->manifest().tensors_size(), 2);
  EXPECT_EQ(got->manifest().tensors(1).chunks_size(), kWorld);  // "w"
  EXPECT_EQ(got->checkpoint().world_size(), kWorld);
}

// GetCheckpoint with `latest`: cairnd resolves the newest COMMITTED step
// with the lookup; newer WRITING, ABORTED and DELETING steps are never it.
TEST_F(CoordinatorTest, GetCheckpointLatestIsTheNewestCommittedStep) {
  options_.storage_uri = "faulty://GetCheckpointLatest";
  Start();
  auto latest = [&](const std::string& job) {
    v1::GetCheckpointRequest get;
    get.set_job(job);
    get.set_latest(true);
    return coordinator_->GetCheckpoint(get);
  };
  absl::StatusOr<v1::GetCheckpointResponse> none = latest("job");
  EXPECT_THAT(none,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("job 'job' has no committed checkpoint")));

  Save("job", 1, 2);
  Save("job", 2, 2);
  Save("job", 3, 2);
  Save("other", 9, 1);  // another job's newer step is not this job's latest
  // Step 4 ABORTED, step 5 WRITING (planned, never committed).
  auto a0 = Begin("job", 4, 0, 2, RankPlan(0, 2));
  auto a1 = Begin("job", 4, 1, 2, RankPlan(1, 2));
  ASSERT_TRUE(a0.get().ok());
  ASSERT_TRUE(a1.get().ok());
  v1::AbortSaveRequest abort;
  abort.set_job("job");
  abort.set_step(4);
  abort.set_rank(0);
  abort.set_reason("test");
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  auto w0 = Begin("job", 5, 0, 2, RankPlan(0, 2));
  auto w1 = Begin("job", 5, 1, 2, RankPlan(1, 2));
  ASSERT_TRUE(w0.get().ok());
  ASSERT_TRUE(w1.get().ok());
  ASSERT_EQ(Record("job", 4)->state(), v1::CHECKPOINT_STATE_ABORTED);
  ASSERT_EQ(Record("job", 5)->state(), v1::CHECKPOINT_STATE_WRITING);

  absl::StatusOr<v1::GetCheckpointResponse> got = latest("job");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().step(), 3);
  EXPECT_EQ(got->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  ASSERT_TRUE(got->has_manifest());
  EXPECT_EQ(got->manifest().step(), 3);
  EXPECT_EQ(got->manifest().job(), "job");
  // record_only (what Checkpointer::LatestStep asks): the same record, no
  // manifest; by step too, for any state.
  v1::GetCheckpointRequest record_only;
  record_only.set_job("job");
  record_only.set_latest(true);
  record_only.set_record_only(true);
  absl::StatusOr<v1::GetCheckpointResponse> rec =
      coordinator_->GetCheckpoint(record_only);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->checkpoint().step(), 3);
  EXPECT_EQ(rec->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_FALSE(rec->has_manifest());
  for (int64_t step : {3, 4}) {
    record_only.set_step(step);
    rec = coordinator_->GetCheckpoint(record_only);
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(rec->checkpoint().step(), step);
    EXPECT_FALSE(rec->has_manifest());
  }

  // Step 3's deletion stops at its first storage delete: the record stays
  // DELETING (its MANIFEST is still on storage) and is never `latest`.
  g_faults->AddRule({.ops = storage::kFaultDelete,
                     .key_contains = "",
                     .count = -1,
                     .action = storage::FaultAction::kFail});
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(3);
  EXPECT_FALSE(coordinator_->DeleteCheckpoint(del).ok());
  ASSERT_EQ(Record("job", 3)->state(), v1::CHECKPOINT_STATE_DELETING);
  got = latest("job");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().step(), 2);
  EXPECT_EQ(got->manifest().step(), 2);

  // Deleted for good, the next newest: step 1 after step 2 goes too.
  g_faults->Reset();
  ASSERT_TRUE(coordinator_->DeleteCheckpoint(del).ok());
  del.set_step(2);
  ASSERT_TRUE(coordinator_->DeleteCheckpoint(del).ok());
  got = latest("job");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().step(), 1);

  // Nothing committed left (only ABORTED and WRITING): NOT_FOUND naming it.
  del.set_step(1);
  ASSERT_TRUE(coordinator_->DeleteCheckpoint(del).ok());
  none = latest("job");
  EXPECT_THAT(none,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("job 'job' has no committed checkpoint")));

  // `latest: false` is not a step; a bad job name is refused as before.
  v1::GetCheckpointRequest bad;
  bad.set_job("job");
  bad.set_latest(false);
  EXPECT_THAT(coordinator_->GetCheckpoint(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad.set_job("../x");
  bad.set_latest(true);
  EXPECT_THAT(coordinator_->GetCheckpoint(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace cairn::coordinator
