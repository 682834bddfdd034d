// Logging for every Cairn binary and library, on spdlog (Debian libspdlog).
//
// Example:
//   CAIRN_LOG(info, "job {} step {} committed ({} bytes)", job, step, n);
//
// Output goes to stderr, one line per event, with a timestamp, level, thread
// id and the logger's name: as text (default), or as one JSON object per
// line for log pipelines (SetLogFormat("json"), CAIRN_LOG_FORMAT=json):
//   {"time":"2026-11-24T10:00:00.123Z","level":"info","thread":42,
//    "logger":"cairn","msg":"job llama step 7 committed"}
// The level comes from SetLogLevel() or, at first use, from the
// CAIRN_LOG_LEVEL environment variable (trace|debug|info|warn|error|off).
// Default: info.
#ifndef CAIRN_COMMON_LOGGING_H_
#define CAIRN_COMMON_LOGGING_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace cairn {

// The process-wide Cairn logger (thread-safe, created on first use).
spdlog::logger& Logger();

// Sets the level by name; INVALID_ARGUMENT for an unknown name.
absl::Status SetLogLevel(absl::string_view level);

// Sets the line format: "text" or "json"; INVALID_ARGUMENT otherwise.
absl::Status SetLogFormat(absl::string_view format);

// `s` escaped for the inside of a JSON string (quotes, backslashes, control
// characters; UTF-8 passes through). Exposed for tests.
std::string JsonEscape(absl::string_view s);

// The job, step, rank and node a log message is about, read from the words
// Cairn's messages use ("job 'llama' step 7 rank 3: ...", "node 2: ...");
// --log-format json adds them as fields so log pipelines can filter on them.
struct LogFields {
  std::optional<std::string> job;
  std::optional<int64_t> step, rank, node;
};
LogFields ExtractLogFields(absl::string_view message);

}  // namespace cairn

#define CAIRN_LOG(level, ...) ::cairn::Logger().level(__VA_ARGS__)

#endif  // CAIRN_COMMON_LOGGING_H_
