// The URI-scheme registry, built three times against different drivers:
//   shard_store_registry_test         core + posix     (CAIRN_LINKS_POSIX)
//   shard_store_registry_memory_test  core + memory    (CAIRN_LINKS_MEMORY)
//   shard_store_registry_core_test    core only
// so a driver is registered exactly when its library is linked, and the core
// knows no scheme by itself.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/shard_store.h"

#ifndef CAIRN_LINKS_POSIX
#define CAIRN_LINKS_POSIX 0
#endif
#ifndef CAIRN_LINKS_MEMORY
#define CAIRN_LINKS_MEMORY 0
#endif

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::string_view kTestScheme = "registrytest";

std::vector<std::string> LinkedSchemes() {
  std::vector<std::string> schemes;
  if (CAIRN_LINKS_POSIX) schemes.push_back("file");
  if (CAIRN_LINKS_MEMORY) schemes.push_back("mem");
  return schemes;
}

// Registered schemes other than the one a test below adds.
std::vector<std::string> DriverSchemes() {
  std::vector<std::string> out;
  for (std::string& s : RegisteredShardStoreSchemes()) {
    if (s != kTestScheme) out.push_back(std::move(s));
  }
  return out;
}

TEST(ShardStoreRegistryTest, ExactlyTheLinkedDriversAreRegistered) {
  EXPECT_THAT(DriverSchemes(), ElementsAreArray(LinkedSchemes()));
}

TEST(ShardStoreRegistryTest, UnknownSchemeIsInvalidArgumentListingRegistered) {
  auto store = OpenShardStore("s3://bucket/ckpt");
  ASSERT_THAT(
      store,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("store URI 's3://bucket/ckpt': unsupported scheme "
                         "'s3' (registered: ")));
  for (const std::string& s : LinkedSchemes()) {
    EXPECT_THAT(std::string(store.status().message()), HasSubstr(s));
  }
  if (!CAIRN_LINKS_POSIX) {
    EXPECT_THAT(std::string(store.status().message()), Not(HasSubstr("file")));
  }
  if (!CAIRN_LINKS_MEMORY) {
    EXPECT_THAT(std::string(store.status().message()), Not(HasSubstr("mem")));
  }
}

TEST(ShardStoreRegistryTest, MalformedUriIsInvalidArgument) {
  for (const char* uri : {"", "relative/path", "://x", "file:/x"}) {
    auto store = OpenShardStore(uri);
    EXPECT_THAT(store, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("malformed store URI")))
        << uri << uri;
  }
}

TEST(ShardStoreRegistryTest, FileSchemeAndBarePathOpenOnlyWithPosixLinked) {
  const std::string dir = testing::MakeTempDirRemovedAtExit("reg");
  ASSERT_FALSE(dir.empty());
  for (const std::string& uri : {absl::StrCat("file://", dir), dir}) {
    auto store = OpenShardStore(uri);
    if (CAIRN_LINKS_POSIX) {
      ASSERT_TRUE(store.ok()) << uri << ": " << store.status();
      EXPECT_EQ((*store)->uri(), absl::StrCat("file://", dir));
    } else {
      EXPECT_THAT(store, StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("unsupported scheme 'file'")))
          << uri;
    }
  }
  if (CAIRN_LINKS_POSIX) {
    auto host = OpenShardStore("file://host/data");
    EXPECT_THAT(
        host,
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("'file://host/data': file URIs name an absolute "
                           "path (file:///path); hosts are not supported")));
  }
}

TEST(ShardStoreRegistryTest, MemSchemeOpensOnlyWithMemoryLinked) {
  auto store = OpenShardStore("mem://registry");
  if (CAIRN_LINKS_MEMORY) {
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->uri(), "mem://registry");
  } else {
    EXPECT_THAT(store, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("unsupported scheme 'mem'")));
  }
}

TEST(ShardStoreRegistryTest, NoDriverLinkedSaysSo) {
  if (!LinkedSchemes().empty()) GTEST_SKIP() << "drivers are linked";
  auto store = OpenShardStore("file:///data/ckpt");
  EXPECT_THAT(
      store,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("(registered: none, no storage driver is linked)")));
}

TEST(ShardStoreRegistryTest, RegisteredSchemeIsOpenedWithItsRest) {
  std::string seen_rest;
  int seen_threads = 0;
  RegisterShardStoreScheme(
      kTestScheme,
      [&](absl::string_view rest, const StoreOptions& options)
          -> absl::StatusOr<std::unique_ptr<ShardStore>> {
        seen_rest = std::string(rest);
        seen_threads = options.io_threads;
        return absl::UnavailableError("registry test store");
      });
  StoreOptions options;
  options.io_threads = 7;
  auto store = OpenShardStore("registrytest://bucket/a/b", options);
  EXPECT_EQ(store.status(), absl::UnavailableError("registry test store"));
  EXPECT_EQ(seen_rest, "bucket/a/b");
  EXPECT_EQ(seen_threads, 7);
  EXPECT_THAT(RegisteredShardStoreSchemes(),
              ::testing::Contains(std::string(kTestScheme)));
}

TEST(ShardStoreRegistryTest, BadOptionsAreRefusedBeforeAnyDriver) {
  StoreOptions options;
  options.io_threads = 0;
  auto store = OpenShardStore("s3://bucket", options);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kInvalidArgument,
                              HasSubstr("io_threads must be >= 1, got 0")));
}

}  // namespace
}  // namespace cairn::storage
