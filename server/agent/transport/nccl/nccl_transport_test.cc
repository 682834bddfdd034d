// NcclTransport's host-only pieces: the announce frame and the lazy,
// collective bootstrap (over the loopback device link). Message delivery is
// covered by transport/transport_conformance_test.cc.
#include "server/agent/transport/nccl/nccl_transport.h"

#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/transport/nccl/loopback_device_link.h"

namespace cairn::agent {
namespace {

using ::testing::HasSubstr;

TEST(NcclAnnounceTest, RoundTripsAndRejectsGarbage) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    internal::Announce a;
    a.tag = rng() & ~kControlTagBit;
    a.length = rng();
    a.seq = rng();
    const std::string f = internal::EncodeAnnounce(a);
    ASSERT_EQ(f.size(), internal::kAnnounceBytes);
    absl::StatusOr<internal::Announce> b = internal::DecodeAnnounce(f);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->tag, a.tag);
    EXPECT_EQ(b->length, a.length);
    EXPECT_EQ(b->seq, a.seq);
  }
  EXPECT_EQ(internal::DecodeAnnounce("short").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad = internal::EncodeAnnounce({});
  bad[0] ^= 1;
  EXPECT_THAT(std::string(internal::DecodeAnnounce(bad).status().message()),
              HasSubstr("malformed announce"));
  internal::Announce control;
  control.tag = kControlTagBit | 1;
  EXPECT_EQ(internal::DecodeAnnounce(internal::EncodeAnnounce(control))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, StartWithoutDeviceLinkIsInvalidArgument) {
  NcclTransportOptions o;
  o.control.node_id = 0;
  o.control.num_nodes = 1;
  auto t = NcclTransport::Start(o, nullptr);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

// Node 1 of 3 sends a device message while node 2 never uses the transport
// and node 0 only receives: the ids still reach every node, all join, and
// the message goes through the device link.
TEST(NcclTransportTest, BootstrapIsCollectiveAndLazy) {
  auto fabric = std::make_shared<LoopbackFabric>();
  std::vector<int> ports(3, 0);
  std::vector<std::unique_ptr<NcclTransport>> nodes;
  for (int i = 0; i < 3; ++i) {
    NcclTransportOptions o;
    o.control.node_id = i;
    o.control.num_nodes = 3;
    o.control.resolve_peer = [&ports](int p) -> absl::StatusOr<std::string> {
      return absl::StrCat("127.0.0.1:", ports[p]);
    };
    o.init_timeout = absl::Seconds(20);
    auto t =
        NcclTransport::Start(o, std::make_unique<LoopbackDeviceLink>(fabric));
    ASSERT_TRUE(t.ok()) << t.status();
    ports[i] = (*t)->port();
    nodes.push_back(std::move(*t));
  }
  const std::string big(NcclTransport::kInlineBytes + 1, 'q');
  ASSERT_TRUE(nodes[1]->Send(0, 12, big).ok());
  absl::StatusOr<std::string> m =
      nodes[0]->RecvMessage(1, 12, absl::Seconds(20));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, big);
  EXPECT_EQ(nodes[1]->device_messages_sent(), 1u);
  EXPECT_EQ(nodes[0]->device_messages_received(), 1u);
  // Small messages stay on the control transport.
  ASSERT_TRUE(nodes[2]->Send(1, 13, std::string("small")).ok());
  ASSERT_TRUE(nodes[1]->RecvMessage(2, 13, absl::Seconds(20)).ok());
  EXPECT_EQ(nodes[2]->device_messages_sent(), 0u);
}

// A node whose peers never join fails its device message with a named
// deadline instead of hanging.
TEST(NcclTransportTest, JoinTimeoutFailsTheSendNamingTheNode) {
  auto fabric = std::make_shared<LoopbackFabric>();
  NcclTransportOptions o;
  o.control.node_id = 0;
  o.control.num_nodes = 2;
  o.control.connect_timeout = absl::Milliseconds(200);
  o.control.resolve_peer = [](int p) -> absl::StatusOr<std::string> {
    return absl::NotFoundError(absl::StrCat("node ", p));
  };
  o.init_timeout = absl::Milliseconds(300);
  auto t =
      NcclTransport::Start(o, std::make_unique<LoopbackDeviceLink>(fabric));
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Status s =
      (*t)->Send(1, 1, std::string(NcclTransport::kInlineBytes + 1, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("1 of 2 nodes joined"));
}

}  // namespace
}  // namespace cairn::agent
