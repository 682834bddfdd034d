#include "server/coordinator/coordinator.h"

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
#include "server/coordinator/load_verifier.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {
namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

std::string SaveName(absl::string_view job, int64_t step) {
  return absl::StrCat("job '", job, "' step ", step);
}

// Validates the (job, step) every RPC names.
absl::Status ValidateJobStep(absl::string_view job, int64_t step) {
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
  return storage::ValidateStep(step);
}

// Validates a rank's (rank, world_size) pair; `who` names the rank and the
// checkpoint for the message.
absl::Status ValidateRankOfWorld(int rank, int world, int max_world_size,
                                 absl::string_view who) {
  if (world <= 0 || world > max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": world_size ", world, " is not in [1, ", max_world_size, "]"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank is out of range for world_size ", world));
  }
  return absl::OkStatus();
}

// Bounds of what cairnd keeps for clients beyond the configurable ones.
// Free text a client sends (an abort reason) is kept and logged up to this.
constexpr size_t kMaxReasonBytes = 1024;
// A plan fingerprint is a hash (planner::FingerprintLocalPlan: 32 hex).
constexpr size_t kMaxFingerprintBytes = 64;
// Aborted saves remembered to answer their late calls.
constexpr size_t kMaxTombstones = 4096;
// Bytes of local plans kept for fingerprint-only saves.
constexpr size_t kKnownPlanBytes = size_t{256} << 20;
// Jobs whose plan version is remembered.
constexpr size_t kMaxPlanVersionJobs = 4096;
// ABORTED catalog records kept per job (the newest): every abort used to add
// one for good, until ListCheckpoints outgrew clients' message limits.
constexpr size_t kMaxAbortedRecordsPerJob = 64;

// `text` cut to `max` bytes, marked when cut.
std::string Truncated(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "...(truncated, ", text.size(),
                      " bytes)");
}

// Approximate heap bytes of a local plan (the known-plan cache's charge).
size_t ApproximateLocalPlanBytes(const planner::LocalSavePlan& plan) {
  size_t n = sizeof(plan);
  for (const planner::WriteItem& item : plan.items) {
    n += sizeof(item) + item.fqn.size() +
         (item.global_shape.size() + item.box.offsets.size() +
          item.box.sizes.size()) *
             sizeof(int64_t);
  }
  return n;
}

// Drops all but the newest kMaxAbortedRecordsPerJob ABORTED records of `job`.
void PruneAbortedRecords(storage::Catalog& catalog, const std::string& job) {
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records =
      catalog.ListCheckpoints(job, true);
  if (!records.ok()) return;
  std::vector<const v1::CheckpointRecord*> aborted;
  for (const v1::CheckpointRecord& r : *records) {
    if (r.job() == job && r.state() == v1::CHECKPOINT_STATE_ABORTED) {
      aborted.push_back(&r);
    }
  }
  if (aborted.size() <= kMaxAbortedRecordsPerJob) return;
  std::sort(aborted.begin(), aborted.end(), [](const auto* a, const auto* b) {
    return std::make_pair(a->created_unix_micros(), a->step()) <
           std::make_pair(b->created_unix_micros(), b->step());
  });
  for (size_t i = 0; i + kMaxAbortedRecordsPerJob < aborted.size(); ++i) {
    (void)catalog.DeleteCheckpoint(job, aborted[i]->step());
  }
}

// Checks the sizes of a rank's local plan before it is decoded.
absl::Status CheckLocalPlanBounds(const v1::LocalSavePlan& plan,
                                  const CoordinatorOptions& options,
                                  absl::string_view who) {
  if (plan.items_size() > options.max_plan_items_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": the local plan has ", plan.items_size(), " items; at most ",
        options.max_plan_items_per_rank,
        " per rank are accepted (cairnd --max-plan-items-per-rank)"));
  }
  for (const v1::WriteItem& item : plan.items()) {
    const std::string& fqn = item.kind() == v1::WriteItem::KIND_BYTES
                                 ? item.bytes_fqn()
                                 : item.tensor().fqn();
    if (fqn.size() > static_cast<size_t>(options.max_fqn_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": fqn '", Truncated(fqn, 64), "' is ", fqn.size(),
          " bytes; at most ", options.max_fqn_bytes, " are accepted"));
    }
  }
  return absl::OkStatus();
}

// Checks the sizes of a PlanLoad or VerifyLoad request before any work:
// as many chunks as a save plan may have items, fqns as long as a save's.
absl::Status CheckLoadRequestBounds(int chunks, int bytes_entries,
                                    const std::vector<const std::string*>& fqns,
                                    const CoordinatorOptions& options,
                                    absl::string_view who) {
  if (chunks > options.max_plan_items_per_rank ||
      bytes_entries > options.max_plan_items_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": ", chunks, " chunks and ", bytes_entries,
        " bytes entries; at most ", options.max_plan_items_per_rank,
        " of each per rank are accepted (cairnd --max-plan-items-per-rank)"));
  }
  for (const std::string* fqn : fqns) {
    if (fqn->size() > static_cast<size_t>(options.max_fqn_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": fqn '", Truncated(*fqn, 64), "' is ", fqn->size(),
          " bytes; at most ", options.max_fqn_bytes, " are accepted"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoadRequestBounds(const v1::PlanLoadRequest& r,
                                    const CoordinatorOptions& options) {
  std::vector<const std::string*> fqns;
  fqns.reserve(std::min(r.wanted_size() + r.wanted_bytes_size(), 1 << 20));
  for (const v1::WantedChunk& w : r.wanted()) fqns.push_back(&w.tensor().fqn());
  for (const std::string& b : r.wanted_bytes()) fqns.push_back(&b);
  return CheckLoadRequestBounds(
      r.wanted_size(), r.wanted_bytes_size(), fqns, options,
      absl::StrCat("rank ", r.rank(), " loading job '", Truncated(r.job(), 128),
                   "'"));
}

absl::Status CheckLoadRequestBounds(const v1::VerifyLoadRequest& r,
                                    const CoordinatorOptions& options) {
  std::vector<const std::string*> fqns;
  fqns.reserve(std::min(r.pieces_size(), 1 << 20));
  for (const v1::ChunkPiece& p : r.pieces()) fqns.push_back(&p.fqn());
  return CheckLoadRequestBounds(
      r.pieces_size(), 0, fqns, options,
      absl::StrCat("rank ", r.rank(), " verifying its load of job '",
                   Truncated(r.job(), 128), "'"));
}

// A short random name for one save attempt's directory.
std::string NewAttemptName() {
  static absl::Mutex* mu = new absl::Mutex;
  static absl::BitGen* gen = new absl::BitGen;
  absl::MutexLock lock(mu);
  return absl::StrFormat("attempt-%012x",
                         absl::Uniform<uint64_t>(*gen) & 0xffffffffffffULL);
}

// Summarises a list of ranks for an error message: "[3, 5, 9] (3 of 8)".
std::string RankList(const std::vector<int>& ranks, int world_size) {
  std::vector<int> shown(ranks.begin(),
                         ranks.begin() + std::min<size_t>(ranks.size(), 16));
  return absl::StrCat("[", absl::StrJoin(shown, ", "),
                      ranks.size() > shown.size() ? ", ..." : "", "] (",
                      ranks.size(), " of ", world_size, ")");
}

}  // namespace

enum class Phase { kGathering, kPlanning, kWriting, kCommitting, kAborted };

struct Coordinator::SaveSession {
  std::string job;
  int64_t step = 0;
  int world_size = 0;
  std::string attempt;  // directory of this attempt's objects
  // The commit failed after the MANIFEST may have become visible and it
  // could not be removed: the objects it names stay (recovery decides).
  bool keep_objects = false;
  std::string step_prefix;  // "<job>/<step>/"
  absl::Time created;
  absl::Time deadline;
  Phase phase = Phase::kGathering;

  // Gathering: one entry per rank that arrived, so a session costs what its
  // ranks sent, never what the world size it claims would need.
  struct Arrival {
    std::shared_ptr<const planner::LocalSavePlan> plan;
    std::string fingerprint;
    uint64_t incarnation = 0;  // of the rank's process; 0: not sent
  };
  absl::flat_hash_map<int, Arrival> arrivals;
  int arrived = 0;
  int64_t plan_items = 0;  // of every arrived plan
  absl::flat_hash_map<int, std::vector<Done<v1::BeginSaveResponse>>>
      begin_waiters;
  // Once every rank arrived (kPlanning on): the arrivals by rank.
  std::vector<std::shared_ptr<const planner::LocalSavePlan>> plans;
  std::vector<std::string> fingerprints;
  // Once planned: the incarnation of each rank's process (0: not sent).
  std::vector<uint64_t> incarnations;

  // Planned.
  std::shared_ptr<const planner::GlobalSavePlan> plan;
  uint64_t plan_version = 0;
  bool plan_from_cache = false;

  // Committing (sized world_size once planned).
  std::vector<std::optional<std::vector<v1::WriteResult>>> results;
  int committed = 0;
  std::vector<Done<v1::CommitSaveResponse>> commit_waiters;

  absl::Status abort_status;
  bool world_mismatch = false;  // aborted: ranks disagreed on world_size
};

struct Coordinator::LoadedCheckpoint {
  v1::Manifest manifest;
  std::unique_ptr<planner::LoadPlanner> planner;
  absl::flat_hash_map<std::string, int> bytes_index;  // fqn -> bytes_entries
  // (object key, offset) of a stored chunk -> (tensor, chunk) indexes.
  absl::flat_hash_map<std::pair<std::string, uint64_t>, std::pair<int, int>>
      chunk_at;
};

// One load round: the ranks of a job that load one step together (their
// PlanLoads arrived within load_join_grace of each other). It resolved
// `latest` once for all of them and gathers their VerifyLoad pieces.
struct Coordinator::LoadRound {
  uint64_t id = 0;
  std::string job;
  int64_t step = 0;
  int world_size = 0;
  absl::Time last_join;  // the membership closes load_join_grace after it
  bool closed = false;   // no rank joins any more
  absl::Time deadline;   // once closed: for the next VerifyLoad report
  absl::Status failed;   // the ranks disagreed: every member gets this
  std::shared_ptr<const LoadedCheckpoint> ckpt;
  struct Piece {
    std::pair<int, int> chunk;  // (tensor, chunk) in the manifest
    ChunkPieceReport report;
  };
  struct Member {
    bool reports = true;  // calls VerifyLoad (else counted as reported)
    std::optional<std::vector<Piece>> pieces;  // set once reported
    Done<v1::VerifyLoadResponse> waiter;       // a parked report
  };
  std::map<int, Member> members;  // by rank
  int reported = 0;               // members whose pieces are set

  std::string Name() const {
    return absl::StrCat("load of ", SaveName(job, step), " by ", world_size,
                        " ranks");
  }
  std::vector<int> Ranks() const {
    std::vector<int> r;
    for (const auto& [rank, m] : members) r.push_back(rank);
    return r;
  }
};

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  if (options.storage_uri.empty()) {
    return absl::InvalidArgumentError("coordinator: storage URI is required");
  }
  if (options.catalog_path.empty()) {
    return absl::InvalidArgumentError("coordinator: catalog path is required");
  }
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator: keep_last must be >= 0, got ", options.keep_last));
  }
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardStore> store,
                         storage::OpenShardStore(options.storage_uri));
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::Catalog> catalog,
                         storage::Catalog::Open(options.catalog_path));
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(store), std::move(catalog)));
  CAIRN_RETURN_IF_ERROR(c->Recover());
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options,
                         std::unique_ptr<storage::ShardStore> store,
                         std::unique_ptr<storage::Catalog> catalog)
    : options_(options),
      store_(std::move(store)),
      catalog_(std::move(catalog)),
      storage_settings_(
          absl::StrCat(store_->uri(), "|align=", options.save_plan.alignment,
                       "|prefix=", options.save_plan.object_prefix)),
      plan_cache_(options.plan_cache_bytes),
      manifests_(options.manifest_cache_entries),
      load_plans_(options.load_plan_cache_bytes),
      known_plans_(kKnownPlanBytes),
      workers_(std::make_unique<ThreadPool>(options.worker_threads)) {
  {
    // Round ids differ across restarts, so a report for a round of the
    // previous process never lands in a new one.
    absl::BitGen gen;
    absl::MutexLock lock(&mu_);
    next_load_round_ = absl::Uniform<uint64_t>(gen, 1, uint64_t{1} << 62);
  }
  reaper_ = std::thread([this] { ReaperLoop(); });
}

Coordinator::~Coordinator() {
  Shutdown();
  if (reaper_.joinable()) reaper_.join();
  workers_.reset();  // drains pending work while members are alive
}

// Start-up recovery: storage is the truth (a MANIFEST's presence is the
// commit), the catalog is made to agree with it, and what a crash left is
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
absl::Status Coordinator::Recover() {
  if (catalog_->empty()) {
    CAIRN_ASSIGN_OR_RETURN(int n, catalog_->RebuildFromStore(*store_));
    if (n > 0) {
      CAIRN_LOG(info, "catalog rebuilt from {}: {} committed checkpoints",
                store_->uri(), n);
    }
  }
  if (!options_.clean_incomplete_on_start) return absl::OkStatus();
  const std::string uri = store_->uri();
  // From the root: a job whose only save died mid-write holds nothing but
  // temp files, so ListJobs (visible keys) does not name it.
  CAIRN_RETURN_IF_ERROR(store_->DeleteAbandonedWrites(""));
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> jobs,
                         storage::ListJobs(*store_));
  std::set<SaveKey> with_manifest;
  std::map<std::string, std::vector<int64_t>> incomplete;
  for (const std::string& job : jobs) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                           storage::ListCommittedSteps(*store_, job));
    for (int64_t step : steps) with_manifest.insert({job, step});
    CAIRN_ASSIGN_OR_RETURN(incomplete[job],
                           storage::ListIncompleteSteps(*store_, job));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         catalog_->ListCheckpoints("", true));

  // Refuse to hide every checkpoint because the storage is not there.
  int committed = 0, lost = 0;
  for (const v1::CheckpointRecord& r : records) {
    if (r.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
    ++committed;
    if (with_manifest.count({r.job(), r.step()}) == 0) ++lost;
  }
  if (lost > 0 && lost == committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the catalog '", options_.catalog_path, "' lists ", committed,
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
    switch (r.state()) {
      case v1::CHECKPOINT_STATE_DELETING:
        CAIRN_LOG(info, "finishing the deletion of {}", name);
        CAIRN_RETURN_IF_ERROR(DeleteStepRecord(r));
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
        CAIRN_RETURN_IF_ERROR(catalog_->PutCheckpoint(r));
        continue;
      default:
        break;
    }
    // WRITING, ABORTED (or a state this build does not know).
    if (has_manifest) {
      absl::StatusOr<v1::Manifest> m =
          storage::ReadManifest(*store_, r.job(), r.step());
      if (m.ok()) {
        v1::CheckpointRecord c = storage::RecordFromManifest(*m, uri);
        if (r.created_unix_micros() != 0) {
          c.set_created_unix_micros(r.created_unix_micros());
        }
        CAIRN_LOG(warn,
                  "{} was {} in the catalog but its MANIFEST is "
                  "durable in {}: COMMITTED",
                  name, v1::CheckpointState_Name(r.state()), uri);
        CAIRN_RETURN_IF_ERROR(catalog_->PutCheckpoint(c));
        SweepCommittedStep(*m);
        continue;
      }
      if (!absl::IsDataLoss(m.status()) && !absl::IsNotFound(m.status())) {
        return m.status();
      }
      if (absl::IsDataLoss(m.status())) {
        CAIRN_LOG(error, "{} ({}): {}; deleting the step", name,
                  v1::CheckpointState_Name(r.state()), m.status().ToString());
        CAIRN_RETURN_IF_ERROR(storage::DeleteStep(*store_, r.job(), r.step()));
        r.set_state(v1::CHECKPOINT_STATE_ABORTED);
        r.set_abort_reason(
            absl::StrCat("its MANIFEST was damaged: ", m.status().message()));
        CAIRN_RETURN_IF_ERROR(catalog_->PutCheckpoint(r));
        continue;
      }
    }
    if (r.state() == v1::CHECKPOINT_STATE_WRITING) {
      // Saves in flight when the previous process stopped can never finish:
      // their ranks were answered UNAVAILABLE and will restart the save.
      r.set_state(v1::CHECKPOINT_STATE_ABORTED);
      r.set_abort_reason("cairnd restarted during the save");
      CAIRN_RETURN_IF_ERROR(catalog_->PutCheckpoint(r));
    }
  }

  // MANIFESTs the catalog does not know (it lost entries, or is older than
  // the storage).
  for (const SaveKey& key : with_manifest) {
    if (recorded.count(key) > 0) continue;
    absl::StatusOr<v1::Manifest> m =
        storage::ReadManifest(*store_, key.first, key.second);
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
        catalog_->PutCheckpoint(storage::RecordFromManifest(*m, uri)));
  }

  for (const auto& [job, steps] : incomplete) {
    for (int64_t step : steps) {
      CAIRN_CRASH_POINT("coordinator.recover.before_removing_incomplete");
      CAIRN_LOG(info, "removing incomplete {} left by a crash",
                SaveName(job, step));
      CAIRN_RETURN_IF_ERROR(storage::DeleteStep(*store_, job, step));
    }
  }
  return absl::OkStatus();
}

void Coordinator::Shutdown() {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    std::vector<std::shared_ptr<SaveSession>> live;
    for (auto& [key, s] : sessions_) live.push_back(s);
    for (auto& s : live) {
      // A commit under way finishes (the destructor drains the workers):
      // aborting it could delete objects a published MANIFEST names.
      if (s->phase == Phase::kCommitting) continue;
      AbortSessionLocked(s,
                         absl::UnavailableError(absl::StrCat(
                             "cairnd is shutting down; restart the save of ",
                             SaveName(s->job, s->step))),
                         &answers);
    }
    AdvanceLoadRoundsLocked(absl::InfiniteFuture(), &answers);
  }
  for (auto& a : answers) a();
}

Coordinator::Stats Coordinator::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.saves_in_progress = static_cast<int64_t>(sessions_.size());
  stats.aborts_remembered = static_cast<int64_t>(tombstones_.size());
  return stats;
}

void Coordinator::ReaperLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    mu_.AwaitWithTimeout(absl::Condition(&shutting_down_),
                         absl::Milliseconds(50));
    if (shutting_down_) break;
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<SaveSession>> expired;
    for (auto& [key, s] : sessions_) {
      if ((s->phase == Phase::kGathering || s->phase == Phase::kWriting) &&
          now > s->deadline) {
        expired.push_back(s);
      }
    }
    std::vector<std::function<void()>> answers;
    AdvanceLoadRoundsLocked(now, &answers);
    for (auto& s : expired) {
      std::vector<int> missing;
      if (s->phase == Phase::kGathering) {
        for (int r = 0; r < s->world_size; ++r) {
          if (!s->arrivals.contains(r)) missing.push_back(r);
        }
        AbortSessionLocked(
            s,
            absl::DeadlineExceededError(absl::StrCat(
                "save of ", SaveName(s->job, s->step), " aborted: ranks ",
                RankList(missing, s->world_size),
                " never called BeginSave within ",
                absl::FormatDuration(options_.begin_deadline))),
            &answers);
      } else {
        for (int r = 0; r < s->world_size; ++r) {
          if (!s->results[r].has_value()) missing.push_back(r);
        }
        AbortSessionLocked(
            s,
            absl::DeadlineExceededError(absl::StrCat(
                "save of ", SaveName(s->job, s->step), " aborted: ranks ",
                RankList(missing, s->world_size),
                " never called CommitSave within ",
                absl::FormatDuration(options_.commit_deadline))),
            &answers);
      }
    }
    if (!answers.empty()) {
      mu_.Unlock();
      for (auto& a : answers) a();
      mu_.Lock();
    }
  }
}

// ---------------------------------------------------------------------------
// BeginSave

void Coordinator::BeginSave(const v1::BeginSaveRequest& request,
                            Done<v1::BeginSaveResponse> done) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  const int world = request.world_size();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);
  if (absl::Status s = ValidateRankOfWorld(
          rank, world, options_.max_world_size,
          absl::StrCat("rank ", rank, " of ", SaveName(job, step)));
      !s.ok()) {
    return done(s);
  }

  // Resolve the rank's plan outside the lock: decode + fingerprint.
  std::shared_ptr<const planner::LocalSavePlan> plan;
  std::string fingerprint;
  if (request.has_local_plan()) {
    if (absl::Status s = CheckLocalPlanBounds(
            request.local_plan(), options_,
            absl::StrCat("rank ", rank, " of ", SaveName(job, step)));
        !s.ok()) {
      return done(s);
    }
    if (request.local_plan().rank() != rank) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " of ", SaveName(job, step),
          " sent a local plan for rank ", request.local_plan().rank())));
    }
    absl::StatusOr<planner::LocalSavePlan> p =
        convert::LocalPlanFromProto(request.local_plan());
    if (!p.ok()) {
      return done(
          absl::Status(p.status().code(),
                       absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                                    ": ", p.status().message())));
    }
    fingerprint = planner::FingerprintLocalPlan(*p);
    plan = std::make_shared<const planner::LocalSavePlan>(std::move(*p));
  } else if (request.plan_case() == v1::BeginSaveRequest::kPlanFingerprint) {
    if (request.plan_fingerprint().size() > kMaxFingerprintBytes) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " of ", SaveName(job, step),
          " sent a plan fingerprint of ", request.plan_fingerprint().size(),
          " bytes; at most ", kMaxFingerprintBytes, " are accepted")));
    }
    fingerprint = request.plan_fingerprint();
  } else {
    return done(absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                     " sent neither a local plan nor a plan fingerprint")));
  }

  // A committed step is never overwritten.
  absl::StatusOr<v1::CheckpointRecord> existing =
      catalog_->GetCheckpoint(job, step);
  if (existing.ok() && existing->state() == v1::CHECKPOINT_STATE_COMMITTED) {
    return done(absl::AlreadyExistsError(absl::StrCat(
        SaveName(job, step), " is already committed; save a new step")));
  }
  if (existing.ok() && existing->state() == v1::CHECKPOINT_STATE_DELETING) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(SaveName(job, step),
                     " is being deleted; finish with `cairn rm` first")));
  }
  const uint64_t incarnation = request.incarnation();

  // Join (or create) the session. Either `done` is parked until the plan is
  // built, or `reply` holds the immediate answer, given after the lock.
  using Reply = std::optional<absl::StatusOr<v1::BeginSaveResponse>>;
  std::shared_ptr<SaveSession> to_plan;
  Reply reply;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    reply = [&]() -> Reply {
      if (shutting_down_) {
        return absl::UnavailableError("cairnd is shutting down");
      }
      if (deleting_.contains(SaveKey{job, step})) {
        return absl::FailedPreconditionError(absl::StrCat(
            SaveName(job, step), " is being deleted; save it once it is gone"));
      }
      if (plan == nullptr) {
        std::shared_ptr<const KnownPlan> known =
            known_plans_.Lookup({job, rank});
        if (known == nullptr || known->fingerprint != fingerprint) {
          v1::BeginSaveResponse resend;
          resend.set_resend_plan(true);
          return resend;
        }
        plan = known->plan;
      } else {
        known_plans_.Insert(
            {job, rank},
            std::make_shared<const KnownPlan>(KnownPlan{fingerprint, plan}),
            ApproximateLocalPlanBytes(*plan) + job.size() + fingerprint.size());
      }

      const SaveKey key{job, step};
      auto it = sessions_.find(key);
      if (it != sessions_.end() && it->second->world_size == world) {
        // Is this rank already in the save, and from which process?
        SaveSession& old = *it->second;
        bool in_save = false, reported = false;
        uint64_t was = 0;
        if (old.phase == Phase::kGathering) {
          auto a = old.arrivals.find(rank);
          if (a != old.arrivals.end()) {
            in_save = true;
            was = a->second.incarnation;
          }
        } else if (static_cast<size_t>(rank) < old.incarnations.size()) {
          in_save = true;
          was = old.incarnations[rank];
          reported = static_cast<size_t>(rank) < old.results.size() &&
                     old.results[rank].has_value();
        }
        // The same process asking again before it reported its writes is a
        // retry (answered below). A new process (the rank restarted), or the
        // same one after it reported (it is saving again and may rewrite
        // what it reported), would write into objects whose crc32c cairnd
        // already holds: abort this attempt and give the save a fresh one.
        const bool restarted =
            in_save && incarnation != 0 && was != 0 && was != incarnation;
        const bool again = in_save && !restarted && reported;
        if (restarted || again) {
          if (old.phase == Phase::kCommitting) {
            return absl::UnavailableError(absl::StrCat(
                "rank ", rank, " of ", SaveName(job, step),
                ": the previous attempt is being committed; retry"));
          }
          // A copy: AbortSessionLocked takes the session out of sessions_.
          const std::shared_ptr<SaveSession> victim = it->second;
          AbortSessionLocked(
              victim,
              absl::AbortedError(absl::StrCat(
                  "save of ", SaveName(job, step), " aborted: rank ", rank,
                  restarted
                      ? absl::StrFormat(
                            " restarted during the save (process %016x "
                            "replaced %016x)",
                            incarnation, was)
                      : " called BeginSave again after reporting its writes",
                  "; the save starts over")),
              &answers);
          it = sessions_.end();
        }
      }
      if (it == sessions_.end()) {
        if (auto t = tombstones_.find(key);
            t != tombstones_.end() && absl::Now() < t->second.refuse_until &&
            !std::binary_search(t->second.arrived.begin(),
                                t->second.arrived.end(), rank)) {
          return t->second.status;
        }
        // A new save (or a new attempt after an abort).
        int of_job = 0;
        for (const auto& [k, live] : sessions_) of_job += k.first == job;
        if (of_job >= options_.max_sessions_per_job ||
            static_cast<int>(sessions_.size()) >= options_.max_sessions) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "rank ", rank, " of ", SaveName(job, step),
              ": too many saves in progress (", of_job, " of job '", job,
              "', at most ", options_.max_sessions_per_job, "; ",
              sessions_.size(), " in total, at most ", options_.max_sessions,
              "); finish or abort one first"));
        }
        tombstones_.erase(key);
        auto fresh = std::make_shared<SaveSession>();
        fresh->job = job;
        fresh->step = step;
        fresh->world_size = world;
        fresh->attempt = NewAttemptName();
        fresh->step_prefix = storage::StepPrefix(job, step);
        fresh->created = absl::Now();
        fresh->deadline = fresh->created + options_.begin_deadline;
        it = sessions_.emplace(key, std::move(fresh)).first;
      }
      SaveSession& s = *it->second;
      if (s.world_size != world) {
        // Fail the whole save now: the ranks already parked would otherwise
        // wait for the begin deadline and hear of a missing rank.
        std::vector<int> arrived;
        for (const auto& [r, a] : s.arrivals) arrived.push_back(r);
        std::sort(arrived.begin(), arrived.end());
        const absl::Status status = absl::InvalidArgumentError(absl::StrCat(
            "save of ", SaveName(job, step), " aborted: rank ", rank,
            " says world_size ", world, " but ranks ",
            RankList(arrived, s.world_size), " say world_size ", s.world_size,
            "; every rank of a save must pass the same world_size"));
        if (s.phase == Phase::kGathering) {
          s.world_mismatch = true;
          const std::shared_ptr<SaveSession> broken = it->second;  // erased
          AbortSessionLocked(broken, status, &answers);
        }
        return status;
      }
      const std::string* arrived_fingerprint = nullptr;
      if (s.phase == Phase::kGathering) {
        auto a = s.arrivals.find(rank);
        if (a != s.arrivals.end()) arrived_fingerprint = &a->second.fingerprint;
      } else {
        arrived_fingerprint = &s.fingerprints[rank];
      }
      if (arrived_fingerprint != nullptr) {
        // A retry (or a duplicate rank): same plan, same answer.
        if (*arrived_fingerprint != fingerprint) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", rank, " of ", SaveName(job, step),
              " called BeginSave twice with different plans (duplicate "
              "rank?)"));
        }
        if (s.phase == Phase::kGathering || s.phase == Phase::kPlanning) {
          s.begin_waiters[rank].push_back(std::move(done));
          return std::nullopt;
        }
        return RankResponse(s, rank);
      }
      if (s.phase != Phase::kGathering) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                         " arrived after the plan was built"));
      }
      const int64_t items = static_cast<int64_t>(plan->items.size());
      if (s.plan_items + items > options_.max_plan_items_per_save) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "rank ", rank, " of ", SaveName(job, step), ": its ", items,
            " plan items would bring the save to ", s.plan_items + items,
            " items; at most ", options_.max_plan_items_per_save,
            " per save are accepted (cairnd --max-plan-items-per-save)"));
      }
      s.plan_items += items;
      s.arrivals[rank] = SaveSession::Arrival{plan, fingerprint, incarnation};
      s.begin_waiters[rank].push_back(std::move(done));
      CAIRN_LOG(debug, "rank {} of {} joined the save ({} of {} ranks)", rank,
                SaveName(job, step), s.arrived + 1, s.world_size);
      if (++s.arrived == s.world_size) {
        // Every rank is here: the world is real, lay the session out densely.
        s.phase = Phase::kPlanning;
        s.plans.resize(world);
        s.fingerprints.resize(world);
        s.incarnations.resize(world);
        for (auto& [r, a] : s.arrivals) {
          s.plans[r] = std::move(a.plan);
          s.fingerprints[r] = std::move(a.fingerprint);
          s.incarnations[r] = a.incarnation;
        }
        s.arrivals.clear();
        to_plan = it->second;
      }
      return std::nullopt;
    }();
  }
  // The aborted attempt is recorded and cleaned before the new one can be.
  for (auto& a : answers) a();
  if (reply.has_value()) return done(std::move(*reply));
  if (to_plan != nullptr) {
    workers_->Schedule([this, to_plan] { PlanSession(to_plan); });
  }
}

void Coordinator::PlanSession(std::shared_ptr<SaveSession> session) {
  // Plans are immutable once every rank arrived; read them without the lock.
  planner::PlanCache::Key key{session->job, session->world_size,
                              session->fingerprints, storage_settings_};
  std::shared_ptr<const planner::GlobalSavePlan> plan = plan_cache_.Lookup(key);
  const bool from_cache = plan != nullptr;
  if (plan == nullptr) {
    std::vector<planner::LocalSavePlan> locals;
    locals.reserve(session->world_size);
    for (const auto& p : session->plans) locals.push_back(*p);
    absl::StatusOr<planner::GlobalSavePlan> built =
        planner::BuildGlobalSavePlan(session->job, session->step, locals,
                                     options_.save_plan);
    if (!built.ok()) {
      AbortSession(session, built.status());
      return;
    }
    plan = std::make_shared<const planner::GlobalSavePlan>(std::move(*built));
    plan_cache_.Insert(key, plan);
  }

  // Storage, not the catalog, says what is committed: a step whose MANIFEST
  // is there (its catalog write failed after the publish, say) is never
  // saved over. Its record is repaired; the ranks hear ALREADY_EXISTS.
  if (absl::StatusOr<v1::Manifest> m =
          storage::ReadManifest(*store_, session->job, session->step);
      m.ok() || !absl::IsNotFound(m.status())) {
    if (m.ok()) {
      (void)catalog_->PutCheckpoint(
          storage::RecordFromManifest(*m, store_->uri()));
    }
    AbortSession(session, m.ok()
                              ? absl::AlreadyExistsError(absl::StrCat(
                                    SaveName(session->job, session->step),
                                    " is already committed; save a new step"))
                              : m.status());
    return;
  }

  v1::CheckpointRecord record;
  record.set_job(session->job);
  record.set_step(session->step);
  record.set_state(v1::CHECKPOINT_STATE_WRITING);
  record.set_world_size(session->world_size);
  record.set_created_unix_micros(absl::ToUnixMicros(session->created));
  record.set_storage_uri(store_->uri());
  if (absl::Status s = catalog_->PutCheckpoint(record); !s.ok()) {
    AbortSession(session, s);
    return;
  }

  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (session->phase != Phase::kPlanning) return;  // aborted meanwhile
    session->plan = plan;
    session->plan_from_cache = from_cache;
    if (plan_versions_.size() >= kMaxPlanVersionJobs &&
        !plan_versions_.contains(session->job)) {
      for (auto v = plan_versions_.begin(); v != plan_versions_.end();) {
        bool live = false;
        for (const auto& [k, s] : sessions_) live |= k.first == v->first;
        if (live) {
          ++v;
        } else {
          plan_versions_.erase(v++);
        }
      }
    }
    uint64_t& version = plan_versions_[session->job];
    if (!from_cache) ++version;
    session->plan_version = version;
    session->phase = Phase::kWriting;
    session->results.resize(session->world_size);
    session->deadline = absl::Now() + options_.commit_deadline;
    if (from_cache) {
      ++stats_.plans_from_cache;
    } else {
      ++stats_.plans_built;
    }
    for (auto& [r, waiters] : session->begin_waiters) {
      for (auto& done : waiters) {
        answers.push_back([this, session, r = r, done = std::move(done)] {
          done(RankResponse(*session, r));
        });
      }
    }
    session->begin_waiters.clear();
  }
  CAIRN_LOG(info, "{}: plan v{} for {} ranks ({})",
            SaveName(session->job, session->step), session->plan_version,
            session->world_size, from_cache ? "cached" : "built");
  for (auto& a : answers) a();
}

absl::StatusOr<v1::BeginSaveResponse> Coordinator::RankResponse(
    const SaveSession& session, int rank) const {
  v1::BeginSaveResponse r;
  r.set_plan_version(session.plan_version);
  r.set_plan_from_cache(session.plan_from_cache);
  r.set_plan_fingerprint(session.fingerprints[rank]);
  r.set_storage_uri(store_->uri());
  r.set_step_prefix(session.step_prefix);
  convert::RankPlanToProto(session.plan->ranks[rank], r.mutable_rank_plan());
  // Object keys of this attempt live in its own directory.
  for (v1::PlannedWrite& w : *r.mutable_rank_plan()->mutable_writes()) {
    w.mutable_location()->set_object_key(
        absl::StrCat(session.attempt, "/", w.location().object_key()));
  }
  return r;
}

// ---------------------------------------------------------------------------
// CommitSave / AbortSave

void Coordinator::CommitSave(const v1::CommitSaveRequest& request,
                             Done<v1::CommitSaveResponse> done) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);

  std::shared_ptr<SaveSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(SaveKey{job, step});
    if (it != sessions_.end()) {
      session = it->second;
    } else if (auto t = tombstones_.find(SaveKey{job, step});
               t != tombstones_.end()) {
      return done(t->second.status);
    }
  }
  if (session == nullptr) {
    // Maybe a retry after the commit finished: answer from the catalog.
    absl::StatusOr<v1::CheckpointRecord> rec =
        catalog_->GetCheckpoint(job, step);
    if (rec.ok() && rec->state() == v1::CHECKPOINT_STATE_COMMITTED) {
      v1::CommitSaveResponse resp;
      *resp.mutable_checkpoint() = *rec;
      return done(std::move(resp));
    }
    if (rec.ok() && rec->state() == v1::CHECKPOINT_STATE_ABORTED) {
      return done(absl::AbortedError(
          absl::StrCat("save of ", SaveName(job, step), " was aborted (",
                       rec->abort_reason(), "); restart it")));
    }
    return done(absl::NotFoundError(
        absl::StrCat("rank ", rank, ": no save of ", SaveName(job, step),
                     " is in progress; call BeginSave first")));
  }

  // Validate results against the rank's plan (immutable once planned).
  std::shared_ptr<const planner::GlobalSavePlan> plan;
  std::string attempt;
  {
    absl::MutexLock lock(&mu_);
    if (session->phase == Phase::kAborted) {
      return done(session->abort_status);
    }
    if (session->phase == Phase::kGathering ||
        session->phase == Phase::kPlanning) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                       " called CommitSave before the plan was built")));
    }
    plan = session->plan;
    attempt = session->attempt;
  }
  if (rank < 0 || rank >= session->world_size) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                     " is out of range for world_size ", session->world_size)));
  }
  {
    absl::MutexLock lock(&mu_);
    const uint64_t in_save = session->incarnations[rank];
    if (request.incarnation() != 0 && in_save != 0 &&
        request.incarnation() != in_save) {
      // An old process of a rank that restarted: its objects belong to an
      // attempt that was aborted, never to this one.
      return done(absl::AbortedError(absl::StrFormat(
          "rank %d of %s: this process (%016x) is not the one in the save "
          "(%016x): the rank restarted and the save started over",
          rank, SaveName(job, step), request.incarnation(), in_save)));
    }
  }
  const planner::RankSavePlan& mine = plan->ranks[rank];
  if (request.results_size() != static_cast<int>(mine.writes.size())) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step), " reported ",
                     request.results_size(), " write results but its plan has ",
                     mine.writes.size(), " writes")));
  }
  for (int i = 0; i < request.results_size(); ++i) {
    const v1::StorageLocation& got = request.results(i).location();
    const planner::StorageLocation& want = mine.writes[i].location;
    const std::string want_key = absl::StrCat(attempt, "/", want.object_key);
    if (got.object_key() != want_key || got.offset() != want.offset ||
        got.length() != want.length) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " of ", SaveName(job, step), " result ", i, " for '",
          mine.writes[i].item.fqn, "' is at ", Truncated(got.object_key(), 256),
          "@", got.offset(), "+", got.length(), " but the plan says ", want_key,
          "@", want.offset, "+", want.length)));
    }
  }

  bool commit_now = false;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (session->phase == Phase::kAborted) return done(session->abort_status);
    auto& slot = session->results[rank];
    std::vector<v1::WriteResult> results(request.results().begin(),
                                         request.results().end());
    bool same = true;
    if (slot.has_value()) {
      same = slot->size() == results.size();
      for (size_t i = 0; same && i < results.size(); ++i) {
        same = (*slot)[i].crc32c() == results[i].crc32c();
      }
    }
    if (!same && session->phase == Phase::kWriting) {
      // The rank rewrote objects it had reported: what is on storage now
      // cannot be trusted to match either report.
      AbortSessionLocked(
          session,
          absl::AbortedError(absl::StrCat(
              "save of ", SaveName(job, step), " aborted: rank ", rank,
              " committed twice with different checksums (its objects may "
              "have been rewritten); the save starts over")),
          &answers);
      answers.push_back([done = std::move(done),
                         status = session->abort_status] { done(status); });
    } else if (!same) {
      return done(absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                       " committed twice with different checksums")));
    } else {
      if (!slot.has_value()) {
        slot = std::move(results);
        ++session->committed;
      }
      session->commit_waiters.push_back(std::move(done));
      if (session->committed == session->world_size &&
          session->phase == Phase::kWriting) {
        session->phase = Phase::kCommitting;
        commit_now = true;
      }
    }
  }
  for (auto& a : answers) a();
  if (commit_now) {
    workers_->Schedule([this, session] { CommitSession(session); });
  }
}

absl::StatusOr<v1::Manifest> Coordinator::BuildManifest(
    const SaveSession& session) const {
  v1::Manifest m;
  m.set_format_version(storage::kManifestFormatVersion);
  m.set_job(session.job);
  m.set_step(session.step);
  m.set_world_size(session.world_size);
  m.set_created_unix_micros(absl::ToUnixMicros(session.created));

  // Every tensor of the plan appears, even one with no bytes.
  std::map<std::string, v1::ManifestTensor> tensors;
  std::map<std::string, v1::ManifestBytes> bytes;
  for (const planner::PlannedEntry& entry : session.plan->entries) {
    if (entry.kind != planner::WriteItem::Kind::kTensorChunk) continue;
    v1::TensorEntry* e = tensors[entry.fqn].mutable_entry();
    e->set_fqn(entry.fqn);
    e->set_dtype(convert::DTypeToProto(entry.dtype));
    e->mutable_global_shape()->Assign(entry.global_shape.begin(),
                                      entry.global_shape.end());
  }
  std::set<std::string> objects;
  uint64_t total = 0;
  for (int r = 0; r < session.world_size; ++r) {
    const planner::RankSavePlan& rp = session.plan->ranks[r];
    const std::vector<v1::WriteResult>& results = *session.results[r];
    for (size_t i = 0; i < rp.writes.size(); ++i) {
      const planner::PlannedWrite& w = rp.writes[i];
      const v1::WriteResult& res = results[i];
      objects.insert(res.location().object_key());
      total += w.location.length;
      if (w.item.kind == planner::WriteItem::Kind::kBytes) {
        v1::ManifestBytes& b = bytes[w.item.fqn];
        b.set_fqn(w.item.fqn);
        *b.mutable_location() = res.location();
        b.set_crc32c(res.crc32c());
        b.set_writer_rank(r);
        continue;
      }
      v1::StoredChunk* c = tensors[w.item.fqn].add_chunks();
      convert::BoxToProto(w.item.box, c->mutable_box());
      *c->mutable_location() = res.location();
      c->set_crc32c(res.crc32c());
      c->set_writer_rank(r);
    }
  }
  for (auto& [fqn, t] : tensors) {
    std::sort(t.mutable_chunks()->begin(), t.mutable_chunks()->end(),
              [](const v1::StoredChunk& a, const v1::StoredChunk& b) {
                return std::lexicographical_compare(
                    a.box().offsets().begin(), a.box().offsets().end(),
                    b.box().offsets().begin(), b.box().offsets().end());
              });
    *m.add_tensors() = std::move(t);
  }
  for (auto& [fqn, b] : bytes) *m.add_bytes_entries() = std::move(b);
  for (const std::string& o : objects) m.add_objects(o);
  m.set_total_bytes(total);
  CAIRN_RETURN_IF_ERROR(storage::ValidateManifest(m));
  return m;
}

void Coordinator::CommitSession(std::shared_ptr<SaveSession> session) {
  const std::string name = SaveName(session->job, session->step);
  absl::StatusOr<v1::Manifest> manifest = BuildManifest(*session);
  if (!manifest.ok()) return AbortSession(session, manifest.status());

  // PublishManifest checks that every object holds every planned byte.
  if (absl::Status s = storage::PublishManifest(*store_, *manifest); !s.ok()) {
    // The MANIFEST may be visible even so (a failure after the rename): it
    // goes before the objects it names, or they stay.
    absl::Status undo =
        store_->Delete(storage::ManifestKey(session->job, session->step));
    if (!undo.ok() && !absl::IsNotFound(undo)) {
      CAIRN_LOG(error,
                "{}: the commit failed and its MANIFEST cannot be removed "
                "({}); keeping its objects for recovery",
                name, undo.ToString());
      absl::MutexLock lock(&mu_);
      session->keep_objects = true;
    }
    return AbortSession(session, s);
  }
  CAIRN_CRASH_POINT("coordinator.commit.after_manifest_publish");
  v1::CheckpointRecord record;
  record.set_job(session->job);
  record.set_step(session->step);
  record.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  record.set_world_size(session->world_size);
  record.set_total_bytes(manifest->total_bytes());
  record.set_num_tensors(manifest->tensors_size());
  record.set_num_bytes_entries(manifest->bytes_entries_size());
  record.set_created_unix_micros(absl::ToUnixMicros(session->created));
  record.set_committed_unix_micros(NowMicros());
  record.set_storage_uri(store_->uri());
  // The manifest is durable: the checkpoint is committed whatever happens to
  // the catalog write (a restart rebuilds it from storage).
  if (absl::Status s = catalog_->PutCheckpoint(record); !s.ok()) {
    CAIRN_LOG(error, "{}: committed on storage but catalog write failed: {}",
              name, s.ToString());
  }
  CAIRN_LOG(info, "{}: committed ({} bytes, {} tensors, {} ranks)", name,
            record.total_bytes(), record.num_tensors(), session->world_size);
  CAIRN_CRASH_POINT("coordinator.commit.after_catalog_commit");

  std::vector<Done<v1::CommitSaveResponse>> waiters;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.commits;
    waiters = std::move(session->commit_waiters);
    session->commit_waiters.clear();
    auto it = sessions_.find(SaveKey{session->job, session->step});
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
  }
  manifests_.Erase(SaveKey{session->job, session->step});
  if (options_.keep_last > 0) {
    absl::StatusOr<v1::GarbageCollectResponse> gc =
        ApplyRetention(session->job, options_.keep_last, false);
    if (!gc.ok()) {
      CAIRN_LOG(warn, "retention for job '{}' failed: {}", session->job,
                gc.status().ToString());
    }
  }
  // Every other attempt of this step is aborted: what they (or ranks that
  // died mid-write) left in the step is garbage.
  SweepCommittedStep(*manifest);
  for (auto& done : waiters) {
    v1::CommitSaveResponse resp;
    *resp.mutable_checkpoint() = record;
    done(std::move(resp));
  }
}

void Coordinator::AbortSessionLocked(
    const std::shared_ptr<SaveSession>& session, absl::Status status,
    std::vector<std::function<void()>>* answers) {
  if (session->phase == Phase::kAborted) return;
  session->phase = Phase::kAborted;
  session->abort_status = status;
  ++stats_.aborts;
  // The session leaves at once (its plans and waiters are freed when the
  // last call holding it returns); a tombstone answers late calls.
  const SaveKey key{session->job, session->step};
  auto live = sessions_.find(key);
  if (live != sessions_.end() && live->second == session) {
    sessions_.erase(live);
    Tombstone& t = tombstones_[key];
    t = Tombstone();
    t.status = status;
    t.seq = ++tombstone_seq_;
    if (session->world_mismatch) {
      t.refuse_until = session->deadline;
      for (const auto& [r, a] : session->arrivals) t.arrived.push_back(r);
      std::sort(t.arrived.begin(), t.arrived.end());
    }
    tombstone_order_.emplace_back(key, tombstone_seq_);
    while (tombstone_order_.size() > kMaxTombstones) {
      auto& [old_key, seq] = tombstone_order_.front();
      auto t = tombstones_.find(old_key);
      if (t != tombstones_.end() && t->second.seq == seq) tombstones_.erase(t);
      tombstone_order_.pop_front();
    }
  }
  session->arrivals.clear();  // (plans may still be read by PlanSession)
  for (auto& [r, waiters] : session->begin_waiters) {
    for (auto& done : waiters) {
      answers->push_back([done = std::move(done), status] { done(status); });
    }
  }
  session->begin_waiters.clear();
  for (auto& done : session->commit_waiters) {
    answers->push_back([done = std::move(done), status] { done(status); });
  }
  session->commit_waiters.clear();
  // Record the abort and delete this attempt's objects off the lock.
  answers->push_back([this, session, status] {
    CAIRN_LOG(warn, "save of {} aborted: {}",
              SaveName(session->job, session->step), status.ToString());
    CAIRN_CRASH_POINT("coordinator.abort.before_cleanup");
    v1::CheckpointRecord record;
    record.set_job(session->job);
    record.set_step(session->step);
    record.set_state(v1::CHECKPOINT_STATE_ABORTED);
    record.set_world_size(session->world_size);
    record.set_created_unix_micros(absl::ToUnixMicros(session->created));
    record.set_storage_uri(store_->uri());
    record.set_abort_reason(Truncated(status.message(), 4 * kMaxReasonBytes));
    bool newer = false;  // a later attempt owns the record now
    bool keep_objects = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(SaveKey{session->job, session->step});
      newer = it != sessions_.end() && it->second != session;
      keep_objects = session->keep_objects;
    }
    absl::StatusOr<v1::CheckpointRecord> prev =
        catalog_->GetCheckpoint(session->job, session->step);
    if (!newer &&
        (!prev.ok() || (prev->state() != v1::CHECKPOINT_STATE_COMMITTED &&
                        prev->state() != v1::CHECKPOINT_STATE_DELETING))) {
      (void)catalog_->PutCheckpoint(record);
      PruneAbortedRecords(*catalog_, session->job);
    }
    if (keep_objects) return;
    absl::Status del = store_->DeletePrefix(
        absl::StrCat(session->step_prefix, session->attempt, "/"));
    if (!del.ok()) {
      CAIRN_LOG(warn, "cleanup of aborted save of {} failed: {}",
                SaveName(session->job, session->step), del.ToString());
    }
  });
}

void Coordinator::AbortSession(const std::shared_ptr<SaveSession>& session,
                               absl::Status status) {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    AbortSessionLocked(session, std::move(status), &answers);
  }
  for (auto& a : answers) a();
}

absl::Status Coordinator::AbortSave(const v1::AbortSaveRequest& request) {
  CAIRN_RETURN_IF_ERROR(ValidateJobStep(request.job(), request.step()));
  std::shared_ptr<SaveSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(SaveKey{request.job(), request.step()});
    if (it != sessions_.end()) session = it->second;
    if (session == nullptr &&
        tombstones_.contains(SaveKey{request.job(), request.step()})) {
      return absl::OkStatus();  // already aborted: a retry
    }
  }
  if (session == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no save of ", SaveName(request.job(), request.step()),
                     " is in progress"));
  }
  {
    absl::MutexLock lock(&mu_);
    const int rank = request.rank();
    bool in_save = false;
    uint64_t was = 0;
    if (session->phase == Phase::kGathering) {
      auto a = session->arrivals.find(rank);
      if (a != session->arrivals.end()) {
        in_save = true;
        was = a->second.incarnation;
      }
    } else if (rank >= 0 &&
               static_cast<size_t>(rank) < session->incarnations.size()) {
      in_save = true;
      was = session->incarnations[rank];
    }
    if (request.incarnation() != 0 &&
        (!in_save || (was != 0 && was != request.incarnation()))) {
      // An old process of a restarted rank, aborting the save it was in:
      // that one is already gone, and this one is not its to abort.
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d (process %016x) is not part of the save of %s in progress "
          "(the save started over without it); not aborted",
          rank, request.incarnation(),
          SaveName(request.job(), request.step())));
    }
    if (session->phase == Phase::kCommitting) {
      return absl::FailedPreconditionError(
          absl::StrCat("save of ", SaveName(request.job(), request.step()),
                       " is already being committed"));
    }
  }
  AbortSession(session,
               absl::AbortedError(absl::StrCat(
                   "save of ", SaveName(request.job(), request.step()),
                   " aborted by rank ", request.rank(), ": ",
                   request.reason().empty()
                       ? "no reason given"
                       : Truncated(request.reason(), kMaxReasonBytes))));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Load and catalog queries

absl::StatusOr<std::shared_ptr<const Coordinator::LoadedCheckpoint>>
Coordinator::LoadCheckpoint(const std::string& job, int64_t step) {
  const SaveKey key{job, step};
  if (auto hit = manifests_.Lookup(key)) return hit;
  CAIRN_ASSIGN_OR_RETURN(v1::Manifest manifest,
                         storage::ReadManifest(*store_, job, step));
  auto loaded = std::make_shared<LoadedCheckpoint>();
  CAIRN_ASSIGN_OR_RETURN(std::vector<planner::StoredTensor> tensors,
                         convert::StoredTensorsFromManifest(manifest));
  CAIRN_ASSIGN_OR_RETURN(loaded->planner,
                         planner::LoadPlanner::Create(std::move(tensors)));
  for (int i = 0; i < manifest.bytes_entries_size(); ++i) {
    loaded->bytes_index[manifest.bytes_entries(i).fqn()] = i;
  }
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    for (int c = 0; c < manifest.tensors(t).chunks_size(); ++c) {
      const v1::StorageLocation& loc = manifest.tensors(t).chunks(c).location();
      loaded->chunk_at[{loc.object_key(), loc.offset()}] = {t, c};
    }
  }
  loaded->manifest = std::move(manifest);
  {
    absl::MutexLock lock(&mu_);
    ++stats_.manifests_loaded;
  }
  manifests_.Insert(key, loaded, 1);
  return std::shared_ptr<const LoadedCheckpoint>(std::move(loaded));
}

absl::StatusOr<v1::PlanLoadResponse> Coordinator::PlanLoad(
    const v1::PlanLoadRequest& request) {
  const std::string& job = request.job();
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
  CAIRN_RETURN_IF_ERROR(CheckLoadRequestBounds(request, options_));
  const int rank = request.rank();
  const int world = request.world_size();
  const bool latest = request.ref_case() != v1::PlanLoadRequest::kStep;
  int64_t step = -1;
  if (!latest) {
    step = request.step();
    CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
    absl::StatusOr<v1::CheckpointRecord> rec =
        catalog_->GetCheckpoint(job, step);
    if (!rec.ok()) {
      if (absl::IsNotFound(rec.status())) {
        return absl::NotFoundError(
            absl::StrCat("no checkpoint ", SaveName(job, step)));
      }
      return rec.status();
    }
    if (rec->state() != v1::CHECKPOINT_STATE_COMMITTED) {
      return absl::FailedPreconditionError(
          absl::StrCat(SaveName(job, step), " is not committed (state ",
                       v1::CheckpointState_Name(rec->state()), ")"));
    }
  }
  // The newest committed step, read before the lock (no lock is held across
  // catalog I/O); a live round's step takes precedence over it.
  int64_t newest = -1;
  if (latest) {
    absl::StatusOr<v1::CheckpointRecord> rec = catalog_->LatestCommitted(job);
    if (rec.ok()) {
      newest = rec->step();
    } else if (!absl::IsNotFound(rec.status())) {
      return rec.status();
    }
  }
  if (world == 0) {  // no round: a one-off load (old clients, tools)
    if (latest && newest < 0) {
      return absl::NotFoundError(
          absl::StrCat("job '", job, "' has no committed checkpoint"));
    }
    return PlanLoadOfStep(request, latest ? newest : step);
  }
  CAIRN_RETURN_IF_ERROR(ValidateRankOfWorld(
      rank, world, options_.max_world_size,
      absl::StrCat("rank ", rank, " loading job '", job, "'")));

  std::shared_ptr<LoadRound> round;
  std::vector<std::function<void()>> answers;
  absl::Status joined;
  {
    absl::MutexLock lock(&mu_);
    joined = shutting_down_ ? absl::UnavailableError("cairnd is shutting down")
                            : JoinLoadRoundLocked(
                                  job, rank, world, request.verify_in_round(),
                                  newest, &step, &round, &answers);
  }
  for (auto& a : answers) a();
  CAIRN_RETURN_IF_ERROR(joined);
  absl::StatusOr<v1::PlanLoadResponse> planned = PlanLoadOfStep(request, step);
  if (!planned.ok()) {
    LeaveLoadRound(round, rank);
    return planned.status();
  }
  planned->set_load_round(round->id);
  return planned;
}

absl::Status Coordinator::JoinLoadRoundLocked(
    const std::string& job, int rank, int world, bool reports,
    int64_t newest_committed, int64_t* step, std::shared_ptr<LoadRound>* joined,
    std::vector<std::function<void()>>* answers) {
  const bool latest = *step < 0;
  const absl::Time now = absl::Now();
  // A retried PlanLoad (the answer to the first was lost) finds its round:
  // the rank is a member that has not reported yet (or, not reporting, of a
  // round still open).
  std::shared_ptr<LoadRound> newest_live;  // that this rank is not part of
  std::shared_ptr<LoadRound> open;  // for the step, this rank not part of it
  for (auto& [id, r] : load_rounds_) {
    if (r->job != job) continue;
    auto m = r->members.find(rank);
    if (m != r->members.end()) {
      const bool pending =
          m->second.reports ? !m->second.pieces.has_value() : !r->closed;
      if (pending && (latest || r->step == *step) && r->world_size == world) {
        *step = r->step;
        *joined = r;
        return r->failed;
      }
      continue;
    }
    if (newest_live == nullptr || r->id > newest_live->id) newest_live = r;
  }
  if (latest) {
    if (newest_live != nullptr) {
      *step = newest_live->step;
    } else if (newest_committed >= 0) {
      *step = newest_committed;
    } else {
      return absl::NotFoundError(
          absl::StrCat("job '", job, "' has no committed checkpoint"));
    }
  }
  for (auto& [id, r] : load_rounds_) {
    if (r->job != job || r->step != *step || r->closed ||
        r->members.count(rank) > 0) {
      continue;
    }
    if (open == nullptr || r->id > open->id) open = r;
  }
  if (open != nullptr && !open->failed.ok()) return open->failed;
  if (open != nullptr && open->world_size != world) {
    const absl::Status status = absl::InvalidArgumentError(absl::StrCat(
        "load of ", SaveName(job, *step), ": rank ", rank, " says world_size ",
        world, " but ranks ", RankList(open->Ranks(), open->world_size),
        " of the load say world_size ", open->world_size,
        "; every rank of a load must pass the same world_size"));
    CAIRN_LOG(warn, "{}", std::string(status.message()));
    FailLoadRoundLocked(*open, status, answers);
    return status;
  }
  if (open == nullptr) {
    open = std::make_shared<LoadRound>();
    open->id = next_load_round_++;
    open->job = job;
    open->step = *step;
    open->world_size = world;
    load_rounds_[open->id] = open;
  }
  LoadRound::Member& m = open->members[rank];
  m.reports = reports;
  if (!reports) {
    m.pieces.emplace();
    ++open->reported;
  }
  open->last_join = now;
  if (static_cast<int>(open->members.size()) == world) {
    open->closed = true;
    open->deadline = now + options_.load_verify_deadline;
    MaybeFinishLoadRoundLocked(open, answers);
  }
  *joined = open;
  return absl::OkStatus();
}

void Coordinator::LeaveLoadRound(const std::shared_ptr<LoadRound>& round,
                                 int rank) {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    auto live = load_rounds_.find(round->id);
    if (live == load_rounds_.end()) return;
    auto m = round->members.find(rank);
    if (m == round->members.end()) return;
    if (m->second.pieces.has_value()) {
      if (m->second.reports) return;  // it reported: no longer planning
      --round->reported;
    }
    round->members.erase(m);
    if (round->members.empty()) {
      load_rounds_.erase(live);
      return;
    }
    // Closed only because every rank had joined: open again for the rank
    // that left (it may plan again) while the grace lasts.
    if (round->closed &&
        absl::Now() <= round->last_join + options_.load_join_grace) {
      round->closed = false;
    }
    MaybeFinishLoadRoundLocked(round, &answers);
  }
  for (auto& a : answers) a();
}

void Coordinator::FailLoadRoundLocked(
    LoadRound& round, const absl::Status& status,
    std::vector<std::function<void()>>* answers) {
  round.failed = status;
  for (auto& [rank, m] : round.members) {
    if (!m.waiter) continue;
    answers->push_back([done = std::move(m.waiter), status] { done(status); });
    m.waiter = nullptr;
  }
}

void Coordinator::MaybeFinishLoadRoundLocked(
    const std::shared_ptr<LoadRound>& round,
    std::vector<std::function<void()>>* answers) {
  if (!round->closed ||
      round->reported != static_cast<int>(round->members.size())) {
    return;
  }
  load_rounds_.erase(round->id);
  if (!round->failed.ok()) return;  // its waiters were answered
  answers->push_back([this, round] {
    workers_->Schedule([this, round] { FinishLoadRound(round); });
  });
}

absl::StatusOr<v1::PlanLoadResponse> Coordinator::PlanLoadOfStep(
    const v1::PlanLoadRequest& request, int64_t step) {
  const std::string& job = request.job();
  // Identical requests (same rank layout) are answered from the cache.
  v1::PlanLoadRequest canonical = request;
  canonical.set_step(step);
  canonical.set_rank(0);
  canonical.set_world_size(0);
  canonical.set_verify_in_round(false);
  std::string cache_key;
  canonical.SerializeToString(&cache_key);
  cache_key =
      absl::StrCat(job, "\n", step, "\n", planner::StableHash128Hex(cache_key));
  if (auto hit = load_plans_.Lookup(cache_key)) {
    absl::MutexLock lock(&mu_);
    ++stats_.load_plans_from_cache;
    return *hit;
  }

  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<const LoadedCheckpoint> ckpt,
                         LoadCheckpoint(job, step));
  std::vector<planner::WantedChunk> wanted;
  wanted.reserve(request.wanted_size());
  for (const v1::WantedChunk& w : request.wanted()) {
    absl::StatusOr<planner::WantedChunk> c = convert::WantedFromProto(w);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrCat("rank ", request.rank(), " loading ",
                       SaveName(job, step), ": ", c.status().message()));
    }
    wanted.push_back(std::move(*c));
  }
  absl::StatusOr<std::vector<planner::ReadItem>> reads =
      ckpt->planner->Plan(wanted);
  if (!reads.ok()) {
    return absl::Status(
        reads.status().code(),
        absl::StrCat("rank ", request.rank(), " loading ", SaveName(job, step),
                     ": ", reads.status().message()));
  }
  v1::PlanLoadResponse resp;
  resp.set_step(step);
  resp.set_storage_uri(store_->uri());
  resp.set_step_prefix(storage::StepPrefix(job, step));
  resp.mutable_reads()->Reserve(static_cast<int>(reads->size()));
  for (const planner::ReadItem& r : *reads) {
    convert::ReadItemToProto(r, resp.add_reads());
  }
  for (const std::string& fqn : request.wanted_bytes()) {
    auto it = ckpt->bytes_index.find(fqn);
    if (it == ckpt->bytes_index.end()) {
      return absl::NotFoundError(absl::StrCat(
          "rank ", request.rank(), " loading ", SaveName(job, step),
          ": bytes entry '", fqn, "' is not in the checkpoint"));
    }
    *resp.add_bytes_entries() = ckpt->manifest.bytes_entries(it->second);
  }
  load_plans_.Insert(cache_key,
                     std::make_shared<const v1::PlanLoadResponse>(resp),
                     resp.ByteSizeLong() + cache_key.size());
  return resp;
}

// ---------------------------------------------------------------------------
// VerifyLoad

void Coordinator::VerifyLoad(const v1::VerifyLoadRequest& request,
                             Done<v1::VerifyLoadResponse> done) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  const int world = request.world_size();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);
  if (absl::Status s = CheckLoadRequestBounds(request, options_); !s.ok()) {
    return done(s);
  }
  const std::string who = absl::StrCat("rank ", rank, " verifying its load of ",
                                       SaveName(job, step));
  if (absl::Status s =
          ValidateRankOfWorld(rank, world, options_.max_world_size, who);
      !s.ok()) {
    return done(s);
  }
  if (request.load_round() == 0) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(who,
                     ": no load round (PlanLoad was called without "
                     "world_size); verify partly read chunks locally")));
  }
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> ckpt =
      LoadCheckpoint(job, step);
  if (!ckpt.ok()) {
    return done(absl::Status(ckpt.status().code(),
                             absl::StrCat(who, ": ", ckpt.status().message())));
  }
  const v1::Manifest& manifest = (*ckpt)->manifest;
  std::vector<LoadRound::Piece> pieces;
  pieces.reserve(request.pieces_size());
  for (int i = 0; i < request.pieces_size(); ++i) {
    const v1::ChunkPiece& p = request.pieces(i);
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": piece ", i, " of '", p.fqn(), "' at ",
          p.source().object_key(), "@", p.source().offset(), ": ", what));
    };
    auto at =
        (*ckpt)->chunk_at.find({p.source().object_key(), p.source().offset()});
    if (at == (*ckpt)->chunk_at.end()) {
      return done(bad("no stored chunk of the checkpoint is there"));
    }
    const auto [t, c] = at->second;
    const v1::StoredChunk& stored = manifest.tensors(t).chunks(c);
    if (manifest.tensors(t).entry().fqn() != p.fqn()) {
      return done(bad(absl::StrCat("the chunk there belongs to '",
                                   manifest.tensors(t).entry().fqn(), "'")));
    }
    if (p.source().length() != stored.location().length()) {
      return done(bad(absl::StrCat("length ", p.source().length(),
                                   " but the stored chunk has ",
                                   stored.location().length())));
    }
    absl::StatusOr<planner::ChunkBox> overlap =
        convert::BoxFromProto(p.overlap(), p.fqn());
    absl::StatusOr<planner::ChunkBox> box =
        convert::BoxFromProto(stored.box(), p.fqn());
    if (!overlap.ok() || !box.ok()) {
      return done(bad(!overlap.ok() ? overlap.status().message()
                                    : box.status().message()));
    }
    if (planner::IsEmpty(*overlap) || !planner::Contains(*box, *overlap)) {
      return done(bad(absl::StrCat("box ", planner::BoxToString(*overlap),
                                   " is empty or not inside the stored chunk ",
                                   planner::BoxToString(*box))));
    }
    pieces.push_back(
        {{t, c}, ChunkPieceReport{rank, i, std::move(*overlap), p.crc_term()}});
  }

  std::optional<absl::StatusOr<v1::VerifyLoadResponse>> reply;
  Done<v1::VerifyLoadResponse> superseded;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    reply = [&]() -> std::optional<absl::StatusOr<v1::VerifyLoadResponse>> {
      if (shutting_down_)
        return absl::UnavailableError("cairnd is shutting down");
      auto it = load_rounds_.find(request.load_round());
      if (it == load_rounds_.end()) {
        return absl::NotFoundError(absl::StrCat(
            who, ": load round ", request.load_round(),
            " is over (it expired, or cairnd restarted); verify partly read "
            "chunks locally"));
      }
      const std::shared_ptr<LoadRound> round = it->second;  // may be erased
      if (round->job != job || round->step != step ||
          round->world_size != world) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, " by ", world, " ranks: load round ", round->id,
                         " is the ", round->Name()));
      }
      auto m = round->members.find(rank);
      if (m == round->members.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": the rank did not plan in load round ", round->id));
      }
      if (!round->failed.ok()) return round->failed;
      LoadRound::Member& member = m->second;
      if (member.pieces.has_value()) {
        // A retry (the first call's connection dropped): the newest wins.
        superseded = std::move(member.waiter);
        member.waiter = nullptr;
      } else {
        ++round->reported;
      }
      ++stats_.load_reports;
      const bool has_pieces = !pieces.empty();
      member.pieces = std::move(pieces);
      round->ckpt = *ckpt;
      if (round->closed) {
        round->deadline = absl::Now() + options_.load_verify_deadline;
      }
      MaybeFinishLoadRoundLocked(round, &answers);
      // Nothing to verify for this rank: answered now, not parked.
      if (!has_pieces) return v1::VerifyLoadResponse();
      member.waiter = std::move(done);
      return std::nullopt;
    }();
  }
  if (superseded) {
    superseded(absl::AbortedError(
        absl::StrCat(who, ": superseded by a retry of the same call")));
  }
  for (auto& a : answers) a();
  if (reply.has_value()) done(std::move(*reply));
}

void Coordinator::FinishLoadRound(std::shared_ptr<LoadRound> round) {
  // Every member has reported: the round is out of load_rounds_ and owned
  // here.
  absl::flat_hash_map<std::pair<int, int>, std::vector<ChunkPieceReport>>
      by_chunk;
  for (auto& [rank, m] : round->members) {
    if (!m.pieces.has_value()) continue;
    for (LoadRound::Piece& p : *m.pieces) {
      by_chunk[p.chunk].push_back(std::move(p.report));
    }
  }
  std::map<int, v1::VerifyLoadResponse> answers;
  int64_t verified = 0, unverified = 0;
  for (auto& [id, reports] : by_chunk) {
    const v1::Manifest& manifest = round->ckpt->manifest;
    const v1::ManifestTensor& tensor = manifest.tensors(id.first);
    const v1::StoredChunk& stored = tensor.chunks(id.second);
    StoredChunkRef ref;
    ref.box = convert::BoxFromProto(stored.box(), "").value();  // validated
    ref.length = stored.location().length();
    ref.crc32c = stored.crc32c();
    const ChunkVerdict verdict = VerifyChunk(ref, reports);
    std::set<int> ranks;
    for (const ChunkPieceReport& r : reports) {
      ranks.insert(r.rank);
      if (verdict != ChunkVerdict::kVerified) {
        answers[r.rank].add_verify_locally(r.index);
      }
    }
    if (verdict == ChunkVerdict::kVerified) {
      ++verified;
      for (int r : ranks) {
        answers[r].set_chunks_verified(answers[r].chunks_verified() + 1);
      }
      continue;
    }
    ++unverified;
    if (verdict != ChunkVerdict::kNotCovered) {
      CAIRN_LOG(warn,
                "{}: stored chunk {} of '{}' at {}@{}: {} (read by ranks {}); "
                "they re-read it whole",
                round->Name(), planner::BoxToString(ref.box),
                tensor.entry().fqn(), stored.location().object_key(),
                stored.location().offset(), ChunkVerdictName(verdict),
                absl::StrJoin(ranks, ", "));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.load_chunks_verified += verified;
    stats_.load_chunks_unverified += unverified;
  }
  for (auto& [rank, m] : round->members) {
    if (m.waiter) m.waiter(std::move(answers[rank]));
  }
}

void Coordinator::AdvanceLoadRoundsLocked(
    absl::Time now, std::vector<std::function<void()>>* answers) {
  const bool shutdown = now == absl::InfiniteFuture();
  std::vector<std::shared_ptr<LoadRound>> rounds;
  for (auto& [id, round] : load_rounds_) rounds.push_back(round);
  for (const std::shared_ptr<LoadRound>& round : rounds) {
    if (!round->closed &&
        (shutdown || now > round->last_join + options_.load_join_grace)) {
      round->closed = true;
      round->deadline = now + options_.load_verify_deadline;
    }
    if (!round->closed) continue;
    if (!shutdown) MaybeFinishLoadRoundLocked(round, answers);
    if (!load_rounds_.contains(round->id)) continue;
    if (!shutdown && now <= round->deadline) continue;
    load_rounds_.erase(round->id);
    std::vector<int> missing;
    for (const auto& [rank, m] : round->members) {
      if (!m.pieces.has_value()) missing.push_back(rank);
    }
    const absl::Status status =
        shutdown ? absl::UnavailableError("cairnd is shutting down")
                 : absl::DeadlineExceededError(absl::StrCat(
                       round->Name(), ": ranks ",
                       RankList(missing, round->world_size),
                       " planned their reads but never called VerifyLoad "
                       "within ",
                       absl::FormatDuration(options_.load_verify_deadline),
                       " of the previous report; verify partly read chunks "
                       "locally"));
    for (auto& [rank, m] : round->members) {
      if (!m.waiter) continue;
      answers->push_back(
          [done = std::move(m.waiter), status] { done(status); });
      m.waiter = nullptr;
    }
  }
}

absl::StatusOr<v1::ListCheckpointsResponse> Coordinator::ListCheckpoints(
    const v1::ListCheckpointsRequest& request) {
  if (!request.job().empty()) {
    CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  }
  CAIRN_ASSIGN_OR_RETURN(
      std::vector<v1::CheckpointRecord> records,
      catalog_->ListCheckpoints(request.job(), request.include_uncommitted()));
  v1::ListCheckpointsResponse resp;
  for (v1::CheckpointRecord& r : records)
    *resp.add_checkpoints() = std::move(r);
  return resp;
}

absl::StatusOr<v1::GetCheckpointResponse> Coordinator::GetCheckpoint(
    const v1::GetCheckpointRequest& request) {
  CAIRN_RETURN_IF_ERROR(ValidateJobStep(request.job(), request.step()));
  absl::StatusOr<v1::CheckpointRecord> rec =
      catalog_->GetCheckpoint(request.job(), request.step());
  if (!rec.ok()) {
    if (absl::IsNotFound(rec.status())) {
      return absl::NotFoundError(absl::StrCat(
          "no checkpoint ", SaveName(request.job(), request.step())));
    }
    return rec.status();
  }
  v1::GetCheckpointResponse resp;
  *resp.mutable_checkpoint() = *rec;
  if (rec->state() == v1::CHECKPOINT_STATE_COMMITTED) {
    CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<const LoadedCheckpoint> ckpt,
                           LoadCheckpoint(request.job(), request.step()));
    *resp.mutable_manifest() = ckpt->manifest;
  }
  return resp;
}

void Coordinator::ForgetCheckpoint(const std::string& job, int64_t step) {
  manifests_.Erase(SaveKey{job, step});
  const std::string prefix = absl::StrCat(job, "\n", step, "\n");
  load_plans_.EraseIf([&](const std::string& key) {
    return key.compare(0, prefix.size(), prefix) == 0;
  });
}

absl::Status Coordinator::DeleteStepRecord(v1::CheckpointRecord record) {
  const std::string& job = record.job();
  const int64_t step = record.step();
  // The record first: from here on the step is never listed, loaded or
  // `latest`, and a crash at any later point leaves a DELETING record that
  // recovery finishes. Then MANIFEST (the checkpoint stops being loadable
  // on storage too), data, and the record last.
  if (record.state() != v1::CHECKPOINT_STATE_DELETING) {
    record.set_state(v1::CHECKPOINT_STATE_DELETING);
    CAIRN_RETURN_IF_ERROR(catalog_->PutCheckpoint(record));
  }
  ForgetCheckpoint(job, step);
  CAIRN_RETURN_IF_ERROR(storage::DeleteStep(*store_, job, step));
  absl::Status s = catalog_->DeleteCheckpoint(job, step);
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  return absl::OkStatus();
}

void Coordinator::SweepCommittedStep(const v1::Manifest& manifest) {
  absl::StatusOr<int> removed = storage::DeleteUnreferenced(*store_, manifest);
  if (!removed.ok()) {
    CAIRN_LOG(warn, "cleaning {}: {}",
              SaveName(manifest.job(), manifest.step()),
              removed.status().ToString());
  } else if (*removed > 0) {
    CAIRN_LOG(info, "{}: removed {} objects of other attempts",
              SaveName(manifest.job(), manifest.step()), *removed);
  }
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
    if (it != sessions_.end() && it->second->phase != Phase::kAborted) {
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
  absl::StatusOr<v1::CheckpointRecord> rec = catalog_->GetCheckpoint(job, step);
  if (!rec.ok()) {
    if (absl::IsNotFound(rec.status())) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint ", SaveName(job, step)));
    }
    return rec.status();
  }
  CAIRN_RETURN_IF_ERROR(DeleteStepRecord(*rec));
  CAIRN_LOG(info, "deleted {}", SaveName(job, step));
  return absl::OkStatus();
}

absl::StatusOr<v1::GarbageCollectResponse> Coordinator::ApplyRetention(
    const std::string& job, int keep_last, bool dry_run) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         catalog_->ListCheckpoints(job, false));
  std::vector<v1::CheckpointRecord> committed;
  for (auto& r : records) {
    if (r.state() == v1::CHECKPOINT_STATE_COMMITTED) committed.push_back(r);
  }
  std::sort(committed.begin(), committed.end(),
            [](const auto& a, const auto& b) { return a.step() > b.step(); });
  v1::GarbageCollectResponse resp;
  for (size_t i = static_cast<size_t>(keep_last); i < committed.size(); ++i) {
    const v1::CheckpointRecord& r = committed[i];
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
    CAIRN_LOG(info, "retention for job '{}' (keep {}): deleted {} checkpoints",
              job, keep_last, resp.deleted_steps_size());
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
  CAIRN_ASSIGN_OR_RETURN(
      v1::GarbageCollectResponse resp,
      ApplyRetention(request.job(), request.keep_last(), request.dry_run()));
  if (request.dry_run()) return resp;
  // What is kept is cleaned: temp files of ranks that died mid-write and
  // objects of other attempts can sit in a committed step (a zombie rank of
  // an aborted attempt may write after its cleanup). No writer is live in a
  // committed step; in-flight saves of other steps are not touched.
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> kept,
                         catalog_->ListCheckpoints(request.job(), false));
  for (const v1::CheckpointRecord& r : kept) {
    absl::StatusOr<v1::Manifest> m =
        storage::ReadManifest(*store_, r.job(), r.step());
    if (!m.ok()) {
      CAIRN_LOG(warn, "gc of job '{}': {}", r.job(), m.status().ToString());
      continue;
    }
    SweepCommittedStep(*m);
  }
  return resp;
}

}  // namespace cairn::coordinator
