// Failure semantics of agent mode (issue 6 item 5) with REAL processes on
// loopback: cairnd, one cairn-agent per simulated node (UDS for its ranks,
// TCP peer transport, rendezvous through a --peer-dir) and rank processes
// (cairn_agent_rank, cairn_train_example).
//
//   * a training process SIGKILLed right after AsyncSave returns: its agent
//     still persists and the checkpoint commits;
//   * an agent killed mid-persist (right before CommitSave): that checkpoint
//     never commits and the previous one stays `latest`;
//   * a node's agent lost (SIGKILL) with the storage copy gone too: its data
//     is restored from a peer agent's replica;
//   * the same with Kubernetes-style agents (--node-id auto, no peer list):
//     the restarted agent gets its node id back from cairnd's registry;
//   * the same over mutual TLS (--peer-tls-*): a replacement agent whose
//     certificate comes from another CA is refused by its peer; SIGHUP
//     reloads the certificates.
//
// Storage (what agents persist to) is file:// under the test's temp dir, or
// a fresh S3 bucket with CAIRN_TEST_STORAGE=s3 (tests/testing/test_storage.h).
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

constexpr char kLayout[] = "2x2:S0,S1";
constexpr int kWorld = 4;  // ranks 0,1 on node 0; ranks 2,3 on node 1

class AgentE2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(CreateStorage());
    ASSERT_NO_FATAL_FAILURE(StartCairnd({"--commit-deadline", "4"}));
  }
  void TearDown() override {
    for (auto& a : agents_) a.reset();
    EndToEndTest::TearDown();
  }

  std::string Socket(int node) const {
    return testing::SocketPath(
        absl::StrCat("e2e-", node, "-", generation_[node]));
  }

  // The cluster token every agent of the test presents to its peers.
  std::string TokenFile() const {
    const std::string path = dir_ + "/peer-token";
    if (!std::filesystem::exists(path)) {
      std::ofstream(path) << "e2e-cluster-token-" << getpid() << "\n";
    }
    return path;
  }

  void StartAgent(int node, int replicas,
                  std::vector<std::string> extra = {"--staging-budget-mib",
                                                    "64"}) {
    ++generation_[node];
    std::vector<std::string> flags = {
        "--listen-unix",     Socket(node),
        "--peer-listen",     "127.0.0.1:0",
        "--num-nodes",       "2",
        "--coordinator",     cairnd_->address(),
        "--replicas",        std::to_string(replicas),
        "--peer-token-file", TokenFile()};
    if (auto_ids_) {
      // As in Kubernetes: no id, no peer list; a stable node name.
      flags.insert(flags.end(), {"--node-id", "auto", "--node-name",
                                 absl::StrCat("k8s-node-", node)});
    } else {
      flags.insert(flags.end(), {"--node-id", std::to_string(node),
                                 "--peer-dir", dir_ + "/peers"});
    }
    flags.insert(flags.end(), extra.begin(), extra.end());
    StartCairnAgent(flags, absl::StrCat("agent-", node, "-", generation_[node]),
                    &agents_[node], nullptr, absl::Seconds(20));
  }

  std::vector<std::string> RankArgs(int rank, const std::string& job) {
    return AgentRankArgv(Socket(rank / 2), job, rank, kWorld, kLayout);
  }

  // Runs one command per rank; returns exit codes and keeps the logs.
  std::vector<int> RunRanks(
      const std::vector<std::vector<std::string>>& argvs) {
    std::vector<int> codes = RunAll(argvs, absl::Minutes(2));
    logs_ = RankLogs();
    return codes;
  }

  std::vector<int> SaveAll(const std::string& job, int64_t step,
                           std::vector<std::string> extra = {},
                           std::vector<std::string> node1_extra = {}) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < kWorld; ++r) {
      auto a = RankArgs(r, job);
      a.insert(a.end(), {"--save-step", std::to_string(step)});
      a.insert(a.end(), extra.begin(), extra.end());
      if (r / 2 == 1) a.insert(a.end(), node1_extra.begin(), node1_extra.end());
      argvs.push_back(std::move(a));
    }
    return RunRanks(argvs);
  }

  // Every rank loads `latest` of `job` through its node's agent, from agent
  // memory.
  std::vector<int> LoadFromMemory(const std::string& job) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < kWorld; ++r) {
      argvs.push_back(RankArgs(r, job));
      argvs.back().insert(argvs.back().end(),
                          {"--load", "latest", "--expect-source", "memory"});
    }
    return RunRanks(argvs);
  }

  // Direct-mode load of `latest` into a different layout, bit-exact.
  void ExpectDirectLoadOf(const std::string& job, int64_t step,
                          std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--load", "latest"});
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < 3; ++r)
      argvs.push_back(RankArgv(job, r, 3, "3:S1", extra));
    std::vector<int> codes = RunRanks(argvs);
    EXPECT_THAT(codes, ::testing::Each(0)) << logs_;
    EXPECT_THAT(logs_, HasSubstr(absl::StrCat("load step ", step)));
  }

  std::map<int64_t, v1::CheckpointState> States(const std::string& job) {
    v1::ListCheckpointsRequest req;
    req.set_job(job);
    req.set_include_uncommitted(true);
    v1::ListCheckpointsResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(Stub()->ListCheckpoints(&ctx, req, &resp).ok());
    std::map<int64_t, v1::CheckpointState> out;
    for (const auto& c : resp.checkpoints()) out[c.step()] = c.state();
    return out;
  }

  bool WaitCommitted(const std::string& job, int64_t step,
                     absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      auto s = States(job);
      if (s.count(step) && s[step] == v1::CHECKPOINT_STATE_COMMITTED) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // cairnd's agent table as "name=id@address", by id.
  std::vector<std::string> Agents() {
    v1::ListAgentsResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(Stub()->ListAgents(&ctx, v1::ListAgentsRequest(), &resp).ok());
    std::vector<std::string> out;
    for (const auto& a : resp.agents()) {
      out.push_back(
          absl::StrCat(a.node_name(), "=", a.node_id(), "@", a.peer_address()));
    }
    return out;
  }

  // Deletes the data objects of `job` from storage: only memory can serve.
  void DeleteStoredData(const std::string& job) {
    auto objects = storage_->DataObjects(job + "/");
    ASSERT_TRUE(objects.ok()) << objects.status();
    int deleted = 0;
    for (const std::string& key : *objects) {
      if (absl::EndsWith(key, ".bin")) {
        ASSERT_TRUE(storage_->Remove(key).ok()) << key;
        ++deleted;
      }
    }
    EXPECT_GT(deleted, 0);
  }

  bool auto_ids_ = false;  // agents started with --node-id auto
  std::unique_ptr<testing::Subprocess> agents_[2];
  int generation_[2] = {0, 0};
  std::string logs_;
};

TEST_F(AgentE2ETest, TrainingKilledRightAfterAsyncSaveStillCommits) {
  StartAgent(0, 1);
  StartAgent(1, 1);
  // Every rank is SIGKILLed the moment AsyncSave returns: nobody waits.
  std::vector<int> codes = SaveAll("killed", 100, {"--kill-after-async-save"});
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_THAT(codes, ::testing::Each(128 + SIGKILL)) << logs_;
  EXPECT_THAT(logs_, HasSubstr("async save step 100 returned"));
  ASSERT_TRUE(WaitCommitted("killed", 100, absl::Seconds(30)))
      << agents_[0]->Log() << agents_[1]->Log();
  ExpectDirectLoadOf("killed", 100);
}

// Streaming: ~2 MiB per rank through agents with a 1 MiB budget (two ranks
// per node, 128 KiB buckets).
const std::vector<std::string> kStreamAgent = {
    "--staging-budget-mib",     "1",   "--stream-bucket-kib", "128",
    "--stream-idle-timeout-ms", "3000"};
const std::vector<std::string> kStreamModel = {"--model", "bench:8388608"};

TEST_F(AgentE2ETest, RankKilledMidStreamLeavesPreviousCheckpointLatest) {
  StartAgent(0, 0, kStreamAgent);
  StartAgent(1, 0, kStreamAgent);
  std::vector<int> codes = SaveAll("midstream", 1, kStreamModel);
  EXPECT_THAT(codes, ::testing::Each(0)) << logs_;
  EXPECT_THAT(agents_[1]->Log(), HasSubstr("in buckets of 131072"));
  // Step 2: node 1's ranks die after filling 3 buckets (of ~16).
  std::vector<std::string> die = {"--exit-after-stream-buckets", "3"};
  codes = SaveAll("midstream", 2, kStreamModel, die);
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_EQ(codes[2], 137) << logs_;
  EXPECT_EQ(codes[3], 137) << logs_;
  EXPECT_NE(codes[0], 0) << logs_;  // their save was aborted
  EXPECT_NE(codes[1], 0) << logs_;
  // The agent aborts the save at cairnd, then logs why: the other ranks can
  // exit before the line is written.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!absl::StrContains(agents_[1]->Log(), "no streaming call") &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(agents_[1]->Log(), HasSubstr("no streaming call"));
  auto states = States("midstream");
  EXPECT_EQ(states[1], v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_NE(states[2], v1::CHECKPOINT_STATE_COMMITTED);
  ExpectDirectLoadOf("midstream", 1, kStreamModel);
}

TEST_F(AgentE2ETest, AgentKilledWhileStreamingLeavesPreviousCheckpointLatest) {
  StartAgent(0, 0, kStreamAgent);
  StartAgent(1, 0, kStreamAgent);
  std::vector<int> codes = SaveAll("agentstream", 1, kStreamModel);
  EXPECT_THAT(codes, ::testing::Each(0)) << logs_;
  // Step 2: node 1's agent exits after streaming every bucket to storage,
  // right before CommitSave.
  codes =
      SaveAll("agentstream", 2, kStreamModel, {"--agent-dies-before-commit"});
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_THAT(codes, ::testing::Each(::testing::Ne(0))) << logs_;
  auto exited = agents_[1]->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok());
  EXPECT_THAT(agents_[1]->Log(), HasSubstr("in buckets of"));
  auto states = States("agentstream");
  EXPECT_EQ(states[1], v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_NE(states[2], v1::CHECKPOINT_STATE_COMMITTED);
  ExpectDirectLoadOf("agentstream", 1, kStreamModel);
}

TEST_F(AgentE2ETest, AgentKilledMidPersistLeavesPreviousCheckpointLatest) {
  StartAgent(0, 0);
  StartAgent(1, 0);
  std::vector<int> codes = SaveAll("agentdies", 1);
  ASSERT_THAT(codes, ::testing::Each(0)) << logs_;
  // Step 2: node 1's agent dies right before CommitSave for its ranks.
  codes = SaveAll("agentdies", 2, {}, {"--agent-dies-before-commit"});
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_THAT(codes, ::testing::Each(1)) << logs_;  // Wait reports failure
  auto exited = agents_[1]->Wait(absl::Seconds(10));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(*exited, 137);
  auto states = States("agentdies");
  EXPECT_EQ(states[1], v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_NE(states[2], v1::CHECKPOINT_STATE_COMMITTED);
  ExpectDirectLoadOf("agentdies", 1);
}

TEST_F(AgentE2ETest, LostNodeAgentIsRestoredFromPeerReplica) {
  StartAgent(0, 1);
  StartAgent(1, 1);
  ASSERT_THAT(SaveAll("nodeloss", 7), ::testing::Each(0)) << logs_;
  // The storage copy is gone too: only memory can serve the load.
  DeleteStoredData("nodeloss");
  agents_[1]->Signal(SIGKILL);  // node 1 lost with its tier 0
  ASSERT_TRUE(agents_[1]->Wait(absl::Seconds(10)).ok());
  StartAgent(1, 1);  // replacement node, empty memory
  std::vector<int> codes = LoadFromMemory("nodeloss");
  EXPECT_THAT(codes, ::testing::Each(0))
      << logs_ << agents_[0]->Log() << agents_[1]->Log();
  EXPECT_THAT(logs_, HasSubstr("rank 2: loaded step 7 from agent memory (0 B "
                               "local"));
}

// The peer transport over mutual TLS: replicas travel through it, a
// replacement agent with a certificate from another CA is refused by its
// peer (so its peer load fails), the right one gets in, and SIGHUP reloads
// the certificates (a broken file keeps the loaded ones).
TEST_F(AgentE2ETest, PeersOverMutualTlsRefuseAStrangerAndReloadOnSighup) {
  const std::string certs = dir_ + "/certs";
  const std::string cmd =
      absl::StrCat("sh '", Binaries().make_certs, "' '", certs, "'");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // Agent 0 reads copies, so the test can break one before a SIGHUP.
  const std::string own = dir_ + "/certs-0";
  std::filesystem::create_directories(own);
  for (const char* f : {"ca.crt", "peer.crt", "peer.key"}) {
    std::filesystem::copy_file(certs + "/" + f, own + "/" + f);
  }
  auto tls = [&](const std::string& d, const std::string& name,
                 const std::string& ca) -> std::vector<std::string> {
    return {"--staging-budget-mib", "64",
            "--peer-tls-ca",        d + "/" + ca + ".crt",
            "--peer-tls-cert",      d + "/" + name + ".crt",
            "--peer-tls-key",       d + "/" + name + ".key"};
  };
  StartAgent(0, 1, tls(own, "peer", "ca"));
  StartAgent(1, 1, tls(certs, "peer", "ca"));
  ASSERT_THAT(SaveAll("tlsloss", 7), ::testing::Each(0)) << logs_;
  DeleteStoredData("tlsloss");
  agents_[1]->Signal(SIGKILL);
  ASSERT_TRUE(agents_[1]->Wait(absl::Seconds(10)).ok());
  // A stranger takes node 1's place: it trusts the cluster CA, but its own
  // certificate is another CA's. Agent 0 refuses it; node 1's ranks cannot
  // get the replica.
  StartAgent(1, 1, tls(certs, "other-peer", "ca"));
  std::vector<int> codes = LoadFromMemory("tlsloss");
  EXPECT_NE(codes[2], 0) << logs_;
  EXPECT_NE(codes[3], 0) << logs_;
  EXPECT_THAT(agents_[0]->Log(),
              HasSubstr("TLS handshake failed: certificate verify failed"));
  EXPECT_THAT(agents_[1]->Log() + logs_, HasSubstr("TLS handshake failed"));
  agents_[1]->Signal(SIGKILL);
  ASSERT_TRUE(agents_[1]->Wait(absl::Seconds(10)).ok());
  // The cluster's own replacement gets in and is served from memory.
  StartAgent(1, 1, tls(certs, "peer", "ca"));
  codes = LoadFromMemory("tlsloss");
  EXPECT_THAT(codes, ::testing::Each(0))
      << logs_ << agents_[0]->Log() << agents_[1]->Log();
  EXPECT_THAT(logs_, HasSubstr("rank 2: loaded step 7 from agent memory (0 B "
                               "local"));

  // SIGHUP: reloaded; with a broken key, refused naming the file.
  auto wait_log = [&](const std::string& want) {
    for (int i = 0; i < 2000; ++i) {  // a hang guard, not a timing check
      if (absl::StrContains(agents_[0]->Log(), want)) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  };
  agents_[0]->Signal(SIGHUP);
  EXPECT_TRUE(wait_log("SIGHUP: peer TLS certificate, key and CA reloaded"))
      << agents_[0]->Log();
  std::ofstream(own + "/peer.key") << "not a key\n";
  agents_[0]->Signal(SIGHUP);
  EXPECT_TRUE(
      wait_log(absl::StrCat("peer TLS reload failed, keeping the "
                            "loaded certificates: --peer-tls-key ",
                            own, "/peer.key")))
      << agents_[0]->Log();
}

// Kubernetes-style agents: --node-id auto with a node name, no --peers or
// --peer-dir. cairnd's registry gives ids by name; the agent of node 0 is
// lost and restarts (same name, new peer port): it must come back as node 0
// (a new name would need id 2, beyond --num-nodes 2, and be refused), and
// node 1 must find it at its new address to serve the peer load.
TEST_F(AgentE2ETest, AutoIdAgentRestartedKeepsItsIdAndItsPeerLoadWorks) {
  auto_ids_ = true;
  StartAgent(0, 1);
  StartAgent(1, 1);
  EXPECT_THAT(agents_[0]->Log(),
              HasSubstr("node 'k8s-node-0' registered with cairnd as node 0"));
  EXPECT_THAT(agents_[1]->Log(),
              HasSubstr("node 'k8s-node-1' registered with cairnd as node 1"));
  const std::vector<std::string> before = Agents();
  ASSERT_EQ(before.size(), 2u);
  EXPECT_THAT(before[0], ::testing::StartsWith("k8s-node-0=0@127.0.0.1:"));
  EXPECT_THAT(before[1], ::testing::StartsWith("k8s-node-1=1@127.0.0.1:"));
  ASSERT_THAT(SaveAll("k8s", 5), ::testing::Each(0)) << logs_;
  // Each node's tier 0 was replicated to the other through the registry's
  // addresses.
  EXPECT_THAT(agents_[0]->Log(), HasSubstr("committed"));
  DeleteStoredData("k8s");
  agents_[0]->Signal(SIGKILL);  // node 0 lost with its tier 0
  ASSERT_TRUE(agents_[0]->Wait(absl::Seconds(10)).ok());
  StartAgent(0, 1);  // the pod restarts on the same node: new port
  EXPECT_THAT(agents_[0]->Log(),
              HasSubstr("node 'k8s-node-0' registered with cairnd as node 0"));
  const std::vector<std::string> after = Agents();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_THAT(after[0], ::testing::StartsWith("k8s-node-0=0@127.0.0.1:"));
  EXPECT_NE(after[0], before[0]);  // the new peer port was registered
  EXPECT_EQ(after[1], before[1]);
  std::vector<int> codes = LoadFromMemory("k8s");
  EXPECT_THAT(codes, ::testing::Each(0))
      << logs_ << agents_[0]->Log() << agents_[1]->Log();
  // Ranks 0 and 1 (node 0, restarted empty) get every byte from node 1.
  EXPECT_THAT(logs_, HasSubstr("rank 0: loaded step 5 from agent memory (0 B "
                               "local"));

  // The other way: node 1 replicates to node 0 at its new address, then
  // node 1 is lost and its restarted agent loads from node 0's replica.
  ASSERT_THAT(SaveAll("k8s", 6), ::testing::Each(0)) << logs_;
  EXPECT_THAT(agents_[1]->Log(), Not(HasSubstr("to node 0 failed")));
  DeleteStoredData("k8s");
  agents_[1]->Signal(SIGKILL);
  ASSERT_TRUE(agents_[1]->Wait(absl::Seconds(10)).ok());
  StartAgent(1, 1);
  EXPECT_THAT(agents_[1]->Log(),
              HasSubstr("node 'k8s-node-1' registered with cairnd as node 1"));
  codes = LoadFromMemory("k8s");
  EXPECT_THAT(codes, ::testing::Each(0))
      << logs_ << agents_[0]->Log() << agents_[1]->Log();
  EXPECT_THAT(logs_, HasSubstr("rank 2: loaded step 6 from agent memory (0 B "
                               "local"));
}

// A third node name in a cluster of --num-nodes 2 is refused with the limit
// named, and the agent exits instead of running without an id.
TEST_F(AgentE2ETest, AutoIdBeyondNumNodesExitsNamingTheLimit) {
  auto_ids_ = true;
  StartAgent(0, 0);
  StartAgent(1, 0);
  std::string out;
  EXPECT_EQ(Run({Binaries().agent, "--node-id", "auto", "--node-name",
                 "k8s-node-2", "--listen-unix", Socket(0) + "x", "--num-nodes",
                 "2", "--coordinator", cairnd_->address()},
                &out, absl::Seconds(30)),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("node 'k8s-node-2'"));
  EXPECT_THAT(out, HasSubstr("--num-nodes 2"));
}

// A fixed-id agent whose --coordinator is wrong (nothing listens there)
// exits at start naming the address and gRPC's reason, instead of starting
// and failing every save later.
TEST_F(AgentE2ETest, WrongCoordinatorExitsAtStartNamingTheAddress) {
  // Bound, never listened on: connections are refused.
  const int port = testing::FreeLoopbackPort();
  ASSERT_NE(port, 0);
  const std::string wrong = absl::StrCat("127.0.0.1:", port);
  std::string out;
  // A hang guard: the first-contact timeout is 5 s.
  EXPECT_EQ(Run({Binaries().agent, "--node-id", "0", "--listen-unix", Socket(0),
                 "--num-nodes", "1", "--coordinator", wrong},
                &out, absl::Seconds(60)),
            1)
      << out;
  EXPECT_THAT(
      out, HasSubstr(absl::StrCat("cairnd at ", wrong, " was never reached")));
  EXPECT_THAT(out, HasSubstr("Connection refused"));
}

}  // namespace
}  // namespace cairn
