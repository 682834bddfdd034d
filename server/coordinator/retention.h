// Retention and deletion of checkpoints, free of the coordinator's locks and
// caches so each piece can be tested alone (which committed checkpoints of a
// job retention deletes is storage::RetentionVictims, a pure function of the
// job's records, which the CLI's offline gc uses too):
//   * DeleteCheckpointInOrder: the crash-safe order of one deletion
//     (record DELETING, MANIFEST, data, record), which recovery finishes
//     after a crash at any point.
//   * SweepCommittedStep: removes what other attempts and dead writers left
//     in a committed step.
// The coordinator (coordinator_retention.cc) adds what needs its state:
// which steps are being deleted, and that no save runs on them.
#ifndef CAIRN_SERVER_COORDINATOR_RETENTION_H_
#define CAIRN_SERVER_COORDINATOR_RETENTION_H_

#include <functional>

#include "absl/status/status.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/catalog/catalog.h"
#include "storage/shard_store.h"

namespace cairn::coordinator {

// Deletes the checkpoint of `record` so that a crash at any point leaves a
// state recovery finishes: the record is marked DELETING first (from then on
// the step is never listed, loaded or `latest`), `forget` is called (the
// caller drops what it cached of the step), then storage::DeleteStep removes
// the MANIFEST (the step stops being loadable on storage too) and the data,
// and the record goes last. A record already DELETING is not rewritten.
// Returns the first error; a record already gone at the end is fine.
absl::Status DeleteCheckpointInOrder(storage::ShardStore& store,
                                     storage::Catalog& catalog,
                                     v1::CheckpointRecord record,
                                     const std::function<void()>& forget);

// Removes temp files of dead writers and objects of other attempts from the
// committed step of `manifest`; failures are logged, never returned (the
// checkpoint is intact either way).
void SweepCommittedStep(storage::ShardStore& store,
                        const v1::Manifest& manifest);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_RETENTION_H_
