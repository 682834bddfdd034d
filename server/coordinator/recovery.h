// Start-up recovery of the coordinator: the catalog is reconciled with
// storage, which is the truth, and what a crash left behind is removed.
// A function of the store and the catalog alone (cairnd has no live save or
// cache yet), so each crash window is tested directly (recovery_test.cc).
#ifndef CAIRN_SERVER_COORDINATOR_RECOVERY_H_
#define CAIRN_SERVER_COORDINATOR_RECOVERY_H_

#include <string>

#include "absl/status/status.h"
#include "storage/catalog/catalog.h"
#include "storage/lease.h"
#include "storage/shard_store.h"

namespace cairn::coordinator {

struct RecoveryOptions {
  // The catalog's directory, named when cairnd refuses to start.
  std::string catalog_path;
  // Reconcile and clean (below); when false, only an empty catalog is
  // rebuilt from storage. Default: true.
  bool clean_incomplete = true;
  // The storage lease of the caller (storage/lease.h): nothing is deleted
  // unless it allows changing the storage (its Check() error is returned).
  // Null: the caller knows no other process uses the storage (tests).
  const storage::StorageLease* lease = nullptr;
  // Where cairnd keeps the manifests of memory checkpoints (their bytes are
  // in agents' memory, not on `store`). Null: no memory checkpoint is
  // expected (a memory record is then treated as one without its manifest).
  storage::ShardStore* memory_store = nullptr;
};

// Runs only while holding the storage's lease (options.lease): another cairnd
// on the same storage would otherwise see this one's in-flight saves as
// crash debris and delete them.
// Rebuilds an empty catalog from storage, then (clean_incomplete) reconciles
// it: storage is the truth (a MANIFEST's presence is the commit), the catalog
// is made to agree with it, and what a crash left is
// removed. No writer of this process is live yet; ranks of the previous one
// that are still writing will find their save gone and restart it.
//   * temp files of writers that died: removed (DeleteAbandonedWrites).
//   * DELETING record: the deletion is finished (MANIFEST, data, record).
//   * WRITING or ABORTED record, MANIFEST present and valid: COMMITTED,
//     filled from the manifest (cairnd stopped between publishing the
//     MANIFEST and recording the commit; a durable checkpoint is never
//     hidden). The step's unreferenced objects are removed.
//   * WRITING or ABORTED record, MANIFEST damaged (no decode, or another
//     job/step): ABORTED, naming the damage, and the step deleted: no rank
//     was ever told it committed.
//   * WRITING record, no MANIFEST: ABORTED ("cairnd restarted during the
//     save"); its bytes go with the incomplete steps below.
//   * COMMITTED record, no MANIFEST (deleted outside cairnd, or by a crashed
//     delete of an older version): ABORTED with the reason, so it is neither
//     listed nor `latest`. Should the MANIFEST come back, the next start
//     makes it COMMITTED again. When no committed record has its MANIFEST,
//     the storage is more likely not mounted than empty: cairnd refuses to
//     start (FAILED_PRECONDITION) rather than hide every checkpoint.
//   * COMMITTED record, MANIFEST present: kept as is (reading every manifest
//     at start costs too much; a damaged one is DATA_LOSS at load/verify).
//   * MANIFEST with no record: COMMITTED from the manifest, as the rebuild of
//     an empty catalog does; a damaged one is left for an operator, logged.
//   * a step with objects but no MANIFEST: deleted.
// Memory checkpoints (tier TIER_MEMORY) are checked against the memory
// store: COMMITTED with its manifest there is kept (the agents say what
// they still hold once they report), without it ABORTED; DELETING is
// finished there; one whose MANIFEST is on storage too was persisted
// (`cairn persist`) before the catalog recorded it: TIER_PERSISTENT.
absl::Status Recover(storage::ShardStore& store, storage::Catalog& catalog,
                     const RecoveryOptions& options);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_RECOVERY_H_
