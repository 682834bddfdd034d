// NodeIdentity: the flags' combinations, the advertise-address rules, peers
// from --peers and --peer-dir, and registration with a real cairnd
// (CoordinatorServer on loopback) under --node-id auto.
#include "server/agent/node_identity.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::IsOk;
using ::cairn::testing::MakeTempDir;
using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// ---- the advertise address ------------------------------------------------

TEST(AdvertisedAddressTest, HostAndPortGivenAreTaken) {
  absl::StatusOr<AdvertisedAddress> a =
      ResolveAdvertisedAddress("10.0.0.5:9000", "0.0.0.0:7071", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 9000);
}

TEST(AdvertisedAddressTest, AHostAloneTakesTheListenPort) {
  absl::StatusOr<AdvertisedAddress> a =
      ResolveAdvertisedAddress("10.0.0.5", "0.0.0.0:7071", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 7071);
}

TEST(AdvertisedAddressTest, NoHostIsTheListenHostElseTheHostName) {
  absl::StatusOr<AdvertisedAddress> a =
      ResolveAdvertisedAddress("", "192.168.1.2:7071", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "192.168.1.2");
  EXPECT_EQ(a->port, 7071);
  a = ResolveAdvertisedAddress("", "0.0.0.0:7071", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "node7");
  // A port alone: the host from --peer-listen's rule.
  a = ResolveAdvertisedAddress(":8000", "0.0.0.0:7071", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "node7");
  EXPECT_EQ(a->port, 8000);
}

TEST(AdvertisedAddressTest, AnyPortIsKnownOnlyOnceBound) {
  absl::StatusOr<AdvertisedAddress> a =
      ResolveAdvertisedAddress("10.0.0.5", "0.0.0.0:0", "node7");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->port, 0);
}

TEST(AdvertisedAddressTest, APortOutside1To65535IsAUsageError) {
  for (const char* bad : {"h:0", "h:65536", "h:x", "h:"}) {
    EXPECT_THAT(
        ResolveAdvertisedAddress(bad, "0.0.0.0:7071", "node7"),
        StatusIs(kInvalid, absl::StrCat("--peer-advertise '", bad,
                                        "': the port must be 1 to 65535")))
        << bad;
  }
}

// ---- --peers and --peer-dir -----------------------------------------------

TEST(ListedPeerTest, TheListInNodeIdOrderThenThePeerDir) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/node-2") << "h2:7071\n";
  const std::vector<std::string> peers = {"h0:7071", "h1:7071"};
  EXPECT_EQ(ResolveListedPeer(peers, dir, 0).value(), "h0:7071");
  EXPECT_EQ(ResolveListedPeer(peers, dir, 1).value(), "h1:7071");
  EXPECT_EQ(ResolveListedPeer(peers, dir, 2).value(), "h2:7071");
  EXPECT_EQ(ResolveListedPeer({}, dir, 2).value(), "h2:7071");
  std::filesystem::remove_all(dir);
}

TEST(ListedPeerTest, ANodeInNeitherIsNotFoundNamingIt) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  EXPECT_THAT(ResolveListedPeer({"h0:7071"}, dir, 3),
              StatusIs(absl::StatusCode::kNotFound,
                       "no peer address known for node 3"));
  EXPECT_THAT(ResolveListedPeer({}, "", -1),
              StatusIs(absl::StatusCode::kNotFound,
                       "no peer address known for node -1"));
  std::filesystem::remove_all(dir);
}

TEST(ListedPeerTest, APublishedAddressIsFoundInThePeerDir) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string peer_dir = dir + "/made/by/publish";
  ASSERT_THAT(PublishPeerAddress(peer_dir, 4, "h4:7071"), IsOk());
  EXPECT_EQ(ResolveListedPeer({}, peer_dir, 4).value(), "h4:7071");
  ASSERT_THAT(PublishPeerAddress(peer_dir, 4, "h4b:7072"), IsOk());
  EXPECT_EQ(ResolveListedPeer({}, peer_dir, 4).value(), "h4b:7072");
  std::filesystem::remove_all(dir);
}

TEST(ListedPeerTest, AnUnusablePeerDirIsAnError) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/file") << "x";
  EXPECT_THAT(PublishPeerAddress(dir + "/file", 0, "h:1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "--peer-dir " + dir + "/file: Not a directory"));
  EXPECT_THAT(PublishPeerAddress(dir + "/file/sub", 0, "h:1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--peer-dir " + dir + "/file/sub")));
  std::filesystem::remove_all(dir);
}

// ---- the flags' combinations ----------------------------------------------

NodeIdentityOptions Fixed(int id) {
  NodeIdentityOptions o;
  o.node_id = absl::StrCat(id);
  o.peer_listen = "0.0.0.0:0";
  o.host_name = "host-a";
  return o;
}

NodeIdentityOptions Auto(const std::string& coordinator) {
  NodeIdentityOptions o;
  o.node_id = "auto";
  o.peer_listen = "127.0.0.1:0";
  o.coordinator = coordinator;
  o.host_name = "host-a";
  o.num_nodes = 4;
  o.register_timeout = absl::Seconds(5);
  return o;
}

TEST(NodeIdentityTest, AutoFindsPeersThroughCairndOnly) {
  NodeIdentityOptions o = Auto("127.0.0.1:1");
  o.peers = "h0:1,h1:1";
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid,
                       "--node-id auto finds peers through cairnd; drop "
                       "--peers and --peer-dir"));
  o = Auto("127.0.0.1:1");
  o.peer_dir = "/shared/peers";
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid, HasSubstr("drop --peers and --peer-dir")));
}

TEST(NodeIdentityTest, AutoInKubernetesNeedsANodeName) {
  NodeIdentityOptions o = Auto("127.0.0.1:1");
  o.in_kubernetes = true;
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid, HasSubstr("--node-id auto in Kubernetes "
                                           "needs --node-name")));
  o.node_name = "gpu-node-3";
  absl::StatusOr<std::unique_ptr<NodeIdentity>> identity =
      NodeIdentity::Create(o);
  ASSERT_THAT(identity, IsOk());
  EXPECT_EQ((*identity)->node_name(), "gpu-node-3");
}

TEST(NodeIdentityTest, AutoWithoutANodeNameIsTheHostName) {
  absl::StatusOr<std::unique_ptr<NodeIdentity>> identity =
      NodeIdentity::Create(Auto("127.0.0.1:1"));
  ASSERT_THAT(identity, IsOk());
  EXPECT_TRUE((*identity)->automatic());
  EXPECT_EQ((*identity)->node_name(), "host-a");
  EXPECT_EQ((*identity)->num_nodes(), 4);
}

TEST(NodeIdentityTest, AutoChecksTheAdvertisePort) {
  NodeIdentityOptions o = Auto("127.0.0.1:1");
  o.peer_advertise = "10.0.0.1:99999";
  o.peer_advertise_given = true;
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid, HasSubstr("the port must be 1 to 65535")));
}

TEST(NodeIdentityTest, NodeNameAndPeerAdvertiseNeedAuto) {
  NodeIdentityOptions o = Fixed(0);
  o.node_name_given = true;  // even empty
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid,
                       "--node-name and --peer-advertise need --node-id auto"));
  o = Fixed(0);
  o.peer_advertise = "10.0.0.1";
  o.peer_advertise_given = true;
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid, HasSubstr("need --node-id auto")));
}

TEST(NodeIdentityTest, ABadNodeIdIsAUsageError) {
  NodeIdentityOptions o = Fixed(0);
  o.node_id = "-2";
  EXPECT_THAT(NodeIdentity::Create(o),
              StatusIs(kInvalid, "--node-id: must be >= 0 or 'auto', got -2"));
}

TEST(NodeIdentityTest, NumNodesIsTheFlagElseThePeerCountElseTheDefault) {
  NodeIdentityOptions o = Fixed(1);
  o.peers = "h0:1,h1:1,h2:1";
  EXPECT_EQ(NodeIdentity::Create(o).value()->num_nodes(), 3);
  o.num_nodes = 8;
  o.num_nodes_given = true;
  EXPECT_EQ(NodeIdentity::Create(o).value()->num_nodes(), 8);
  EXPECT_EQ(NodeIdentity::Create(Fixed(0)).value()->num_nodes(), 1);
}

TEST(NodeIdentityTest, AGivenIdPublishesToThePeerDirAndResolvesFromIt) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  NodeIdentityOptions o = Fixed(2);
  o.peers = "h0:7071";
  o.peer_dir = dir;
  o.num_nodes = 3;
  o.num_nodes_given = true;
  absl::StatusOr<std::unique_ptr<NodeIdentity>> identity =
      NodeIdentity::Create(o);
  ASSERT_THAT(identity, IsOk());
  NodeIdentity& n = **identity;
  EXPECT_FALSE(n.automatic());
  ASSERT_THAT(n.Register(), IsOk());
  EXPECT_EQ(n.node_id(), 2);
  ASSERT_THAT(n.Announce(7075), IsOk());
  // Listening on 0.0.0.0: published under the host name.
  auto resolve = n.PeerResolver();
  EXPECT_EQ(resolve(2).value(), "host-a:7075");
  EXPECT_EQ(resolve(0).value(), "h0:7071");
  EXPECT_THAT(resolve(1), StatusIs(absl::StatusCode::kNotFound,
                                   "no peer address known for node 1"));
  std::filesystem::remove_all(dir);
}

TEST(NodeIdentityTest, AListenHostIsPublishedAsIs) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  NodeIdentityOptions o = Fixed(0);
  o.peer_listen = "10.2.0.7:0";
  o.peer_dir = dir;
  absl::StatusOr<std::unique_ptr<NodeIdentity>> identity =
      NodeIdentity::Create(o);
  ASSERT_THAT(identity, IsOk());
  ASSERT_THAT((*identity)->Announce(4000), IsOk());
  EXPECT_EQ(ResolveListedPeer({}, dir, 0).value(), "10.2.0.7:4000");
  std::filesystem::remove_all(dir);
}

// ---- --node-id auto against cairnd ----------------------------------------

class AutoNodeIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_THAT(c, IsOk());
    cairnd_ = std::move(*c);
  }
  void TearDown() override {
    cairnd_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string Address() const {
    return absl::StrCat("127.0.0.1:", cairnd_->port());
  }

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
};

TEST_F(AutoNodeIdentityTest, AKnownPortIsRegisteredAtOnce) {
  NodeIdentityOptions o = Auto(Address());
  o.node_name = "node-a";
  o.peer_advertise = "10.1.0.1:7071";
  o.peer_advertise_given = true;
  absl::StatusOr<std::unique_ptr<NodeIdentity>> a = NodeIdentity::Create(o);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT((*a)->Register(), IsOk());
  EXPECT_EQ((*a)->node_id(), 0);
  EXPECT_EQ((*a)->PeerResolver()(0).value(), "10.1.0.1:7071");
  ASSERT_THAT((*a)->Announce(5555), IsOk());  // the advertised port stays
  EXPECT_EQ((*a)->PeerResolver()(0).value(), "10.1.0.1:7071");
}

TEST_F(AutoNodeIdentityTest, AnyPortIsStartingUntilAnnounced) {
  NodeIdentityOptions o = Auto(Address());
  o.node_name = "node-a";
  ASSERT_THAT(NodeIdentity::Create(o).value()->Register(), IsOk());
  o.node_name = "node-b";
  absl::StatusOr<std::unique_ptr<NodeIdentity>> b = NodeIdentity::Create(o);
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT((*b)->Register(), IsOk());
  EXPECT_EQ((*b)->node_id(), 1);
  auto resolve = (*b)->PeerResolver();
  EXPECT_THAT(resolve(1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("'node-b'")));
  ASSERT_THAT((*b)->Announce(7072), IsOk());
  EXPECT_EQ(resolve(1).value(), "127.0.0.1:7072");
}

TEST(NodeIdentityRegisterTest, AnUnreachableCairndFailsNamingTheNode) {
  NodeIdentityOptions o = Auto("127.0.0.1:1");
  o.node_name = "node-z";
  o.register_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<NodeIdentity>> z = NodeIdentity::Create(o);
  ASSERT_THAT(z, IsOk());
  EXPECT_THAT((*z)->Register(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("registering node 'node-z': ")));
}

}  // namespace
}  // namespace cairn::agent
