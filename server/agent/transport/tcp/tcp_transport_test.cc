#include "server/agent/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/little_endian.h"
#include "common/testing/status_matchers.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/transport/tcp/test_certs.h"
#include "storage/checksum.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string RandomBytes(size_t n, std::mt19937& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Two (or more) transports in this process, resolving each other's ports.
struct Cluster {
  std::vector<int> ports;
  std::vector<std::unique_ptr<TcpTransport>> nodes;

  static std::unique_ptr<Cluster> Make(
      int n, ControlHandler handler = {},
      std::function<void(TcpTransportOptions&)> tweak = {}) {
    auto c = std::make_unique<Cluster>();
    c->ports.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      TcpTransportOptions o;
      o.node_id = i;
      o.num_nodes = n;
      o.connect_timeout = absl::Milliseconds(300);
      o.resolve_peer = [cl = c.get()](int peer) -> absl::StatusOr<std::string> {
        if (peer < 0 || peer >= static_cast<int>(cl->ports.size()) ||
            cl->ports[peer] == 0) {
          return absl::NotFoundError(absl::StrCat("node ", peer));
        }
        return absl::StrCat("127.0.0.1:", cl->ports[peer]);
      };
      o.control_handler = handler;
      if (tweak) tweak(o);
      auto t = TcpTransport::Start(o);
      EXPECT_TRUE(t.ok()) << t.status();
      c->ports[i] = (*t)->port();
      c->nodes.push_back(std::move(*t));
    }
    return c;
  }
};

TEST(TcpTransportTest, DeliversEveryMessageByTagInAnyOrder) {
  auto c = Cluster::Make(2);
  std::mt19937 rng(42);
  std::vector<std::string> sent;
  for (int i = 0; i < 200; ++i) {
    const size_t n = (i % 7 == 0) ? 0 : rng() % (i % 3 == 0 ? 300000 : 700);
    sent.push_back(RandomBytes(n, rng));
    ASSERT_TRUE(c->nodes[0]->Send(1, 1000 + i, sent.back()).ok());
  }
  // Receive in reverse order: the mailbox is keyed by (peer, tag).
  for (int i = 199; i >= 0; --i) {
    std::string out(sent[i].size(), '\0');
    absl::Status s =
        c->nodes[1]->Recv(0, 1000 + i, absl::MakeSpan(out), absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(out, sent[i]) << "message " << i;
  }
}

TEST(TcpTransportTest, ConcurrentSendersBothDirections) {
  auto c = Cluster::Make(3);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      if (from == to) continue;
      threads.emplace_back([&, from, to] {
        std::mt19937 rng(from * 10 + to);
        for (int i = 0; i < 30; ++i) {
          std::string m = RandomBytes(rng() % 100000, rng);
          m.insert(0, absl::StrCat(from, "->", to, ":", i, "|"));
          if (!c->nodes[from]->Send(to, i, m).ok()) ++failures;
          std::string got;
          absl::StatusOr<std::string> r =
              c->nodes[to]->RecvMessage(from, i, absl::Seconds(10));
          if (!r.ok() || *r != m) ++failures;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(TcpTransportTest, CorruptPayloadIsDataLoss) {
  auto c = Cluster::Make(2);
  c->nodes[0]->CorruptNextSendForTest();
  ASSERT_TRUE(c->nodes[0]->Send(1, 7, std::string(5000, 'x')).ok());
  std::string out(5000, '\0');
  absl::Status s =
      c->nodes[1]->Recv(0, 7, absl::MakeSpan(out), absl::Seconds(10));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("crc32c")));
  // The connection stays usable.
  ASSERT_TRUE(c->nodes[0]->Send(1, 8, std::string(10, 'y')).ok());
  std::string ok(10, '\0');
  EXPECT_TRUE(
      c->nodes[1]->Recv(0, 8, absl::MakeSpan(ok), absl::Seconds(10)).ok());
  EXPECT_EQ(ok, std::string(10, 'y'));
}

TEST(TcpTransportTest, SizeMismatchTimeoutAndUnknownPeer) {
  auto c = Cluster::Make(2);
  ASSERT_TRUE(c->nodes[0]->Send(1, 1, std::string(10, 'a')).ok());
  std::string small(5, '\0');
  absl::Status s =
      c->nodes[1]->Recv(0, 1, absl::MakeSpan(small), absl::Seconds(10));
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expected 5")));
  s = c->nodes[1]->Recv(0, 2, absl::MakeSpan(small), absl::Milliseconds(50));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded));
  s = c->nodes[0]->Send(5, 1, std::string("x"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("bad peer node 5")));
}

// A resolver that knows the peer does not exist (FAILED_PRECONDITION: no
// agent registered as that node) ends the connect at once; any other error
// is retried until connect_timeout (the peer may be starting).
TEST(TcpTransportTest, ConnectRetriesResolveUnlessThePeerDoesNotExist) {
  for (const absl::StatusCode code : {absl::StatusCode::kFailedPrecondition,
                                      absl::StatusCode::kUnavailable}) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    TcpTransportOptions o;
    o.node_id = 0;
    o.num_nodes = 2;
    o.connect_timeout = absl::Milliseconds(300);
    o.resolve_peer = [calls, code](int peer) -> absl::StatusOr<std::string> {
      ++*calls;
      return absl::Status(code, absl::StrCat("node ", peer, " is unknown"));
    };
    auto t = TcpTransport::Start(o);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::Status s = (*t)->Send(1, 1, std::string("x"));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                            HasSubstr("node 1 is unknown")));
    if (code == absl::StatusCode::kFailedPrecondition) {
      EXPECT_EQ(calls->load(), 1);
    } else {
      EXPECT_GT(calls->load(), 1);
    }
  }
}

TEST(TcpTransportTest, RecvFailsFastWhenPeerGoesAway) {
  auto c = Cluster::Make(2);
  ASSERT_TRUE(c->nodes[0]->Send(1, 1, std::string("hello")).ok());
  std::string out(5, '\0');
  ASSERT_TRUE(
      c->nodes[1]->Recv(0, 1, absl::MakeSpan(out), absl::Seconds(5)).ok());
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    c->nodes[0].reset();  // node 0 dies: its connection to node 1 closes
  });
  const absl::Time t0 = absl::Now();
  absl::Status s =
      c->nodes[1]->Recv(0, 2, absl::MakeSpan(out), absl::Seconds(20));
  killer.join();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(15));
}

TEST(TcpTransportTest, ControlMessagesGoToTheHandler) {
  absl::Mutex mu;
  std::vector<std::pair<int, std::string>> got;
  auto c = Cluster::Make(2, [&](int peer, uint64_t tag, std::string m) {
    absl::MutexLock l(&mu);
    got.push_back({peer, absl::StrCat(tag & ~kControlTagBit, ":", m)});
  });
  ASSERT_TRUE(
      c->nodes[1]->Send(0, kControlTagBit | 9, std::string("ping")).ok());
  absl::MutexLock l(&mu);
  auto one = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !got.empty(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(10)));
  EXPECT_EQ(got[0].first, 1);
  EXPECT_EQ(got[0].second, "9:ping");
}

// --- Hostile peers: raw sockets speaking (or not) the wire format. ---

// A field of /proc/self/status ("Threads", "VmHWM" in kB, ...).
int64_t ProcStatus(absl::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts =
        absl::StrSplit(line, absl::ByAnyChar(": \t"), absl::SkipEmpty());
    int64_t v = 0;
    if (parts.size() >= 2 && parts[0] == field &&
        absl::SimpleAtoi(parts[1], &v)) {
      return v;
    }
  }
  return -1;
}

// Resets VmHWM (peak RSS) to the current RSS.
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// A connection to 127.0.0.1:`port` (invalid when it cannot be made).
UniqueFd RawConnect(int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return UniqueFd();
  }
  return fd;
}

void WriteAll(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Reads until the other side closes; returns what came (the ack, if any).
// `closed` is false if it stayed open for a whole minute (a hang guard, far
// above any timeout the tests configure).
std::string ReadUntilClosed(int fd, bool* closed) {
  std::string got;
  *closed = false;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) return got;
    char buf[4096];
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r <= 0) {
      *closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(r));
  }
}

uint32_t AckCode(const std::string& ack) {
  if (ack.size() < internal::kAckBytes) return ~0u;
  return little_endian::Load32(ack.data() + 4);
}

constexpr char kToken[] = "a-cluster-token-of-some-length";

// The first `n` bytes that come from `fd` (fewer if it closes first, or
// stays silent for a minute: a hang guard).
std::string ReadBytes(int fd, size_t n) {
  std::string got;
  while (got.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) break;
    char buf[64];
    const ssize_t r = read(fd, buf, std::min(sizeof(buf), n - got.size()));
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  return got;
}

// The wire format's bytes, written out by hand from the top of
// tcp_transport.h (crc32c computed apart from Cairn): what a peer of
// another build sends and expects.
TEST(TcpTransportTest, WireBytesAreFixed) {
  const std::string header(
      "CRN2"                              // magic
      "\x01\x00\x00\x00"                  // flags: kMoreFrames
      "\x18\x17\x16\x15\x14\x13\x12\x11"  // tag
      "\x28\x27\x26\x25\x24\x23\x22\x21"  // length
      "\x34\x33\x32\x31"                  // crc32c(payload)
      "\x5b\x32\xe5\xc0",                 // crc32c(bytes [0, 28))
      internal::kFrameHeaderBytes);
  EXPECT_EQ(absl::BytesToHexString(internal::EncodeFrameHeader(
                0x1112131415161718, 0x2122232425262728, 0x31323334,
                internal::kMoreFrames)),
            absl::BytesToHexString(header));
  // Node 0's hello with the token "tok".
  const std::string hello(
      "CRN2"
      "\x00\x00\x00\x00"                  // flags
      "\xff\xff\xff\xff\xff\xff\xff\xff"  // tag: kHelloTag
      "\x0b\x00\x00\x00\x00\x00\x00\x00"  // length 11
      "\xc6\xf4\x57\x6a"                  // crc32c(payload)
      "\x68\xa2\xec\xc4"                  // crc32c(bytes [0, 28))
      "\x01\x00\x00\x00"                  // payload: version 1
      "\x00\x00\x00\x00"                  // node 0
      "tok",                              // token
      internal::kFrameHeaderBytes + 11);
  EXPECT_EQ(absl::BytesToHexString(internal::EncodeHello(0, "tok")),
            absl::BytesToHexString(hello));
  // Decoded by a receiver: it acks the hello (accepted, with its
  // max_frame_bytes) and delivers the message of tag 7 that follows.
  const std::string message(
      "CRN2"
      "\x00\x00\x00\x00"                  // flags
      "\x07\x00\x00\x00\x00\x00\x00\x00"  // tag 7
      "\x03\x00\x00\x00\x00\x00\x00\x00"  // length 3
      "\xb7\x3f\x4b\x36"                  // crc32c("abc")
      "\xdd\x60\x52\x16"                  // crc32c(bytes [0, 28))
      "abc",
      internal::kFrameHeaderBytes + 3);
  const std::string ack(
      "CRNA"                               // magic
      "\x00\x00\x00\x00"                   // HelloRefusal::kAccepted
      "\x00\x00\x10\x00\x00\x00\x00\x00",  // max_frame_bytes 1 MiB
      internal::kAckBytes);
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.peer_token = "tok";
    o.max_frame_bytes = 1 << 20;
  });
  UniqueFd fd = RawConnect(c->ports[1]);
  ASSERT_TRUE(fd.valid());
  WriteAll(fd.get(), hello + message);
  EXPECT_EQ(absl::BytesToHexString(ReadBytes(fd.get(), internal::kAckBytes)),
            absl::BytesToHexString(ack));
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 7, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abc");
}

TEST(TcpTransportTest, HostileFramesAreRefusedBeforeAnyAllocation) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.peer_token = kToken;
    o.max_frame_bytes = 1 << 20;
    o.handshake_timeout = absl::Milliseconds(300);
  });
  const int port = c->ports[1];
  ResetPeakRss();
  const int64_t peak_before_kb = ProcStatus("VmHWM");
  ASSERT_GT(peak_before_kb, 0);
  struct Case {
    std::string name;
    std::string bytes;
    uint32_t want_ack;  // ~0u: no ack expected
  };
  const std::string hello = internal::EncodeHello(0, kToken);
  auto claim = [&](uint64_t length) {
    return hello + internal::EncodeFrameHeader(7, length, 0, 0);
  };
  const std::string bad_hello_len =
      internal::EncodeFrameHeader(internal::kHelloTag, uint64_t{1} << 30, 0, 0);
  const std::vector<Case> cases = {
      {"1 TiB claim", claim(uint64_t{1} << 40), 0},
      {"2 GiB claim", claim(uint64_t{2} << 30), 0},
      {"one byte over max_frame_bytes", claim((1 << 20) + 1), 0},
      {"frame with the hello tag",
       claim(0).substr(0, hello.size()) +
           internal::EncodeFrameHeader(internal::kHelloTag, 10, 0, 0),
       0},
      {"wrong token", internal::EncodeHello(0, "guess"),
       static_cast<uint32_t>(HelloRefusal::kBadToken)},
      {"no token", internal::EncodeHello(0, ""),
       static_cast<uint32_t>(HelloRefusal::kBadToken)},
      {"unknown node", internal::EncodeHello(7, kToken),
       static_cast<uint32_t>(HelloRefusal::kUnknownNode)},
      {"its own node id", internal::EncodeHello(1, kToken),
       static_cast<uint32_t>(HelloRefusal::kUnknownNode)},
      {"1 GiB hello", bad_hello_len,
       static_cast<uint32_t>(HelloRefusal::kMalformed)},
      {"garbage", std::string(200, '\x5a'),
       static_cast<uint32_t>(HelloRefusal::kMalformed)},
      {"truncated header", hello.substr(0, 10), ~0u},
      {"silence", "", ~0u},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    UniqueFd fd = RawConnect(port);
    ASSERT_TRUE(fd.valid());
    if (!k.bytes.empty()) WriteAll(fd.get(), k.bytes);
    bool closed = false;
    const std::string got = ReadUntilClosed(fd.get(), &closed);
    fd.Reset();
    EXPECT_TRUE(closed) << "the agent kept the connection open";
    if (k.want_ack == ~0u) {
      EXPECT_TRUE(got.empty());
    } else {
      EXPECT_EQ(AckCode(got), k.want_ack);
    }
  }
  // A frame length is never allocated on a claim: the peak RSS stayed put.
  EXPECT_LT(ProcStatus("VmHWM") - peak_before_kb, 64 << 10)
      << "peak RSS grew while hostile frames came in";

  // The legitimate peer is still served, and a message larger than a frame
  // arrives whole (split into 1 MiB frames and put back together).
  std::mt19937 rng(3);
  const std::string big = RandomBytes((5 << 20) + 123, rng);
  ASSERT_TRUE(c->nodes[0]->Send(1, 99, big).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 99, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == big);
  EXPECT_EQ(c->nodes[1]->reader_threads(), 1);
}

// An authenticated peer sending control messages faster than the handlers
// take them (here: never, until released) is disconnected at the bound,
// with a refusal naming it; so is one sending a control message larger
// than the byte bound, before its payload is allocated. Real peers are
// served again afterwards.
TEST(TcpTransportTest, PeerFloodingControlMessagesIsDisconnected) {
  absl::Notification release;
  std::atomic<int> handled{0};
  auto c = Cluster::Make(
      2,
      [&](int, uint64_t, std::string) {
        release.WaitForNotification();
        ++handled;
      },
      [](TcpTransportOptions& o) {
        o.peer_token = kToken;
        o.max_frame_bytes = 1 << 20;
        o.control_threads = 2;
        o.max_queued_control_messages = 16;
        o.max_queued_control_bytes = 1 << 20;
      });
  const std::string hello = internal::EncodeHello(0, kToken);
  {
    UniqueFd fd = RawConnect(c->ports[1]);
    ASSERT_TRUE(fd.valid());
    std::string flood = hello;
    const std::string payload = "control-0123456789";
    for (uint64_t i = 0; i < 5000; ++i) {
      flood += internal::EncodeFrameHeader(
          kControlTagBit | i, payload.size(),
          storage::Crc32c(payload.data(), payload.size()), 0);
      flood += payload;
    }
    // The receiver may close before it has read everything.
    (void)send(fd.get(), flood.data(), flood.size(), MSG_NOSIGNAL);
    bool closed = false;
    EXPECT_EQ(AckCode(ReadUntilClosed(fd.get(), &closed)), 0u);
    EXPECT_TRUE(closed) << "a flooding peer stayed connected";
    fd.Reset();
    EXPECT_LE(c->nodes[1]->queued_control_messages(0), 16);
    EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("node 0: 16 control"));
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("max_queued_control_messages"));
  }
  release.Notify();
  for (int i = 0; i < 1000 && c->nodes[1]->queued_control_messages(0) > 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(c->nodes[1]->queued_control_messages(0), 0);
  {
    // One control message of three 512 KiB frames: over 1 MiB at the third.
    UniqueFd fd = RawConnect(c->ports[1]);
    ASSERT_TRUE(fd.valid());
    const std::string part(512 << 10, 'p');
    const uint32_t crc = storage::Crc32c(part.data(), part.size());
    std::string big = hello;
    for (int i = 0; i < 3; ++i) {
      big += internal::EncodeFrameHeader(kControlTagBit | 77, part.size(), crc,
                                         i < 2 ? internal::kMoreFrames : 0);
      big += part;
    }
    (void)send(fd.get(), big.data(), big.size(), MSG_NOSIGNAL);
    bool closed = false;
    EXPECT_EQ(AckCode(ReadUntilClosed(fd.get(), &closed)), 0u);
    EXPECT_TRUE(closed);
    fd.Reset();
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("node 0: control message tag"));
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("max_queued_control_bytes"));
  }
  // A real peer's control message is handled.
  const int before = handled.load();
  ASSERT_TRUE(
      c->nodes[0]->Send(1, kControlTagBit | 9000, std::string("ping")).ok());
  for (int i = 0; i < 1000 && handled.load() == before; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(handled.load(), before + 1);
}

// An authenticated peer sending data messages nobody receives is
// disconnected at the mailbox's message bound, and one sending a data
// message of endless frames (or messages adding up) at its byte bound,
// before the frame over it is allocated; each time the refusal names the
// peer and the bound, and its unreceived messages are dropped. Real peers'
// messages are delivered before and after.
TEST(TcpTransportTest, PeerFloodingTheMailboxIsDisconnected) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.peer_token = kToken;
    o.max_frame_bytes = 1 << 20;
    o.max_mailbox_messages = 16;
    o.max_mailbox_bytes = 1 << 20;
  });
  ASSERT_TRUE(c->nodes[0]->Send(1, 1, std::string("before")).ok());
  ASSERT_TRUE(c->nodes[1]->RecvMessage(0, 1, absl::Seconds(10)).ok());
  const std::string hello = internal::EncodeHello(0, kToken);
  // Waits until node 1 has let go of every byte node 0 sent.
  auto drained = [&] {
    for (int i = 0; i < 1000 && c->nodes[1]->mailbox_bytes(0) > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return c->nodes[1]->mailbox_bytes(0) == 0 &&
           c->nodes[1]->mailbox_size() == 0;
  };
  auto expect_disconnected = [&](const std::string& bytes) {
    UniqueFd fd = RawConnect(c->ports[1]);
    ASSERT_TRUE(fd.valid());
    // The receiver may close before it has read everything.
    (void)send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    bool closed = false;
    EXPECT_EQ(AckCode(ReadUntilClosed(fd.get(), &closed)), 0u);
    EXPECT_TRUE(closed) << "a flooding peer stayed connected";
    fd.Reset();
  };
  {
    std::string flood = hello;
    const std::string payload = "data-0123456789";
    for (uint64_t i = 0; i < 5000; ++i) {
      flood += internal::EncodeFrameHeader(
          100 + i, payload.size(),
          storage::Crc32c(payload.data(), payload.size()), 0);
      flood += payload;
    }
    expect_disconnected(flood);
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("node 0: 16 data messages unreceived"));
    EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("max_mailbox_messages"));
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("dropping its 16 unreceived messages"));
    EXPECT_TRUE(drained());
  }
  const std::string part(512 << 10, 'p');
  const uint32_t crc = storage::Crc32c(part.data(), part.size());
  {
    // One data message of 64 frames of 512 KiB (32 MiB, under no Recv):
    // over 1 MiB at the third frame.
    std::string endless = hello;
    for (int i = 0; i < 64; ++i) {
      endless += internal::EncodeFrameHeader(7000, part.size(), crc,
                                             internal::kMoreFrames);
      endless += part;
    }
    expect_disconnected(endless);
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("node 0: 1048576 bytes of data messages"));
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("(tag 7000, 1048576 of it so far)"));
    EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("max_mailbox_bytes"));
    EXPECT_TRUE(drained());
  }
  {
    // Whole messages adding up: the third 512 KiB one is over 1 MiB.
    std::string many = hello;
    for (int i = 0; i < 3; ++i) {
      many += internal::EncodeFrameHeader(8000 + i, part.size(), crc, 0);
      many += part;
    }
    expect_disconnected(many);
    EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("max_mailbox_bytes"));
    EXPECT_THAT(c->nodes[1]->last_refusal(),
                HasSubstr("dropping its 2 unreceived messages"));
    EXPECT_TRUE(drained());
  }
  // A real peer's messages, up to the bounds, are delivered.
  ASSERT_TRUE(c->nodes[0]->Send(1, 2, std::string(1 << 19, 'a')).ok());
  ASSERT_TRUE(c->nodes[0]->Send(1, 3, std::string(1 << 19, 'b')).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 3, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), size_t{1} << 19);
  got = c->nodes[1]->RecvMessage(0, 2, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(drained());
}

// A connection from 127.0.0.2 (loopback, another source address).
UniqueFd RawConnectFrom(const char* ip, int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &src.sin_addr);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Whether node 1 closes `fd` within 10 s (it closes a refused connection at
// once; held ones wait for their minute-long handshake timeout).
bool ClosedSoon(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 10000) <= 0) return false;
  char b;
  return read(fd, &b, 1) <= 0;
}

// Connections from one address beyond max_connections_per_address, and
// beyond max_connections in all, are closed as they are accepted, with a
// refusal naming the address and the cap; the ones held (silent, in their
// handshake) never make a real peer's connection give way.
TEST(TcpTransportTest, ConnectionsAreCappedPerAddressAndInAll) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.handshake_timeout = absl::Minutes(1);
    o.max_pending_connections = 8;
    o.max_connections_per_address = 4;
    o.max_connections = 6;
  });
  std::vector<UniqueFd> held;
  for (int i = 0; i < 10; ++i) {
    UniqueFd fd = RawConnectFrom("127.0.0.2", c->ports[1]);
    ASSERT_TRUE(fd.valid()) << "cannot connect from 127.0.0.2";
    if (i < 4) {
      held.push_back(std::move(fd));
      continue;
    }
    EXPECT_TRUE(ClosedSoon(fd.get()))
        << "connection " << i << " was not refused";
    fd.Reset();
  }
  EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("127.0.0.2:"));
  EXPECT_THAT(c->nodes[1]->last_refusal(),
              HasSubstr("4 connections from this address are open"));
  EXPECT_THAT(c->nodes[1]->last_refusal(),
              HasSubstr("max_connections_per_address 4"));
  EXPECT_EQ(c->nodes[1]->open_connections("127.0.0.2"), 4);
  // The real peer (from 127.0.0.1) gets in: 5 open.
  ASSERT_TRUE(c->nodes[0]->Send(1, 5, std::string("in")).ok());
  ASSERT_TRUE(c->nodes[1]->RecvMessage(0, 5, absl::Seconds(10)).ok());
  // One more from a third address fits (6), the next is over the cap.
  UniqueFd sixth = RawConnectFrom("127.0.0.3", c->ports[1]);
  ASSERT_TRUE(sixth.valid());
  for (int i = 0; i < 1000 && c->nodes[1]->open_connections() < 6; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(c->nodes[1]->open_connections(), 6);
  UniqueFd seventh = RawConnectFrom("127.0.0.3", c->ports[1]);
  ASSERT_TRUE(seventh.valid());
  EXPECT_TRUE(ClosedSoon(seventh.get()));
  seventh.Reset();
  EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("127.0.0.3:"));
  EXPECT_THAT(c->nodes[1]->last_refusal(), HasSubstr("max_connections 6"));
  // The held ones are still open, and closing them frees their places.
  for (UniqueFd& fd : held) {
    pollfd p{fd.get(), POLLIN | POLLRDHUP, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0) << "a held connection was closed";
    fd.Reset();
  }
  sixth.Reset();
  for (int i = 0; i < 1000 && c->nodes[1]->open_connections() > 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(c->nodes[1]->open_connections(), 1);  // the real peer's
  EXPECT_EQ(c->nodes[1]->open_connections("127.0.0.2"), 0);
}

TEST(TcpTransportTest, PeerWithAnotherTokenGetsPermissionDenied) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.peer_token = o.node_id == 0 ? "token-a" : "token-b";
  });
  absl::Status s = c->nodes[0]->Send(1, 1, std::string("x"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          AllOf(HasSubstr("peer node 1 at 127.0.0.1:"),
                                HasSubstr("wrong cluster token"))));
}

TEST(TcpTransportTest, IdleConnectionsAreBoundedAndTimedOut) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.max_pending_connections = 16;
    o.handshake_timeout = absl::Milliseconds(500);
    // Everything here comes from 127.0.0.1, the real peer too: no cap per
    // address, so the handshake table's own rule is what is tested.
    o.max_connections_per_address = 1000;
  });
  const int64_t threads_before = ProcStatus("Threads");
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 500; ++i) {
    UniqueFd fd = RawConnect(c->ports[1]);
    ASSERT_TRUE(fd.valid()) << "connection " << i;
    fds.push_back(std::move(fd));
  }
  // No thread per connection: a handshake is the acceptor's business.
  EXPECT_LE(ProcStatus("Threads"), threads_before + 1);
  // The legitimate peer gets in while they are held (at most 16 are, the
  // oldest give way to newer ones).
  ASSERT_TRUE(c->nodes[0]->Send(1, 5, std::string("still here")).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 5, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "still here");
  // Every silent connection is closed by the agent (refused when the
  // pending slots were taken, or after the handshake timeout).
  for (UniqueFd& fd : fds) {
    bool closed = false;
    EXPECT_TRUE(ReadUntilClosed(fd.get(), &closed).empty());
    EXPECT_TRUE(closed);
    fd.Reset();
  }
  EXPECT_LE(ProcStatus("Threads"), threads_before + 1);
  EXPECT_EQ(c->nodes[1]->reader_threads(), 1);
}

TEST(TcpTransportTest, IdleAuthenticatedConnectionIsClosedAndSenderReconnects) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.idle_timeout = absl::Milliseconds(200);
  });
  ASSERT_TRUE(c->nodes[0]->Send(1, 1, std::string("one")).ok());
  ASSERT_TRUE(c->nodes[1]->RecvMessage(0, 1, absl::Seconds(10)).ok());
  // A raw, authenticated but silent connection is closed too.
  UniqueFd fd = RawConnect(c->ports[1]);
  ASSERT_TRUE(fd.valid());
  WriteAll(fd.get(), internal::EncodeHello(0, ""));
  bool closed = false;
  EXPECT_EQ(AckCode(ReadUntilClosed(fd.get(), &closed)), 0u);
  EXPECT_TRUE(closed);
  fd.Reset();
  // The sender drops its idle connection before the receiver would.
  ASSERT_TRUE(c->nodes[0]->Send(1, 2, std::string("two")).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 2, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "two");
}

TEST(TcpTransportTest, MessageWhoseRecvGaveUpIsDroppedWhenItArrives) {
  auto c = Cluster::Make(2);
  std::string out(4, '\0');
  absl::Status s =
      c->nodes[1]->Recv(0, 42, absl::MakeSpan(out), absl::Milliseconds(10));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded));
  c->nodes[1]->Abandon(0, 43);  // given up on before it was even sent
  ASSERT_TRUE(c->nodes[0]->Send(1, 42, std::string(1 << 20, 'l')).ok());
  ASSERT_TRUE(c->nodes[0]->Send(1, 43, std::string(1 << 20, 'm')).ok());
  ASSERT_TRUE(c->nodes[0]->Send(1, 44, std::string("next")).ok());
  // One connection delivers in order: once 44 is here, 42 and 43 came.
  absl::StatusOr<std::string> next =
      c->nodes[1]->RecvMessage(0, 44, absl::Seconds(10));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(c->nodes[1]->mailbox_size(), 0u);
  // A message already here is dropped by Abandon at once.
  ASSERT_TRUE(c->nodes[0]->Send(1, 45, std::string("x")).ok());
  ASSERT_TRUE(c->nodes[0]->Send(1, 46, std::string("y")).ok());
  ASSERT_TRUE(c->nodes[1]->RecvMessage(0, 46, absl::Seconds(10)).ok());
  EXPECT_EQ(c->nodes[1]->mailbox_size(), 1u);
  c->nodes[1]->Abandon(0, 45);
  EXPECT_EQ(c->nodes[1]->mailbox_size(), 0u);
}

// --- Mutual TLS (certificates from tests/testing/make_test_certs.sh). ---

using testing::TestCerts;

#define REQUIRE_CERTS() \
  ASSERT_FALSE(TestCerts::Dir().empty()) << "make_test_certs.sh failed"

// A cluster whose nodes all use `name` signed by `ca` (and a token).
std::unique_ptr<Cluster> TlsCluster(
    int n, std::function<void(TcpTransportOptions&)> tweak = {}) {
  return Cluster::Make(n, {}, [tweak](TcpTransportOptions& o) {
    TestCerts::Use(o);
    o.peer_token = kToken;
    if (tweak) tweak(o);
  });
}

// The refusal `t` logged last, once it contains `want` (the refusing side
// may log after the other side already saw the connection fail); what it
// is after 20 s otherwise (a hang guard).
std::string RefusalWith(TcpTransport& t, absl::string_view want) {
  for (int i = 0; i < 2000; ++i) {
    const std::string r = t.last_refusal();
    if (absl::StrContains(r, want)) return r;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return t.last_refusal();
}

// Starts one more transport as node `id` of `c` (not added to it), e.g. a
// peer with other certificates.
std::unique_ptr<TcpTransport> StartNode(
    Cluster& c, int id, std::function<void(TcpTransportOptions&)> tweak) {
  TcpTransportOptions o;
  o.node_id = id;
  o.num_nodes = static_cast<int>(c.ports.size());
  o.connect_timeout = absl::Milliseconds(300);
  o.peer_token = kToken;
  o.resolve_peer = [cl = &c](int peer) -> absl::StatusOr<std::string> {
    return absl::StrCat("127.0.0.1:", cl->ports[peer]);
  };
  tweak(o);
  auto t = TcpTransport::Start(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(TcpTransportTlsTest, DeliversMessagesOverMutualTls) {
  REQUIRE_CERTS();
  auto c = TlsCluster(
      3, [](TcpTransportOptions& o) { o.max_frame_bytes = 1 << 20; });
  ASSERT_TRUE(c->nodes[0]->tls());
  std::mt19937 rng(11);
  // Larger than a frame (split into 1 MiB frames), small, and empty.
  const std::vector<std::string> sent = {RandomBytes((5 << 20) + 7, rng),
                                         RandomBytes(100, rng), ""};
  for (size_t i = 0; i < sent.size(); ++i) {
    ASSERT_TRUE(c->nodes[0]->Send(1, i, sent[i]).ok());
    ASSERT_TRUE(c->nodes[2]->Send(1, i, sent[i]).ok());
  }
  for (int from : {0, 2}) {
    for (size_t i = 0; i < sent.size(); ++i) {
      absl::StatusOr<std::string> got =
          c->nodes[1]->RecvMessage(from, i, absl::Seconds(20));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == sent[i]) << "from " << from << " message " << i;
    }
  }
  EXPECT_EQ(c->nodes[1]->reader_threads(), 2);
  EXPECT_EQ(c->nodes[1]->last_refusal(), "");
}

TEST(TcpTransportTlsTest, PlaintextPeerIsRefused) {
  REQUIRE_CERTS();
  auto c = TlsCluster(2);
  // A raw plaintext hello (right token) gets no ack: the agent wants TLS.
  UniqueFd fd = RawConnect(c->ports[1]);
  ASSERT_TRUE(fd.valid());
  WriteAll(fd.get(), internal::EncodeHello(0, kToken));
  bool closed = false;
  const std::string got = ReadUntilClosed(fd.get(), &closed);
  fd.Reset();
  EXPECT_TRUE(closed);
  EXPECT_NE(got.substr(0, 4), std::string("CRNA", 4)) << "a cairn ack came";
  EXPECT_THAT(RefusalWith(*c->nodes[1], "TLS handshake failed"),
              HasSubstr("TLS handshake failed"));
  // A plaintext transport is refused too.
  auto plain = StartNode(*c, 0, [](TcpTransportOptions&) {});
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->Send(1, 1, std::string("x")).ok());
  EXPECT_EQ(c->nodes[1]->reader_threads(), 0);
  // And a TLS sender to a plaintext agent fails naming TLS.
  c->ports[0] = plain->port();
  absl::Status s = c->nodes[1]->Send(0, 1, std::string("x"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("peer node 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("TLS handshake failed"));
  EXPECT_EQ(plain->reader_threads(), 0);
}

TEST(TcpTransportTlsTest, PeerWithACertificateFromAnotherCaIsRefused) {
  REQUIRE_CERTS();
  auto c = TlsCluster(2);
  // It trusts the cluster CA (so it accepts the agent), but its own
  // certificate comes from another CA: the agent refuses it.
  auto intruder = StartNode(*c, 0, [](TcpTransportOptions& o) {
    TestCerts::Use(o, "other-peer", "ca");
  });
  ASSERT_NE(intruder, nullptr);
  absl::Status s = intruder->Send(1, 1, std::string("x"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          AllOf(HasSubstr("peer node 1 at 127.0.0.1:"),
                                HasSubstr("TLS handshake failed"))));
  EXPECT_THAT(RefusalWith(*c->nodes[1],
                          "TLS handshake failed: certificate verify failed"),
              HasSubstr("TLS handshake failed: certificate verify failed"));
  EXPECT_EQ(c->nodes[1]->reader_threads(), 0);
  // One that trusts only the other CA refuses the agent itself.
  auto stranger = StartNode(*c, 0, [](TcpTransportOptions& o) {
    TestCerts::Use(o, "other-peer", "other-ca");
  });
  ASSERT_NE(stranger, nullptr);
  s = stranger->Send(1, 1, std::string("x"));
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("TLS handshake failed: certificate verify failed")));
  EXPECT_EQ(c->nodes[1]->reader_threads(), 0);
  // The cluster's own peer still gets in.
  ASSERT_TRUE(c->nodes[0]->Send(1, 2, std::string("member")).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 2, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "member");
}

TEST(TcpTransportTlsTest, PeerWithAnExpiredCertificateIsRefused) {
  REQUIRE_CERTS();
  auto c = TlsCluster(2);
  // Starts (cairnd does the same: a renewed file can be reloaded), but
  // peers refuse it.
  auto stale = StartNode(*c, 0, [](TcpTransportOptions& o) {
    TestCerts::Use(o, "expired", "ca");
  });
  ASSERT_NE(stale, nullptr);
  absl::Status s = stale->Send(1, 1, std::string("x"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          AllOf(HasSubstr("peer node 1"),
                                HasSubstr("TLS handshake failed"))));
  EXPECT_THAT(RefusalWith(*c->nodes[1], "certificate has expired"),
              HasSubstr("certificate has expired"));
  EXPECT_EQ(c->nodes[1]->reader_threads(), 0);
}

// A TLS client that trusts the cluster CA but presents no certificate.
TEST(TcpTransportTlsTest, PeerWithoutACertificateIsRefused) {
  REQUIRE_CERTS();
  auto c = TlsCluster(2);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  ASSERT_EQ(SSL_CTX_load_verify_locations(
                ctx, TestCerts::Path("ca.crt").c_str(), nullptr),
            1);
  UniqueFd fd = RawConnect(c->ports[1]);
  ASSERT_TRUE(fd.valid());
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd.get());
  std::string got;
  // TLS 1.3: the client finishes its side before the server's verdict, so
  // the refusal shows when reading the ack.
  if (SSL_connect(ssl) == 1) {
    const std::string hello = internal::EncodeHello(0, kToken);
    SSL_write(ssl, hello.data(), static_cast<int>(hello.size()));
    char buf[64];
    const int r = SSL_read(ssl, buf, sizeof(buf));
    if (r > 0) got.assign(buf, static_cast<size_t>(r));
  }
  ERR_clear_error();
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  fd.Reset();
  EXPECT_EQ(got, "") << "an ack came to a peer without a certificate";
  const std::string why =
      "TLS handshake failed: peer did not return a certificate";
  EXPECT_THAT(RefusalWith(*c->nodes[1], why), HasSubstr(why));
  EXPECT_EQ(c->nodes[1]->reader_threads(), 0);
}

// Handshakes run non-blocking in the acceptor: clients that connect and
// never finish theirs (silent, or a ClientHello cut short) do not hold up a
// real peer, though the handshake timeout is far away.
TEST(TcpTransportTlsTest, StalledHandshakesDoNotBlockARealPeer) {
  REQUIRE_CERTS();
  auto c = TlsCluster(2, [](TcpTransportOptions& o) {
    o.handshake_timeout = absl::Minutes(5);
  });
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 8; ++i) {
    UniqueFd fd = RawConnect(c->ports[1]);
    ASSERT_TRUE(fd.valid());
    // Half send the first bytes of a TLS record header, then stop.
    if (i % 2 == 1) WriteAll(fd.get(), std::string("\x16\x03\x01\x02", 4));
    fds.push_back(std::move(fd));
  }
  // connect_timeout is 300 ms: were the acceptor stuck in one of the
  // handshakes above, this Send would fail.
  ASSERT_TRUE(c->nodes[0]->Send(1, 5, std::string("through")).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 5, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "through");
  // The stalled ones are still held (not dropped to make room).
  for (UniqueFd& fd : fds) {
    pollfd p{fd.get(), POLLIN | POLLRDHUP, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0) << "a stalled handshake was closed";
    fd.Reset();
  }
  EXPECT_EQ(c->nodes[1]->reader_threads(), 1);
}

TEST(TcpTransportTlsTest, ReloadTlsSwapsCertificatesForNewConnections) {
  REQUIRE_CERTS();
  // Each node reads copies it owns, so a test can replace them.
  const std::string dir = TestCerts::Path("reload");
  auto install = [&](int node, const std::string& name, const std::string& ca) {
    const std::string d = absl::StrCat(dir, "/", node);
    std::filesystem::create_directories(d);
    const auto over = std::filesystem::copy_options::overwrite_existing;
    std::filesystem::copy_file(TestCerts::Path(ca + ".crt"), d + "/ca.crt",
                               over);
    std::filesystem::copy_file(TestCerts::Path(name + ".crt"), d + "/cert.crt",
                               over);
    std::filesystem::copy_file(TestCerts::Path(name + ".key"), d + "/cert.key",
                               over);
  };
  for (int i = 0; i < 3; ++i) install(i, "peer", "ca");
  auto c = Cluster::Make(3, {}, [&](TcpTransportOptions& o) {
    const std::string d = absl::StrCat(dir, "/", o.node_id);
    o.tls_ca_file = d + "/ca.crt";
    o.tls_cert_file = d + "/cert.crt";
    o.tls_key_file = d + "/cert.key";
  });
  ASSERT_TRUE(c->nodes[0]->Send(1, 1, std::string("before")).ok());
  ASSERT_TRUE(c->nodes[1]->RecvMessage(0, 1, absl::Seconds(10)).ok());

  // Nodes 1 and 2 move to a new CA.
  for (int i : {1, 2}) {
    install(i, "other-peer", "other-ca");
    ASSERT_TRUE(c->nodes[i]->ReloadTls().ok());
  }
  // Node 0's open connection to node 1 continues.
  ASSERT_TRUE(c->nodes[0]->Send(1, 2, std::string("open")).ok());
  absl::StatusOr<std::string> got =
      c->nodes[1]->RecvMessage(0, 2, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "open");
  // New connections use the new certificates: 2 -> 1 works, 0 -> 2 (old CA
  // against new) is refused.
  ASSERT_TRUE(c->nodes[2]->Send(1, 3, std::string("new ca")).ok());
  got = c->nodes[1]->RecvMessage(2, 3, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "new ca");
  absl::Status s = c->nodes[0]->Send(2, 4, std::string("old ca"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("TLS handshake failed")));

  // A broken file fails the reload, naming it; the loaded certificates
  // stay in use.
  const std::string bad_key = absl::StrCat(dir, "/2/cert.key");
  std::ofstream(bad_key) << "not a key\n";
  s = c->nodes[2]->ReloadTls();
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad_key)));
  ASSERT_TRUE(c->nodes[1]->Send(2, 5, std::string("still new")).ok());
  got = c->nodes[2]->RecvMessage(1, 5, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "still new");
  // Without TLS there is nothing to reload.
  auto plain = Cluster::Make(1);
  EXPECT_THAT(plain->nodes[0]->ReloadTls(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(TcpTransportTlsTest, TlsFilesAreAllOrNoneAndChecked) {
  REQUIRE_CERTS();
  auto start = [](std::function<void(TcpTransportOptions&)> tweak) {
    TcpTransportOptions o;
    o.node_id = 0;
    o.num_nodes = 2;
    o.resolve_peer = [](int) { return std::string("127.0.0.1:1"); };
    TestCerts::Use(o);
    tweak(o);
    return TcpTransport::Start(o).status();
  };
  absl::Status s = start([](TcpTransportOptions& o) { o.tls_key_file = ""; });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("--peer-tls-key is missing")));
  s = start([](TcpTransportOptions& o) { o.tls_ca_file = ""; });
  EXPECT_THAT(std::string(s.message()), HasSubstr("--peer-tls-ca is missing"));
  s = start([](TcpTransportOptions& o) { o.tls_ca_file = "/nonexistent.pem"; });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("--peer-tls-ca /nonexistent.pem")));
  // A key as the certificate, a certificate as the key, another key.
  s = start([](TcpTransportOptions& o) {
    o.tls_cert_file = TestCerts::Path("peer.key");
  });
  EXPECT_THAT(std::string(s.message()), HasSubstr("--peer-tls-cert"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("peer.key"));
  s = start([](TcpTransportOptions& o) {
    o.tls_key_file = TestCerts::Path("peer.crt");
  });
  EXPECT_THAT(std::string(s.message()), HasSubstr("--peer-tls-key"));
  s = start([](TcpTransportOptions& o) {
    o.tls_key_file = TestCerts::Path("other-peer.key");
  });
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not the private key"));
  EXPECT_TRUE(start([](TcpTransportOptions&) {}).ok());
}

// A real second process on loopback: the child echoes every message back
// with its bytes reversed; the parent checks each against its own oracle.
TEST(TcpTransportTest, ExchangesMessagesWithAnotherProcess) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const int kMessages = 50;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int parent_port = 0;
    if (read(to_child[0], &parent_port, sizeof(int)) != sizeof(int)) _exit(2);
    TcpTransportOptions o;
    o.node_id = 1;
    o.num_nodes = 2;
    o.resolve_peer = [parent_port](int) -> absl::StatusOr<std::string> {
      return absl::StrCat("127.0.0.1:", parent_port);
    };
    auto t = TcpTransport::Start(o);
    if (!t.ok()) _exit(3);
    int port = (*t)->port();
    if (write(to_parent[1], &port, sizeof(int)) != sizeof(int)) _exit(4);
    for (int i = 0; i < kMessages; ++i) {
      absl::StatusOr<std::string> m =
          (*t)->RecvMessage(0, i, absl::Seconds(20));
      if (!m.ok()) _exit(5);
      std::string r(m->rbegin(), m->rend());
      if (!(*t)->Send(0, i, r).ok()) _exit(6);
    }
    absl::SleepFor(absl::Milliseconds(200));
    _exit(0);
  }
  int child_port = 0;
  TcpTransportOptions o;
  o.node_id = 0;
  o.num_nodes = 2;
  o.resolve_peer = [&child_port](int) -> absl::StatusOr<std::string> {
    return absl::StrCat("127.0.0.1:", child_port);
  };
  auto t = TcpTransport::Start(o);
  ASSERT_TRUE(t.ok());
  int port = (*t)->port();
  ASSERT_EQ(write(to_child[1], &port, sizeof(int)), sizeof(int));
  ASSERT_EQ(read(to_parent[0], &child_port, sizeof(int)), sizeof(int));
  std::mt19937 rng(7);
  for (int i = 0; i < kMessages; ++i) {
    std::string m = RandomBytes(rng() % 200000, rng);
    ASSERT_TRUE((*t)->Send(1, i, m).ok());
    std::string back(m.size(), '\0');
    absl::Status s = (*t)->Recv(1, i, absl::MakeSpan(back), absl::Seconds(20));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(back, std::string(m.rbegin(), m.rend())) << "message " << i;
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace cairn::agent
