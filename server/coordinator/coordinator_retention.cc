// Deletion and retention of checkpoints: DeleteCheckpoint, GarbageCollect,
// retention after a commit, and the crash-safe order every deletion follows
// (record DELETING, MANIFEST, data, record). See coordinator.h.

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_internal.h"
#include "server/coordinator/load_verifier.h"
#include "server/coordinator/request_bounds.h"
#include "server/coordinator/retention.h"
#include "storage/checkpoint_layout.h"
#include "storage/checkpoint_record.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {

void Coordinator::ForgetCheckpoint(const std::string& job, int64_t step) {
  manifests_.Erase(SaveKey{job, step});
  const std::string prefix = absl::StrCat(job, "\n", step, "\n");
  load_plans_.EraseIf([&](const std::string& key) {
    return key.compare(0, prefix.size(), prefix) == 0;
  });
}

absl::Status Coordinator::DeleteStepRecord(v1::CheckpointRecord record) {
  const std::string job = record.job();
  const int64_t step = record.step();
  CAIRN_RETURN_IF_ERROR(CheckStorageLease(SaveName(job, step)));
  const bool in_memory = record.tier() == v1::TIER_MEMORY;
  // Chosen before the record is moved into the call.
  storage::ShardStore& store = ManifestStore(record);
  CAIRN_RETURN_IF_ERROR(
      DeleteCheckpointInOrder(store, *catalog_, std::move(record),
                              [&] { ForgetCheckpoint(job, step); }));
  // A persisted memory checkpoint leaves its memory manifest behind; the
  // agents drop their copies when they next report.
  if (!in_memory && memory_store_ != nullptr) {
    if (absl::Status s = storage::DeleteStep(*memory_store_, job, step);
        !s.ok() && !absl::IsNotFound(s)) {
      CAIRN_LOG(warn, "{}: its memory manifest stays: {}", SaveName(job, step),
                s.ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::DeleteCheckpoint(
    const v1::DeleteCheckpointRequest& request) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  CAIRN_RETURN_IF_ERROR(ValidateJobStep(job, step));
  const SaveKey key{job, step};
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(key);
    if (it != sessions_.end() && it->second->phase() != Phase::kAborted) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot delete ", SaveName(job, step),
                       ": a save is in progress (abort it first)"));
    }
    if (!deleting_.insert(key).second) {
      return absl::FailedPreconditionError(
          absl::StrCat(SaveName(job, step), " is already being deleted"));
    }
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    deleting_.erase(key);
  };
  absl::StatusOr<v1::CheckpointRecord> rec = RecordOfStep(*catalog_, job, step);
  if (!rec.ok()) return rec.status();
  CAIRN_RETURN_IF_ERROR(DeleteStepRecord(*rec));
  CAIRN_LOG(info, "deleted {}", SaveName(job, step));
  return absl::OkStatus();
}

absl::StatusOr<v1::GarbageCollectResponse> Coordinator::ApplyRetention(
    const std::string& job, int keep_last, bool dry_run, v1::Tier tier) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         catalog_->ListCheckpoints(job, false));
  records.erase(std::remove_if(records.begin(), records.end(),
                               [&](const v1::CheckpointRecord& r) {
                                 return (r.tier() == v1::TIER_MEMORY) !=
                                        (tier == v1::TIER_MEMORY);
                               }),
                records.end());
  v1::GarbageCollectResponse resp;
  for (const v1::CheckpointRecord& r :
       storage::RetentionVictims(records, keep_last)) {
    if (!dry_run) {
      const SaveKey key{job, r.step()};
      {
        absl::MutexLock lock(&mu_);
        // Another deletion (cairn rm, a concurrent retention) has it.
        if (!deleting_.insert(key).second) continue;
      }
      absl::Status s = DeleteStepRecord(r);
      {
        absl::MutexLock lock(&mu_);
        deleting_.erase(key);
      }
      CAIRN_RETURN_IF_ERROR(s);
    }
    resp.add_deleted_steps(r.step());
    resp.set_freed_bytes(resp.freed_bytes() + r.total_bytes());
  }
  if (!dry_run && resp.deleted_steps_size() > 0) {
    CAIRN_LOG(info,
              "retention for job '{}' (keep {} {}): deleted {} checkpoints",
              job, keep_last, TierName(tier), resp.deleted_steps_size());
  }
  return resp;
}

absl::StatusOr<v1::GarbageCollectResponse> Coordinator::GarbageCollect(
    const v1::GarbageCollectRequest& request) {
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  if (request.keep_last() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gc of job '", request.job(),
                     "': keep_last must be >= 1 (the newest "
                     "committed checkpoint is never deleted), got ",
                     request.keep_last()));
  }
  // Each tier keeps its newest keep_last.
  CAIRN_ASSIGN_OR_RETURN(
      v1::GarbageCollectResponse resp,
      ApplyRetention(request.job(), request.keep_last(), request.dry_run(),
                     v1::TIER_PERSISTENT));
  CAIRN_ASSIGN_OR_RETURN(v1::GarbageCollectResponse memory,
                         ApplyRetention(request.job(), request.keep_last(),
                                        request.dry_run(), v1::TIER_MEMORY));
  for (int64_t step : memory.deleted_steps()) resp.add_deleted_steps(step);
  resp.set_freed_bytes(resp.freed_bytes() + memory.freed_bytes());
  if (request.dry_run()) return resp;
  // What is kept is cleaned: temp files of ranks that died mid-write and
  // objects of other attempts can sit in a committed step (a zombie rank of
  // an aborted attempt may write after its cleanup). No writer is live in a
  // committed step; in-flight saves of other steps are not touched.
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> kept,
                         catalog_->ListCheckpoints(request.job(), false));
  for (const v1::CheckpointRecord& r : kept) {
    if (r.tier() == v1::TIER_MEMORY) continue;  // nothing of it on storage
    absl::StatusOr<storage::ManifestSummary> m =
        storage::ReadManifestSummary(*store_, r.job(), r.step());
    if (!m.ok()) {
      CAIRN_LOG(warn, "gc of job '{}': {}", r.job(), m.status().ToString());
      continue;
    }
    SweepCommittedStep(*store_, m->header);
  }
  return resp;
}

}  // namespace cairn::coordinator
