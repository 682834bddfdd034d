// NcclTransport's host-only pieces: the announce frame, the lazy,
// collective bootstrap and the bound on a transfer a peer never completes
// (over the loopback device link), and AwaitTransfer (the wait
// NcclDeviceLink polls the GPU with). Message delivery is
// covered by transport/transport_conformance_test.cc.
#include "server/agent/transport/nccl/nccl_transport.h"

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/transport/nccl/loopback_device_link.h"
#include "server/agent/transport/nccl/transfer_wait.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
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
  EXPECT_THAT(internal::DecodeAnnounce("short"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::string bad = internal::EncodeAnnounce({});
  bad[0] ^= 1;
  EXPECT_THAT(std::string(internal::DecodeAnnounce(bad).status().message()),
              HasSubstr("malformed announce"));
  internal::Announce control;
  control.tag = kControlTagBit | 1;
  EXPECT_THAT(internal::DecodeAnnounce(internal::EncodeAnnounce(control)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// An announce's bytes, written out by hand from the frame at the top of
// nccl_transport.h.
TEST(NcclAnnounceTest, BytesAreFixed) {
  const std::string want(
      "CRNA"                               // magic
      "\x00\x00\x00\x00"                   // reserved
      "\x18\x17\x16\x15\x14\x13\x12\x11"   // tag
      "\x28\x27\x26\x25\x24\x23\x22\x21"   // length
      "\x38\x37\x36\x35\x34\x33\x32\x31",  // seq
      internal::kAnnounceBytes);
  internal::Announce a;
  a.tag = 0x1112131415161718;
  a.length = 0x2122232425262728;
  a.seq = 0x3132333435363738;
  EXPECT_EQ(absl::BytesToHexString(internal::EncodeAnnounce(a)),
            absl::BytesToHexString(want));
  absl::StatusOr<internal::Announce> b = internal::DecodeAnnounce(want);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->tag, a.tag);
  EXPECT_EQ(b->length, a.length);
  EXPECT_EQ(b->seq, a.seq);
}

TEST(NcclTransportTest, StartWithoutDeviceLinkIsInvalidArgument) {
  NcclTransportOptions o;
  o.control.node_id = 0;
  o.control.num_nodes = 1;
  auto t = NcclTransport::Start(o, nullptr);
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kInvalidArgument));
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
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          HasSubstr("1 of 2 nodes joined")));
}

TEST(AwaitTransferTest, DoneReturnsOkWithoutAborting) {
  int polls = 0, aborts = 0;
  absl::Status s = AwaitTransfer(
      [&]() -> absl::StatusOr<bool> { return ++polls >= 3; }, [&] { ++aborts; },
      absl::Now() + absl::Minutes(1), absl::Minutes(1), "ncclSend to node 1");
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(aborts, 0);
}

TEST(AwaitTransferTest, ACommunicatorErrorAbortsAndNamesTheTransfer) {
  int aborts = 0;
  absl::Status s = AwaitTransfer(
      []() -> absl::StatusOr<bool> {
        return absl::InternalError("remote process exited");
      },
      [&] { ++aborts; }, absl::Now() + absl::Minutes(1), absl::Minutes(1),
      "ncclRecv of 8 bytes from node 2");
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kInternal,
               HasSubstr("ncclRecv of 8 bytes from node 2: remote process")));
  EXPECT_EQ(aborts, 1);
}

// A transfer the peer never completes (it died mid-transfer) ends at the
// deadline: aborted once, DEADLINE_EXCEEDED naming it and the timeout.
TEST(AwaitTransferTest, PastTheDeadlineAbortsOnce) {
  int aborts = 0;
  absl::Status s =
      AwaitTransfer([]() -> absl::StatusOr<bool> { return false; },
                    [&] { ++aborts; }, absl::Now() + absl::Milliseconds(50),
                    absl::Milliseconds(50), "ncclSend of 8 bytes to node 1");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                  HasSubstr("ncclSend of 8 bytes to node 1 did not complete "
                            "within 50ms")));
  EXPECT_EQ(aborts, 1);
}

// The device side of node 0 stops mid-transfer (its Recv never takes the
// bytes, as a GPU whose process died) while its control transport still
// answers: node 1's Send fails at transfer_timeout naming node 0 and its
// address, and the next device message to node 0 fails at once (the
// communicator was aborted) instead of hanging.
class StalledRecvLink : public DeviceLink {
 public:
  explicit StalledRecvLink(std::shared_ptr<LoopbackFabric> fabric)
      : inner_(std::move(fabric)) {}
  absl::StatusOr<std::string> NewUniqueId() override {
    return inner_.NewUniqueId();
  }
  absl::Status Init(int num_nodes, int node, const std::string& up_id,
                    const std::string& down_id,
                    absl::Duration timeout) override {
    return inner_.Init(num_nodes, node, up_id, down_id, timeout);
  }
  absl::Status Send(int peer, absl::Span<const char> data,
                    absl::Duration timeout) override {
    return inner_.Send(peer, data, timeout);
  }
  absl::Status Recv(int peer, absl::Span<char> out,
                    absl::Duration timeout) override {
    stalled_.Notify();
    release_.WaitForNotification();
    return inner_.Recv(peer, out, timeout);
  }
  absl::Notification& stalled() { return stalled_; }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  LoopbackDeviceLink inner_;
  absl::Notification stalled_, release_;
};

TEST(NcclTransportTest, PeerDyingMidTransferFailsTheSendNamingThePeer) {
  auto fabric = std::make_shared<LoopbackFabric>();
  std::vector<int> ports(2, 0);
  std::vector<std::unique_ptr<NcclTransport>> nodes;
  StalledRecvLink* stalled = nullptr;
  for (int i = 0; i < 2; ++i) {
    NcclTransportOptions o;
    o.control.node_id = i;
    o.control.num_nodes = 2;
    o.control.resolve_peer = [&ports](int p) -> absl::StatusOr<std::string> {
      return absl::StrCat("127.0.0.1:", ports[p]);
    };
    o.init_timeout = absl::Seconds(20);
    o.transfer_timeout = absl::Seconds(1);
    std::unique_ptr<DeviceLink> link;
    if (i == 0) {
      auto l = std::make_unique<StalledRecvLink>(fabric);
      stalled = l.get();
      link = std::move(l);
    } else {
      link = std::make_unique<LoopbackDeviceLink>(fabric);
    }
    auto t = NcclTransport::Start(o, std::move(link));
    ASSERT_TRUE(t.ok()) << t.status();
    ports[i] = (*t)->port();
    nodes.push_back(std::move(*t));
  }
  const std::string big(NcclTransport::kInlineBytes + 1, 'q');
  absl::Status sent = absl::UnknownError("not run");
  absl::Notification done;
  std::thread sender([&] {
    sent = nodes[1]->Send(0, 12, big);
    done.Notify();
  });
  // A hang guard, far beyond transfer_timeout.
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    ADD_FAILURE() << "the send to a stalled peer still waits after 60 s";
  }
  stalled->Release();  // node 0's pump goes on (and times out itself)
  sender.join();
  EXPECT_TRUE(stalled->stalled().HasBeenNotified());
  EXPECT_THAT(sent, StatusIs(absl::StatusCode::kDeadlineExceeded,
                             AllOf(HasSubstr(absl::StrCat(
                                       "to node 0 (127.0.0.1:", ports[0], ")")),
                                   HasSubstr("did not complete"))));
  // The direction's communicator is gone: the next message fails at once.
  absl::Status again = nodes[1]->Send(0, 13, big);
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("aborted")));
  // Small messages still go over the control transport.
  ASSERT_TRUE(nodes[1]->Send(0, 14, std::string("small")).ok());
  EXPECT_TRUE(nodes[0]->RecvMessage(1, 14, absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace cairn::agent
