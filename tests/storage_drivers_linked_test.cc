// Every production library that opens storage brings the posix and s3
// drivers with it, and none brings the test-only memory driver. Built once
// per library (storage_drivers_linked_{client,coordinator,agent,cli}_test),
// linking only that library: a driver lost from a library's link (a
// registrar dropped by the linker, a dependency removed) fails here, and with
// it the binaries cairnd, cairn-agent and cairn, and every program using
// libcairn. CAIRN_LINKS_S3: the build has the s3 driver (storage/s3).
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/shard_store.h"

namespace cairn::storage {
namespace {

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
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("unsupported scheme")));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cairn-linked"));
}
#else
constexpr char kRegistered[] = "file";
TEST(StorageDriversLinkedTest, PosixAndOnlyPosixIsRegistered) {
  EXPECT_THAT(RegisteredShardStoreSchemes(), ElementsAre("file"));
}
#endif

TEST(StorageDriversLinkedTest, FileUriOpensAndRoundTripsAnObject) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/cairn-drv-XXXXXX");
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
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
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat(
                  "unsupported scheme 'mem' (registered: ", kRegistered, ")")));
}

}  // namespace
}  // namespace cairn::storage
