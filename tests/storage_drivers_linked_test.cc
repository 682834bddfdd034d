// Every production library that opens storage brings the posix and s3
// drivers with it, and none brings the test-only memory driver. Built once
// per library (storage_drivers_linked_{client,coordinator,agent,cli}_test),
// linking only that library: a driver lost from a library's link (a
// registrar dropped by the linker, a dependency removed) fails here, and with
// it the binaries cairnd, cairn-agent and cairn, and every program using
// libcairn. CAIRN_LINKS_S3: the build has the s3 driver (storage/s3).
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/shard_store.h"

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

#ifdef CAIRN_LINKS_S3
constexpr char kRegistered[] = "file, s3";
TEST(StorageDriversLinkedTest, PosixAndS3AreRegistered) {
  EXPECT_THAT(RegisteredShardStoreSchemes(), ElementsAre("file", "s3"));
}

// An s3:// URI reaches the driver, which fails here (nothing listens on
// port 1) naming the bucket: UNAVAILABLE, not "unsupported scheme".
TEST(StorageDriversLinkedTest, S3UriReachesTheS3Driver) {
  // Credentials of its own, so the driver gets as far as connecting.
  ::setenv("AWS_ACCESS_KEY_ID", "linked-test", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "linked-test-secret", 1);
  auto store = OpenShardStore(
      "s3://cairn-linked/x?endpoint=http://127.0.0.1:1&max_attempts=1");
  // The driver may connect when opened or on first use.
  const absl::Status s =
      store.ok() ? (*store)->List("").status() : store.status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          AllOf(Not(HasSubstr("unsupported scheme")),
                                HasSubstr("cairn-linked"))));
}
#else
constexpr char kRegistered[] = "file";
TEST(StorageDriversLinkedTest, PosixAndOnlyPosixIsRegistered) {
  EXPECT_THAT(RegisteredShardStoreSchemes(), ElementsAre("file"));
}
#endif

TEST(StorageDriversLinkedTest, FileUriOpensAndRoundTripsAnObject) {
  const std::string dir = testing::MakeTempDirRemovedAtExit("drv");
  ASSERT_FALSE(dir.empty());
  auto store = OpenShardStore(absl::StrCat("file://", dir));
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string data = "bytes";
  ASSERT_TRUE((*store)->Put("job/step-1/obj", data).ok());
  auto back = ReadObject(**store, "job/step-1/obj");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, "bytes");
}

TEST(StorageDriversLinkedTest, MemoryDriverIsNotLinkedIntoProduction) {
  auto store = OpenShardStore("mem://x");
  EXPECT_THAT(
      store,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("unsupported scheme 'mem' (registered: ",
                                      kRegistered, ")"))));
}

}  // namespace
}  // namespace cairn::storage
