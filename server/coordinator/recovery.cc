#include "server/coordinator/recovery.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/coordinator/messages.h"
#include "server/coordinator/retention.h"
#include "storage/checkpoint_layout.h"
#include "storage/checkpoint_record.h"
#include "storage/manifest.h"

namespace cairn::coordinator {
namespace {

using SaveKey = std::pair<std::string, int64_t>;  // (job, step)

}  // namespace

absl::Status Recover(storage::ShardStore& store, storage::Catalog& catalog,
                     const RecoveryOptions& options) {
  if (catalog.empty()) {
    CAIRN_ASSIGN_OR_RETURN(int n, catalog.RebuildFromStore(store));
    if (n > 0) {
      CAIRN_LOG(info, "catalog rebuilt from {}: {} committed checkpoints",
                store.uri(), n);
    }
  }
  if (!options.clean_incomplete) return absl::OkStatus();
  const std::string uri = store.uri();
  // What is deleted below is debris only if no other process writes there:
  // checked before each deletion (a lease that cannot be renewed stops it).
  auto held = [&]() -> absl::Status {
    return options.lease == nullptr ? absl::OkStatus() : options.lease->Check();
  };
  CAIRN_RETURN_IF_ERROR(held());
  // From the root: a job whose only save died mid-write holds nothing but
  // temp files, so ListJobs (visible keys) does not name it.
  CAIRN_RETURN_IF_ERROR(store.DeleteAbandonedWrites(""));
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> jobs,
                         storage::ListJobs(store));
  std::set<SaveKey> with_manifest;
  std::map<std::string, std::vector<int64_t>> incomplete;
  for (const std::string& job : jobs) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                           storage::ListCommittedSteps(store, job));
    for (int64_t step : steps) with_manifest.insert({job, step});
    CAIRN_ASSIGN_OR_RETURN(incomplete[job],
                           storage::ListIncompleteSteps(store, job));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         catalog.ListCheckpoints("", true));

  // Refuse to hide every checkpoint because the storage is not there.
  int committed = 0, lost = 0;
  const auto in_memory = [&](const v1::CheckpointRecord& r) {
    return r.tier() == v1::TIER_MEMORY &&
           with_manifest.count({r.job(), r.step()}) == 0;
  };
  for (const v1::CheckpointRecord& r : records) {
    if (r.state() != v1::CHECKPOINT_STATE_COMMITTED || in_memory(r)) continue;
    ++committed;
    if (with_manifest.count({r.job(), r.step()}) == 0) ++lost;
  }
  if (lost > 0 && lost == committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the catalog '", options.catalog_path, "' lists ", committed,
        " committed checkpoints but none of their MANIFESTs is in ", uri,
        ": is the storage mounted, and is it the one this catalog belongs "
        "to? If the checkpoints were deleted on purpose, remove the catalog "
        "directory and cairnd rebuilds it from storage"));
  }

  std::set<SaveKey> recorded;
  for (v1::CheckpointRecord& r : records) {
    const SaveKey key{r.job(), r.step()};
    const std::string name = SaveName(r.job(), r.step());
    recorded.insert(key);
    const bool has_manifest = with_manifest.count(key) > 0;
    if (r.tier() == v1::TIER_MEMORY && has_manifest &&
        r.state() == v1::CHECKPOINT_STATE_COMMITTED) {
      CAIRN_LOG(warn, "{} was persisted before cairnd stopped: persistent",
                name);
      r.set_tier(v1::TIER_PERSISTENT);
      r.set_persisting(false);
      CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
      continue;
    }
    if (in_memory(r) && (r.state() == v1::CHECKPOINT_STATE_COMMITTED ||
                         r.state() == v1::CHECKPOINT_STATE_DELETING)) {
      absl::Status found = absl::NotFoundError("no memory store");
      if (options.memory_store != nullptr) {
        if (r.state() == v1::CHECKPOINT_STATE_DELETING) {
          CAIRN_LOG(info, "finishing the deletion of {} (memory)", name);
          CAIRN_RETURN_IF_ERROR(DeleteCheckpointInOrder(*options.memory_store,
                                                        catalog, r, nullptr));
          continue;
        }
        found =
            options.memory_store->Size(storage::ManifestKey(r.job(), r.step()))
                .status();
      }
      if (found.ok()) {
        if (r.persisting()) {
          // The promotion's writes died with the previous process; their
          // objects go with the incomplete steps below.
          r.set_persisting(false);
          CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
        }
        continue;
      }
      if (!absl::IsNotFound(found)) return found;
      CAIRN_LOG(error,
                "{} is a COMMITTED memory checkpoint but its manifest is "
                "gone: marking it ABORTED",
                name);
      r.set_state(v1::CHECKPOINT_STATE_ABORTED);
      r.set_abort_reason("its memory manifest was missing when cairnd started");
      CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
      continue;
    }
    switch (r.state()) {
      case v1::CHECKPOINT_STATE_DELETING:
        CAIRN_LOG(info, "finishing the deletion of {}", name);
        CAIRN_RETURN_IF_ERROR(held());
        CAIRN_RETURN_IF_ERROR(
            DeleteCheckpointInOrder(store, catalog, r, nullptr));
        continue;
      case v1::CHECKPOINT_STATE_COMMITTED:
        if (has_manifest) continue;
        CAIRN_LOG(error,
                  "{} is COMMITTED in the catalog but has no MANIFEST "
                  "in {}: marking it ABORTED",
                  name, uri);
        r.set_state(v1::CHECKPOINT_STATE_ABORTED);
        r.set_abort_reason(
            absl::StrCat("its MANIFEST was missing from ", uri,
                         " when cairnd started (deleted outside cairnd?)"));
        CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
        continue;
      default:
        break;
    }
    // WRITING, ABORTED (or a state this build does not know).
    if (has_manifest) {
      absl::StatusOr<storage::ManifestSummary> m =
          storage::ReadManifestSummary(store, r.job(), r.step());
      if (m.ok()) {
        v1::CheckpointRecord c = storage::RecordFromManifest(*m, uri);
        if (r.created_unix_micros() != 0) {
          c.set_created_unix_micros(r.created_unix_micros());
        }
        CAIRN_LOG(warn,
                  "{} was {} in the catalog but its MANIFEST is "
                  "durable in {}: COMMITTED",
                  name, v1::CheckpointState_Name(r.state()), uri);
        CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(c));
        CAIRN_RETURN_IF_ERROR(held());
        SweepCommittedStep(store, m->header);
        continue;
      }
      if (!absl::IsDataLoss(m.status()) && !absl::IsNotFound(m.status())) {
        return m.status();
      }
      if (absl::IsDataLoss(m.status())) {
        CAIRN_LOG(error, "{} ({}): {}; deleting the step", name,
                  v1::CheckpointState_Name(r.state()), m.status().ToString());
        CAIRN_RETURN_IF_ERROR(held());
        CAIRN_RETURN_IF_ERROR(storage::DeleteStep(store, r.job(), r.step()));
        r.set_state(v1::CHECKPOINT_STATE_ABORTED);
        r.set_abort_reason(
            absl::StrCat("its MANIFEST was damaged: ", m.status().message()));
        CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
        continue;
      }
    }
    if (r.state() == v1::CHECKPOINT_STATE_WRITING) {
      // Saves in flight when the previous process stopped can never finish:
      // their ranks were answered UNAVAILABLE and will restart the save.
      r.set_state(v1::CHECKPOINT_STATE_ABORTED);
      r.set_abort_reason("cairnd restarted during the save");
      CAIRN_RETURN_IF_ERROR(catalog.PutCheckpoint(r));
    }
  }

  // MANIFESTs the catalog does not know (it lost entries, or is older than
  // the storage).
  for (const SaveKey& key : with_manifest) {
    if (recorded.count(key) > 0) continue;
    absl::StatusOr<storage::ManifestSummary> m =
        storage::ReadManifestSummary(store, key.first, key.second);
    if (!m.ok()) {
      if (absl::IsUnavailable(m.status())) return m.status();
      CAIRN_LOG(warn,
                "{} has a MANIFEST but it is unusable, left for an "
                "operator: {}",
                SaveName(key.first, key.second), m.status().ToString());
      continue;
    }
    CAIRN_LOG(warn,
              "{} is committed in {} but was not in the catalog: "
              "COMMITTED",
              SaveName(key.first, key.second), uri);
    CAIRN_RETURN_IF_ERROR(
        catalog.PutCheckpoint(storage::RecordFromManifest(*m, uri)));
  }

  for (const auto& [job, steps] : incomplete) {
    for (int64_t step : steps) {
      CAIRN_CRASH_POINT("coordinator.recover.before_removing_incomplete");
      CAIRN_LOG(info, "removing incomplete {} left by a crash",
                SaveName(job, step));
      CAIRN_RETURN_IF_ERROR(held());
      CAIRN_RETURN_IF_ERROR(storage::DeleteStep(store, job, step));
    }
  }
  return absl::OkStatus();
}

}  // namespace cairn::coordinator
