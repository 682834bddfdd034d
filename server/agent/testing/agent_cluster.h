// Test fixture of the agent as a whole: a real CoordinatorServer on
// loopback, agents started and stopped per simulated node (each an
// AgentServer with its UDS service and TCP peer transport, peers resolved on
// loopback) and AgentCheckpointer ranks saving and loading the synthetic
// model through them. Used by the tests of the composed agent (agent_test,
// agent_server_test, agent_streaming_test); each component's own tests
// need none of it.
#ifndef CAIRN_SERVER_AGENT_TESTING_AGENT_CLUSTER_H_
#define CAIRN_SERVER_AGENT_TESTING_AGENT_CLUSTER_H_

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/agent/agent_checkpointer.h"
#include "client/examples/synthetic_model.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/agent/agent_server.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::agent::testing {

class AgentCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    // The agents' sockets are in it: their paths must fit sun_path.
    dir_ = ::cairn::testing::MakeSocketTempDir("agent-test");
    ASSERT_FALSE(dir_.empty());
    ::cairn::coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    spec.coordinator.commit_deadline = absl::Seconds(20);
    // Agents report every 100 ms: a stopped one's memory counts as lost
    // after a second.
    spec.coordinator.holdings_lease = absl::Seconds(1);
    auto c = ::cairn::coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
  }
  void TearDown() override {
    agents_.clear();
    cairnd_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string Address() const {
    return absl::StrCat("127.0.0.1:", cairnd_->port());
  }
  std::string Socket(int node) const { return sockets_[node]; }

  // Starts (or restarts) the agent of `node` in a cluster of `nodes`.
  void StartAgent(int node, int nodes, int replicas,
                  uint64_t budget = uint64_t{256} << 20,
                  std::function<void(AgentServer::Spec&)> tweak = {}) {
    if (static_cast<int>(agents_.size()) < nodes) agents_.resize(nodes);
    if (static_cast<int>(ports_.size()) < nodes) ports_.resize(nodes, 0);
    if (static_cast<int>(sockets_.size()) < nodes) sockets_.resize(nodes);
    sockets_[node] =
        absl::StrCat(dir_, "/agent-", node, "-", ++generation_, ".sock");
    AgentServer::Spec spec;
    spec.unix_socket = Socket(node);
    spec.agent.node_id = node;
    spec.agent.num_nodes = nodes;
    spec.agent.coordinator = Address();
    spec.agent.replicas = replicas;
    spec.agent.staging_budget_bytes = budget;
    spec.agent.peer_timeout = absl::Seconds(10);
    spec.agent.bucket_cap_bytes = 64 << 10;  // many buckets in tests
    spec.agent.store.durable = false;
    spec.agent.stream_idle_timeout = absl::Seconds(2);
    spec.agent.holdings_report_interval = absl::Milliseconds(100);
    spec.agent.resolve_peer = [this](int n) -> absl::StatusOr<std::string> {
      if (n < 0 || n >= static_cast<int>(ports_.size()) || ports_[n] == 0) {
        return absl::NotFoundError(absl::StrCat("node ", n));
      }
      return absl::StrCat("127.0.0.1:", ports_[n]);
    };
    if (tweak) tweak(spec);
    auto s = AgentServer::Start(std::move(spec));
    ASSERT_TRUE(s.ok()) << s.status();
    ports_[node] = (*s)->agent().peer_port();
    agents_[node] = std::move(*s);
  }

  void StopAgent(int node) {
    agents_[node].reset();
    ports_[node] = 0;
  }

  std::unique_ptr<::cairn::client::AgentCheckpointer> Rank(
      int node, const std::string& job, int rank, int world,
      bool allow_streaming = true) {
    ::cairn::client::AgentCheckpointerOptions o;
    o.allow_streaming = allow_streaming;
    o.agent_socket = Socket(node);
    o.direct.coordinator = Address();
    o.direct.job = job;
    o.direct.rank = rank;
    o.direct.world_size = world;
    o.wait_for_space = absl::Seconds(5);
    auto c = ::cairn::client::AgentCheckpointer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Every rank (rank r on node r / ranks_per_node) saves `step` through its
  // agent and waits for the commit.
  void SaveAll(
      const std::string& job, int world, int ranks_per_node,
      const std::string& layout, int64_t step,
      ::cairn::client::SaveTier tier = ::cairn::client::SaveTier::kPolicy) {
    auto spec = ::cairn::examples::ModelSpec("small");
    ASSERT_TRUE(spec.ok());
    auto lay = ::cairn::examples::ParseLayout(layout);
    ASSERT_TRUE(lay.ok());
    std::vector<::cairn::client::SaveFuture> futures;
    for (int r = 0; r < world; ++r) {
      auto model =
          ::cairn::examples::ShardedModel::Create(*spec, *lay, r, true, step);
      ASSERT_TRUE(model.ok());
      auto ckpt = Rank(r / ranks_per_node, job, r, world);
      ASSERT_NE(ckpt, nullptr);
      auto f = ckpt->AsyncSave(step, (*model)->state(), tier);
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ(ckpt->last_save_stats().bytes > 0, true);
      futures.push_back(*f);
      // The model's buffers are freed here: the agent owns the snapshot.
    }
    for (auto& f : futures) {
      auto rec = f.Wait(absl::Seconds(30));
      ASSERT_TRUE(rec.ok()) << rec.status();
      EXPECT_EQ(rec->state, ::cairn::client::CheckpointState::kCommitted);
      EXPECT_EQ(rec->step, step);
    }
  }

  struct Loaded {
    ::cairn::client::LoadSource source;
    uint64_t peers = 0;
    uint64_t local = 0;
  };
  // Every rank loads `latest` into `layout` through its agent; verifies.
  std::vector<Loaded> LoadAll(const std::string& job, int world,
                              int ranks_per_node, const std::string& layout,
                              int64_t want_step) {
    auto spec = ::cairn::examples::ModelSpec("small");
    auto lay = ::cairn::examples::ParseLayout(layout);
    std::vector<Loaded> out;
    for (int r = 0; r < world; ++r) {
      auto model =
          ::cairn::examples::ShardedModel::Create(*spec, *lay, r, false, 0);
      EXPECT_TRUE(model.ok());
      auto ckpt = Rank(r / ranks_per_node, job, r, world);
      auto step =
          ckpt->Load(::cairn::client::LoadRef::Latest(), (*model)->state());
      EXPECT_TRUE(step.ok())
          << step.status() << " (agent: " << ckpt->last_agent_load_error()
          << ")";
      if (!step.ok()) return out;
      EXPECT_EQ(*step, want_step);
      absl::Status v = (*model)->Verify(*step);
      EXPECT_TRUE(v.ok()) << "rank " << r << ": " << v;
      out.push_back({ckpt->last_load_source(), ckpt->last_load_bytes_peers(),
                     ckpt->last_load_bytes_local()});
      if (ckpt->last_load_source() !=
          ::cairn::client::LoadSource::kAgentMemory) {
        last_agent_error_ = ckpt->last_agent_load_error();
      }
    }
    return out;
  }

  // Deletes every data object of the job on storage (keeps MANIFESTs), so a
  // load can only succeed from memory.
  int DeleteStoredData() {
    int n = 0;
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(dir_ + "/ckpt")) {
      if (e.is_regular_file() && e.path().extension() == ".bin") {
        std::filesystem::remove(e.path());
        ++n;
      }
    }
    return n;
  }

  std::string dir_;
  int generation_ = 0;
  std::vector<std::string> sockets_;
  std::unique_ptr<::cairn::coordinator::CoordinatorServer> cairnd_;
  std::vector<std::unique_ptr<AgentServer>> agents_;
  std::vector<int> ports_;
  absl::Status last_agent_error_;
};

}  // namespace cairn::agent::testing

#endif  // CAIRN_SERVER_AGENT_TESTING_AGENT_CLUSTER_H_
