// The agent's socket and shared memory and who may use them
// (AgentServer): modes whatever the umask, one server per path, a path that
// is not a socket never replaced, other users refused unless in the socket
// group (SO_PEERCRED), and the segments theirs then too.
#include "server/agent/agent_server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/testing/agent_cluster.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using AgentServerTest = ::cairn::agent::testing::AgentCluster;

// --- Who may use the agent's socket and shared memory. ---

enum class Reach { kServed, kClosed, kNoAccess, kError };

// A forked process that becomes uid/gid (supplementary groups `groups`)
// connects to the socket at `path` and speaks the HTTP/2 preface: kServed
// when the agent's gRPC server answers, kClosed when the agent closes the
// connection unserved, kNoAccess when the file mode refuses the connect.
Reach ConnectAs(const std::string& path, uid_t uid, gid_t gid,
                const std::vector<gid_t>& groups) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.data(), path.size());
  static const char kPreface[] =
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  const pid_t pid = fork();
  if (pid < 0) return Reach::kError;
  if (pid == 0) {  // async-signal-safe calls only
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(gid) != 0 ||
        setuid(uid) != 0) {
      _exit(10);
    }
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      _exit(errno == EACCES ? 2 : 11);
    }
    (void)!send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) _exit(12);  // hang guard
    char c;
    _exit(read(fd, &c, 1) > 0 ? 1 : 0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
    return Reach::kError;
  }
  switch (WEXITSTATUS(status)) {
    case 0:
      return Reach::kClosed;
    case 1:
      return Reach::kServed;
    case 2:
      return Reach::kNoAccess;
    default:
      return Reach::kError;
  }
}

// Modes and groups of this process's agent segments of `node` in /dev/shm.
std::vector<std::pair<mode_t, gid_t>> SegmentModes(int node) {
  std::vector<std::pair<mode_t, gid_t>> out;
  // "cairn-agent-<node>-<pid>x<nonce>-<seq>" (shm::SegmentFamily).
  const std::string prefix =
      absl::StrCat("cairn-agent-", node, "-", getpid(), "x");
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string file = e.path().filename().string();
    if (!absl::StartsWith(file, prefix) || absl::EndsWith(file, ".lock")) {
      continue;
    }
    struct stat st;
    if (stat(e.path().c_str(), &st) == 0) {
      out.push_back({st.st_mode & 07777, st.st_gid});
    }
  }
  return out;
}

TEST_F(AgentServerTest, SocketAndSegmentsHaveTheirModesWhateverTheUmask) {
  const mode_t old_umask = umask(0);  // the old socket came out 0777
  StartAgent(0, 1, 0);
  umask(old_umask);
  struct stat st;
  ASSERT_EQ(stat(Socket(0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getegid());
  // The private directory it was created in is gone.
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_FALSE(
        absl::StartsWith(e.path().filename().string(), ".cairn-agent-"))
        << e.path();
  }
  umask(0);
  SaveAll("modes", 1, 1, "1:R", 1);
  umask(old_umask);
  const auto modes = SegmentModes(0);
  ASSERT_FALSE(modes.empty());
  for (const auto& [mode, gid] : modes) EXPECT_EQ(mode, 0600u);

  // A second agent on the same path is refused; the first keeps serving.
  AgentServer::Spec spec;
  spec.unix_socket = Socket(0);
  spec.agent.node_id = 0;
  spec.agent.coordinator = Address();
  auto second = AgentServer::Start(std::move(spec));
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("another process is serving on " +
                                         Socket(0))));
  // A path that is not a socket is never replaced.
  const std::string file = dir_ + "/not-a-socket";
  std::ofstream(file) << "keep me";
  AgentServer::Spec on_file;
  on_file.unix_socket = file;
  on_file.agent.node_id = 0;
  on_file.agent.coordinator = Address();
  auto refused = AgentServer::Start(std::move(on_file));
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("is not a socket")));
  std::ifstream in(file);
  std::string kept((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "keep me");
  SaveAll("modes", 1, 1, "1:R", 2);
}

// Whether this process may become uid/gid 65534 and give a file to gid 65534:
// false inside a user namespace that maps only root (Bazel's linux-sandbox).
bool CanActAsNobody(const std::string& dir) {
  const std::string probe = dir + "/nobody-probe";
  const int fd = open(probe.c_str(), O_CREAT | O_WRONLY, 0600);
  if (fd < 0) return false;
  const bool chowned = fchown(fd, static_cast<uid_t>(-1), 65534) == 0;
  close(fd);
  unlink(probe.c_str());
  if (!chowned) return false;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0)
    _exit(setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0
              ? 0
              : 1);
  int status = 0;
  return waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

TEST_F(AgentServerTest, OtherUsersAreRefusedUnlessInTheSocketGroup) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  if (!CanActAsNobody(dir_)) {
    GTEST_SKIP() << "uid/gid 65534 are not usable here (a user namespace "
                    "that maps only root, e.g. Bazel's sandbox)";
  }
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // others may reach the socket
  StartAgent(0, 1, 0);
  // Another user cannot even connect (mode 0660, the agent's group)...
  EXPECT_EQ(ConnectAs(Socket(0), 65534, 65534, {}), Reach::kNoAccess);
  // ...and with the file opened to everyone, SO_PEERCRED still refuses it.
  ASSERT_EQ(chmod(Socket(0).c_str(), 0666), 0);
  EXPECT_EQ(ConnectAs(Socket(0), 65534, 65534, {}), Reach::kClosed);
  EXPECT_EQ(agents_[0]->refused_connections(), 1);
  EXPECT_EQ(ConnectAs(Socket(0), 0, 0, {}), Reach::kServed);  // root

  // With a socket group, its members are served (primary or supplementary
  // group) and the shared memory is theirs too.
  const gid_t kGroup = 65534;
  StartAgent(0, 1, 0, uint64_t{256} << 20, [&](AgentServer::Spec& spec) {
    spec.socket_group = std::to_string(kGroup);
  });
  struct stat st;
  ASSERT_EQ(stat(Socket(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kGroup);
  EXPECT_EQ(ConnectAs(Socket(0), 65533, kGroup, {}), Reach::kServed);
  EXPECT_EQ(ConnectAs(Socket(0), 65533, 65533, {kGroup}), Reach::kServed);
  EXPECT_EQ(ConnectAs(Socket(0), 65533, 65533, {}), Reach::kNoAccess);
  ASSERT_EQ(chmod(Socket(0).c_str(), 0666), 0);
  EXPECT_EQ(ConnectAs(Socket(0), 65533, 65533, {}), Reach::kClosed);
  SaveAll("group", 1, 1, "1:R", 1);
  const auto modes = SegmentModes(0);
  ASSERT_FALSE(modes.empty());
  for (const auto& [mode, gid] : modes) {
    EXPECT_EQ(mode, 0660u);
    EXPECT_EQ(gid, kGroup);
  }
}
}  // namespace
}  // namespace cairn::agent
