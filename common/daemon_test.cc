#include "common/daemon.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::daemon {
namespace {

using ::cairn::testing::IsOk;
using ::cairn::testing::MakeTempDir;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(WriteFileAtomicallyTest, WritesTheWholeFileAndLeavesNoTemporaryFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/port";
  ASSERT_THAT(WriteFileAtomically(path, "7070\n"), IsOk());
  EXPECT_EQ(ReadFile(path), "7070\n");
  EXPECT_THAT(Names(dir), ElementsAre("port"));
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, ReplacesAnExistingFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/node-3";
  std::ofstream(path) << "a much longer old address:1\n";
  ASSERT_THAT(WriteFileAtomically(path, "h:2\n"), IsOk());
  EXPECT_EQ(ReadFile(path), "h:2\n");
  EXPECT_THAT(Names(dir), ElementsAre("node-3"));
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, ModeIsTheUmasksLikeAnyNewFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const mode_t old = umask(022);
  const absl::Status s = WriteFileAtomically(dir + "/f", "x");
  umask(old);
  ASSERT_THAT(s, IsOk());
  struct stat st;
  ASSERT_EQ(stat((dir + "/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, AMissingDirectoryIsAnErrorNamingThePath) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/no-such-dir/port";
  EXPECT_THAT(WriteFileAtomically(path, "1\n"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("writing " + path), HasSubstr("tmp"))));
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, AnUnwritableDirectoryIsAnError) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes into any directory";
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(chmod(dir.c_str(), 0500), 0);
  EXPECT_THAT(WriteFileAtomically(dir + "/port", "1\n"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("writing " + dir + "/port")));
  chmod(dir.c_str(), 0700);
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, AFileInPlaceOfTheDirectoryIsAnError) {
  // Unwritable for root too.
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/file") << "x";
  const std::string path = dir + "/file/port";
  EXPECT_THAT(WriteFileAtomically(path, "1\n"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("writing " + path)));
  EXPECT_THAT(Names(dir), ElementsAre("file"));
  std::filesystem::remove_all(dir);
}

TEST(WriteFileAtomicallyTest, AFailedRenameRemovesTheTemporaryFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  // A non-empty directory where the file should go: rename cannot replace
  // it.
  const std::string path = dir + "/ready";
  std::filesystem::create_directories(path + "/inside");
  EXPECT_THAT(
      WriteFileAtomically(path, "1\n"),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("writing " + path), HasSubstr("renaming"))));
  EXPECT_THAT(Names(dir), ElementsAre("ready"));
  std::filesystem::remove_all(dir);
}

// The tests raise signals at their own thread (raise), which has them
// blocked: sigwait takes them.
TEST(StopSignalsTest, SighupReloadsAndSigtermStops) {
  StopSignals signals;
  int reloads = 0;
  ASSERT_EQ(raise(SIGHUP), 0);
  StopSignals::WaitOptions options;
  options.on_reload = [&] {
    ++reloads;
    raise(SIGTERM);
  };
  const int sig = signals.Wait(options);
  EXPECT_EQ(sig, SIGTERM);
  EXPECT_EQ(reloads, 1);
}

TEST(StopSignalsTest, SigintStopsWithoutAReload) {
  StopSignals signals;
  int reloads = 0;
  ASSERT_EQ(raise(SIGINT), 0);
  StopSignals::WaitOptions options;
  options.on_reload = [&] { ++reloads; };
  EXPECT_EQ(signals.Wait(options), SIGINT);
  EXPECT_EQ(reloads, 0);
}

TEST(StopSignalsTest, PollsBetweenSignals) {
  StopSignals signals;
  int polls = 0;
  int reloads = 0;
  StopSignals::WaitOptions options;
  options.on_reload = [&] { ++reloads; };
  options.poll_every = absl::Milliseconds(1);
  options.on_poll = [&] {
    if (++polls == 2) raise(SIGHUP);
    if (polls == 3) raise(SIGTERM);
  };
  const int sig = signals.Wait(options);
  EXPECT_EQ(sig, SIGTERM);
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(reloads, 1);
}

}  // namespace
}  // namespace cairn::daemon
