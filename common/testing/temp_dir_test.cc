#include "common/testing/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MakeTempDirTest, MakesAFreshDirectoryNamedAfterTheTest) {
  const std::string a = MakeTempDir();
  const std::string b = MakeTempDir();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_NE(a, b);
  EXPECT_TRUE(std::filesystem::is_directory(a));
  EXPECT_TRUE(std::filesystem::is_empty(a));
  EXPECT_THAT(a, HasSubstr("/cairn-MakesAFreshDirectoryNamedAfterTheTest-"));
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
}

TEST(MakeTempDirTest, IsUnderTestTmpdirAndTakesANameWithSlashes) {
  const std::string base = MakeTempDir("base");
  ASSERT_FALSE(base.empty());
  const char* old = std::getenv("TEST_TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TEST_TMPDIR", base.c_str(), 1);
  const std::string dir = MakeTempDir("Suite/Case/0");
  if (old != nullptr) {
    setenv("TEST_TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TEST_TMPDIR");
  }
  EXPECT_THAT(dir, StartsWith(base + "/cairn-Suite_Case_0-"));
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::filesystem::remove_all(base);
}

TEST(MakeTempDirTest, SocketTempDirIsUnderTmp) {
  const std::string dir = MakeSocketTempDir("sock");
  EXPECT_THAT(dir, StartsWith("/tmp/cairn-sock-"));
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::filesystem::remove_all(dir);
}

TEST(MakeTempDirTest, RemovedAtExitIsAFreshDirectory) {
  const std::string dir = MakeTempDirRemovedAtExit("exit");
  ASSERT_FALSE(dir.empty());
  EXPECT_THAT(dir, HasSubstr("/cairn-exit-"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

}  // namespace
}  // namespace cairn::testing
