// Real processes for end-to-end tests: cairnd and training ranks run as
// separate programs, started with posix_spawn, their output kept in files.
#ifndef CAIRN_TESTS_TESTING_SUBPROCESS_H_
#define CAIRN_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cairn::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path`.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  // Kills (SIGKILL) and reaps the process if it is still running.
  ~Subprocess();

  // Waits for exit; returns the exit code, or 128 + signal if killed.
  // DEADLINE_EXCEEDED (process left running) after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::Minutes(5));
  void Signal(int sig);
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // The log's contents so far.
  std::string Log() const;
  // Waits until the log contains `text`: false if the process exits without
  // it or `timeout` passes first.
  bool WaitForLog(const std::string& text,
                  absl::Duration timeout = absl::Minutes(1));

 private:
  Subprocess(pid_t pid, std::string log_path)
      : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_ = -1;
  std::string log_path_;
};

// The contents of `path`; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Waits at most `timeout` for `path` to exist (daemons write their port and
// ready files by rename) and returns its contents; an error with `p`'s log
// if `p` exits first or the time runs out.
absl::StatusOr<std::string> WaitForFile(const std::string& path, Subprocess& p,
                                        absl::Duration timeout);

// A field of /proc/<pid>/status ("VmHWM", "VmRSS") in bytes; -1 if absent.
int64_t ProcStatusBytes(pid_t pid, const std::string& field);

// Runs every argv in parallel and waits for all; returns their exit codes.
absl::StatusOr<std::vector<int>> RunAll(
    const std::vector<std::vector<std::string>>& argvs,
    const std::string& log_prefix, absl::Duration timeout = absl::Minutes(5));

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_SUBPROCESS_H_
