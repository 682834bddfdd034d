#include "common/logging.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/pattern_formatter.h"
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

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ %t %n] %v";
constexpr char kJsonPattern[] =
    R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","thread":%t,)"
    R"("logger":"%n","msg":"%*"})";

// %* in the JSON pattern: the message, JSON-escaped.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        JsonEscape(absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

void ApplyFormat(spdlog::logger& logger, bool json) {
  if (json) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(
        spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(kJsonPattern);
    logger.set_formatter(std::move(formatter));
  } else {
    logger.set_pattern(kTextPattern);
  }
}

std::shared_ptr<spdlog::logger> MakeLogger() {
  auto logger = spdlog::stderr_color_mt("cairn");
  const char* format = std::getenv("CAIRN_LOG_FORMAT");
  const bool bad_format = format != nullptr && std::string(format) != "json" &&
                          std::string(format) != "text";
  ApplyFormat(*logger, format != nullptr && std::string(format) == "json");
  spdlog::level::level_enum level = spdlog::level::info;
  const char* env = std::getenv("CAIRN_LOG_LEVEL");
  const bool bad_env = env != nullptr && !ParseLevel(env, &level);
  logger->set_level(level);
  if (bad_format) {
    logger->warn("CAIRN_LOG_FORMAT='{}' is not text or json; logging as text",
                 format);
  }
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

std::string JsonEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(
              &out, "\\u00",
              absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out;
}

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

namespace cairn {

absl::Status SetLogFormat(absl::string_view format) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log format '", format, "'; expected text or json"));
  }
  ApplyFormat(Logger(), format == "json");
  return absl::OkStatus();
}

}  // namespace cairn
