// AgentDirectory against a real cairnd (CoordinatorServer on loopback):
// registration (ids by node name, retried while cairnd is not up, bounded by
// register_timeout), and peer addresses from the registry's table.
#include "server/agent/agent_directory.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class AgentDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::cairn::testing::MakeTempDir("agent-directory");
    ASSERT_FALSE(dir_.empty());
    StartCairnd(0);
  }
  void TearDown() override {
    cairnd_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartCairnd(int port) {
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = absl::StrCat("127.0.0.1:", port);
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
    port_ = cairnd_->port();
  }
  AgentDirectoryOptions Options(const std::string& name, int num_nodes = 4) {
    AgentDirectoryOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", port_);
    o.node_name = name;
    o.num_nodes = num_nodes;
    o.min_refresh_interval = absl::ZeroDuration();  // every Resolve asks
    o.rpc_timeout = absl::Seconds(1);
    return o;
  }

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
  int port_ = 0;
};

TEST_F(AgentDirectoryTest, RestartedAgentKeepsItsIdAndPeersSeeItsNewAddress) {
  AgentDirectory a(Options("node-a")), b(Options("node-b"));
  ASSERT_EQ(a.Register("10.1.0.1:7071").value(), 0);
  ASSERT_EQ(b.Register("10.1.0.2:7071").value(), 1);
  EXPECT_EQ(a.Resolve(1).value(), "10.1.0.2:7071");
  // node-b's agent restarts in a new pod: a new directory, a new address.
  AgentDirectory b2(Options("node-b"));
  ASSERT_EQ(b2.Register("10.1.0.9:7071").value(), 1);
  EXPECT_EQ(a.Resolve(1).value(), "10.1.0.9:7071");
  EXPECT_EQ(b2.Resolve(0).value(), "10.1.0.1:7071");
}

TEST_F(AgentDirectoryTest, UnknownNodeFailsAtOnceAndStartingNodeIsUnavailable) {
  AgentDirectory a(Options("node-a")), b(Options("node-b"));
  ASSERT_EQ(a.Register("10.1.0.1:7071").value(), 0);
  ASSERT_EQ(b.Register("").value(), 1);  // registered, not serving yet
  absl::StatusOr<std::string> starting = a.Resolve(1);
  EXPECT_THAT(starting,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("'node-b'")));
  absl::StatusOr<std::string> unknown = a.Resolve(3);
  EXPECT_THAT(unknown,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no agent has registered as node 3")));
}

TEST_F(AgentDirectoryTest, KnownPeersStayResolvableWhileCairndIsDown) {
  AgentDirectory a(Options("node-a")), b(Options("node-b"));
  ASSERT_EQ(a.Register("10.1.0.1:7071").value(), 0);
  ASSERT_EQ(b.Register("10.1.0.2:7071").value(), 1);
  ASSERT_EQ(a.Resolve(1).value(), "10.1.0.2:7071");
  const int64_t before = a.refreshes();
  cairnd_.reset();
  EXPECT_EQ(a.Resolve(1).value(), "10.1.0.2:7071");  // from the last table
  EXPECT_GT(a.refreshes(), before);                  // it did try cairnd
  // A node the last table does not hold: cairnd's answer is unknown, so the
  // caller may retry.
  EXPECT_THAT(a.Resolve(2), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(AgentDirectoryTest, ResolveReusesARecentTable) {
  AgentDirectoryOptions o = Options("node-a");
  o.min_refresh_interval = absl::Hours(1);
  AgentDirectory a(o), b(Options("node-b"));
  ASSERT_EQ(a.Register("10.1.0.1:7071").value(), 0);
  ASSERT_EQ(b.Register("10.1.0.2:7071").value(), 1);
  ASSERT_TRUE(a.Resolve(1).ok());
  ASSERT_TRUE(a.Resolve(0).ok());
  ASSERT_TRUE(a.Resolve(1).ok());
  EXPECT_EQ(a.refreshes(), 1);
}

TEST_F(AgentDirectoryTest, RegistrationWaitsForACairndThatStartsLater) {
  const int port = port_;
  cairnd_.reset();  // cairnd is down; it comes back on the same port
  AgentDirectoryOptions o = Options("node-a");
  o.register_timeout = absl::Seconds(60);
  AgentDirectory a(o);
  absl::StatusOr<int> id = absl::UnknownError("not run");
  std::thread registering([&] { id = a.Register("10.1.0.1:7071"); });
  absl::SleepFor(absl::Milliseconds(500));
  StartCairnd(port);
  registering.join();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 0);
}

TEST_F(AgentDirectoryTest, RegistrationGivesUpAfterItsTimeoutNamingCairnd) {
  const int port = port_;
  cairnd_.reset();
  AgentDirectoryOptions o = Options("node-a");
  o.register_timeout = absl::Seconds(1);
  AgentDirectory a(o);
  absl::StatusOr<int> id = a.Register("10.1.0.1:7071");
  EXPECT_THAT(
      id, StatusIs(absl::StatusCode::kDeadlineExceeded,
                   AllOf(HasSubstr(absl::StrCat("cairnd at 127.0.0.1:", port)),
                         HasSubstr("'node-a'"))));
}

TEST_F(AgentDirectoryTest, RefusedRegistrationIsNotRetried) {
  AgentDirectoryOptions o = Options("bad/name");
  o.register_timeout = absl::Hours(1);  // a retry would hang the test
  AgentDirectory bad(o);
  absl::StatusOr<int> id = bad.Register("10.1.0.1:7071");
  EXPECT_THAT(id, StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("node_name 'bad/name'")));
  AgentDirectory a(Options("a", 1)), b(Options("b", 1));
  ASSERT_EQ(a.Register("h:1").value(), 0);
  id = b.Register("h:2");
  EXPECT_THAT(id, StatusIs(absl::StatusCode::kResourceExhausted,
                           HasSubstr("--num-nodes 1")));
}

}  // namespace
}  // namespace cairn::agent
