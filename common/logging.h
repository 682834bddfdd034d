// Logging for every Cairn binary and library, on spdlog (Debian libspdlog).
//
// Example:
//   CAIRN_LOG(info, "job {} step {} committed ({} bytes)", job, step, n);
//
// Output goes to stderr with a timestamp, level, thread id and the logger's
// name. The level comes from SetLogLevel() or, at first use, from the
// CAIRN_LOG_LEVEL environment variable (trace|debug|info|warn|error|off).
// Default: info.
#ifndef CAIRN_COMMON_LOGGING_H_
#define CAIRN_COMMON_LOGGING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace cairn {

// The process-wide Cairn logger (thread-safe, created on first use).
spdlog::logger& Logger();

// Sets the level by name; INVALID_ARGUMENT for an unknown name.
absl::Status SetLogLevel(absl::string_view level);

}  // namespace cairn

#define CAIRN_LOG(level, ...) ::cairn::Logger().level(__VA_ARGS__)

#endif  // CAIRN_COMMON_LOGGING_H_
