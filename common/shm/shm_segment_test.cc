#include "common/shm/shm_segment.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::shm {
namespace {

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
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr(name));
}

TEST(ShmSegmentTest, RejectsDuplicatesBadNamesAndShortSegments) {
  const std::string name = TestName("dup");
  auto a = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(ShmSegment::Create(name, 4096).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ShmSegment::Create("no-slash", 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmSegment::Create(TestName("zero"), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto big = ShmSegment::Open(name, 8192);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("smaller"));
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

}  // namespace
}  // namespace cairn::shm
