// Command-line conventions shared by every Cairn binary (cairnd,
// cairn-agent, cairn): --version, range checks whose errors say what is
// wrong ("--keep-last: must be >= 0, got -1"), and the exit codes docs/cli.md
// documents (0 success, 1 failure, 2 usage).
#ifndef CAIRN_COMMON_CLI_FLAGS_H_
#define CAIRN_COMMON_CLI_FLAGS_H_

#include <optional>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

namespace cairn::flags {

inline constexpr int kExitUsage = 2;

// A number >= min (CLI11's own range checks print 1.79769e+308 as 309
// digits).
CLI::Validator AtLeast(double min);
// A number > 0.
CLI::Validator Positive();
// A number in [min, max].
CLI::Validator InRange(double min, double max);

// The daemons' logging flags: --log-level (trace, debug, info, warn, error,
// off; default info) and --log-format (text or json; default text), both
// checked as sets. The caller applies them after Parse (SetLogLevel,
// SetLogFormat in common/logging.h).
struct LogFlags {
  std::string level = "info";
  std::string format = "text";
};
void AddLogFlags(CLI::App& app, LogFlags* flags);

// Adds --version to `app`, printing VersionString(program).
void AddVersionFlag(CLI::App& app, const std::string& program);

// Makes every long option --foo-bar of `app` (but --help, --version and
// --print-config) also settable by the environment variable CAIRN_FOO_BAR.
// Precedence: the command line, then the environment, then the default. An
// environment value goes through the option's checks like a flag's, and a
// bad one is a usage error naming the variable. Call after adding the
// options, before Parse.
void AddEnvironmentVariables(CLI::App& app);

// "CAIRN_FOO_BAR" for "--foo-bar".
std::string EnvironmentVariableFor(const std::string& long_name);

// Adds --print-config: Parse then prints every option's effective value and
// where it came from (command line, environment variable, default) to `out`
// and returns 0, so operators can see what a daemon would run with.
void AddPrintConfigFlag(CLI::App& app);

// Whether `opt` was given in argv (--name, --name=V, -c, -cV), not only
// through its environment variable: CLI11 counts both alike.
bool GivenOnCommandLine(const CLI::Option& opt, int argc,
                        const char* const* argv);

// Parses argv. Returns nullopt to go on, or the exit code main should
// return: 0 after --help/--version/--print-config (printed to `out`),
// kExitUsage after a usage error (printed to `err` with a pointer to
// --help). A program with --print-config (a daemon, whose whole
// configuration can come from CAIRN_*) also warns on `err` about CAIRN_*
// variables that are none of its settings, such as a typo.
std::optional<int> Parse(CLI::App& app, int argc, const char* const* argv,
                         std::ostream& out, std::ostream& err);

}  // namespace cairn::flags

#endif  // CAIRN_COMMON_CLI_FLAGS_H_
