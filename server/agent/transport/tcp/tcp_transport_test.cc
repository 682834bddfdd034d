#include "server/agent/transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::agent {
namespace {

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
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("crc32c"));
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
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 5"));
  s = c->nodes[1]->Recv(0, 2, absl::MakeSpan(small), absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  s = c->nodes[0]->Send(5, 1, std::string("x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bad peer node 5"));
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
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(s.message()), HasSubstr("node 1 is unknown"));
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
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("closed"));
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

int RawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
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
  uint32_t code;
  std::memcpy(&code, ack.data() + 4, 4);
  return code;
}

constexpr char kToken[] = "a-cluster-token-of-some-length";

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
    const int fd = RawConnect(port);
    ASSERT_GE(fd, 0);
    if (!k.bytes.empty()) WriteAll(fd, k.bytes);
    bool closed = false;
    const std::string got = ReadUntilClosed(fd, &closed);
    close(fd);
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

TEST(TcpTransportTest, PeerWithAnotherTokenGetsPermissionDenied) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.peer_token = o.node_id == 0 ? "token-a" : "token-b";
  });
  absl::Status s = c->nodes[0]->Send(1, 1, std::string("x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("peer node 1 at 127.0.0.1:"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("wrong cluster token"));
}

TEST(TcpTransportTest, IdleConnectionsAreBoundedAndTimedOut) {
  auto c = Cluster::Make(2, {}, [](TcpTransportOptions& o) {
    o.max_pending_connections = 16;
    o.handshake_timeout = absl::Milliseconds(500);
  });
  const int64_t threads_before = ProcStatus("Threads");
  std::vector<int> fds;
  for (int i = 0; i < 500; ++i) {
    const int fd = RawConnect(c->ports[1]);
    ASSERT_GE(fd, 0) << "connection " << i;
    fds.push_back(fd);
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
  for (int fd : fds) {
    bool closed = false;
    EXPECT_TRUE(ReadUntilClosed(fd, &closed).empty());
    EXPECT_TRUE(closed);
    close(fd);
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
  const int fd = RawConnect(c->ports[1]);
  ASSERT_GE(fd, 0);
  WriteAll(fd, internal::EncodeHello(0, ""));
  bool closed = false;
  EXPECT_EQ(AckCode(ReadUntilClosed(fd, &closed)), 0u);
  EXPECT_TRUE(closed);
  close(fd);
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
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
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
