// Internal to the coordinator facade (coordinator*.cc): the state records
// its files share (a loaded manifest, a load index in progress) and limits. Not
// part of the public interface (coordinator.h).
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"
#include "proto/convert/load_answer.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/load_verifier.h"
#include "server/coordinator/messages.h"
#include "server/coordinator/save_session.h"

namespace cairn::coordinator {

// The catalog record of job/step; NOT_FOUND "no checkpoint <job>/<step>" when
// there is none (other catalog errors as they are).
inline absl::StatusOr<v1::CheckpointRecord> RecordOfStep(
    storage::Catalog& catalog, const std::string& job, int64_t step) {
  absl::StatusOr<v1::CheckpointRecord> rec = catalog.GetCheckpoint(job, step);
  if (absl::IsNotFound(rec.status())) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint ", SaveName(job, step)));
  }
  return rec;
}

// Aborted saves remembered to answer their late calls.
inline constexpr size_t kMaxTombstones = 4096;
// Jobs whose plan version is remembered.
inline constexpr size_t kMaxPlanVersionJobs = 4096;
// ABORTED catalog records kept per job (the newest): every abort used to add
// one for good, until ListCheckpoints outgrew clients' message limits.
inline constexpr size_t kMaxAbortedRecordsPerJob = 64;

// Memory for the keys of load layouts asked for once (~100 bytes each).
inline constexpr size_t kLoadLayoutsSeenBytes = size_t{4} << 20;

using Phase = SaveSession::Phase;

// What cairnd keeps of a loaded checkpoint: the manifest as its serialized
// bytes (for GetCheckpoint) and its stored chunks once, in the load planner
// (PlanLoad reads them, VerifyLoad checks pieces against them). The parsed
// v1::Manifest is not kept: it held every chunk's box, location and key a
// second time in protobuf messages, ~300 bytes per chunk.
struct Coordinator::LoadedCheckpoint {
  // Stored tensors in the manifest's order: (tensor, chunk) indexes are the
  // manifest's. The planner also finds a stored chunk by its location.
  std::unique_ptr<planner::LoadPlanner> planner;
  // The stored tensors in fqn order, and their convert::TensorsDigest (what
  // a short-form PlanLoad request names).
  std::vector<int> tensors_by_fqn;
  std::string tensors_digest;
  std::vector<v1::ManifestBytes> bytes_entries;
  absl::flat_hash_map<std::string, int> bytes_index;  // fqn -> bytes_entries
  // The size of the last PlanLoad answer made of this checkpoint, by form
  // (convert::AnswerForm): the room the next one is given up front (the ranks
  // of a sharded load get answers of about one size).
  mutable std::atomic<size_t> answer_bytes[convert::kNumAnswerForms] = {};

  // Approximate bytes held (what the load index cache charges).
  size_t MemoryBytes() const;
};

// A LoadCheckpoint build in progress: `result` is set before `done`.
struct Coordinator::LoadingCheckpoint {
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> result;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_
