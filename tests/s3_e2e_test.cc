// End-to-end on S3 only, through the real binaries as processes: what has
// no file:// counterpart, or whose file:// counterpart moves directories
// (ops_test's posix-only cases). The rest of the end-to-end suite runs on S3
// as e2e_test, ops_test and agent_e2e_test with CAIRN_TEST_STORAGE=s3.
//
//   * cairnd refuses to start on wrong credentials (UNAUTHENTICATED) or a
//     missing bucket (NOT_FOUND), naming the bucket, before it serves;
//   * `cairn -s s3://missing-bucket/... ls` is an error, not "no
//     checkpoints";
//   * `cairn -c ADDR verify` from a host that cannot reach the S3 endpoint
//     (or has other credentials) says the storage is not reachable from
//     this host, not DATA_LOSS; a data object really missing still is.
//
// Needs an S3 server named by AWS_ENDPOINT_URL (+ AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY): `ctest -L s3` starts one (scripts/ceph/ceph.sh);
// without it every test fails saying so.
//
// Binaries come from --cairnd=, --cli=, --rank= (Bazel passes them as args),
// else from the paths CMake compiled in.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_layout.h"
#include "tests/testing/cairnd_process.h"
#include "tests/testing/path_flags.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_storage.h"

#ifndef CAIRN_CAIRND_PATH
#define CAIRN_CAIRND_PATH ""
#endif
#ifndef CAIRN_CLI_PATH
#define CAIRN_CLI_PATH ""
#endif
#ifndef CAIRN_RANK_PATH
#define CAIRN_RANK_PATH ""
#endif

namespace cairn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string g_cairnd = CAIRN_CAIRND_PATH;
std::string g_cli = CAIRN_CLI_PATH;
std::string g_rank = CAIRN_RANK_PATH;

// Runs a program with extra environment settings.
constexpr char kEnv[] = "/usr/bin/env";

class S3E2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_FALSE(dir_.empty());
    absl::StatusOr<std::unique_ptr<testing::TestStorage>> storage =
        testing::TestStorage::Create(dir_ + "/cairnd",
                                     testing::TestStorage::Kind::kS3);
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = std::move(*storage);
  }
  void TearDown() override {
    cairnd_.reset();
    if (storage_ != nullptr) {
      absl::Status cleaned = storage_->Cleanup();
      EXPECT_TRUE(cleaned.ok()) << cleaned;
    }
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  void StartCairnd() {
    absl::StatusOr<std::unique_ptr<testing::CairndProcess>> c =
        testing::CairndProcess::Start(g_cairnd, dir_ + "/cairnd",
                                      storage_->CairndFlags());
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
  }

  // Runs `argv` to completion; returns its exit code, its output (stdout and
  // stderr) in `*output`.
  int Run(const std::vector<std::string>& argv, std::string* output) {
    const std::string log = absl::StrCat(dir_, "/run-", ++runs_, ".log");
    absl::StatusOr<testing::Subprocess> p =
        testing::Subprocess::Start(argv, log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return -1;
    absl::StatusOr<int> code = p->Wait(absl::Minutes(2));
    EXPECT_TRUE(code.ok()) << code.status();
    *output = p->Log();
    return code.ok() ? *code : -1;
  }

  // Saves `steps` from `world` ranks (layout "<world>:S0"); exit codes.
  std::vector<int> SaveSteps(const std::string& job, int world,
                             const std::string& steps) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < world; ++r) {
      argvs.push_back({g_rank, "--coordinator", cairnd_->address(), "--job",
                       job, "--rank", std::to_string(r), "--world-size",
                       std::to_string(world), "--layout",
                       absl::StrCat(world, ":S0"), "--save-steps", steps});
    }
    absl::StatusOr<std::vector<int>> codes = testing::RunAll(
        argvs, absl::StrCat(dir_, "/ranks-", ++runs_, "-"), absl::Minutes(3));
    EXPECT_TRUE(codes.ok()) << codes.status();
    return codes.ok() ? *codes : std::vector<int>();
  }

  // The test bucket's URI with another bucket name.
  std::string MissingBucketUri() const {
    return absl::StrCat("s3://", storage_->bucket(), "-missing/ckpt");
  }

  std::string dir_;
  std::unique_ptr<testing::TestStorage> storage_;
  std::unique_ptr<testing::CairndProcess> cairnd_;
  int runs_ = 0;
};

// Wrong credentials are found when cairnd starts, not on the first save.
TEST_F(S3E2ETest, CairndWithWrongCredentialsRefusesToStart) {
  std::string out;
  EXPECT_EQ(Run({kEnv, "AWS_SECRET_ACCESS_KEY=not-the-secret", g_cairnd,
                 "--listen", "127.0.0.1:0", "--data-dir", dir_ + "/cairnd",
                 "--storage", storage_->uri()},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(out, HasSubstr(storage_->bucket()));
}

TEST_F(S3E2ETest, CairndOnAMissingBucketRefusesToStart) {
  std::string out;
  EXPECT_EQ(Run({g_cairnd, "--listen", "127.0.0.1:0", "--data-dir",
                 dir_ + "/cairnd", "--storage", MissingBucketUri()},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(storage_->bucket(), "-missing")));
}

// The S3 counterpart of ops_test's CliOfflineMissingStorageRootIsAnError: a
// typo in the bucket is an error, not an empty listing.
TEST_F(S3E2ETest, CliOfflineOnAMissingBucketIsAnError) {
  std::string out;
  EXPECT_EQ(Run({g_cli, "-s", MissingBucketUri(), "ls"}, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(storage_->bucket(), "-missing")));
  EXPECT_THAT(out, Not(HasSubstr("no checkpoints")));
}

// The S3 counterpart of ops_test's
// CliVerifyWhereStorageIsNotMountedSaysUnreachable: `cairn -c ADDR verify`
// reads the bucket from the CLI's host, with that host's endpoint and
// credentials.
TEST_F(S3E2ETest, CliVerifyWhereS3IsNotReachableSaysSo) {
  StartCairnd();
  ASSERT_THAT(SaveSteps("job", 2, "1"), ::testing::Each(0));
  const std::string unreachable =
      absl::StrCat("FAILED_PRECONDITION: storage ", storage_->uri(),
                   " of job 'job' step 1 is not reachable from this host");
  std::string out;
  // Nothing listens on port 1.
  EXPECT_EQ(Run({kEnv, "AWS_ENDPOINT_URL=http://127.0.0.1:1", g_cli, "-c",
                 cairnd_->address(), "verify", "job", "1"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(unreachable));
  EXPECT_THAT(out, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(out, HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(out, Not(HasSubstr("DATA_LOSS")));
  // Other credentials on this host.
  EXPECT_EQ(Run({kEnv, "AWS_SECRET_ACCESS_KEY=not-the-secret", g_cli, "-c",
                 cairnd_->address(), "verify", "job", "1"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(unreachable));
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(out, Not(HasSubstr("DATA_LOSS")));
  // With this host's environment it verifies.
  EXPECT_EQ(Run({g_cli, "-c", cairnd_->address(), "verify", "job", "1"}, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("OK: job job step 1"));
  // A data object really missing is still data loss, naming it.
  absl::StatusOr<std::vector<std::string>> objects =
      storage_->DataObjects(storage::StepPrefix("job", 1));
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 2u);
  ASSERT_TRUE(storage_->Remove(objects->front()).ok());
  EXPECT_EQ(Run({g_cli, "-c", cairnd_->address(), "verify", "job", "1"}, &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(
      out,
      HasSubstr(objects->front().substr(storage::StepPrefix("job", 1).size())));
}

}  // namespace
}  // namespace cairn

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  cairn::testing::ParsePathFlags(argc, argv,
                                 {
                                     {"cairnd", &cairn::g_cairnd},
                                     {"cli", &cairn::g_cli},
                                     {"rank", &cairn::g_rank},
                                 });
  return RUN_ALL_TESTS();
}
