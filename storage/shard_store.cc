#include "storage/shard_store.h"

namespace cairn::storage {

absl::StatusOr<std::vector<std::string>> ShardStore::ListChildren(
    absl::string_view) {
  return absl::UnimplementedError("ListChildren");
}
absl::StatusOr<std::unique_ptr<ShardStore>> OpenShardStore(
    absl::string_view, const StoreOptions&) {
  return absl::UnimplementedError("OpenShardStore");
}
void RegisterShardStoreScheme(absl::string_view, ShardStoreFactory) {}
absl::Status ValidateKey(absl::string_view) {
  return absl::UnimplementedError("ValidateKey");
}
absl::Status ValidatePrefix(absl::string_view) {
  return absl::UnimplementedError("ValidatePrefix");
}
absl::StatusOr<std::string> ReadObject(ShardStore&, absl::string_view,
                                       uint64_t) {
  return absl::UnimplementedError("ReadObject");
}

}  // namespace cairn::storage
