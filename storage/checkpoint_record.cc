#include "storage/checkpoint_record.h"

#include <algorithm>
#include <string>

namespace cairn::storage {

v1::CheckpointRecord RecordFromManifest(const v1::Manifest& manifest,
                                        absl::string_view storage_uri) {
  v1::CheckpointRecord r;
  r.set_job(manifest.job());
  r.set_step(manifest.step());
  r.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  r.set_world_size(manifest.world_size());
  r.set_total_bytes(manifest.total_bytes());
  r.set_num_tensors(manifest.tensors_size());
  r.set_num_bytes_entries(manifest.bytes_entries_size());
  r.set_created_unix_micros(manifest.created_unix_micros());
  r.set_committed_unix_micros(manifest.created_unix_micros());
  r.set_storage_uri(std::string(storage_uri));
  return r;
}

v1::CheckpointRecord RecordFromManifest(const ManifestSummary& manifest,
                                        absl::string_view storage_uri) {
  v1::CheckpointRecord r = RecordFromManifest(manifest.header, storage_uri);
  r.set_num_tensors(manifest.num_tensors);
  return r;
}

std::vector<v1::CheckpointRecord> RetentionVictims(
    const std::vector<v1::CheckpointRecord>& records, int keep_last) {
  if (keep_last < 0) return {};
  std::vector<v1::CheckpointRecord> committed;
  for (const v1::CheckpointRecord& r : records) {
    if (r.state() == v1::CHECKPOINT_STATE_COMMITTED) committed.push_back(r);
  }
  std::sort(committed.begin(), committed.end(),
            [](const auto& a, const auto& b) { return a.step() > b.step(); });
  if (committed.size() <= static_cast<size_t>(keep_last)) return {};
  committed.erase(committed.begin(), committed.begin() + keep_last);
  return committed;
}

}  // namespace cairn::storage
