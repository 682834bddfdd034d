#include "common/shm/shm_segment.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::shm {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

std::string TestName(absl::string_view what) {
  return absl::StrCat("/cairn-agent-test-", getpid(), "-", what);
}

TEST(ShmSegmentTest, OpenedMappingSharesBytesWithCreator) {
  auto created = ShmSegment::Create(TestName("share"), 10000);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = ShmSegment::Open(TestName("share"), 10000);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::memset((*created)->data(), 0xab, 10000);
  (*opened)->data()[9999] = 0x11;
  EXPECT_EQ(static_cast<unsigned char>((*opened)->data()[0]), 0xab);
  EXPECT_EQ((*created)->data()[9999], 0x11);
  EXPECT_EQ((*opened)->size(), 10000u);
}

TEST(ShmSegmentTest, CreatorUnlinksNameOnDestruction) {
  const std::string name = TestName("unlink");
  { ASSERT_TRUE(ShmSegment::Create(name, 4096).ok()); }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name));
  auto opened = ShmSegment::Open(name, 4096);
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
}

TEST(ShmSegmentTest, RejectsDuplicatesBadNamesAndShortSegments) {
  const std::string name = TestName("dup");
  auto a = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(ShmSegment::Create(name, 4096),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(ShmSegment::Create("no-slash", 4096),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShmSegment::Create(TestName("zero"), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto big = ShmSegment::Open(name, 8192);
  EXPECT_THAT(big, StatusIs(absl::StatusCode::kFailedPrecondition,
                            HasSubstr("smaller")));
}

TEST(ShmSegmentTest, RemoveStaleSegmentsRemovesOnlyDeadCreatorsSegments) {
  const std::string keep = TestName("keep");
  auto k = ShmSegment::Create(keep, 4096);
  ASSERT_TRUE(k.ok());
  // A pid that is certainly dead: a child that exited and was reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);
  const std::string prefix = absl::StrCat("cairn-agent-stale", getpid(), "-");
  // A "crashed" agent's segment, and a live agent's one under the same prefix.
  auto dead = ShmSegment::Create(absl::StrCat("/", prefix, child, "-1"), 4096);
  auto live =
      ShmSegment::Create(absl::StrCat("/", prefix, getpid(), "-1"), 4096);
  ASSERT_TRUE(dead.ok());
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(RemoveStaleSegments(prefix), 1);
  EXPECT_FALSE(
      std::filesystem::exists(absl::StrCat("/dev/shm/", prefix, child, "-1")));
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrCat("/dev/shm/", prefix, getpid(), "-1")));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + keep));
}

// A family's names carry a random nonce, so two processes with the same pid
// in different PID namespaces (containers sharing /dev/shm) never collide;
// liveness is the family's lock, which the kernel drops when its owner dies.
TEST(ShmSegmentTest, FamiliesAreUniqueAndOnlyDeadOnesAreRemoved) {
  const std::string prefix = absl::StrCat("cairn-agent-fam", getpid(), "-");
  auto a = SegmentFamily::Claim(prefix);
  auto b = SegmentFamily::Claim(prefix);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->name_prefix(), (*b)->name_prefix());
  EXPECT_TRUE(absl::StartsWith((*a)->name_prefix(),
                               absl::StrCat(prefix, getpid(), "x")));
  auto live =
      ShmSegment::Create(absl::StrCat("/", (*a)->name_prefix(), 1), 4096);
  ASSERT_TRUE(live.ok()) << live.status();

  // A crashed owner: a child claims a family, creates two segments and dies
  // without cleaning up (its lock is dropped, its files stay).
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  UniqueFd reader(pipefd[0]);
  UniqueFd writer(pipefd[1]);
  const pid_t child = fork();
  if (child == 0) {
    auto f = SegmentFamily::Claim(prefix);
    if (!f.ok()) _exit(1);
    for (int i = 1; i <= 2; ++i) {
      auto s =
          ShmSegment::Create(absl::StrCat("/", (*f)->name_prefix(), i), 4096);
      if (!s.ok()) _exit(2);
      s->release();  // leak it, as a crash would
    }
    const std::string name = (*f)->name_prefix();
    if (write(writer.get(), name.data(), name.size()) !=
        static_cast<ssize_t>(name.size())) {
      _exit(3);
    }
    _exit(0);  // no destructors: the lock file stays, unlocked
  }
  writer.Reset();  // so that the read ends with the child's bytes
  char buf[256];
  const ssize_t n = read(reader.get(), buf, sizeof(buf));
  reader.Reset();
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_GT(n, 0);
  const std::string dead(buf, n);
  ASSERT_TRUE(std::filesystem::exists(absl::StrCat("/dev/shm/", dead, 1)));

  // The dead family's two segments and lock file go; the live ones stay
  // (their lock is held by this process, through another open file).
  EXPECT_EQ(RemoveStaleSegments(prefix), 2);
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat("/dev/shm/", dead, 1)));
  EXPECT_FALSE(std::filesystem::exists(
      absl::StrCat("/dev/shm/", dead.substr(0, dead.size() - 1), ".lock")));
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrCat("/dev/shm/", (*a)->name_prefix(), 1)));
  EXPECT_EQ(RemoveStaleSegments(prefix), 0);

  // Destroying a family unlinks its lock file.
  const std::string b_lock = absl::StrCat(
      "/dev/shm/",
      (*b)->name_prefix().substr(0, (*b)->name_prefix().size() - 1), ".lock");
  ASSERT_TRUE(std::filesystem::exists(b_lock));
  b->reset();
  EXPECT_FALSE(std::filesystem::exists(b_lock));
}

}  // namespace
}  // namespace cairn::shm
