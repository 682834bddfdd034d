// The deletion pieces alone (retention.h): the crash-safe order of one
// deletion on a fault-injecting store with a real catalog. (Which steps
// retention deletes is storage/checkpoint_record_test.cc's.)
#include "server/coordinator/retention.h"

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_layout.h"
#include "storage/checkpoint_record.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/fault_injection_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DeleteInOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    catalog_dir_ = testing::MakeTempDir("retention-" + name);
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
  EXPECT_THAT(catalog_->GetCheckpoint("job", 4),
              StatusIs(absl::StatusCode::kNotFound));
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
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk went away")));
  EXPECT_GT(store_->fired(id), 0);
  // Not loadable any more (MANIFEST first), not listed (DELETING).
  EXPECT_THAT(storage::ReadManifest(*store_, "job", 4),
              StatusIs(absl::StatusCode::kNotFound));
  auto rec = catalog_->GetCheckpoint("job", 4);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_DELETING);
  auto listed = catalog_->ListCheckpoints("job", false);
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(*listed, ElementsAre());
  // Finishing the DELETING record (what recovery does) completes it.
  store_->Reset();
  ASSERT_TRUE(DeleteCheckpointInOrder(*store_, *catalog_, *rec, {}).ok());
  EXPECT_THAT(catalog_->GetCheckpoint("job", 4),
              StatusIs(absl::StatusCode::kNotFound));
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
