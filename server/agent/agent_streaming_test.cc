// Saves larger than an agent's whole staging budget, streamed through it
// (StreamingSave, Persister) by real ranks: bit-exact through a budget a
// fraction of the save, several ranks through one shared budget, and a rank
// stopping mid-stream aborts the save with the previous checkpoint still
// latest.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/agent/agent_checkpointer.h"
#include "client/examples/synthetic_model.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/testing/agent_cluster.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using AgentStreamingTest = ::cairn::agent::testing::AgentCluster;

TEST_F(AgentStreamingTest, SaveLargerThanBudgetStreamsThroughBucketsBitExact) {
  // ~730 KB on one rank through a 160 KiB budget (80 KiB buckets).
  const uint64_t budget = 160 << 10;
  StartAgent(0, 1, 0, budget);
  auto spec = examples::ModelSpec("small");
  auto lay = examples::ParseLayout("1:R");
  auto model = examples::ShardedModel::Create(*spec, *lay, 0, true, 5);
  ASSERT_TRUE(model.ok());
  uint64_t model_bytes = 0;
  const planner::LocalSavePlan local = (*model)->state().ToLocalPlan(0).value();
  for (const auto& item : local.items) {
    model_bytes += item.length;
  }
  ASSERT_GT(model_bytes, 4 * budget);
  auto ckpt = Rank(0, "j7", 0, 1);
  auto f = ckpt->AsyncSave(5, (*model)->state());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(ckpt->last_save_stats().bytes, model_bytes);
  EXPECT_GE(ckpt->last_save_stats().streamed_buckets,
            static_cast<int64_t>(model_bytes / (budget / 2)));
  model->reset();  // the agent owns nothing of it: every byte is on storage
  auto rec = f->Wait(absl::Seconds(30));
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state, client::CheckpointState::kCommitted);
  v1::AgentStatusResponse st = agents_[0]->agent().Status();
  EXPECT_EQ(st.streamed_saves(), 1);
  EXPECT_EQ(st.streamed_buckets(), ckpt->last_save_stats().streamed_buckets);
  EXPECT_GT(st.peak_used_bytes(), 0u);
  EXPECT_LE(st.peak_used_bytes(), budget);  // never more staged than budget
  EXPECT_EQ(st.tier0_sets(), 0);            // a streamed save keeps nothing
  // Bit-exact from storage, as saved and resharded into 2 ranks.
  std::vector<Loaded> loaded = LoadAll("j7", 1, 1, "1:R", 5);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].source, client::LoadSource::kStorage);
  EXPECT_EQ(LoadAll("j7", 2, 2, "2:S0", 5).size(), 2u);
}

TEST_F(AgentStreamingTest, ConcurrentRanksStreamThroughOneSharedBudget) {
  // Two ranks of one node (~370 KB each) share a 256 KiB budget: their
  // buckets compete for space, and BeginSave is collective across them.
  const uint64_t budget = 256 << 10;
  StartAgent(0, 1, 0, budget);
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(2);
  std::vector<int64_t> buckets(2, 0);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto spec = examples::ModelSpec("small");
      auto lay = examples::ParseLayout("2:S0");
      auto model = examples::ShardedModel::Create(*spec, *lay, r, true, 2);
      auto ckpt = Rank(0, "j8", r, 2);
      if (!model.ok() || ckpt == nullptr) {
        status[r] = absl::InternalError("setup");
        return;
      }
      auto f = ckpt->AsyncSave(2, (*model)->state());
      if (!f.ok()) {
        status[r] = f.status();
        return;
      }
      buckets[r] = ckpt->last_save_stats().streamed_buckets;
      status[r] = f->Wait(absl::Seconds(30)).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_GE(buckets[r], 2) << "rank " << r;
  }
  v1::AgentStatusResponse st = agents_[0]->agent().Status();
  EXPECT_EQ(st.streamed_saves(), 2);
  EXPECT_LE(st.peak_used_bytes(), budget);
  EXPECT_EQ(LoadAll("j8", 2, 2, "2:S0", 2).size(), 2u);
}

TEST_F(AgentStreamingTest, RankStoppingMidStreamAbortsAndPreviousStaysLatest) {
  const uint64_t budget = 256 << 10;
  StartAgent(0, 1, 0, budget);
  SaveAll("j9", 1, 1, "1:R", 1);  // streamed, committed
  Agent& a = agents_[0]->agent();
  // Step 2: the "rank" fills one bucket, hands it back, then goes silent.
  auto spec = examples::ModelSpec("small");
  auto lay = examples::ParseLayout("1:R");
  auto model = examples::ShardedModel::Create(*spec, *lay, 0, true, 2);
  ASSERT_TRUE(model.ok());
  v1::BeginStageRequest b;
  b.set_job("j9");
  b.set_step(2);
  b.set_rank(0);
  b.set_world_size(1);
  b.set_allow_streaming(true);
  {
    v1::LocalSavePlan proto;
    convert::LocalPlanToProto((*model)->state().ToLocalPlan(0).value(), &proto);
    for (const v1::WriteItem& w : proto.items()) {
      *b.add_items()->mutable_item() = w;
    }
  }
  auto staged = a.BeginStage(b);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_TRUE(staged->streaming());
  EXPECT_EQ(staged->bucket_bytes(), budget / 2);
  v1::StageBucketRequest sb;
  sb.set_save_id(staged->save_id());
  auto first = a.StageBucket(sb);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->end_of_stream());
  ASSERT_GT(first->pieces_size(), 0);
  // FinishStage before the stream is complete is refused.
  v1::FinishStageRequest fin;
  fin.set_save_id(staged->save_id());
  absl::Status early = a.FinishStage(fin);
  EXPECT_THAT(early, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("not fully staged")));
  sb.set_filled_bucket(first->bucket());
  auto second = a.StageBucket(sb);
  ASSERT_TRUE(second.ok()) << second.status();
  // ... silence: the agent aborts after stream_idle_timeout (2 s).
  v1::WaitSaveRequest wr;
  wr.set_job("j9");
  wr.set_step(2);
  wr.set_rank(0);
  wr.set_timeout_ms(20000);
  absl::StatusOr<v1::CheckpointRecord> r = a.WaitSave(wr);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kAborted,
                          AllOf(HasSubstr("no streaming call"),
                                HasSubstr("job 'j9' step 2"))));
  // The late rank is told, and its bucket is not reused.
  sb.set_filled_bucket(second->bucket());
  EXPECT_THAT(a.StageBucket(sb), StatusIs(absl::StatusCode::kAborted));
  std::vector<Loaded> loaded = LoadAll("j9", 1, 1, "1:R", 1);
  ASSERT_EQ(loaded.size(), 1u);
  // The agent still streams the next save, within the budget.
  SaveAll("j9", 1, 1, "1:R", 3);
  EXPECT_LE(a.Status().peak_used_bytes(), budget);
  EXPECT_EQ(a.Status().streamed_saves(), 2);
}
}  // namespace
}  // namespace cairn::agent
