// The harness of the end-to-end tests (tests/*_test.cc): a fixture for tests
// that run Cairn's real binaries (cairnd, cairn-agent, ranks, the CLI) as
// processes on loopback, and where those binaries are. Every such test
// links e2e_main.cc as its main, which fills in Binaries().
//
// Example:
//   class ListE2ETest : public testing::EndToEndTest {};
//   TEST_F(ListE2ETest, SavedStepsAreListed) {
//     ASSERT_NO_FATAL_FAILURE(StartCairnd());
//     ASSERT_THAT(SaveSteps("job", 2, "1,2"), Each(0)) << RankLogs();
//     std::string out;
//     EXPECT_EQ(Run({Binaries().cli, "-c", cairnd_->address(), "ls"}, &out),
//               0);
//   }
//
// Thread-compatible.
#ifndef CAIRN_TESTS_TESTING_E2E_HARNESS_H_
#define CAIRN_TESTS_TESTING_E2E_HARNESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/cairnd_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_storage.h"

namespace cairn::testing {

// The binaries and scripts the tests run. CMake compiles their paths into
// e2e_main.cc (CAIRN_*_PATH); Bazel, whose binaries live in runfiles, passes
// them as --NAME=PATH arguments, which win.
struct BinaryPaths {
  std::string cairnd;                              // --cairnd
  std::string agent;                               // --agent: cairn-agent
  std::string agent_rank;                          // --agent-rank
  std::string rank;                                // --rank: the example job
  std::string cli;                                 // --cli: cairn
  std::string make_certs;                          // --make-certs
  std::string promtool = "/usr/bin/promtool";      // --promtool
  std::string prometheus = "/usr/bin/prometheus";  // --prometheus
};
const BinaryPaths& Binaries();
// Sets Binaries() to `paths`, with every "--NAME=PATH" argument of
// argv[1, argc) applied. Call after ::testing::InitGoogleTest, which removes
// gtest's own flags.
void SetBinaries(BinaryPaths paths, int argc, char** argv);

// A Unix socket path for `name` that fits sun_path's 107 bytes (Bazel's
// TEST_TMPDIR is long): /tmp/cairn-<name>-<pid>.sock.
std::string SocketPath(const std::string& name);

class EndToEndTest : public ::testing::Test {
 protected:
  // dir_: a fresh directory named after the test.
  void SetUp() override;
  // Stops cairnd_ (SIGKILL), cleans up the test storage, and removes dir_
  // unless the test failed. A subclass stops its own processes first.
  void TearDown() override;

  // storage_: the test's storage for a cairnd whose --data-dir is
  // dir_/`data_dir`, of `kind` (CAIRN_TEST_STORAGE's when unset).
  void CreateStorage(const std::string& data_dir = "cairnd",
                     std::optional<TestStorage::Kind> kind = std::nullopt);

  // cairnd_: cairnd with --data-dir dir_/cairnd and `flags`, on storage_
  // (when CreateStorage made one) unless `flags` name a --storage.
  void StartCairnd(std::vector<std::string> flags = {});

  // A Coordinator stub on cairnd_, as clients make it (CairndChannel).
  std::unique_ptr<v1::Coordinator::Stub> Stub() const;

  // Runs `argv` to completion (at most `timeout`): its exit code, -1 (and a
  // test failure) when it cannot be run; its output (stdout and stderr) in
  // `*output`.
  int Run(const std::vector<std::string>& argv, std::string* output,
          absl::Duration timeout = absl::Minutes(2));

  // argv of rank `rank` of `world` ranks of the example job `job` (layout
  // `layout`) on cairnd_, then `extra`.
  std::vector<std::string> RankArgv(
      const std::string& job, int rank, int world, const std::string& layout,
      const std::vector<std::string>& extra = {}) const;
  // The same rank in agent mode (cairn_agent_rank), through the cairn-agent
  // serving `agent_socket`.
  std::vector<std::string> AgentRankArgv(
      const std::string& agent_socket, const std::string& job, int rank,
      int world, const std::string& layout,
      const std::vector<std::string>& extra = {}) const;

  // Runs every argv at once, each at most `timeout`: their exit codes, empty
  // (and a test failure) when they cannot be run. RankLog() and RankLogs()
  // hold their output until the next RunAll.
  std::vector<int> RunAll(const std::vector<std::vector<std::string>>& argvs,
                          absl::Duration timeout = absl::Minutes(3));
  // The output of process `i` of the last RunAll.
  std::string RankLog(int i) const;
  // The output of every process of the last RunAll, "rank <i>: " first.
  std::string RankLogs() const;

  // `world` ranks of the example job save `steps` (layout "<world>:S0",
  // then `extra`): their exit codes.
  std::vector<int> SaveSteps(const std::string& job, int world,
                             const std::string& steps,
                             const std::vector<std::string>& extra = {});

  // Starts cairn-agent with `flags` and --ready-file, its log and ready file
  // named dir_/<name>.{log,ready}, and waits (at most `timeout`) until it is
  // ready. `*ready` gets the ready file's contents (the peer port).
  void StartCairnAgent(const std::vector<std::string>& flags,
                       const std::string& name,
                       std::unique_ptr<Subprocess>* agent,
                       std::string* ready = nullptr,
                       absl::Duration timeout = absl::Seconds(30));

  std::string dir_;
  std::unique_ptr<TestStorage> storage_;
  std::unique_ptr<CairndProcess> cairnd_;

 private:
  int runs_ = 0;
  std::string last_run_;  // log prefix of the last RunAll
  size_t last_run_size_ = 0;
};

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_E2E_HARNESS_H_
