#include "storage/catalog/catalog.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_layout.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::storage {
namespace {

namespace fs = std::filesystem;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("catalog");
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/db";
    auto catalog = Catalog::Open(path_);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = std::move(catalog).value();
  }
  void TearDown() override {
    catalog_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Reopen() {
    catalog_.reset();
    auto catalog = Catalog::Open(path_);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = std::move(catalog).value();
  }

  static v1::CheckpointRecord Record(const std::string& job, int64_t step,
                                     v1::CheckpointState state) {
    v1::CheckpointRecord r;
    r.set_job(job);
    r.set_step(step);
    r.set_state(state);
    r.set_world_size(4);
    r.set_total_bytes(1000 + step);
    return r;
  }

  static std::vector<int64_t> Steps(
      const std::vector<v1::CheckpointRecord>& records) {
    std::vector<int64_t> out;
    for (const auto& r : records) out.push_back(r.step());
    return out;
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogTest, PutGetListLatestDelete) {
  EXPECT_TRUE(catalog_->empty());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a", 5, v1::CHECKPOINT_STATE_COMMITTED))
          .ok());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a", 10, v1::CHECKPOINT_STATE_COMMITTED))
          .ok());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a", 12, v1::CHECKPOINT_STATE_WRITING))
          .ok());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a", 9, v1::CHECKPOINT_STATE_ABORTED))
          .ok());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a-b", 1, v1::CHECKPOINT_STATE_COMMITTED))
          .ok());
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a.c", 2, v1::CHECKPOINT_STATE_COMMITTED))
          .ok());
  EXPECT_FALSE(catalog_->empty());

  EXPECT_EQ(catalog_->GetCheckpoint("a", 10)->total_bytes(), 1010u);
  EXPECT_THAT(
      catalog_->GetCheckpoint("a", 11),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("job 'a' step 11")));
  EXPECT_THAT(Steps(catalog_->ListCheckpoints("a", false).value()),
              ElementsAre(5, 10));
  EXPECT_THAT(Steps(catalog_->ListCheckpoints("a", true).value()),
              ElementsAre(5, 9, 10, 12));
  // "" = every job, ordered by job name then step ("a" < "a-b" < "a.c").
  std::vector<std::string> order;
  const std::vector<v1::CheckpointRecord> all =
      catalog_->ListCheckpoints("", true).value();
  for (const auto& r : all) {
    order.push_back(absl::StrCat(r.job(), ":", r.step()));
  }
  EXPECT_THAT(order,
              ElementsAre("a:5", "a:9", "a:10", "a:12", "a-b:1", "a.c:2"));
  // The newest committed, skipping the WRITING step 12.
  EXPECT_EQ(catalog_->LatestCommitted("a")->step(), 10);
  EXPECT_EQ(catalog_->LatestCommitted("a-b")->step(), 1);
  EXPECT_THAT(catalog_->LatestCommitted("zzz"),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(catalog_->ListJobs().value(), ElementsAre("a", "a-b", "a.c"));

  // Replace: step 12 commits.
  ASSERT_TRUE(
      catalog_->PutCheckpoint(Record("a", 12, v1::CHECKPOINT_STATE_COMMITTED))
          .ok());
  EXPECT_EQ(catalog_->LatestCommitted("a")->step(), 12);
  ASSERT_TRUE(catalog_->DeleteCheckpoint("a", 12).ok());
  EXPECT_THAT(catalog_->DeleteCheckpoint("a", 12),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(catalog_->LatestCommitted("a")->step(), 10);

  // Durable across reopen.
  Reopen();
  EXPECT_THAT(Steps(catalog_->ListCheckpoints("a", true).value()),
              ElementsAre(5, 9, 10));
}

TEST_F(CatalogTest, RejectsBadInput) {
  EXPECT_THAT(catalog_->PutCheckpoint(
                  Record("bad/job", 1, v1::CHECKPOINT_STATE_COMMITTED)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      catalog_->PutCheckpoint(Record("a", -3, v1::CHECKPOINT_STATE_COMMITTED)),
      StatusIs(absl::StatusCode::kInvalidArgument));
  const absl::Status s =
      catalog_->PutCheckpoint(Record("a", 1, v1::CHECKPOINT_STATE_UNSPECIFIED));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("job 'a' step 1")));
  EXPECT_TRUE(catalog_->empty());
  EXPECT_THAT(catalog_->ListCheckpoints("../x", true),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CatalogTest, PlanCacheEntries) {
  const std::string key("fp\0with/bytes", 13);
  const std::string value("\x00\x01plan", 6);
  EXPECT_THAT(catalog_->GetPlanCacheEntry("a", key),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_TRUE(catalog_->PutPlanCacheEntry("a", key, value).ok());
  ASSERT_TRUE(catalog_->PutPlanCacheEntry("a-b", key, "other").ok());
  EXPECT_EQ(catalog_->GetPlanCacheEntry("a", key).value(), value);
  EXPECT_EQ(catalog_->GetPlanCacheEntry("a-b", key).value(), "other");
  // Plan entries do not make the catalog non-empty.
  EXPECT_TRUE(catalog_->empty());
  Reopen();
  EXPECT_EQ(catalog_->GetPlanCacheEntry("a", key).value(), value);
  ASSERT_TRUE(catalog_->DeletePlanCacheEntries("a").ok());
  EXPECT_THAT(catalog_->GetPlanCacheEntry("a", key),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(catalog_->GetPlanCacheEntry("a-b", key).value(), "other");
}

TEST_F(CatalogTest, AgentRecordsSurviveReopenAndDelete) {
  auto agent = [](const std::string& name, int id, const std::string& addr) {
    v1::AgentRecord r;
    r.set_node_name(name);
    r.set_node_id(id);
    r.set_peer_address(addr);
    return r;
  };
  ASSERT_TRUE(catalog_->PutAgent(agent("node-b", 1, "10.0.0.2:7071")).ok());
  ASSERT_TRUE(catalog_->PutAgent(agent("node-a", 0, "10.0.0.1:7071")).ok());
  ASSERT_TRUE(catalog_->PutAgent(agent("node-b", 1, "10.0.0.9:7071")).ok());
  // Agents do not make the catalog non-empty (it is still rebuilt).
  EXPECT_TRUE(catalog_->empty());
  Reopen();
  auto agents = catalog_->ListAgents();
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_EQ(agents->size(), 2u);
  EXPECT_EQ((*agents)[0].node_name(), "node-a");
  EXPECT_EQ((*agents)[1].node_name(), "node-b");
  EXPECT_EQ((*agents)[1].node_id(), 1);
  EXPECT_EQ((*agents)[1].peer_address(), "10.0.0.9:7071");
  EXPECT_THAT(catalog_->PutAgent(agent("", 2, "")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(catalog_->PutAgent(agent("x", -1, "")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_TRUE(catalog_->DeleteAgent("node-a").ok());
  absl::Status again = catalog_->DeleteAgent("node-a");
  EXPECT_THAT(again,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("node-a")));
  EXPECT_EQ(catalog_->ListAgents()->size(), 1u);
}

TEST_F(CatalogTest, RebuildFromStoreFindsEveryCommittedCheckpoint) {
  auto store = OpenShardStore("mem://").value();
  TestCheckpointSpec spec;
  for (const char* job : {"llama", "gpt"}) {
    spec.job = job;
    for (int64_t step : {100, 200}) {
      spec.step = step;
      ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
    }
  }
  spec.job = "llama";
  spec.step = 300;  // incomplete: not recorded
  ASSERT_TRUE(WriteTestCheckpointData(*store, spec).ok());
  spec.step = 250;  // corrupt manifest: skipped, the rest still found
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  ASSERT_TRUE(
      store
          ->Put(ManifestKey("llama", 250), absl::Span<const char>("garbage", 7))
          .ok());

  ASSERT_TRUE(catalog_->empty());
  auto n = catalog_->RebuildFromStore(*store);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4);
  EXPECT_THAT(catalog_->ListJobs().value(), ElementsAre("gpt", "llama"));
  EXPECT_THAT(Steps(catalog_->ListCheckpoints("llama", true).value()),
              ElementsAre(100, 200));
  auto latest = catalog_->LatestCommitted("llama");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step(), 200);
  EXPECT_EQ(latest->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(latest->storage_uri(), store->uri());
  EXPECT_EQ(latest->world_size(), 2);
  EXPECT_EQ(latest->num_tensors(), 3);
  EXPECT_EQ(latest->num_bytes_entries(), 1);
  EXPECT_EQ(latest->total_bytes(),
            ReadManifest(*store, "llama", 200)->total_bytes());
  // Idempotent.
  EXPECT_EQ(catalog_->RebuildFromStore(*store).value(), 4);
  EXPECT_EQ(catalog_->ListCheckpoints("", true)->size(), 4u);
}

TEST_F(CatalogTest, ConcurrentWritersAndReaders) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string job = absl::StrCat("job", t);
      for (int64_t step = 0; step < 50; ++step) {
        ASSERT_TRUE(catalog_
                        ->PutCheckpoint(
                            Record(job, step, v1::CHECKPOINT_STATE_COMMITTED))
                        .ok());
        ASSERT_EQ(catalog_->LatestCommitted(job)->step(), step);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(catalog_->ListCheckpoints("", false)->size(), 200u);
}

TEST_F(CatalogTest, SecondOpenOfTheSameDatabaseFails) {
  // RocksDB's LOCK: a second cairnd on the same catalog is refused, saying
  // why.
  auto second = Catalog::Open(path_);
  EXPECT_THAT(second,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path_),
                             HasSubstr("is in use by another process"))));
}

// DecodeCheckpointRecord is what every read of a record goes through
// (fuzz/catalog_record_fuzzer.cc fuzzes it).
v1::CheckpointRecord TestRecord(const std::string& job, int64_t step) {
  v1::CheckpointRecord r;
  r.set_job(job);
  r.set_step(step);
  r.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  r.set_total_bytes(77);
  return r;
}

TEST(CatalogRecordTest, DecodesTheRecordStoredUnderItsKey) {
  const std::string key = CheckpointRecordKey("job-1", 42);
  EXPECT_EQ(key, std::string("ckpt/job-1\0"
                             "0000000000000042",
                             27));
  auto r =
      DecodeCheckpointRecord(key, TestRecord("job-1", 42).SerializeAsString());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->total_bytes(), 77u);
}

TEST(CatalogRecordTest, RecordOfAnotherJobOrStepIsDataLoss) {
  // A record that parses but is not the one its key names must never be
  // served as that checkpoint (ls / latest / load would show another step).
  for (const auto& [job, step] :
       {std::pair<std::string, int64_t>{"job-2", 42}, {"job-1", 41}}) {
    auto r = DecodeCheckpointRecord(CheckpointRecordKey("job-1", 42),
                                    TestRecord(job, step).SerializeAsString());
    EXPECT_THAT(
        r,
        StatusIs(absl::StatusCode::kDataLoss,
                 HasSubstr(absl::StrCat("catalog: record 'ckpt/job-1\\0"
                                        "0000000000000042' holds the record of "
                                        "job '",
                                        job, "' step ", step))));
  }
}

TEST(CatalogRecordTest, MalformedKeyOrValueIsDataLoss) {
  const std::string value = TestRecord("j", 3).SerializeAsString();
  for (const std::string& key : {std::string("ckpt/j"),
                                 std::string("plan/j\0"
                                             "0000000000000003",
                                             23),
                                 std::string("ckpt/j\0"
                                             "000000000000003",
                                             22),
                                 std::string("ckpt/j\0"
                                             "00000000000000-3",
                                             23),
                                 std::string("ckpt/j\0"
                                             "9999999999999999",
                                             23),
                                 std::string("ckpt/\0"
                                             "0000000000000003",
                                             22),
                                 std::string("ckpt/j/k\0"
                                             "0000000000000003",
                                             25)}) {
    auto r = DecodeCheckpointRecord(key, value);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kDataLoss,
                            HasSubstr("is not a checkpoint key")))
        << absl::CHexEscape(key);
  }
  auto r = DecodeCheckpointRecord(CheckpointRecordKey("j", 3), "\xff\xff");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDataLoss,
                          HasSubstr("catalog: record 'ckpt/j\\0"
                                    "0000000000000003' does "
                                    "not parse")));
}

}  // namespace
}  // namespace cairn::storage
