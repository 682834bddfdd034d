#include "storage/memory/memory_shard_store.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/testing/shard_store_conformance.h"

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(Memory, ShardStoreConformanceTest,
                         ::testing::Values(ShardStoreConformanceParam{
                             "memory", [] { return OpenShardStore("mem://"); },
                             /*reopen_shares_data=*/true}),
                         ShardStoreConformanceParamName);

TEST(MemoryShardStoreTest, NamedStoresAreSharedInTheProcess) {
  auto a = OpenShardStore("mem://shared-test");
  auto b = OpenShardStore("mem://shared-test");
  auto other = OpenShardStore("mem://other-test");
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  ASSERT_TRUE((*a)->Put("k", absl::Span<const char>("v", 1)).ok());
  EXPECT_EQ(ReadObject(**b, "k").value(), "v");
  EXPECT_THAT((*other)->Size("k"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ((*a)->uri(), "mem://shared-test");
  // Pinned: still there after every handle is gone.
  a->reset();
  b->reset();
  auto c = OpenShardStore("mem://shared-test");
  EXPECT_EQ(ReadObject(**c, "k").value(), "v");
}

TEST(MemoryShardStoreTest, AnonymousStoresArePrivate) {
  auto a = OpenShardStore("mem://");
  auto b = OpenShardStore("mem://");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->uri(), (*b)->uri());
  ASSERT_TRUE((*a)->Put("k", absl::Span<const char>("v", 1)).ok());
  EXPECT_THAT((*b)->Size("k"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(MemoryShardStoreTest, BadNameIsInvalidArgument) {
  auto s = OpenShardStore("mem://a/b");
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a/b")));
}

}  // namespace
}  // namespace cairn::storage
