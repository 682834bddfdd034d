#include "storage/checkpoint_layout.h"

namespace cairn::storage {

absl::Status ValidateJobName(absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::Status ValidateStep(int64_t) { return absl::UnimplementedError("x"); }
std::string StepPrefix(absl::string_view, int64_t) { return ""; }
std::string ManifestKey(absl::string_view, int64_t) { return ""; }
std::string ObjectKey(absl::string_view, int64_t, absl::string_view) {
  return "";
}
absl::StatusOr<int64_t> ParseStepDir(absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::Status PublishManifest(ShardStore&, const v1::Manifest&) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<v1::Manifest> ReadManifest(ShardStore&, absl::string_view,
                                          int64_t) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::vector<std::string>> ListJobs(ShardStore&) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(ShardStore&,
                                                        absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::StatusOr<std::vector<int64_t>> ListIncompleteSteps(ShardStore&,
                                                         absl::string_view) {
  return absl::UnimplementedError("x");
}
absl::Status DeleteStep(ShardStore&, absl::string_view, int64_t) {
  return absl::UnimplementedError("x");
}
absl::Status ReadVerified(ShardStore&, absl::string_view, int64_t,
                          const v1::StorageLocation&, uint32_t,
                          absl::string_view, absl::Span<char>) {
  return absl::UnimplementedError("x");
}
absl::Status VerifyCheckpoint(ShardStore&, const v1::Manifest&,
                              std::function<void(uint64_t, uint64_t)>) {
  return absl::UnimplementedError("x");
}

}  // namespace cairn::storage
