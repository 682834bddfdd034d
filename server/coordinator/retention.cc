#include "server/coordinator/retention.h"

#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "server/coordinator/messages.h"
#include "storage/checkpoint_layout.h"

namespace cairn::coordinator {

absl::Status DeleteCheckpointInOrder(storage::ShardStore& store,
                                     storage::Catalog& catalog,
                                     v1::CheckpointRecord record,
                                     const std::function<void()>& forget) {
  const std::string& job = record.job();
  const int64_t step = record.step();
  // The record first: from here on the step is never listed, loaded or
  // `latest`, and a crash at any later point leaves a DELETING record that
  // recovery finishes. Then MANIFEST (the checkpoint stops being loadable
  // on storage too), data, and the record last.
  if (record.state() != v1::CHECKPOINT_STATE_DELETING) {
    record.set_state(v1::CHECKPOINT_STATE_DELETING);
    CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(record));
  }
  if (forget) forget();
  CAIRN_RETURN_IF_ERROR(storage::DeleteStep(store, job, step));
  absl::Status s = catalog.DeleteCheckpoint(job, step);
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  return absl::OkStatus();
}

void SweepCommittedStep(storage::ShardStore& store,
                        const v1::Manifest& manifest) {
  absl::StatusOr<int> removed = storage::DeleteUnreferenced(store, manifest);
  if (!removed.ok()) {
    CAIRN_LOG(warn, "cleaning {}: {}",
              SaveName(manifest.job(), manifest.step()),
              removed.status().ToString());
  } else if (*removed > 0) {
    CAIRN_LOG(info, "{}: removed {} objects of other attempts",
              SaveName(manifest.job(), manifest.step()), *removed);
  }
}

}  // namespace cairn::coordinator
