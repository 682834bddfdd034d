// The agent registry through the coordinator (its catalog on disk): ids by
// node name, kept across a cairnd restart; the lowest free id for a new name;
// limits; input errors naming the field.
#include "server/coordinator/agent_registry.h"

#include <future>
#include <set>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "server/coordinator/coordinator_test_fixture.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class AgentRegistryTest : public CoordinatorTest {
 protected:
  absl::StatusOr<v1::RegisterAgentResponse> Register(const std::string& name,
                                                     const std::string& address,
                                                     int num_nodes = 8) {
    v1::RegisterAgentRequest r;
    r.set_node_name(name);
    r.set_peer_address(address);
    r.set_num_nodes(num_nodes);
    return coordinator_->agents().Register(r);
  }
  int IdOf(const std::string& name, const std::string& address,
           int num_nodes = 8) {
    auto r = Register(name, address, num_nodes);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->node_id() : -1;
  }
  // The table as "name=id@address" strings, by id.
  std::vector<std::string> Table() {
    std::vector<std::string> out;
    const v1::ListAgentsResponse list = coordinator_->agents().List();
    for (const v1::AgentRecord& a : list.agents()) {
      out.push_back(
          absl::StrCat(a.node_name(), "=", a.node_id(), "@", a.peer_address()));
    }
    return out;
  }
};

TEST_F(AgentRegistryTest, SameNameGetsSameIdAcrossCairndRestart) {
  Start();
  EXPECT_EQ(IdOf("gpu-node-a", "10.0.0.1:7071"), 0);
  EXPECT_EQ(IdOf("gpu-node-b", "10.0.0.2:7071"), 1);
  EXPECT_EQ(IdOf("gpu-node-c", ""), 2);
  // The agent of b restarts in a new pod (new IP): same id, new address.
  auto again = Register("gpu-node-b", "10.0.0.7:7071");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->node_id(), 1);
  EXPECT_FALSE(again->first_registration());

  // cairnd restarts with the same catalog.
  coordinator_.reset();
  Start();
  EXPECT_THAT(Table(), ::testing::ElementsAre("gpu-node-a=0@10.0.0.1:7071",
                                              "gpu-node-b=1@10.0.0.7:7071",
                                              "gpu-node-c=2@"));
  // Re-registration in another order changes no id.
  EXPECT_EQ(IdOf("gpu-node-c", "10.0.0.3:7071"), 2);
  EXPECT_EQ(IdOf("gpu-node-a", "10.0.0.1:7071"), 0);
  auto d = Register("gpu-node-d", "10.0.0.4:7071");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node_id(), 3);
  EXPECT_TRUE(d->first_registration());
}

TEST_F(AgentRegistryTest, ConcurrentNewNamesGetDistinctIds) {
  Start();
  constexpr int kAgents = 32;
  std::vector<std::future<int>> ids;
  for (int i = 0; i < kAgents; ++i) {
    ids.push_back(std::async(std::launch::async, [this, i] {
      return IdOf(absl::StrCat("node-", i), absl::StrCat("10.0.1.", i, ":1"),
                  kAgents);
    }));
  }
  std::set<int> seen;
  for (auto& f : ids) seen.insert(f.get());
  // Every id of 0..kAgents-1 exactly once.
  EXPECT_EQ(seen.size(), static_cast<size_t>(kAgents));
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), kAgents - 1);
}

TEST_F(AgentRegistryTest, IdsBeyondNumNodesAreRefusedNamingTheLimit) {
  Start();
  EXPECT_EQ(IdOf("a", "h:1", 2), 0);
  EXPECT_EQ(IdOf("b", "h:2", 2), 1);
  auto c = Register("c", "h:3", 2);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("'c'"), HasSubstr("--num-nodes 2"),
                                HasSubstr("a=0, b=1"))));
  // A known name whose id the agent's num_nodes excludes.
  auto b = Register("b", "h:2", 1);
  EXPECT_THAT(b, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("at least 2")));
}

TEST_F(AgentRegistryTest, ForgottenNodeFreesItsIdForANewName) {
  Start();
  EXPECT_EQ(IdOf("a", "h:1", 2), 0);
  EXPECT_EQ(IdOf("b", "h:2", 2), 1);
  v1::ForgetAgentRequest forget;
  forget.set_node_name("a");
  auto f = coordinator_->agents().Forget(forget);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->node_id(), 0);
  auto again = coordinator_->agents().Forget(forget);
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kNotFound, HasSubstr("'a'")));
  // The replacement node has a new name; the freed id survives a restart.
  coordinator_.reset();
  Start();
  EXPECT_EQ(IdOf("a-replacement", "h:3", 2), 0);
  EXPECT_THAT(Table(),
              ::testing::ElementsAre("a-replacement=0@h:3", "b=1@h:2"));
}

TEST_F(AgentRegistryTest, MaxAgentsBoundsTheTable) {
  options_.max_agents = 2;
  Start();
  EXPECT_EQ(IdOf("a", "h:1"), 0);
  EXPECT_EQ(IdOf("b", "h:2"), 1);
  auto c = Register("c", "h:3");
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kResourceExhausted,
                          HasSubstr("--max-agents")));
  EXPECT_EQ(IdOf("a", "h:9"), 0);  // known names still re-register
}

TEST_F(AgentRegistryTest, BadInputIsInvalidArgumentNamingTheField) {
  Start();
  struct Case {
    std::string name, address;
    int num_nodes;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"", "h:1", 2, "node_name ''"},
      {std::string(254, 'n'), "h:1", 2, "node_name"},
      {"bad/name", "h:1", 2, "node_name 'bad/name'"},
      {"bad name", "h:1", 2, "node_name"},
      {"n", "nohostport", 2, "peer_address 'nohostport'"},
      {"n", "h:0", 2, "the port must be 1 to 65535"},
      {"n", "h:65536", 2, "the port must be 1 to 65535"},
      {"n", "h:x", 2, "peer_address"},
      {"n", ":7071", 2, "the host must be"},
      {"n", "0.0.0.0:7071", 2, "--peer-advertise"},
      {"n", "[::1]:7071", 2, "the host must be"},
      {"n", "h:1", 0, "num_nodes 0"},
  };
  for (const Case& c : cases) {
    auto r = Register(c.name, c.address, c.num_nodes);
    EXPECT_THAT(
        r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.expect)))
        << c.name << " " << c.address;
  }
  EXPECT_TRUE(Table().empty());  // nothing was recorded
  v1::ForgetAgentRequest forget;
  EXPECT_THAT(coordinator_->agents().Forget(forget),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace cairn::coordinator
