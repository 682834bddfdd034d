#include "common/testing/temp_dir.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace cairn::testing {
namespace {

std::string MakeDirUnder(const std::string& base, absl::string_view name) {
  std::string tag(name);
  if (tag.empty()) {
    const ::testing::TestInfo* test =
        ::testing::UnitTest::GetInstance()->current_test_info();
    tag = test != nullptr ? test->name() : "test";
  }
  tag = absl::StrReplaceAll(tag, {{"/", "_"}});
  std::string path = absl::StrCat(base, "/cairn-", tag, "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << path << ": " << std::strerror(errno);
    return "";
  }
  return path;
}

ABSL_CONST_INIT absl::Mutex exit_mu(absl::kConstInit);
std::vector<std::string>* removed_at_exit ABSL_GUARDED_BY(exit_mu) = nullptr;
pid_t exit_owner = 0;  // the process that made them, not a forked child

void RemoveAtExit() {
  if (getpid() != exit_owner) return;
  absl::MutexLock lock(&exit_mu);
  std::error_code ec;
  for (const std::string& dir : *removed_at_exit) {
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace

std::string MakeTempDir(absl::string_view name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return MakeDirUnder(base != nullptr && *base != '\0' ? base : "/tmp", name);
}

std::string MakeSocketTempDir(absl::string_view name) {
  return MakeDirUnder("/tmp", name);
}

std::string MakeTempDirRemovedAtExit(absl::string_view name) {
  std::string dir = MakeTempDir(name);
  if (dir.empty()) return dir;
  absl::MutexLock lock(&exit_mu);
  if (removed_at_exit == nullptr) {
    removed_at_exit = new std::vector<std::string>();
    exit_owner = getpid();
    std::atexit(RemoveAtExit);
  }
  removed_at_exit->push_back(dir);
  return dir;
}

}  // namespace cairn::testing
