// The retention and deletion pieces alone (retention.h): which steps
// retention deletes, checked against a brute-force oracle on random
// catalogs, and the crash-safe order of one deletion on a fault-injecting
// store with a real catalog.
#include "server/coordinator/retention.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_layout.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/fault_injection_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::CheckpointRecord Rec(int64_t step, v1::CheckpointState state) {
  v1::CheckpointRecord r;
  r.set_job("job");
  r.set_step(step);
  r.set_state(state);
  r.set_total_bytes(static_cast<uint64_t>(step) * 10);
  return r;
}

std::vector<int64_t> Steps(const std::vector<v1::CheckpointRecord>& records) {
  std::vector<int64_t> steps;
  for (const auto& r : records) steps.push_back(r.step());
  return steps;
}

TEST(RetentionVictimsTest, KeepsTheNewestCommittedAndIgnoresOtherStates) {
  const std::vector<v1::CheckpointRecord> records = {
      Rec(1, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(2, v1::CHECKPOINT_STATE_ABORTED),
      Rec(3, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(5, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(9, v1::CHECKPOINT_STATE_WRITING),
      Rec(0, v1::CHECKPOINT_STATE_DELETING)};
  EXPECT_THAT(Steps(RetentionVictims(records, 2)), ElementsAre(1));
  EXPECT_THAT(Steps(RetentionVictims(records, 1)), ElementsAre(3, 1));
  EXPECT_THAT(Steps(RetentionVictims(records, 0)), ElementsAre(5, 3, 1));
  EXPECT_THAT(Steps(RetentionVictims(records, 3)), ElementsAre());
  EXPECT_THAT(Steps(RetentionVictims(records, -1)), ElementsAre());
  EXPECT_THAT(Steps(RetentionVictims({}, 1)), ElementsAre());
}

// Oracle: a record is deleted iff it is COMMITTED and at least keep_last
// committed records have a higher step; the answer is newest first.
TEST(RetentionVictimsTest, MatchesABruteForceOracleOnRandomCatalogs) {
  std::mt19937_64 rng(12);
  const v1::CheckpointState kStates[] = {
      v1::CHECKPOINT_STATE_COMMITTED, v1::CHECKPOINT_STATE_COMMITTED,
      v1::CHECKPOINT_STATE_WRITING, v1::CHECKPOINT_STATE_ABORTED,
      v1::CHECKPOINT_STATE_DELETING};
  for (int trial = 0; trial < 5000; ++trial) {
    SCOPED_TRACE(trial);
    std::set<int64_t> used;
    std::vector<v1::CheckpointRecord> records;
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const int64_t step = static_cast<int64_t>(rng() % 40);
      if (!used.insert(step).second) continue;
      records.push_back(Rec(step, kStates[rng() % 5]));
    }
    std::shuffle(records.begin(), records.end(), rng);
    const int keep_last = static_cast<int>(rng() % 14) - 1;

    std::vector<int64_t> want;
    for (const auto& r : records) {
      if (r.state() != v1::CHECKPOINT_STATE_COMMITTED || keep_last < 0) {
        continue;
      }
      int newer = 0;
      for (const auto& o : records) {
        newer +=
            o.state() == v1::CHECKPOINT_STATE_COMMITTED && o.step() > r.step();
      }
      if (newer >= keep_last) want.push_back(r.step());
    }
    std::sort(want.rbegin(), want.rend());
    const std::vector<v1::CheckpointRecord> got =
        RetentionVictims(records, keep_last);
    ASSERT_EQ(Steps(got), want) << "keep_last " << keep_last;
    for (const auto& r : got) {
      EXPECT_EQ(r.total_bytes(), static_cast<uint64_t>(r.step()) * 10);
    }
  }
}

class DeleteInOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const char* tmp = std::getenv("TEST_TMPDIR");
    catalog_dir_ = absl::StrCat(tmp ? tmp : "/tmp", "/cairn-retention-", name,
                                "-", getpid());
    std::filesystem::remove_all(catalog_dir_);
    store_ = std::make_unique<storage::FaultInjectionStore>(
        storage::OpenMemoryShardStore("retention-" + name).value());
    catalog_ = storage::Catalog::Open(catalog_dir_).value();
    storage::TestCheckpointSpec spec;
    spec.step = 4;
    manifest_ = storage::WriteTestCheckpoint(*store_, spec).value();
    record_ = storage::RecordFromManifest(manifest_, store_->uri());
    ASSERT_TRUE(catalog_->PutCheckpoint(record_).ok());
  }
  void TearDown() override {
    catalog_.reset();
    std::filesystem::remove_all(catalog_dir_);
  }

  std::string catalog_dir_;
  std::unique_ptr<storage::FaultInjectionStore> store_;
  std::unique_ptr<storage::Catalog> catalog_;
  v1::Manifest manifest_;
  v1::CheckpointRecord record_;
};

TEST_F(DeleteInOrderTest, MarksTheRecordBeforeTouchingStorageAndRemovesItLast) {
  int forgot = 0;
  const int64_t mutations = store_->mutation_count();
  absl::Status s = DeleteCheckpointInOrder(*store_, *catalog_, record_, [&] {
    ++forgot;
    // The record says DELETING before any storage mutation.
    auto rec = catalog_->GetCheckpoint("job", 4);
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_DELETING);
    EXPECT_EQ(store_->mutation_count(), mutations);
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(forgot, 1);
  EXPECT_EQ(catalog_->GetCheckpoint("job", 4).status().code(),
            absl::StatusCode::kNotFound);
  auto left = store_->List(storage::StepPrefix("job", 4));
  ASSERT_TRUE(left.ok());
  EXPECT_THAT(*left, ElementsAre());
}

TEST_F(DeleteInOrderTest, AFailureLeavesADeletingRecordWithoutManifest) {
  storage::FaultRule rule;
  rule.ops = storage::kFaultDelete;
  rule.key_contains = storage::StepPrefix("job", 4);
  rule.skip = 1;  // the MANIFEST goes; the data does not
  rule.count = -1;
  rule.status = absl::UnavailableError("disk went away");
  const int id = store_->AddRule(rule);
  absl::Status s = DeleteCheckpointInOrder(*store_, *catalog_, record_, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk went away"));
  EXPECT_GT(store_->fired(id), 0);
  // Not loadable any more (MANIFEST first), not listed (DELETING).
  EXPECT_EQ(storage::ReadManifest(*store_, "job", 4).status().code(),
            absl::StatusCode::kNotFound);
  auto rec = catalog_->GetCheckpoint("job", 4);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_DELETING);
  auto listed = catalog_->ListCheckpoints("job", false);
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(*listed, ElementsAre());
  // Finishing the DELETING record (what recovery does) completes it.
  store_->Reset();
  ASSERT_TRUE(DeleteCheckpointInOrder(*store_, *catalog_, *rec, {}).ok());
  EXPECT_EQ(catalog_->GetCheckpoint("job", 4).status().code(),
            absl::StatusCode::kNotFound);
  auto incomplete = storage::ListIncompleteSteps(*store_, "job");
  ASSERT_TRUE(incomplete.ok());
  EXPECT_THAT(*incomplete, ElementsAre());
}

TEST_F(DeleteInOrderTest, SweepRemovesOtherAttemptsAndKeepsTheCheckpoint) {
  const std::string prefix = storage::StepPrefix("job", 4);
  ASSERT_TRUE(store_
                  ->Put(prefix + "attempt-00000000dead/data-0",
                        absl::MakeConstSpan("zombie", 6))
                  .ok());
  SweepCommittedStep(*store_, manifest_);
  auto keys = store_->List(prefix);
  ASSERT_TRUE(keys.ok());
  for (const std::string& k : *keys) {
    EXPECT_THAT(k, ::testing::Not(HasSubstr("dead")));
  }
  EXPECT_TRUE(storage::VerifyCheckpoint(*store_, manifest_).ok());
}

}  // namespace
}  // namespace cairn::coordinator
