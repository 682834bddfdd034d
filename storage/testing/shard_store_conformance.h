// The ShardStore conformance suite: one parameterized gtest that every
// backend runs. A backend's test instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(
//       Posix, ShardStoreConformanceTest,
//       ::testing::Values(ShardStoreConformanceParam{
//           "posix",
//           [] {
//             return OpenShardStore("file://" +
//                                   testing::MakeTempDirRemovedAtExit());
//           },
//           /*reopen_shares_data=*/true}),
//       ShardStoreConformanceParamName);
//
// The factory is called once per test and must return an empty store. The
// tests (shard_store_conformance.cc) cover: put/read/replace, writers
// (invisible until Close, abort on destruction, errors after Close), ranged
// and multi-range reads against a byte oracle, NOT_FOUND / OUT_OF_RANGE /
// INVALID_ARGUMENT with the key in the message, bad keys on every method,
// List / ListChildren / Delete / DeletePrefix semantics, PutIfAbsent (one
// winner among concurrent creators), a randomized
// sequence of operations against a std::map oracle (fixed seed), and
// concurrent writers, readers and listers.
#ifndef CAIRN_STORAGE_TESTING_SHARD_STORE_CONFORMANCE_H_
#define CAIRN_STORAGE_TESTING_SHARD_STORE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "storage/shard_store.h"

namespace cairn::storage {

struct ShardStoreConformanceParam {
  std::string name;  // test-name suffix: [A-Za-z0-9_]+
  std::function<absl::StatusOr<std::unique_ptr<ShardStore>>()> open;
  // OpenShardStore(store->uri()) sees the same objects.
  bool reopen_shares_data = true;
};

inline std::ostream& operator<<(std::ostream& os,
                                const ShardStoreConformanceParam& p) {
  return os << p.name;
}

inline std::string ShardStoreConformanceParamName(
    const ::testing::TestParamInfo<ShardStoreConformanceParam>& info) {
  return info.param.name;
}

class ShardStoreConformanceTest
    : public ::testing::TestWithParam<ShardStoreConformanceParam> {
 protected:
  void SetUp() override;
  ShardStore& store() { return *store_; }

  std::unique_ptr<ShardStore> store_;
};

namespace internal {
// Defined next to the tests: referencing it from every file that includes
// this header makes the linker keep the tests' object file even though
// nothing else refers to it.
extern const int kShardStoreConformanceTestsLinked;
[[gnu::used]] static const int* const kShardStoreConformanceTestsAnchor =
    &kShardStoreConformanceTestsLinked;
}  // namespace internal

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_TESTING_SHARD_STORE_CONFORMANCE_H_
