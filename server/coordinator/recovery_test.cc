// Start-up recovery through the coordinator (no gRPC): what a crash or an
// outside edit leaves in the catalog and on storage is reconciled at start.
#include "server/coordinator/recovery.h"

#include <atomic>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "server/coordinator/coordinator_test_fixture.h"
#include "storage/lease.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, RestartRebuildsCatalogAndRemovesIncompleteSteps) {
  Start();
  Save("job", 1, 2);
  auto b0 = Begin("job", 2, 0, 1, RankPlan(0, 1));
  BeginResult r = b0.get();
  ASSERT_TRUE(r.ok());
  Write("job", 2, 0, *r);  // written, never committed: the process "crashes"
  coordinator_.reset();
  std::filesystem::remove_all(options_.catalog_path);  // catalog lost too
  Start();
  EXPECT_EQ(LatestStep("job"), 1);
  auto store = storage::OpenShardStore(options_.storage_uri);
  ASSERT_TRUE(store.ok());
  auto incomplete = storage::ListIncompleteSteps(**store, "job");
  ASSERT_TRUE(incomplete.ok());
  EXPECT_TRUE(incomplete->empty());
}

TEST_F(CoordinatorTest, CrashAfterManifestPublishIsCommittedOnRestart) {
  UsePosix();
  Start();
  Save("job", 1, 2);
  std::vector<v1::BeginSaveResponse> plans = Save("job", 2, 2);
  auto committed = Record("job", 2);
  ASSERT_TRUE(committed.ok());
  coordinator_.reset();
  // What a SIGKILL between publishing the MANIFEST and recording the commit
  // leaves: the WRITING record PlanSession wrote and a durable MANIFEST.
  // Also a rank of another attempt that died mid-write, and that attempt's
  // object a zombie wrote after its cleanup.
  EditCatalog([&](storage::Catalog& catalog) {
    v1::CheckpointRecord writing;
    writing.set_job("job");
    writing.set_step(2);
    writing.set_state(v1::CHECKPOINT_STATE_WRITING);
    writing.set_world_size(2);
    writing.set_created_unix_micros(committed->created_unix_micros());
    writing.set_storage_uri(committed->storage_uri());
    ASSERT_TRUE(catalog.PutCheckpoint(writing).ok());
  });
  const std::string step2 = storage::StepPrefix("job", 2);
  DeadWriter(step2 + AttemptOf(plans[0]) + "/data-rank1");
  DeadWriter(step2 + "attempt-000000000bad/data-0");
  ASSERT_TRUE(Disk()
                  .Put(step2 + "attempt-000000000bad/data-1",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_EQ(TempFiles(), 2);

  Start();
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_COMMITTED)
      << v1::CheckpointState_Name(rec->state()) << " " << rec->abort_reason();
  EXPECT_EQ(rec->total_bytes(), committed->total_bytes());
  EXPECT_EQ(rec->num_tensors(), committed->num_tensors());
  EXPECT_EQ(rec->num_bytes_entries(), committed->num_bytes_entries());
  EXPECT_EQ(rec->world_size(), 2);
  EXPECT_EQ(rec->created_unix_micros(), committed->created_unix_micros());
  EXPECT_EQ(LatestStep("job"), 2);
  EXPECT_THAT(ListedSteps("job"), ::testing::ElementsAre(1, 2));
  auto keys = Disk().List(step2);
  ASSERT_TRUE(keys.ok());
  // (The whole attempt name: a random attempt id may hold "bad".)
  for (const std::string& k : *keys) {
    EXPECT_THAT(k, Not(HasSubstr("attempt-000000000bad/")));
  }
  ExpectCatalogAndStorageAgree("job");
  // Retention sees it like any other committed checkpoint.
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(1);
  auto collected = coordinator_->GarbageCollect(gc);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_THAT(collected->deleted_steps(), ::testing::ElementsAre(1));
  ExpectCatalogAndStorageAgree("job");
}

TEST_F(CoordinatorTest, RestartAbortsSavesWithoutManifestAndRemovesTheirBytes) {
  UsePosix();
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  coordinator_.reset();
  // Step 2 was in flight (written, no MANIFEST yet); step 3 had just begun:
  // its only rank died mid-write, so its directory holds only a temp file.
  ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", 2)).ok());
  DeadWriter(storage::StepPrefix("job", 3) + "attempt-000000000003/data-0");
  EditCatalog([&](storage::Catalog& catalog) {
    for (int64_t step : {2, 3}) {
      v1::CheckpointRecord writing;
      writing.set_job("job");
      writing.set_step(step);
      writing.set_state(v1::CHECKPOINT_STATE_WRITING);
      writing.set_world_size(1);
      ASSERT_TRUE(catalog.PutCheckpoint(writing).ok());
    }
  });
  Start();
  for (int64_t step : {2, 3}) {
    auto rec = Record("job", step);
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_ABORTED) << step;
    EXPECT_THAT(rec->abort_reason(), HasSubstr("restarted during the save"));
  }
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/job/0000000000000002"));
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/job/0000000000000003"));
  ExpectCatalogAndStorageAgree("job");
  EXPECT_EQ(LatestStep("job"), 1);
}

TEST_F(CoordinatorTest, RestartReconcilesRecordsAndManifestsBothWays) {
  UsePosix();
  Start();
  for (int64_t step : {1, 2, 3}) Save("job", step, 1);
  coordinator_.reset();
  // The catalog lost step 2's record (it is not empty, so no rebuild), and
  // step 3's MANIFEST is gone from storage (removed by hand).
  EditCatalog([&](storage::Catalog& catalog) {
    ASSERT_TRUE(catalog.DeleteCheckpoint("job", 2).ok());
  });
  ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", 3)).ok());
  Start();
  auto two = Record("job", 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->state(), v1::CHECKPOINT_STATE_COMMITTED);
  auto three = Record("job", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(three->abort_reason(), HasSubstr("MANIFEST was missing"));
  EXPECT_EQ(LatestStep("job"), 2);
  ExpectCatalogAndStorageAgree("job");

  // No committed record has its MANIFEST: storage not mounted, not empty.
  coordinator_.reset();
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", step)).ok());
  }
  auto refused = Coordinator::Create(options_);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                AllOf(HasSubstr("is the storage mounted"),
                                      HasSubstr(options_.catalog_path))));
}

// One cairnd per storage: a second coordinator on the storage (its own
// catalog) is refused, naming the first, before its recovery can take the
// first one's save in flight for crash debris and delete it.
TEST_F(CoordinatorTest, SecondCoordinatorOnTheStorageIsRefusedAndSparesSaves) {
  UsePosix();
  Start();
  Save("job", 1, 1);
  BeginResult begun = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(begun.ok()) << begun.status();
  const v1::CommitSaveRequest commit = Write("job", 2, 0, *begun);

  CoordinatorOptions second = options_;
  second.catalog_path = options_.catalog_path + "-second";
  auto refused = Coordinator::Create(second);
  std::filesystem::remove_all(second.catalog_path);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::string msg(refused.status().message());
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("storage ", options_.storage_uri,
                                          " is held by cairnd (pid ", getpid(),
                                          " on host ")));
  EXPECT_THAT(msg, HasSubstr("catalog " + options_.catalog_path));
  EXPECT_THAT(msg, HasSubstr("expires "));

  CommitResult committed = Commit(commit).get();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  ExpectCatalogAndStorageAgree("job");
}

// A coordinator whose lease was taken over (a higher generation: another
// cairnd holds the storage now) commits, saves and deletes nothing more,
// and says so; cairnd is told (and stops, main.cc).
TEST_F(CoordinatorTest, CoordinatorThatLostTheStorageLeaseChangesNothing) {
  UsePosix();
  std::atomic<int> lost{0};
  options_.storage_lease_ttl = absl::Seconds(3);
  options_.on_storage_lease_lost = [&](const absl::Status&) { ++lost; };
  Start();
  Save("job", 1, 1);
  BeginResult begun = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(begun.ok()) << begun.status();
  const v1::CommitSaveRequest commit = Write("job", 2, 0, *begun);

  storage::LeaseRecord other = coordinator_->storage_lease().record();
  other.generation += 1;
  other.holder_id = "other";
  other.host = "other-host";
  other.address = "10.0.0.9:7070";
  other.renewed_unix_micros = absl::ToUnixMicros(absl::Now());
  const std::string body = other.Serialize();
  ASSERT_TRUE(
      Disk()
          .Put(storage::LeaseKey(other.generation), absl::MakeConstSpan(body))
          .ok());
  coordinator_->storage_lease().RenewNowForTest();

  CommitResult refused = Commit(commit).get();
  EXPECT_THAT(
      refused,
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          AllOf(HasSubstr("job 'job' step 2: refused: the lease on storage"),
                HasSubstr("taken over by cairnd (pid"),
                HasSubstr("other-host, serving 10.0.0.9:7070"))));
  EXPECT_FALSE(Disk().Size(storage::ManifestKey("job", 2)).ok());
  BeginResult again = Begin("job", 3, 0, 1, RankPlan(0, 1)).get();
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("job 'job' step 3: refused")));
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(1);
  EXPECT_THAT(coordinator_->DeleteCheckpoint(del),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(Disk().Size(storage::ManifestKey("job", 1)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (lost.load() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(lost.load(), 1);
  // Its lease is not marked released on the way out: it is the other's.
  coordinator_.reset();
  auto lease = storage::ReadLease(Disk());
  ASSERT_TRUE(lease.ok() && lease->has_value()) << lease.status();
  EXPECT_EQ((*lease)->holder_id, "other");
  EXPECT_FALSE((*lease)->released);
}

// The first save of a job killed mid-write leaves nothing but temp files:
// no object is visible, so the job itself is not listed. Recovery must still
// find and remove them (a crash test found 64 MiB files kept forever).
TEST_F(CoordinatorTest, RestartRemovesTempFilesOfAJobWithNothingElse) {
  UsePosix();
  Start();
  DeadWriter(storage::StepPrefix("fresh", 1) + "attempt-000000000001/data-0");
  ASSERT_EQ(TempFiles(), 1);
  Restart();
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/fresh"));
  ExpectCatalogAndStorageAgree("fresh");
}

// ---------------------------------------------------------------------------
// Recover() alone, on a memory store and a real catalog: every case of the
// reconciliation table in recovery.h.

class RecoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    catalog_dir_ = testing::MakeTempDir("recover-" + name);
    store_ = storage::OpenMemoryShardStore("recover-" + name).value();
    catalog_ = storage::Catalog::Open(catalog_dir_).value();
  }
  void TearDown() override {
    catalog_.reset();
    std::filesystem::remove_all(catalog_dir_);
  }
  // A checkpoint of `step` on storage (MANIFEST published when `publish`).
  v1::Manifest Checkpoint(int64_t step, bool publish = true) {
    storage::TestCheckpointSpec spec;
    spec.step = step;
    auto m = publish ? storage::WriteTestCheckpoint(*store_, spec)
                     : storage::WriteTestCheckpointData(*store_, spec);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : v1::Manifest();
  }
  void Put(int64_t step, v1::CheckpointState state,
           int64_t created_micros = 0) {
    v1::CheckpointRecord r;
    r.set_job("job");
    r.set_step(step);
    r.set_state(state);
    r.set_world_size(2);
    r.set_created_unix_micros(created_micros);
    ASSERT_TRUE(catalog_->PutCheckpoint(r).ok());
  }
  absl::StatusOr<v1::CheckpointRecord> Get(int64_t step) {
    return catalog_->GetCheckpoint("job", step);
  }
  absl::Status Run(bool clean = true) {
    return Recover(*store_, *catalog_, RecoveryOptions{catalog_dir_, clean});
  }
  bool StepOnStorage(int64_t step) {
    auto keys = store_->List(storage::StepPrefix("job", step));
    return keys.ok() && !keys->empty();
  }

  std::string catalog_dir_;
  std::unique_ptr<storage::ShardStore> store_;
  std::unique_ptr<storage::Catalog> catalog_;
};

TEST_F(RecoverTest, ReconcilesEveryRecordStateWithStorage) {
  Checkpoint(1);
  Put(1, v1::CHECKPOINT_STATE_COMMITTED);  // kept as is
  Checkpoint(2);
  Put(2, v1::CHECKPOINT_STATE_WRITING, 1234);  // MANIFEST durable: COMMITTED
  Checkpoint(3, /*publish=*/false);
  Put(3, v1::CHECKPOINT_STATE_WRITING);    // no MANIFEST: ABORTED, removed
  Put(4, v1::CHECKPOINT_STATE_COMMITTED);  // MANIFEST gone: ABORTED
  Checkpoint(5);
  Put(5, v1::CHECKPOINT_STATE_DELETING);  // the deletion is finished
  Checkpoint(6);                          // no record: COMMITTED
  Checkpoint(7);
  ASSERT_TRUE(store_
                  ->Put(storage::ManifestKey("job", 7),
                        absl::MakeConstSpan("garbage", 7))
                  .ok());
  Put(7, v1::CHECKPOINT_STATE_ABORTED);  // damaged MANIFEST: step deleted
  Checkpoint(8, /*publish=*/false);      // no record, no MANIFEST: removed
  ASSERT_TRUE(Run().ok());

  auto expect = [&](int64_t step, v1::CheckpointState state,
                    const std::string& reason) {
    SCOPED_TRACE(step);
    auto r = Get(step);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), state) << v1::CheckpointState_Name(r->state());
    EXPECT_THAT(r->abort_reason(), HasSubstr(reason));
  };
  expect(1, v1::CHECKPOINT_STATE_COMMITTED, "");
  expect(2, v1::CHECKPOINT_STATE_COMMITTED, "");
  EXPECT_EQ(Get(2)->created_unix_micros(), 1234);
  EXPECT_GT(Get(2)->total_bytes(), 0u);
  expect(3, v1::CHECKPOINT_STATE_ABORTED, "cairnd restarted during the save");
  expect(4, v1::CHECKPOINT_STATE_ABORTED, "its MANIFEST was missing from");
  EXPECT_THAT(Get(5), StatusIs(absl::StatusCode::kNotFound));
  expect(6, v1::CHECKPOINT_STATE_COMMITTED, "");
  expect(7, v1::CHECKPOINT_STATE_ABORTED, "its MANIFEST was damaged");
  EXPECT_THAT(Get(8), StatusIs(absl::StatusCode::kNotFound));
  for (int64_t step : {3, 5, 7, 8}) EXPECT_FALSE(StepOnStorage(step)) << step;
  for (int64_t step : {1, 2, 6}) EXPECT_TRUE(StepOnStorage(step)) << step;
  auto committed = storage::ListCommittedSteps(*store_, "job");
  ASSERT_TRUE(committed.ok());
  EXPECT_THAT(*committed, ::testing::ElementsAre(1, 2, 6));
}

TEST_F(RecoverTest, RefusesToStartWhenNoCommittedRecordHasItsManifest) {
  Put(1, v1::CHECKPOINT_STATE_COMMITTED);
  Put(2, v1::CHECKPOINT_STATE_COMMITTED);
  absl::Status s = Run();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kFailedPrecondition,
                  AllOf(HasSubstr("lists 2 committed"), HasSubstr(catalog_dir_),
                        HasSubstr(store_->uri()))));
  // Nothing was changed.
  EXPECT_EQ(Get(1)->state(), v1::CHECKPOINT_STATE_COMMITTED);
}

TEST_F(RecoverTest, EmptyCatalogIsRebuiltAndNoCleaningWhenDisabled) {
  Checkpoint(1);
  Checkpoint(2, /*publish=*/false);
  ASSERT_TRUE(Run(/*clean=*/false).ok());
  ASSERT_TRUE(Get(1).ok());
  EXPECT_EQ(Get(1)->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_TRUE(StepOnStorage(2));  // incomplete, but cleaning is off
  Put(3, v1::CHECKPOINT_STATE_WRITING);
  ASSERT_TRUE(Run(/*clean=*/false).ok());
  EXPECT_EQ(Get(3)->state(), v1::CHECKPOINT_STATE_WRITING);
  ASSERT_TRUE(Run().ok());
  EXPECT_FALSE(StepOnStorage(2));
  EXPECT_EQ(Get(3)->state(), v1::CHECKPOINT_STATE_ABORTED);
}

}  // namespace
}  // namespace cairn::coordinator
