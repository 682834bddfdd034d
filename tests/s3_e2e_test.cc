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
#include "tests/testing/e2e_harness.h"

namespace cairn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::Binaries;

// Runs a program with extra environment settings.
constexpr char kEnv[] = "/usr/bin/env";

class S3E2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(
        CreateStorage("cairnd", testing::TestStorage::Kind::kS3));
  }

  // The test bucket's URI with another bucket name.
  std::string MissingBucketUri() const {
    return absl::StrCat("s3://", storage_->bucket(), "-missing/ckpt");
  }
};

// Wrong credentials are found when cairnd starts, not on the first save.
TEST_F(S3E2ETest, CairndWithWrongCredentialsRefusesToStart) {
  std::string out;
  EXPECT_EQ(Run({kEnv, "AWS_SECRET_ACCESS_KEY=not-the-secret",
                 Binaries().cairnd, "--listen", "127.0.0.1:0", "--data-dir",
                 dir_ + "/cairnd", "--storage", storage_->uri()},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(out, HasSubstr(storage_->bucket()));
}

TEST_F(S3E2ETest, CairndOnAMissingBucketRefusesToStart) {
  std::string out;
  EXPECT_EQ(Run({Binaries().cairnd, "--listen", "127.0.0.1:0", "--data-dir",
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
  EXPECT_EQ(Run({Binaries().cli, "-s", MissingBucketUri(), "ls"}, &out), 1)
      << out;
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
  EXPECT_EQ(Run({kEnv, "AWS_ENDPOINT_URL=http://127.0.0.1:1", Binaries().cli,
                 "-c", cairnd_->address(), "verify", "job", "1"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(unreachable));
  EXPECT_THAT(out, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(out, HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(out, Not(HasSubstr("DATA_LOSS")));
  // Other credentials on this host.
  EXPECT_EQ(Run({kEnv, "AWS_SECRET_ACCESS_KEY=not-the-secret", Binaries().cli,
                 "-c", cairnd_->address(), "verify", "job", "1"},
                &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr(unreachable));
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(out, Not(HasSubstr("DATA_LOSS")));
  // With this host's environment it verifies.
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("OK: job job step 1"));
  // A data object really missing is still data loss, naming it.
  absl::StatusOr<std::vector<std::string>> objects =
      storage_->DataObjects(storage::StepPrefix("job", 1));
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 2u);
  ASSERT_TRUE(storage_->Remove(objects->front()).ok());
  EXPECT_EQ(
      Run({Binaries().cli, "-c", cairnd_->address(), "verify", "job", "1"},
          &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(
      out,
      HasSubstr(objects->front().substr(storage::StepPrefix("job", 1).size())));
}

}  // namespace
}  // namespace cairn
