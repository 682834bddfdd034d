#include "server/agent/shm_segment.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::agent {
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

TEST(ShmSegmentTest, RemoveStaleSegmentsRemovesOnlyThePrefix) {
  const std::string keep = TestName("keep");
  auto k = ShmSegment::Create(keep, 4096);
  ASSERT_TRUE(k.ok());
  // A "crashed" segment: created, then its owner object leaked on purpose.
  const std::string stale_prefix = absl::StrCat("cairn-agent-stale-", getpid());
  auto s = ShmSegment::Create("/" + stale_prefix + "-1", 4096);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(RemoveStaleSegments(stale_prefix), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + stale_prefix + "-1"));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + keep));
}

}  // namespace
}  // namespace cairn::agent
