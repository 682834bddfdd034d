// Every production library that opens storage brings the posix driver with
// it, and none brings the test-only memory driver. Built once per library
// (storage_drivers_linked_{client,coordinator,agent,cli}_test), linking only
// that library: a driver lost from a library's link (a registrar dropped by
// the linker, a dependency removed) fails here, and with it the binaries
// cairnd, cairn-agent and cairn, and every program using libcairn.
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

TEST(StorageDriversLinkedTest, PosixAndOnlyPosixIsRegistered) {
  EXPECT_THAT(RegisteredShardStoreSchemes(), ElementsAre("file"));
}

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
              HasSubstr("unsupported scheme 'mem' (registered: file)"));
}

}  // namespace
}  // namespace cairn::storage
