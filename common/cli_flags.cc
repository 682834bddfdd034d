#include "common/cli_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
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

void AddVersionFlag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", VersionString(program),
                       "Print the version and exit");
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
    err << app.get_name() << ": " << e.what() << "\n"
        << "Run with --help for more information.\n";
    return kExitUsage;
  }
  return std::nullopt;
}

}  // namespace cairn::flags
