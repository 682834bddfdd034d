#include "common/logging.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace cairn {
namespace {

bool ParseLevel(absl::string_view name, spdlog::level::level_enum* out) {
  for (int l = spdlog::level::trace; l <= spdlog::level::off; ++l) {
    auto level = static_cast<spdlog::level::level_enum>(l);
    auto sv = spdlog::level::to_string_view(level);
    if (absl::string_view(sv.data(), sv.size()) == name) {
      *out = level;
      return true;
    }
  }
  if (name == "warn") {  // spdlog spells it "warning"
    *out = spdlog::level::warn;
    return true;
  }
  return false;
}

std::shared_ptr<spdlog::logger> MakeLogger() {
  auto logger = spdlog::stderr_color_mt("cairn");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %t %n] %v");
  spdlog::level::level_enum level = spdlog::level::info;
  const char* env = std::getenv("CAIRN_LOG_LEVEL");
  const bool bad_env = env != nullptr && !ParseLevel(env, &level);
  logger->set_level(level);
  if (bad_env) {
    // Libraries cannot refuse to start; say so instead of ignoring it.
    // (cairnd and cairn-agent take it as --log-level and refuse it.)
    logger->warn(
        "CAIRN_LOG_LEVEL='{}' is not a log level (trace, debug, info, warn, "
        "error or off); logging at info",
        env);
  }
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace

spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger>* logger =
      new std::shared_ptr<spdlog::logger>(MakeLogger());
  return **logger;
}

absl::Status SetLogLevel(absl::string_view level) {
  spdlog::level::level_enum parsed;
  if (!ParseLevel(level, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log level '", level,
                     "'; expected trace, debug, info, warn, error or off"));
  }
  Logger().set_level(parsed);
  return absl::OkStatus();
}

}  // namespace cairn
