// Memory checkpoints through real agents and a real cairnd: saved with no
// byte on storage, restored from the replicas after a node is lost
// (resharded, bit-exact), the replacement node's agent given its copies
// back, and `latest` falling back to storage when more nodes are lost than
// there are replicas.
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/testing/agent_cluster.h"

namespace cairn::agent {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class AgentMemoryTest : public testing::AgentCluster {
 protected:
  // Files of job "mem" on storage.
  int StoredFiles() {
    int n = 0;
    if (!std::filesystem::exists(dir_ + "/ckpt/mem")) return 0;
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(dir_ + "/ckpt/mem")) {
      n += e.is_regular_file() ? 1 : 0;
    }
    return n;
  }
  v1::CheckpointRecord Listed(const std::string& job, int64_t step) {
    v1::ListCheckpointsRequest list;
    list.set_job(job);
    auto l = cairnd_->coordinator().ListCheckpoints(list);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) {
      for (const auto& r : l->checkpoints()) {
        if (r.step() == step) return r;
      }
    }
    ADD_FAILURE() << job << " step " << step << " is not listed";
    return {};
  }
  // Waits until cairnd counts `copies` live copies of (job, step).
  void AwaitCopies(const std::string& job, int64_t step, int copies) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (Listed(job, step).live_copies() != copies && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(Listed(job, step).live_copies(), copies) << job << " " << step;
  }
};

TEST_F(AgentMemoryTest, NodeLossIsRestoredFromReplicasWithoutStorage) {
  for (int n = 0; n < 3; ++n) StartAgent(n, 3, 1);
  SaveAll("mem", 3, 1, "3:S0", 10, client::SaveTier::kMemory);
  EXPECT_EQ(StoredFiles(), 0);  // not one byte on storage
  const v1::CheckpointRecord rec = Listed("mem", 10);
  EXPECT_EQ(rec.tier(), v1::TIER_MEMORY);
  EXPECT_EQ(rec.holder_nodes_size(), 3);
  for (int n = 0; n < 3; ++n) {
    // Its own rank's shards and the previous node's replica, pinned.
    EXPECT_EQ(agents_[n]->agent().Status().memory_sets(), 2) << "node " << n;
  }
  AwaitCopies("mem", 10, 2);
  // Node 1 is lost (its agent and its rank); a replacement agent starts
  // empty on it: rank 1's shards live on node 2 only now.
  StopAgent(1);
  StartAgent(1, 3, 1);
  AwaitCopies("mem", 10, 1);
  EXPECT_TRUE(Listed("mem", 10).restorable());
  // Every rank, the replacement's included, loads into another layout from
  // the agents' memory, bit-exact.
  std::vector<Loaded> loaded = LoadAll("mem", 3, 1, "3:S1", 10);
  ASSERT_EQ(loaded.size(), 3u);
  for (const Loaded& l : loaded) {
    EXPECT_EQ(l.source, client::LoadSource::kAgentMemory) << last_agent_error_;
  }
  // The replacement gets copies back (two of every rank again), and with
  // copies lost cairnd also wrote the checkpoint to storage.
  AwaitCopies("mem", 10, 2);
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (Listed("mem", 10).tier() == v1::TIER_MEMORY && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Listed("mem", 10).tier(), v1::TIER_PERSISTENT);
  EXPECT_GT(StoredFiles(), 0);
}

TEST_F(AgentMemoryTest, PersistWritesAMemoryCheckpointToStorage) {
  for (int n = 0; n < 2; ++n) StartAgent(n, 2, 1);
  SaveAll("mem", 2, 1, "2:S0", 7, client::SaveTier::kMemory);
  EXPECT_EQ(StoredFiles(), 0);
  v1::PersistCheckpointRequest req;
  req.set_job("mem");
  req.set_step(7);
  req.set_wait(true);
  req.set_timeout_ms(30000);
  std::promise<absl::StatusOr<v1::PersistCheckpointResponse>> done;
  cairnd_->coordinator().PersistCheckpoint(
      req, [&](absl::StatusOr<v1::PersistCheckpointResponse> r) {
        done.set_value(std::move(r));
      });
  absl::StatusOr<v1::PersistCheckpointResponse> r = done.get_future().get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->checkpoint().tier(), v1::TIER_PERSISTENT);
  EXPECT_GT(StoredFiles(), 0);
  // Every agent's memory is lost: the checkpoint loads from storage,
  // resharded, bit-exact.
  for (int n = 0; n < 2; ++n) StopAgent(n);
  for (int n = 0; n < 2; ++n) StartAgent(n, 2, 1);
  std::vector<Loaded> loaded = LoadAll("mem", 2, 1, "2:S1", 7);
  ASSERT_EQ(loaded.size(), 2u);
  for (const Loaded& l : loaded) {
    EXPECT_EQ(l.source, client::LoadSource::kStorage);
  }
}

TEST_F(AgentMemoryTest, MoreNodesLostThanReplicasFallsBackToStorage) {
  for (int n = 0; n < 3; ++n) StartAgent(n, 3, 1);
  SaveAll("mem", 3, 1, "3:S0", 5, client::SaveTier::kPersistent);
  SaveAll("mem", 3, 1, "3:S0", 10, client::SaveTier::kMemory);
  AwaitCopies("mem", 10, 2);
  // Nodes 1 and 2 are lost: rank 1's shards were on both.
  StopAgent(1);
  StopAgent(2);
  StartAgent(1, 3, 1);
  StartAgent(2, 3, 1);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (Listed("mem", 10).restorable() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const v1::CheckpointRecord lost = Listed("mem", 10);
  EXPECT_FALSE(lost.restorable());
  EXPECT_THAT(lost.unrestorable_reason(),
              AllOf(HasSubstr("rank"), HasSubstr("1")));
  // `latest` is the newest checkpoint complete somewhere: step 5.
  std::vector<Loaded> loaded = LoadAll("mem", 3, 1, "3:S1", 5);
  EXPECT_EQ(loaded.size(), 3u);
}

TEST_F(AgentMemoryTest, AMemorySaveTooLargeForTheBudgetIsRefusedNamingIt) {
  for (int n = 0; n < 2; ++n) StartAgent(n, 2, 1, uint64_t{256} << 10);
  auto spec = examples::ModelSpec("small");
  ASSERT_TRUE(spec.ok());
  auto lay = examples::ParseLayout("1:R");
  ASSERT_TRUE(lay.ok());
  auto model = examples::ShardedModel::Create(*spec, *lay, 0, true, 3);
  ASSERT_TRUE(model.ok());
  auto ckpt = Rank(0, "big", 0, 1);
  auto f = ckpt->AsyncSave(3, (*model)->state(), client::SaveTier::kMemory);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(f.status().message(),
              AllOf(HasSubstr("job 'big'"), HasSubstr("step 3"),
                    HasSubstr("budget of 262144 bytes")));
}

TEST_F(AgentMemoryTest, ABudgetFullOfMemoryCheckpointsRefusesTheNextSave) {
  for (int n = 0; n < 2; ++n) StartAgent(n, 2, 1, uint64_t{1} << 20);
  SaveAll("full", 2, 1, "2:S0", 1, client::SaveTier::kMemory);
  auto spec = examples::ModelSpec("small");
  auto lay = examples::ParseLayout("2:S0");
  ASSERT_TRUE(spec.ok() && lay.ok());
  auto model = examples::ShardedModel::Create(*spec, *lay, 0, true, 2);
  ASSERT_TRUE(model.ok());
  // Its own shards and node 1's replica of step 1 are pinned: step 2 has no
  // room, and is refused at once, not after the rank's wait_for_space (an
  // hour here: waiting it out would time the test out).
  client::AgentCheckpointerOptions o;
  o.agent_socket = Socket(0);
  o.direct.coordinator = Address();
  o.direct.job = "full";
  o.direct.rank = 0;
  o.direct.world_size = 2;
  o.wait_for_space = absl::Hours(1);
  auto ckpt = client::AgentCheckpointer::Connect(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto f = (*ckpt)->AsyncSave(2, (*model)->state(), client::SaveTier::kMemory);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(f.status().message(),
              AllOf(HasSubstr("job 'full'"), HasSubstr("step 2"),
                    HasSubstr("budget of 1048576 bytes"),
                    HasSubstr("bytes of memory checkpoints it holds")));
}

}  // namespace
}  // namespace cairn::agent
