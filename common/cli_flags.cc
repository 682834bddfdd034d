#include "common/cli_flags.h"

#include <unistd.h>  // environ

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/version.h"

namespace cairn::flags {
namespace {

// The value of `s` as a number, or nullopt (CLI11's conversion then reports
// what is not a number).
std::optional<double> AsNumber(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || std::isnan(v)) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator AtLeast(double min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        std::optional<double> v = AsNumber(s);
        if (v.has_value() && *v < min) {
          return absl::StrCat("must be >= ", min, ", got ", s);
        }
        return std::string();
      },
      absl::StrCat(">= ", min));
}

CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::optional<double> v = AsNumber(s);
        if (v.has_value() && *v <= 0) {
          return absl::StrCat("must be > 0, got ", s);
        }
        return std::string();
      },
      "> 0");
}

CLI::Validator InRange(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& s) -> std::string {
        std::optional<double> v = AsNumber(s);
        if (v.has_value() && (*v < min || *v > max)) {
          return absl::StrCat("must be in [", min, ", ", max, "], got ", s);
        }
        return std::string();
      },
      absl::StrCat("in [", min, ", ", max, "]"));
}

std::string EnvironmentVariableFor(const std::string& long_name) {
  std::string name = "CAIRN_";
  for (char c : long_name) {
    name +=
        c == '-'
            ? '_'
            : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

namespace {

constexpr char kPrintConfig[] = "print-config";

bool Excluded(const std::string& long_name) {
  return long_name == "help" || long_name == "version" ||
         long_name == kPrintConfig;
}

// The options of `app` with a long name, each with its variable.
std::vector<std::pair<const CLI::Option*, std::string>> EnvOptions(
    const CLI::App& app) {
  std::vector<std::pair<const CLI::Option*, std::string>> out;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (Excluded(name)) continue;
    out.emplace_back(opt, EnvironmentVariableFor(name));
  }
  return out;
}

// Whether `argv` names option --`name` (as --name or --name=...).
bool OnCommandLine(int argc, const char* const* argv, const std::string& name) {
  const std::string flag = "--" + name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

void PrintConfig(const CLI::App& app, int argc, const char* const* argv,
                 std::ostream& out) {
  out << "# " << app.get_name()
      << " configuration: command line, then CAIRN_* environment, then "
         "default\n";
  for (const auto& [opt, env] : EnvOptions(app)) {
    const std::string& name = opt->get_lnames().front();
    std::string value, source;
    if (OnCommandLine(argc, argv, name)) {
      source = "command line";
    } else if (std::getenv(env.c_str()) != nullptr) {
      source = env;
    } else {
      source = "default";
    }
    if (opt->count() > 0) {
      for (const std::string& r : opt->results()) {
        value += (value.empty() ? "" : ",") + r;
      }
    } else {
      value = opt->get_default_str();
    }
    if (opt->get_type_size() == 0) {  // a flag
      value = opt->count() > 0 ? "true" : "false";
    }
    out << "--" << name << "=" << value << "  # " << source << "\n";
  }
}

// CAIRN_* variables that are not a daemon's flags but are read elsewhere
// (libraries, the Python package, tests): never warned about.
constexpr absl::string_view kNonFlagVariables[] = {
    "CAIRN_PEER_TOKEN", "CAIRN_CRASH_POINTS", "CAIRN_COORDINATOR", "CAIRN_JOB",
    "CAIRN_AGENT_SOCKET", "CAIRN_BUILD_DIR", "CAIRN_TEST_STORAGE",
    "CAIRN_CEPH_DIR",
    // Client settings (libcairn, the Python package, the CLI): in a daemon's
    // container they are for the CLI.
    "CAIRN_TOKEN", "CAIRN_TLS_CA"};
constexpr absl::string_view kNonFlagPrefixes[] = {"CAIRN_S3_", "CAIRN_TEST_"};

// A CAIRN_* variable that names no option of a program that reads its
// options from the environment is most likely a typo
// (CAIRN_STAGING_BUDGET_MB): say so on `err` instead of ignoring it.
// Only daemons (programs with --print-config) warn: a tool such as the
// `cairn` CLI run inside a daemon's container sees the daemon's CAIRN_*
// settings, which are not typos.
void WarnUnknownEnvironmentVariables(const CLI::App& app, std::ostream& err) {
  bool daemon = false;
  for (const CLI::Option* opt : app.get_options()) {
    daemon |=
        !opt->get_lnames().empty() && opt->get_lnames().front() == kPrintConfig;
  }
  if (!daemon) return;
  std::set<std::string> known;
  for (const auto& [opt, env] : EnvOptions(app)) {
    if (!opt->get_envname().empty()) known.insert(env);
  }
  if (known.empty()) return;  // this program takes no options from CAIRN_*
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    if (!absl::StartsWith(name, "CAIRN_") || known.count(std::string(name))) {
      continue;
    }
    bool expected = false;
    for (absl::string_view v : kNonFlagVariables) expected |= name == v;
    for (absl::string_view p : kNonFlagPrefixes) {
      expected |= absl::StartsWith(name, p);
    }
    if (expected) continue;
    err << app.get_name() << ": warning: " << name << " is set but is not a "
        << app.get_name() << " setting (ignored); settings are --foo-bar as "
        << "CAIRN_FOO_BAR, see --help\n";
  }
}

}  // namespace

void AddEnvironmentVariables(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (Excluded(name)) continue;
    opt->envname(EnvironmentVariableFor(name));
  }
}

void AddPrintConfigFlag(CLI::App& app) {
  app.add_flag(std::string("--") + kPrintConfig,
               "Print every option's effective value and where it came from "
               "(command line, CAIRN_* environment, default), then exit");
}

void AddLogFlags(CLI::App& app, LogFlags* flags) {
  app.add_option("--log-level", flags->level,
                 "trace, debug, info, warn, error or off")
      ->capture_default_str()
      ->check(
          CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--log-format", flags->format,
                 "text, or json: one JSON object per line (time, level, "
                 "thread, logger, msg) for log pipelines")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
}

void AddVersionFlag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", VersionString(program),
                       "Print the version and exit");
}

bool GivenOnCommandLine(const CLI::Option& opt, int argc,
                        const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") return false;  // positional arguments from here on
    for (const std::string& name : opt.get_lnames()) {
      const std::string flag = "--" + name;
      if (a == flag || absl::StartsWith(a, flag + "=")) return true;
    }
    for (const std::string& name : opt.get_snames()) {
      if (absl::StartsWith(a, "-" + name) && !absl::StartsWith(a, "--")) {
        return true;
      }
    }
  }
  return false;
}

std::optional<int> Parse(CLI::App& app, int argc, const char* const* argv,
                         std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    app.exit(e, out, err);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    app.exit(e, out, err);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    err << app.get_name() << ": " << e.what();
    // A bad value that came from the environment: say which variable.
    const std::string what = e.what();
    for (const auto& [opt, env] : EnvOptions(app)) {
      const std::string& name = opt->get_lnames().front();
      const char* value = std::getenv(env.c_str());
      if (value != nullptr && !OnCommandLine(argc, argv, name) &&
          what.find("--" + name) != std::string::npos) {
        err << " (from the environment: " << env << "=" << value << ")";
      }
    }
    err << "\n"
        << "Run with --help for more information.\n";
    return kExitUsage;
  }
  WarnUnknownEnvironmentVariables(app, err);
  const CLI::Option* print = nullptr;
  for (const CLI::Option* opt : app.get_options()) {
    if (!opt->get_lnames().empty() &&
        opt->get_lnames().front() == kPrintConfig) {
      print = opt;
    }
  }
  if (print != nullptr && print->count() > 0) {
    PrintConfig(app, argc, argv, out);
    return 0;
  }
  return std::nullopt;
}

}  // namespace cairn::flags
