// libcairn's agent mode against a real cairnd and a real cairn-agent, both
// in-process (cairnd on loopback port 0, the agent on a Unix socket in a temp
// dir): AsyncSave returns a future whose Wait gives the committed
// CheckpointInfo, loads come from agent memory or fall back to storage, and
// failures name the rank, job and step.
#include "client/agent/agent_checkpointer.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/agent_server.h"
#include "server/coordinator/coordinator_server.h"
#include "storage/testing/status_testing.h"

namespace cairn::client {
namespace {

using ::testing::HasSubstr;

class AgentCheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Under /tmp, not TEST_TMPDIR: the agent's socket path must fit sun_path.
    char tmpl[] = "/tmp/cairn-agent-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/ckpt");
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
  }
  void TearDown() override {
    agent_.reset();
    cairnd_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::string Socket() const { return dir_ + "/agent.sock"; }

  void StartAgent() {
    agent::AgentServer::Spec spec;
    spec.unix_socket = Socket();
    spec.agent.node_id = 0;
    spec.agent.num_nodes = 1;
    spec.agent.coordinator = absl::StrCat("127.0.0.1:", cairnd_->port());
    spec.agent.staging_budget_bytes = 16 << 20;
    spec.agent.store.durable = false;
    auto s = agent::AgentServer::Start(std::move(spec));
    ASSERT_TRUE(s.ok()) << s.status();
    agent_ = std::move(*s);
  }

  AgentCheckpointerOptions Options(int rank, int world) const {
    AgentCheckpointerOptions o;
    o.agent_socket = Socket();
    o.direct.coordinator = absl::StrCat("127.0.0.1:", cairnd_->port());
    o.direct.job = "job";
    o.direct.rank = rank;
    o.direct.world_size = world;
    o.direct.max_retries = 0;
    o.direct.store.use_odirect = false;
    o.rpc_timeout = absl::Seconds(10);
    o.wait_for_space = absl::Seconds(5);
    return o;
  }

  // "w": fp32 [16] held whole by a single rank, filled from `seed`.
  static absl::Status AddW(StateDict& state, std::vector<char>& buf,
                           char seed) {
    buf.assign(64, 0);
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<char>(seed + i * 3);
    }
    return state.AddChunks(
        "w", planner::DType::kFloat32, {16},
        {TensorChunk{planner::ChunkBox{{0}, {16}}, absl::MakeSpan(buf)}});
  }

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
  std::unique_ptr<agent::AgentServer> agent_;
};

TEST_F(AgentCheckpointerTest, AsyncSaveCommitsAndLoadComesFromAgentMemory) {
  StartAgent();
  auto c = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'a').ok());
  absl::StatusOr<SaveFuture> f = (*c)->AsyncSave(6, state);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->step(), 6);
  EXPECT_EQ((*c)->last_save_stats().bytes, 64u);
  absl::StatusOr<CheckpointInfo> info = f->Wait(absl::Seconds(30));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job, "job");
  EXPECT_EQ(info->step, 6);
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
  EXPECT_EQ(info->world_size, 1);
  EXPECT_EQ(info->bytes, 64u);

  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  absl::StatusOr<int64_t> loaded = (*c)->Load(LoadRef::Latest(), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 6);
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kAgentMemory);
  EXPECT_TRUE((*c)->last_agent_load_error().ok());
  EXPECT_EQ((*c)->last_load_bytes_local(), 64u);
  EXPECT_EQ(got, buf);
}

TEST_F(AgentCheckpointerTest, LoadFallsBackToStorageWhenTheAgentIsDown) {
  StartAgent();
  auto c = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'b').ok());
  auto f = (*c)->AsyncSave(8, state);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->Wait(absl::Seconds(30)).ok());
  agent_.reset();  // the agent is gone: its memory tiers with it

  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  absl::StatusOr<int64_t> loaded = (*c)->Load(LoadRef::Step(8), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 8);
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kStorage);
  EXPECT_FALSE((*c)->last_agent_load_error().ok());
  EXPECT_EQ(got, buf);
}

TEST_F(AgentCheckpointerTest, AsyncSaveWithoutAgentNamesRankJobAndStep) {
  auto c = AgentCheckpointer::Connect(Options(1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'c').ok());
  const absl::Status s = (*c)->AsyncSave(3, state).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 saving job 'job' step 3 via agent"));
}

TEST_F(AgentCheckpointerTest, UnsaveableStateIsRefusedNamingTheTensor) {
  auto c = AgentCheckpointer::Connect(Options(0, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf(64);
  planner::DTensorLayout partial{{{2}, {0, 1}},
                                 {planner::Placement::Partial()}};
  ASSERT_TRUE(state
                  .AddDTensor("model.pending", planner::DType::kFloat32, {16},
                              partial, 0, absl::MakeSpan(buf))
                  .ok());
  const absl::Status s = (*c)->AsyncSave(3, state).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 0 saving job 'job' step 3 via agent"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'model.pending'"));
}

TEST_F(AgentCheckpointerTest, ConnectRefusesBadOptions) {
  AgentCheckpointerOptions o = Options(0, 1);
  o.agent_socket.clear();
  EXPECT_STATUS(AgentCheckpointer::Connect(o).status(), kInvalidArgument,
                "agent mode needs the agent's socket");
  o = Options(2, 2);
  EXPECT_STATUS(AgentCheckpointer::Connect(o).status(), kInvalidArgument,
                "job 'job': rank 2 is out of range for world_size 2");
  o = Options(0, 1);
  o.direct.job = "no spaces";
  EXPECT_EQ(AgentCheckpointer::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cairn::client
