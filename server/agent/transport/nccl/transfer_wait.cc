#include "server/agent/transport/nccl/transfer_wait.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace cairn::agent {

absl::Status AwaitTransfer(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                           absl::FunctionRef<void()> abort, absl::Time deadline,
                           absl::Duration timeout, absl::string_view what) {
  absl::Duration pause = absl::Microseconds(20);
  while (true) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok()) {
      abort();
      return absl::Status(done.status().code(),
                          absl::StrCat(what, ": ", done.status().message()));
    }
    if (*done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      abort();
      return absl::DeadlineExceededError(absl::StrCat(
          what, " did not complete within ", absl::FormatDuration(timeout),
          " (the peer died or stalled mid-transfer); communicator aborted"));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(1));
  }
}

}  // namespace cairn::agent
