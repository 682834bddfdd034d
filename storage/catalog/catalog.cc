#include "storage/catalog/catalog.h"

#include "rocksdb/db.h"

namespace cairn::storage {

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string&) {
  return absl::UnimplementedError("catalog");
}
Catalog::Catalog(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
Catalog::~Catalog() = default;
absl::Status Catalog::PutCheckpoint(const v1::CheckpointRecord&) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<v1::CheckpointRecord> Catalog::GetCheckpoint(absl::string_view,
                                                            int64_t) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::vector<v1::CheckpointRecord>> Catalog::ListCheckpoints(
    absl::string_view, bool) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<v1::CheckpointRecord> Catalog::LatestCommitted(
    absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::Status Catalog::DeleteCheckpoint(absl::string_view, int64_t) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::vector<std::string>> Catalog::ListJobs() {
  return absl::UnimplementedError("x");
}
absl::Status Catalog::PutPlanCacheEntry(absl::string_view, absl::string_view,
                                        absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::string> Catalog::GetPlanCacheEntry(absl::string_view,
                                                       absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::Status Catalog::DeletePlanCacheEntries(absl::string_view) {
  return absl::UnimplementedError("x");
}
bool Catalog::empty() { return true; }
absl::StatusOr<int> Catalog::RebuildFromStore(ShardStore&) {
  return absl::UnimplementedError("x");
}
v1::CheckpointRecord RecordFromManifest(const v1::Manifest&,
                                        absl::string_view) {
  return {};
}

}  // namespace cairn::storage
