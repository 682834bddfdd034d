#include "common/logging.h"

#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
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
    R"("logger":"%n","msg":%*})";

// %* in the JSON pattern: the message as a JSON string, then the job, step,
// rank and node it names as fields of their own.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const absl::string_view text(msg.payload.data(), msg.payload.size());
    std::string out = absl::StrCat("\"", JsonEscape(text), "\"");
    const LogFields f = ExtractLogFields(text);
    if (f.job) absl::StrAppend(&out, ",\"job\":\"", JsonEscape(*f.job), "\"");
    if (f.step) absl::StrAppend(&out, ",\"step\":", *f.step);
    if (f.rank) absl::StrAppend(&out, ",\"rank\":", *f.rank);
    if (f.node) absl::StrAppend(&out, ",\"node\":", *f.node);
    dest.append(out.data(), out.data() + out.size());
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

namespace {

// The value after the first "<word> " in `m` that starts a word: a number,
// or (for a job) a 'quoted' or bare name ending at a space, ':' or ','.
std::optional<std::string> WordAfter(absl::string_view m,
                                     absl::string_view word, bool number) {
  const std::string key = absl::StrCat(word, " ");
  for (size_t at = m.find(key); at != absl::string_view::npos;
       at = m.find(key, at + 1)) {
    if (at > 0 && std::isalnum(static_cast<unsigned char>(m[at - 1]))) continue;
    absl::string_view rest = m.substr(at + key.size());
    if (number) {
      size_t n = 0;
      while (n < rest.size() &&
             std::isdigit(static_cast<unsigned char>(rest[n]))) {
        ++n;
      }
      if (n > 0 && n <= 18) return std::string(rest.substr(0, n));
      continue;
    }
    if (!rest.empty() && rest[0] == '\'') {
      const size_t end = rest.find('\'', 1);
      if (end != absl::string_view::npos && end > 1) {
        return std::string(rest.substr(1, end - 1));
      }
      continue;
    }
    const size_t end = rest.find_first_of(" :,");
    const absl::string_view name = rest.substr(0, end);
    if (!name.empty()) return std::string(name);
  }
  return std::nullopt;
}

std::optional<int64_t> NumberAfter(absl::string_view m,
                                   absl::string_view word) {
  std::optional<std::string> s = WordAfter(m, word, /*number=*/true);
  int64_t v = 0;
  if (!s || !absl::SimpleAtoi(*s, &v)) return std::nullopt;
  return v;
}

}  // namespace

LogFields ExtractLogFields(absl::string_view message) {
  LogFields f;
  f.job = WordAfter(message, "job", /*number=*/false);
  f.step = NumberAfter(message, "step");
  f.rank = NumberAfter(message, "rank");
  f.node = NumberAfter(message, "node");
  return f;
}

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
