// The catalog's record of a checkpoint (cairn.v1.CheckpointRecord) as storage
// implies it, and which records retention deletes: pure functions of protos,
// shared by cairnd (its catalog rebuild, commit, recovery and retention) and
// the `cairn` CLI offline (which has no catalog and reads storage instead).
#ifndef CAIRN_STORAGE_CHECKPOINT_RECORD_H_
#define CAIRN_STORAGE_CHECKPOINT_RECORD_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/checkpoint_layout.h"

namespace cairn::storage {

// The record a committed manifest implies (state COMMITTED), its checkpoint
// stored on `storage_uri`. The commit time is not in the manifest:
// committed_unix_micros is its creation time, the closest known bound.
v1::CheckpointRecord RecordFromManifest(const v1::Manifest& manifest,
                                        absl::string_view storage_uri);
// The same from a manifest read without its tensors (ReadManifestSummary, or
// what PublishManifest published).
v1::CheckpointRecord RecordFromManifest(const ManifestSummary& manifest,
                                        absl::string_view storage_uri);

// The COMMITTED records of `records` (one job's, as the catalog lists them)
// beyond the newest `keep_last` by step, newest first: the checkpoints that
// retention keeping `keep_last` deletes. Records in any other state are never
// chosen. `keep_last` 0 chooses every committed record; a negative one none.
//
// Example: records of steps 1, 2 (ABORTED), 3 and 5 with keep_last 2: the
// committed steps are 1, 3 and 5; 5 and 3 are kept, the answer is [1].
std::vector<v1::CheckpointRecord> RetentionVictims(
    const std::vector<v1::CheckpointRecord>& records, int keep_last);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_CHECKPOINT_RECORD_H_
