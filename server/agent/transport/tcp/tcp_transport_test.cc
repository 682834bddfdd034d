#include "server/agent/transport/tcp/tcp_transport.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

  static std::unique_ptr<Cluster> Make(int n, ControlHandler handler = {}) {
    auto c = std::make_unique<Cluster>();
    c->ports.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      TcpTransportOptions o;
      o.node_id = i;
      o.connect_timeout = absl::Milliseconds(300);
      o.resolve_peer = [cl = c.get()](int peer) -> absl::StatusOr<std::string> {
        if (peer < 0 || peer >= static_cast<int>(cl->ports.size()) ||
            cl->ports[peer] == 0) {
          return absl::NotFoundError(absl::StrCat("node ", peer));
        }
        return absl::StrCat("127.0.0.1:", cl->ports[peer]);
      };
      o.control_handler = handler;
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
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("peer node 5"));
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
