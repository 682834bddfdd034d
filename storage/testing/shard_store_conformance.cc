#include "storage/testing/shard_store_conformance.h"

namespace cairn::storage {
namespace internal {
const int kShardStoreConformanceTestsLinked = 1;
}  // namespace internal

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ShardStoreConformanceTest);

void ShardStoreConformanceTest::SetUp() {
  auto store = GetParam().open();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = std::move(store).value();
}

}  // namespace cairn::storage
