#include "common/daemon.h"

#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_logging.h"
#include "common/logging.h"

namespace cairn::daemon {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

absl::Status SetUpLogging(const flags::LogFlags& log) {
  if (absl::Status s = SetLogFormat(log.format); !s.ok()) return s;
  RouteGrpcLogsToCairnLogger();
  return SetLogLevel(log.level);
}

namespace {

// A name for the temporary file of `path` no other writer in this process
// or another uses at the same time.
std::string TempPathFor(const std::string& path) {
  static std::atomic<int> counter{0};
  return absl::StrCat(path, ".tmp-", getpid(), "-", counter++);
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = TempPathFor(path);
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("writing ", path, ": creating ", tmp));
  }
  absl::Status status = WriteAll(fd, contents);
  if (status.ok() && fsync(fd) != 0) {
    status = absl::ErrnoToStatus(errno, "fsync");
  }
  if (close(fd) != 0 && status.ok()) {
    status = absl::ErrnoToStatus(errno, "close");
  }
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("renaming ", tmp));
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return absl::Status(status.code(),
                        absl::StrCat("writing ", path, ": ", status.message()));
  }
  return absl::OkStatus();
}

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int StopSignals::Wait(const WaitOptions& options) const {
  const bool poll = options.poll_every > absl::ZeroDuration();
  const timespec every = absl::ToTimespec(options.poll_every);
  int sig = 0;
  while (true) {
    if (poll) {
      sig = sigtimedwait(&set_, nullptr, &every);
      if (sig < 0) {
        if (errno != EAGAIN && errno != EINTR) break;
        if (options.on_poll) options.on_poll();
        continue;
      }
    } else if (sigwait(&set_, &sig) != 0) {
      break;
    }
    if (sig != SIGHUP) break;
    if (options.on_reload) options.on_reload();
  }
  return sig;
}

}  // namespace cairn::daemon
