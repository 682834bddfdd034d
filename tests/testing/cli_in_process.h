// The `cairn` CLI run inside the test process (cli::RunCli), its stdout and
// stderr apart: for tests that parse what it prints.
#ifndef CAIRN_TESTS_TESTING_CLI_IN_PROCESS_H_
#define CAIRN_TESTS_TESTING_CLI_IN_PROCESS_H_

#include <string>
#include <vector>

namespace cairn::testing {

// Runs `cairn ARGS`: its exit code; its stdout in `*out`, and its stderr in
// `*err` unless null.
int RunCliInProcess(std::vector<std::string> args, std::string* out,
                    std::string* err = nullptr);

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_CLI_IN_PROCESS_H_
