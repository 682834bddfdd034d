#include "tests/testing/cli_in_process.h"

#include <sstream>

#include "client/cli/cli.h"

namespace cairn::testing {

int RunCliInProcess(std::vector<std::string> args, std::string* out,
                    std::string* err) {
  args.insert(args.begin(), "cairn");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream o, e;
  const int rc = cli::RunCli(static_cast<int>(argv.size()), argv.data(), o, e);
  *out = o.str();
  if (err != nullptr) *err = e.str();
  return rc;
}

}  // namespace cairn::testing
