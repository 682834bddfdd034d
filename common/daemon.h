// What every Cairn daemon (cairnd, cairn-agent) does around its server:
// logging from the common flags, the signals it stops and reloads on, and
// the files it announces itself with (--port-file, --ready-file, a peer
// rendezvous file), written so that a reader never sees half a file.
//
// Example (a daemon's main):
//   cairn::daemon::DisableMutexDeadlockDetection();
//   ... add flags, cairn::flags::Parse ...
//   if (absl::Status s = cairn::daemon::SetUpLogging(log); !s.ok()) ...
//   cairn::daemon::StopSignals signals;  // before any thread starts
//   ... start the server ...
//   CAIRN_RETURN_IF_ERROR(cairn::daemon::WriteFileAtomically(
//       port_file, absl::StrCat(port, "\n")));
//   cairn::daemon::StopSignals::WaitOptions wait;
//   wait.on_reload = [&] { server->Reload(); };
//   const int sig = signals.Wait(wait);
//   server->Shutdown();
#ifndef CAIRN_COMMON_DAEMON_H_
#define CAIRN_COMMON_DAEMON_H_

#include <signal.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"

namespace cairn::daemon {

// Debian's Abseil is built with Mutex deadlock detection on: every lock and
// every Mutex's destruction updates one global lock graph (CPU on every
// lock, and one more lock that every thread shares). The tests keep it; the
// daemons call this first thing and do not pay for it.
void DisableMutexDeadlockDetection();

// Applies the logging flags (cairn::flags::AddLogFlags): the line format,
// gRPC's own log lines routed through Cairn's logger, then the level.
// INVALID_ARGUMENT for an unknown level or format (the flags' checks reject
// them first).
absl::Status SetUpLogging(const flags::LogFlags& log);

// Writes `contents` to `path` so that a reader sees the old file or the
// whole new one, never a part: into a temporary file next to it (created
// with mode 0666 less the umask), fsynced, then renamed over `path`. The
// error names `path` and the step that failed; the temporary file is
// removed then.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// The signals a daemon stops on (SIGTERM, SIGINT) and reloads on (SIGHUP),
// taken by the main thread with sigwait.
//
// Construct it in the main thread before any other thread starts: it
// blocks the three signals in the calling thread, and threads inherit the
// mask, so none of them takes one. They stay blocked after it is gone: a
// second SIGTERM while the daemon drains must not kill it.
class StopSignals {
 public:
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  struct WaitOptions {
    // Runs on each SIGHUP; null: SIGHUP is ignored.
    std::function<void()> on_reload;
    // With a positive interval, runs `on_poll` each time that long passes
    // without a signal (a daemon's check for changed files). Default: none.
    absl::Duration poll_every = absl::ZeroDuration();
    std::function<void()> on_poll;
  };
  // Waits until SIGTERM or SIGINT arrives, running the callbacks in this
  // thread meanwhile, and returns the signal; -1 or 0 if waiting failed
  // (errno from sigtimedwait, or sigwait's error).
  int Wait(const WaitOptions& options) const;

 private:
  sigset_t set_;
};

}  // namespace cairn::daemon

#endif  // CAIRN_COMMON_DAEMON_H_
