#include "tests/testing/e2e_harness.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"

namespace cairn::testing {
namespace {

BinaryPaths& MutableBinaries() {
  static BinaryPaths* paths = new BinaryPaths();
  return *paths;
}

}  // namespace

const BinaryPaths& Binaries() { return MutableBinaries(); }

void SetBinaries(BinaryPaths paths, int argc, char** argv) {
  const std::pair<const char*, std::string*> flags[] = {
      {"cairnd", &paths.cairnd},
      {"agent", &paths.agent},
      {"agent-rank", &paths.agent_rank},
      {"rank", &paths.rank},
      {"cli", &paths.cli},
      {"make-certs", &paths.make_certs},
      {"promtool", &paths.promtool},
      {"prometheus", &paths.prometheus},
  };
  for (int i = 1; i < argc; ++i) {
    for (const auto& [name, value] : flags) {
      absl::string_view a = argv[i];
      if (absl::ConsumePrefix(&a, absl::StrCat("--", name, "="))) {
        *value = std::string(a);
      }
    }
  }
  MutableBinaries() = std::move(paths);
}

std::string SocketPath(const std::string& name) {
  return absl::StrCat("/tmp/cairn-", name, "-", getpid(), ".sock");
}

void EndToEndTest::SetUp() {
  dir_ = MakeTempDir();
  ASSERT_FALSE(dir_.empty());
}

void EndToEndTest::TearDown() {
  cairnd_.reset();
  if (storage_ != nullptr) {
    absl::Status cleaned = storage_->Cleanup();
    EXPECT_TRUE(cleaned.ok()) << cleaned;
  }
  if (!HasFailure()) std::filesystem::remove_all(dir_);
}

void EndToEndTest::CreateStorage(const std::string& data_dir,
                                 std::optional<TestStorage::Kind> kind) {
  const std::string path = absl::StrCat(dir_, "/", data_dir);
  absl::StatusOr<std::unique_ptr<TestStorage>> storage =
      kind.has_value() ? TestStorage::Create(path, *kind)
                       : TestStorage::Create(path);
  ASSERT_TRUE(storage.ok()) << storage.status();
  storage_ = std::move(*storage);
}

void EndToEndTest::StartCairnd(std::vector<std::string> flags) {
  if (storage_ != nullptr &&
      std::find(flags.begin(), flags.end(), "--storage") == flags.end()) {
    const std::vector<std::string> storage = storage_->CairndFlags();
    flags.insert(flags.begin(), storage.begin(), storage.end());
  }
  absl::StatusOr<std::unique_ptr<CairndProcess>> c =
      CairndProcess::Start(Binaries().cairnd, dir_ + "/cairnd", flags);
  ASSERT_TRUE(c.ok()) << c.status();
  cairnd_ = std::move(*c);
}

std::unique_ptr<v1::Coordinator::Stub> EndToEndTest::Stub() const {
  return v1::Coordinator::NewStub(CairndChannel(cairnd_->address()));
}

int EndToEndTest::Run(const std::vector<std::string>& argv, std::string* output,
                      absl::Duration timeout) {
  absl::StatusOr<Subprocess> p =
      Subprocess::Start(argv, absl::StrCat(dir_, "/run-", ++runs_, ".log"));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return -1;
  absl::StatusOr<int> code = p->Wait(timeout);
  EXPECT_TRUE(code.ok()) << code.status();
  *output = p->Log();
  return code.ok() ? *code : -1;
}

std::vector<std::string> EndToEndTest::RankArgv(
    const std::string& job, int rank, int world, const std::string& layout,
    const std::vector<std::string>& extra) const {
  std::vector<std::string> argv = {Binaries().rank,
                                   "--coordinator",
                                   cairnd_->address(),
                                   "--job",
                                   job,
                                   "--rank",
                                   std::to_string(rank),
                                   "--world-size",
                                   std::to_string(world),
                                   "--layout",
                                   layout};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> EndToEndTest::AgentRankArgv(
    const std::string& agent_socket, const std::string& job, int rank,
    int world, const std::string& layout,
    const std::vector<std::string>& extra) const {
  std::vector<std::string> argv = RankArgv(job, rank, world, layout, extra);
  argv[0] = Binaries().agent_rank;
  argv.insert(argv.begin() + 1, {"--agent-socket", agent_socket});
  return argv;
}

std::vector<int> EndToEndTest::RunAll(
    const std::vector<std::vector<std::string>>& argvs,
    absl::Duration timeout) {
  last_run_ = absl::StrCat(dir_, "/run-", ++runs_, "-rank");
  last_run_size_ = argvs.size();
  absl::StatusOr<std::vector<int>> codes =
      testing::RunAll(argvs, last_run_, timeout);
  EXPECT_TRUE(codes.ok()) << codes.status();
  return codes.ok() ? *std::move(codes) : std::vector<int>();
}

std::string EndToEndTest::RankLog(int i) const {
  return ReadFile(absl::StrCat(last_run_, i, ".log"));
}

std::string EndToEndTest::RankLogs() const {
  std::string logs;
  for (size_t i = 0; i < last_run_size_; ++i) {
    absl::StrAppend(&logs, "rank ", i, ": ", RankLog(i));
  }
  return logs;
}

std::vector<int> EndToEndTest::SaveSteps(
    const std::string& job, int world, const std::string& steps,
    const std::vector<std::string>& extra) {
  std::vector<std::vector<std::string>> argvs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = RankArgv(
        job, r, world, absl::StrCat(world, ":S0"), {"--save-steps", steps});
    argv.insert(argv.end(), extra.begin(), extra.end());
    argvs.push_back(std::move(argv));
  }
  return RunAll(argvs);
}

void EndToEndTest::StartCairnAgent(const std::vector<std::string>& flags,
                                   const std::string& name,
                                   std::unique_ptr<Subprocess>* agent,
                                   std::string* ready, absl::Duration timeout) {
  const std::string ready_file = absl::StrCat(dir_, "/", name, ".ready");
  std::vector<std::string> argv = {Binaries().agent};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"--ready-file", ready_file});
  absl::StatusOr<Subprocess> p =
      Subprocess::Start(argv, absl::StrCat(dir_, "/", name, ".log"));
  ASSERT_TRUE(p.ok()) << p.status();
  *agent = std::make_unique<Subprocess>(std::move(*p));
  absl::StatusOr<std::string> contents =
      WaitForFile(ready_file, **agent, timeout);
  ASSERT_TRUE(contents.ok()) << name << ": " << contents.status();
  if (ready != nullptr) *ready = *std::move(contents);
}

}  // namespace cairn::testing
