// The coordinator facade in-process (no gRPC): a whole save by several
// ranks, shutdown, and many ranks of two jobs at once.
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

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
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
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

}  // namespace
}  // namespace cairn::coordinator
