#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace cairn::testing {

absl::StatusOr<Subprocess> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(),
                       environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
  }
  return Subprocess(pid, log_path);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      log_path_(std::move(other.log_path_)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = std::exchange(other.pid_, -1);
    log_path_ = std::move(other.log_path_);
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

std::string Subprocess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Subprocess::WaitForLog(const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (absl::StrContains(Log(), text)) return true;
    if (Wait(absl::Milliseconds(20)).ok()) break;
  }
  return absl::StrContains(Log(), text);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> WaitForFile(const std::string& path, Subprocess& p,
                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!std::filesystem::exists(path)) {
    absl::StatusOr<int> exited = p.Wait(absl::Milliseconds(20));
    if (exited.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the process exited with ", *exited, " before writing ",
                       path, ": ", p.Log()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no ", path, " after ", absl::FormatDuration(timeout),
                       ": ", p.Log()));
    }
  }
  return ReadFile(path);
}

int64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (!absl::ConsumePrefix(&v, field + ":")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, " kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(v, &kb)) return kb * 1024;
  }
  return -1;
}

absl::StatusOr<std::vector<int>> RunAll(
    const std::vector<std::vector<std::string>>& argvs,
    const std::string& log_prefix, absl::Duration timeout) {
  std::vector<Subprocess> procs;
  for (size_t i = 0; i < argvs.size(); ++i) {
    absl::StatusOr<Subprocess> p =
        Subprocess::Start(argvs[i], absl::StrCat(log_prefix, i, ".log"));
    if (!p.ok()) return p.status();
    procs.push_back(std::move(*p));
  }
  std::vector<int> codes;
  for (Subprocess& p : procs) {
    absl::StatusOr<int> c = p.Wait(timeout);
    if (!c.ok()) return c.status();
    codes.push_back(*c);
  }
  return codes;
}

}  // namespace cairn::testing
