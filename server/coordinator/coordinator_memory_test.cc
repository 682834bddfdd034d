// Multi-tier saves through the coordinator: memory checkpoints commit with
// their holders and nothing on storage, `latest` is the newest restorable,
// copies lost and a restart of cairnd, policies and their retention.
#include <algorithm>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_test_fixture.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::IsOk;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class CoordinatorMemoryTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    options_.holdings_lease = absl::Milliseconds(300);
    UsePosix();
    Start();
  }

  // Node `node` reports holding `held` (job "job", (step, rank) pairs).
  v1::ReportHoldingsResponse ReportOf(
      int node, const std::vector<std::pair<int64_t, int>>& held,
      uint64_t incarnation = 1, uint64_t budget = uint64_t{1} << 30) {
    v1::ReportHoldingsRequest r;
    r.set_node_id(node);
    r.set_num_nodes(4);
    r.set_incarnation(incarnation + node * 1000);
    r.set_budget_bytes(budget);
    for (const auto& [step, rank] : held) {
      v1::HeldShards* h = r.add_held();
      h->set_job("job");
      h->set_step(step);
      h->set_rank(rank);
      h->set_memory_tier(true);
    }
    absl::StatusOr<v1::ReportHoldingsResponse> resp =
        coordinator_->ReportHoldings(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::ReportHoldingsResponse();
  }

  // A save by `world` agent-mode ranks asking for `tier`; each rank commits
  // with holders(rank) (for a memory save, nothing is written). Returns the
  // first error, else the tier cairnd chose.
  absl::StatusOr<v1::Tier> AgentSave(
      int64_t step, int world, v1::Tier tier, int replicas,
      const std::function<std::vector<int>(int)>& holders,
      bool agent_holds = true) {
    std::vector<std::future<BeginResult>> begins;
    for (int r = 0; r < world; ++r) {
      v1::BeginSaveRequest req;
      req.set_job("job");
      req.set_step(step);
      req.set_rank(r);
      req.set_world_size(world);
      *req.mutable_local_plan() = RankPlan(r, world);
      req.set_tier(tier);
      req.set_agent_holds(agent_holds);
      req.set_replicas(replicas);
      auto promise = std::make_shared<std::promise<BeginResult>>();
      coordinator_->BeginSave(
          req, [promise](BeginResult b) { promise->set_value(std::move(b)); });
      begins.push_back(promise->get_future());
    }
    std::vector<v1::BeginSaveResponse> plans;
    absl::Status first;
    for (auto& f : begins) {
      BeginResult b = f.get();
      if (!b.ok()) {
        if (first.ok()) first = b.status();
        continue;
      }
      plans.push_back(*b);
    }
    if (!first.ok()) return first;
    std::vector<std::future<CommitResult>> commits;
    for (int r = 0; r < world; ++r) {
      v1::CommitSaveRequest c;
      if (plans[r].tier() == v1::TIER_MEMORY) {
        c.set_job("job");
        c.set_step(step);
        c.set_rank(r);
        for (const v1::PlannedWrite& w : plans[r].rank_plan().writes()) {
          v1::WriteResult* res = c.add_results();
          *res->mutable_location() = w.location();
          res->set_crc32c(
              storage::Crc32c(std::string(w.location().length(), 'm')));
        }
        for (int n : holders(r)) c.add_holder_nodes(n);
      } else {
        c = Write("job", step, r, plans[r]);
      }
      commits.push_back(Commit(c));
    }
    for (auto& f : commits) {
      CommitResult c = f.get();
      if (!c.ok() && first.ok()) first = c.status();
    }
    if (!first.ok()) return first;
    return plans[0].tier();
  }

  v1::CheckpointRecord Listed(int64_t step) {
    v1::ListCheckpointsRequest list;
    list.set_job("job");
    auto l = coordinator_->ListCheckpoints(list);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) {
      for (const auto& r : l->checkpoints()) {
        if (r.step() == step) return r;
      }
    }
    ADD_FAILURE() << "step " << step << " is not listed";
    return {};
  }

  absl::StatusOr<int64_t> Latest() {
    v1::GetCheckpointRequest get;
    get.set_job("job");
    get.set_latest(true);
    get.set_record_only(true);
    auto r = coordinator_->GetCheckpoint(get);
    if (!r.ok()) return r.status();
    return r->checkpoint().step();
  }

  static std::vector<int> Ring(int rank) { return {rank % 2, (rank + 1) % 2}; }
};

TEST_F(CoordinatorMemoryTest, MemorySaveCommitsWithItsHoldersAndNoStorage) {
  ReportOf(0, {});
  ReportOf(1, {});
  absl::StatusOr<v1::Tier> tier = AgentSave(5, 2, v1::TIER_MEMORY, 1, Ring);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_EQ(*tier, v1::TIER_MEMORY);
  // Nothing of it is on storage; its manifest is cairnd's.
  EXPECT_THAT(storage::ListJobs(Disk()).value(), IsEmpty());
  v1::GetCheckpointRequest get;
  get.set_job("job");
  get.set_step(5);
  auto got = coordinator_->GetCheckpoint(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().tier(), v1::TIER_MEMORY);
  EXPECT_THAT(got->checkpoint().holder_nodes(), ElementsAre(0, 1));
  EXPECT_EQ(got->checkpoint().live_copies(), 2);
  EXPECT_TRUE(got->checkpoint().restorable());
  EXPECT_EQ(got->manifest().tensors_size(), 2);
  EXPECT_EQ(*Latest(), 5);
  // A rank that would read storage itself is told the tier, nothing to read.
  v1::PlanLoadRequest plan;
  plan.set_job("job");
  plan.set_latest(true);
  auto answer = coordinator_->PlanLoad(plan);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->step(), 5);
  EXPECT_EQ(answer->tier(), v1::TIER_MEMORY);
  EXPECT_EQ(answer->reads_size(), 0);
}

TEST_F(CoordinatorMemoryTest, TooFewCopiesOrNoAgentsAreRefusedNamingWhy) {
  ReportOf(0, {});
  ReportOf(1, {});
  // Rank 1 names one holder: the save cannot commit, every rank hears why.
  absl::StatusOr<v1::Tier> t = AgentSave(5, 2, v1::TIER_MEMORY, 1, [](int r) {
    return r == 0 ? std::vector<int>{0, 1} : std::vector<int>{1};
  });
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("rank 1"), HasSubstr("needs 2"))));
  EXPECT_THAT(Latest(), StatusIs(absl::StatusCode::kNotFound));
  // Two replicas with two agents reporting.
  EXPECT_THAT(AgentSave(6, 2, v1::TIER_MEMORY, 2, Ring),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("needs 3 cairn-agents")));
  // A rank without an agent.
  EXPECT_THAT(AgentSave(7, 2, v1::TIER_MEMORY, 1, Ring, false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("saves directly")));
}

TEST_F(CoordinatorMemoryTest, LatestIsTheNewestRestorableAndLsSaysWhy) {
  ReportOf(0, {});
  ReportOf(1, {});
  ASSERT_EQ(AgentSave(1, 2, v1::TIER_PERSISTENT, 1, Ring).value(),
            v1::TIER_PERSISTENT);
  ASSERT_EQ(AgentSave(2, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  EXPECT_EQ(*Latest(), 2);
  // Node 1 keeps reporting both ranks' shards: node 0 lost, still restorable.
  const absl::Time until = absl::Now() + absl::Milliseconds(700);
  while (absl::Now() < until) {
    ReportOf(1, {{2, 0}, {2, 1}});
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(*Latest(), 2);
  EXPECT_EQ(Listed(2).live_copies(), 1);
  EXPECT_THAT(Listed(2).live_holder_nodes(), ElementsAre(1));
  // Node 1 restarts empty: nothing holds them, latest goes back to step 1.
  ReportOf(1, {}, /*incarnation=*/2);
  EXPECT_EQ(*Latest(), 1);
  const v1::CheckpointRecord lost = Listed(2);
  EXPECT_FALSE(lost.restorable());
  EXPECT_THAT(lost.unrestorable_reason(),
              AllOf(HasSubstr("ranks 0, 1"), HasSubstr("nodes 0, 1")));
  EXPECT_TRUE(Listed(1).restorable());
  // With every checkpoint in memory and lost, latest says so.
  ASSERT_THAT(coordinator_->DeleteCheckpoint([] {
    v1::DeleteCheckpointRequest d;
    d.set_job("job");
    d.set_step(1);
    return d;
  }()),
              IsOk());
  EXPECT_THAT(Latest(), StatusIs(absl::StatusCode::kNotFound,
                                 AllOf(HasSubstr("can be restored now"),
                                       HasSubstr("step 2"))));
}

TEST_F(CoordinatorMemoryTest, RestartedCairndRelearnsWhatTheAgentsHold) {
  ReportOf(0, {});
  ReportOf(1, {});
  ASSERT_EQ(AgentSave(1, 2, v1::TIER_PERSISTENT, 1, Ring).value(),
            v1::TIER_PERSISTENT);
  ASSERT_EQ(AgentSave(2, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  Restart();
  // The agents report soon after: `latest` waits for them, and is step 2.
  std::thread agents([this] {
    absl::SleepFor(absl::Milliseconds(100));
    ReportOf(0, {{2, 0}, {2, 1}});
    ReportOf(1, {{2, 1}, {2, 0}});
  });
  EXPECT_EQ(*Latest(), 2);
  agents.join();
  EXPECT_EQ(Listed(2).live_copies(), 2);
  // Restarted again, and no agent reports: after the lease, step 1.
  Restart();
  EXPECT_EQ(*Latest(), 1);
  EXPECT_FALSE(Listed(2).restorable());
}

TEST_F(CoordinatorMemoryTest,
       RecoveryAbortsAMemoryCheckpointWhoseManifestIsGone) {
  ReportOf(0, {});
  ReportOf(1, {});
  ASSERT_EQ(AgentSave(1, 2, v1::TIER_PERSISTENT, 1, Ring).value(),
            v1::TIER_PERSISTENT);
  ASSERT_EQ(AgentSave(2, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  ASSERT_EQ(AgentSave(3, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  // cairnd dies; step 3's memory manifest is lost with it (a crash before
  // it was durable, or the directory damaged).
  coordinator_.reset();
  std::filesystem::remove_all(options_.catalog_path + "-memory/" +
                              storage::StepPrefix("job", 3));
  Restart();
  EXPECT_EQ(Record("job", 2)->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(Record("job", 3)->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(Record("job", 3)->abort_reason(), HasSubstr("memory manifest"));
  EXPECT_THAT(ListedSteps("job"), ElementsAre(1, 2));
  // The persistent checkpoint is untouched on storage.
  EXPECT_THAT(storage::ListCommittedSteps(Disk(), "job").value(),
              ElementsAre(1));
}

TEST_F(CoordinatorMemoryTest, RecoveryFinishesAPromotionCutAfterItsManifest) {
  ReportOf(0, {});
  ReportOf(1, {});
  ASSERT_EQ(AgentSave(2, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  // A promotion whose objects and MANIFEST reached storage, cairnd killed
  // before the catalog recorded it persistent.
  coordinator_.reset();
  auto memory =
      storage::OpenShardStore("file://" + options_.catalog_path + "-memory");
  ASSERT_TRUE(memory.ok());
  auto m = storage::ReadManifest(**memory, "job", 2);
  ASSERT_TRUE(m.ok()) << m.status();
  std::map<std::string, uint64_t> ends;
  for (const v1::ManifestTensor& t : m->tensors()) {
    for (const v1::StoredChunk& c : t.chunks()) {
      uint64_t& end = ends[c.location().object_key()];
      end = std::max(end, c.location().offset() + c.location().length());
    }
  }
  for (const v1::ManifestBytes& b : m->bytes_entries()) {
    uint64_t& end = ends[b.location().object_key()];
    end = std::max(end, b.location().offset() + b.location().length());
  }
  for (const auto& [key, end] : ends) {
    const std::string zeros(end, '\0');
    ASSERT_TRUE(Disk()
                    .Put(storage::ObjectKey("job", 2, key),
                         absl::MakeConstSpan(zeros.data(), zeros.size()))
                    .ok());
  }
  ASSERT_TRUE(storage::PublishManifest(Disk(), *m).ok());
  Restart();
  EXPECT_EQ(Record("job", 2)->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(Record("job", 2)->tier(), v1::TIER_PERSISTENT);
  EXPECT_THAT(storage::ListCommittedSteps(Disk(), "job").value(),
              ElementsAre(2));
}

TEST_F(CoordinatorMemoryTest, PolicyChoosesTiersAndRetainsEachApart) {
  ReportOf(0, {});
  ReportOf(1, {});
  v1::SetJobPolicyRequest set;
  v1::JobPolicy* p = set.mutable_policy();
  p->set_job("job");
  p->set_memory_every(10);
  p->set_persist_every(40);
  p->set_replicas(2);
  p->set_keep_memory(2);
  p->set_keep_persistent(1);
  // Two agents cannot hold three copies.
  EXPECT_THAT(
      coordinator_->SetJobPolicy(set),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("2 replicas need 3"), HasSubstr("2 report"))));
  p->set_replicas(1);
  ASSERT_THAT(coordinator_->SetJobPolicy(set).status(), IsOk());
  v1::GetJobPolicyRequest get;
  get.set_job("job");
  auto got = coordinator_->GetJobPolicy(get);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->set());
  EXPECT_EQ(got->policy().persist_every(), 40);
  // Steps 10, 20, 30 in memory; 40 and 80 persisted; 50, 60 in memory.
  for (int64_t step : {10, 20, 30, 40, 50, 60, 80}) {
    absl::StatusOr<v1::Tier> t =
        AgentSave(step, 2, v1::TIER_UNSPECIFIED, 0, Ring);
    ASSERT_TRUE(t.ok()) << step << ": " << t.status();
    EXPECT_EQ(*t, step % 40 == 0 ? v1::TIER_PERSISTENT : v1::TIER_MEMORY)
        << step;
  }
  // Memory: the newest 2 (50, 60); persistent: the newest 1 (80). The
  // memory manifests of the deleted ones are gone from cairnd's store.
  EXPECT_THAT(ListedSteps("job"), ElementsAre(50, 60, 80));
  auto memory =
      storage::OpenShardStore("file://" + options_.catalog_path + "-memory");
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_THAT(storage::ListCommittedSteps(**memory, "job").value(),
              ElementsAre(50, 60));
  EXPECT_THAT(storage::ListCommittedSteps(Disk(), "job").value(),
              ElementsAre(80));
  // An agent still holding step 10's shards is told to drop them; 50's it
  // keeps.
  v1::ReportHoldingsResponse r = ReportOf(0, {{10, 0}, {50, 0}});
  ASSERT_EQ(r.drop_size(), 1);
  EXPECT_EQ(r.drop(0).step(), 10);
  // Malformed policies.
  p->set_persist_every(25);
  EXPECT_THAT(coordinator_->SetJobPolicy(set),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("multiple of memory_every")));
  // Cleared: saves persist again.
  set.set_clear(true);
  ASSERT_THAT(coordinator_->SetJobPolicy(set).status(), IsOk());
  EXPECT_EQ(AgentSave(90, 2, v1::TIER_UNSPECIFIED, 0, Ring).value(),
            v1::TIER_PERSISTENT);
}

TEST_F(CoordinatorMemoryTest, PersistRefusesWhatCannotBeWritten) {
  ReportOf(0, {});
  ReportOf(1, {});
  ASSERT_EQ(AgentSave(1, 2, v1::TIER_PERSISTENT, 1, Ring).value(),
            v1::TIER_PERSISTENT);
  ASSERT_EQ(AgentSave(2, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  auto persist = [&](int64_t step) {
    v1::PersistCheckpointRequest req;
    req.set_job("job");
    req.set_step(step);
    std::promise<absl::StatusOr<v1::PersistCheckpointResponse>> p;
    coordinator_->PersistCheckpoint(
        req, [&](absl::StatusOr<v1::PersistCheckpointResponse> r) {
          p.set_value(std::move(r));
        });
    return p.get_future().get();
  };
  // Already on storage: answered as it is.
  auto one = persist(1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->checkpoint().tier(), v1::TIER_PERSISTENT);
  EXPECT_THAT(persist(9).status(), StatusIs(absl::StatusCode::kNotFound));
  // Without `wait`: ordered, and the record says it is persisting.
  auto two = persist(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->checkpoint().persisting());
  EXPECT_TRUE(Listed(2).persisting());
  // Every copy lost: nothing to write it from.
  ASSERT_EQ(AgentSave(3, 2, v1::TIER_MEMORY, 1, Ring).value(), v1::TIER_MEMORY);
  ReportOf(0, {}, 7);
  ReportOf(1, {}, 7);
  EXPECT_THAT(
      persist(3).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("cannot persist"), HasSubstr("ranks 0, 1"))));
}

TEST_F(CoordinatorMemoryTest, DirectRanksUnderAPolicyPersist) {
  ReportOf(0, {});
  ReportOf(1, {});
  v1::SetJobPolicyRequest set;
  set.mutable_policy()->set_job("job");
  set.mutable_policy()->set_memory_every(1);
  set.mutable_policy()->set_persist_every(100);
  set.mutable_policy()->set_replicas(1);
  set.mutable_policy()->set_keep_memory(1);
  ASSERT_THAT(coordinator_->SetJobPolicy(set).status(), IsOk());
  EXPECT_EQ(AgentSave(3, 2, v1::TIER_UNSPECIFIED, 0, Ring, false).value(),
            v1::TIER_PERSISTENT);
  EXPECT_THAT(storage::ListCommittedSteps(Disk(), "job").value(),
              ElementsAre(3));
}

}  // namespace
}  // namespace cairn::coordinator
