// The coordinator: the library behind cairnd. Transport-agnostic: it takes and
// returns cairn.v1 messages; coordinator_service.h adapts it to gRPC.
//
// Save protocol (direct mode):
//   1. Every rank calls BeginSave(job, step, rank, world_size, plan). Calls
//      park (no thread waits) until all world_size ranks have arrived; then
//      the global plan is built, or taken from the plan cache when every
//      rank's fingerprint is unchanged, and each rank is answered with its
//      own part. A rank missing at the begin deadline aborts the save with
//      DEADLINE_EXCEEDED naming the missing ranks.
//   2. Ranks write their items to storage under "<job>/<step>/<attempt>/..."
//      (an attempt directory per save attempt, so a zombie rank of an aborted
//      attempt can never overwrite bytes of a later, committed one).
//   3. Every rank calls CommitSave with its crc32c results. The last one
//      triggers the commit: object sizes checked, MANIFEST published
//      atomically (durable), catalog marked COMMITTED, retention applied —
//      and only then are the ranks answered. A rank missing at the commit
//      deadline, or an AbortSave, aborts: ABORTED/DEADLINE_EXCEEDED to every
//      waiting rank, catalog ABORTED, the attempt's objects deleted.
// Every call is idempotent: a retried BeginSave/CommitSave gets the same
// answer as the first. Ranks identify their process (`incarnation`): a
// BeginSave from a new process for a rank already in a save (the rank
// restarted), or from a rank that already reported its writes (it may have
// rewritten them), aborts that save and starts a fresh attempt, so a commit
// never publishes an object whose bytes differ from the crc32c reported for
// them. Results or aborts from a process not in the save are refused. A
// rank whose process left the save before it was planned (its BeginSave
// call was cancelled: the process died) is not in it any more: a new
// process of that rank joins the save, and the world is not complete
// without one.
//
// Deletion (DeleteCheckpoint, GarbageCollect, retention) marks the catalog
// record DELETING before touching storage, then removes the MANIFEST, then
// the data, then the record; a step being deleted is never listed, loaded or
// `latest`, and cannot be saved until the record is gone.
//
// Recovery (Create): the storage's lease is taken (one cairnd per storage,
// storage/lease.h), then the catalog is reconciled with storage, which is
// the truth — see recovery.h for every case.
//
// Load protocol: PlanLoad resolves a step, loads its manifest through a
// cache, and answers read items from the planner's overlap index; identical
// requests are answered from a plan cache. A rank that names its world size
// joins a load round of the job: the membership stays open while its ranks
// read, until all world_size ranks have joined or every member has reported
// and load_join_grace has passed since the last join. `latest` is resolved
// once per round: a rank asking for it gets the step of the newest live round
// of the job it has not taken part in, else the newest COMMITTED step (and
// opens a round), so a commit landing between two ranks' PlanLoads never
// hands them different steps. Ranks of one round that disagree on world_size
// get INVALID_ARGUMENT naming both sizes, at once. After reading, every member
// calls VerifyLoad with the crc32c terms of the stored chunks it read only in
// part; it parks until the membership is closed and every member has
// reported (a report without pieces is answered at once), then each chunk the
// ranks read completely between them is checked against the manifest
// (load_verifier.h) and every rank is told which of its pieces it must still
// verify by reading the chunk whole. A rank loading alone, or after the
// others finished, therefore waits at most load_join_grace after reading,
// never for ranks that are not loading.
//
// Parts (each with its own tests beside it):
//   save_session.h    the state machine of one save attempt (pure)
//   load_rounds.h     load rounds: membership, `latest`, VerifyLoad combining
//   retention.h       which steps retention deletes; the crash-safe delete
//   recovery.h        catalog <-> storage reconciliation at start
//   request_bounds.h  validation and bounds of every request
// This class owns the shared state (catalog, caches, sessions, the mutex)
// and wires the parts: coordinator_save.cc (BeginSave/CommitSave/AbortSave
// steps), coordinator_load.cc (PlanLoad/VerifyLoad), coordinator_retention.cc
// (DeleteCheckpoint/GarbageCollect/retention after a commit).
//
// Thread-safe: every method may be called concurrently. No lock is held
// across storage or RocksDB I/O, plan building, or a wait for other ranks.
// Lock order: mu_ is never held while calling into load_rounds_ (which has
// its own mutex).
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.pb.h"
#include "common/lru_cache.h"
#include "common/metrics.h"
#include "common/thread_pool.h"
#include "planner/load_plan.h"
#include "planner/packed_plan.h"
#include "planner/plan_cache.h"
#include "planner/save_plan.h"
#include "server/coordinator/agent_registry.h"
#include "server/coordinator/coordinator_options.h"
#include "server/coordinator/load_rounds.h"
#include "server/coordinator/memory_holdings.h"
#include "server/coordinator/tier_policy.h"
#include "storage/catalog/catalog.h"
#include "storage/lease.h"
#include "storage/shard_store.h"

namespace cairn::coordinator {

class SaveSession;

// A rank's load plan as PlanLoadResponse wire bytes
// (convert::PlanLoadAnswerWriter): every field but load_round. Immutable, so
// the load plan cache and the answers sent share one copy.
struct EncodedLoadPlan {
  std::string bytes;
  int reads = 0;               // read items
  uint64_t bytes_to_read = 0;  // what the answer tells its rank to read
};

// What PlanLoad answers: the plan and the load round joined. Its wire bytes
// are `plan->bytes` followed by the load_round field (the last one), the
// bytes protobuf writes for the same PlanLoadResponse.
struct PlanLoadAnswer {
  std::shared_ptr<const EncodedLoadPlan> plan;
  uint64_t load_round = 0;

  std::string Serialize() const;
  absl::StatusOr<v1::PlanLoadResponse> Decode() const;
};

class Coordinator {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  // Whether the caller of a call not yet answered has gone: its call was
  // cancelled (the process died and its connection closed, or it gave up
  // waiting). Called only until the call's `done` runs. Null: never known.
  using CallerGone = std::function<bool()>;

  // Opens storage and the catalog, rebuilds the catalog from storage when it
  // is empty, and cleans what a crash left behind.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorOptions& options);

  // Aborts every in-flight save with UNAVAILABLE and stops background work.
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // `done` is called exactly once, possibly on another thread, possibly
  // before BeginSave/CommitSave return. A rank parked in BeginSave whose
  // caller has gone (`gone`) no longer counts as arrived once another rank
  // would complete the save or another process of the rank arrives: the
  // save waits for the rank again instead of planning with a process that is
  // gone, and a restarted process of the rank joins it (save_session.h).
  void BeginSave(const v1::BeginSaveRequest& request,
                 Done<v1::BeginSaveResponse> done, CallerGone gone = nullptr);
  void CommitSave(const v1::CommitSaveRequest& request,
                  Done<v1::CommitSaveResponse> done);
  absl::Status AbortSave(const v1::AbortSaveRequest& request);

  // The answer as cairnd sends it (wire bytes, see PlanLoadAnswer).
  absl::StatusOr<PlanLoadAnswer> PlanLoadEncoded(
      const v1::PlanLoadRequest& request);
  // PlanLoadEncoded's answer as a message (tests, in-process callers).
  absl::StatusOr<v1::PlanLoadResponse> PlanLoad(
      const v1::PlanLoadRequest& request);
  // Reads the manifest (blocking I/O on a cache miss), then parks `done`
  // until every rank of the load has reported.
  void VerifyLoad(const v1::VerifyLoadRequest& request,
                  Done<v1::VerifyLoadResponse> done);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request);
  // The record of a step (with its manifest when COMMITTED), or with
  // `latest` that of the newest COMMITTED step, resolved here (NOT_FOUND
  // naming the job when it has none).
  absl::StatusOr<v1::GetCheckpointResponse> GetCheckpoint(
      const v1::GetCheckpointRequest& request);
  absl::Status DeleteCheckpoint(const v1::DeleteCheckpointRequest& request);
  absl::StatusOr<v1::GarbageCollectResponse> GarbageCollect(
      const v1::GarbageCollectRequest& request);

  // Multi-tier saves (coordinator_memory.cc): a job's policy, validated
  // against the agents reporting now (tier_policy.h); an agent's report of
  // what it holds, answered with what it should drop.
  absl::StatusOr<v1::SetJobPolicyResponse> SetJobPolicy(
      const v1::SetJobPolicyRequest& request);
  absl::StatusOr<v1::GetJobPolicyResponse> GetJobPolicy(
      const v1::GetJobPolicyRequest& request);
  absl::StatusOr<v1::ReportHoldingsResponse> ReportHoldings(
      const v1::ReportHoldingsRequest& request);
  // Writes a memory checkpoint to storage: the agents holding its ranks'
  // shards write them (PersistOrders in their report answers), then its
  // MANIFEST is published there and it becomes persistent. `done` is
  // called once ordered, or with `wait` once persistent (or at the
  // request's timeout, DEADLINE_EXCEEDED: it goes on).
  void PersistCheckpoint(const v1::PersistCheckpointRequest& request,
                         Done<v1::PersistCheckpointResponse> done);

  // What the agents hold in memory, from their reports.
  MemoryHoldings& holdings() { return holdings_; }

  // Aborts in-flight saves (UNAVAILABLE: "cairnd is shutting down") and
  // answers their waiting ranks. Idempotent; the destructor calls it.
  void Shutdown();

  // Node ids and peer addresses of agents started with --node-id auto.
  AgentRegistry& agents() { return *agents_; }

  // Runs blocking work off the caller's thread (used by the gRPC adapter).
  ThreadPool& workers() { return *workers_; }

  const CoordinatorOptions& options() const { return options_; }
  storage::ShardStore& store() { return *store_; }
  // The storage lease held (CoordinatorOptions::storage_lease_ttl).
  storage::StorageLease& storage_lease() { return *lease_; }
  // Records where cairnd serves in the storage lease (the port is known
  // once bound), so a second cairnd refused names it.
  void SetServingAddress(std::string address);

  // Parked BeginSave calls whose caller has gone (CallerGone), which the
  // save has not let go of yet.
  int BeginSaveCallsGoneForTest() const;

  // Statistics for tests and metrics.
  struct Stats {
    int64_t plans_built = 0;
    int64_t plans_from_cache = 0;
    int64_t load_plans_from_cache = 0;
    int64_t load_requests_short = 0;  // tensors_digest requests planned
    int64_t load_wanted_resends = 0;  // answered resend_wanted
    int64_t manifests_loaded = 0;     // load indexes built
    int64_t loads_prepared = 0;       // of those, after a commit
    int64_t commits = 0;
    int64_t aborts = 0;
    int64_t load_chunks_verified = 0;    // by combining ranks' pieces
    int64_t load_chunks_unverified = 0;  // sent back to verify locally
    int64_t saves_in_progress = 0;       // sessions held now
    int64_t aborts_remembered = 0;       // tombstones held now
    int64_t load_reports = 0;            // VerifyLoad reports accepted
  };
  Stats stats() const;

  // This coordinator's Prometheus metrics (cairnd serves them on
  // --metrics-listen; docs/operations.md "Metrics" lists them). Gauges of
  // the catalog (committed checkpoints and bytes per job, entries) are
  // computed at scrape time from one catalog scan.
  metrics::Registry& metrics() { return metrics_; }

 private:
  struct LoadedCheckpoint;
  using SaveKey = std::pair<std::string, int64_t>;

  Coordinator(const CoordinatorOptions& options,
              std::unique_ptr<storage::ShardStore> store,
              std::unique_ptr<storage::Catalog> catalog);

  void ReaperLoop();

  // BeginSave's steps. The rank's plan: decoded and fingerprinted (a local
  // plan), or only its fingerprint (resolved from known_plans_ later).
  struct RankPlan {
    std::shared_ptr<const planner::PackedLocalPlan> plan;
    std::string fingerprint;
  };
  absl::StatusOr<RankPlan> DecodeRankPlan(
      const v1::BeginSaveRequest& request) const;
  // ALREADY_EXISTS for a committed step, FAILED_PRECONDITION for one being
  // deleted (catalog I/O: no lock).
  absl::Status CheckStepIsSavable(const std::string& job, int64_t step);
  // The rank joins a session: nullopt when `done` was parked (`*to_plan` set
  // when it completed the arrivals), else the answer to give now.
  std::optional<absl::StatusOr<v1::BeginSaveResponse>> JoinSaveLocked(
      const v1::BeginSaveRequest& request, RankPlan mine,
      Done<v1::BeginSaveResponse>& done, CallerGone gone,
      std::shared_ptr<SaveSession>* to_plan,
      std::vector<std::function<void()>>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before the rank joins a gathering save: ranks whose processes have gone
  // leave it (SaveSession::WithdrawDeparted) when the rank would complete
  // the world, or the rank's own process in it when this is another one.
  void ForgetDepartedRanksLocked(const v1::BeginSaveRequest& request,
                                 std::vector<std::function<void()>>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills a fingerprint-only plan from known_plans_ (left null when unknown:
  // the global plan may still be cached, see AskForMissingPlans), or
  // remembers a sent one.
  void ResolveKnownPlanLocked(const std::string& job, int rank, RankPlan* mine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts the attempt the rank is in when its process restarted or it saves
  // again after reporting; UNAVAILABLE while that attempt commits.
  absl::Status RestartIfRankReturnedLocked(
      const v1::BeginSaveRequest& request,
      std::vector<std::function<void()>>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live session of (job, step), or a new attempt: refused while a
  // world-size tombstone stands for this rank, or beyond the session limits.
  absl::StatusOr<std::shared_ptr<SaveSession>> SessionToJoinLocked(
      const std::string& job, int64_t step, int rank, int world)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds (or fetches) the global plan for a session whose ranks have all
  // arrived, then answers every waiting BeginSave.
  void PlanSession(const std::shared_ptr<SaveSession>& session);
  // When the global plan is not cached and some ranks arrived with a
  // fingerprint whose plan cairnd no longer holds: sends the session back
  // to gathering and answers those ranks resend_plan (true). False when
  // every local plan is there.
  bool AskForMissingPlans(const std::shared_ptr<SaveSession>& session);
  // Publishes the manifest of a session whose ranks have all committed.
  void CommitSession(std::shared_ptr<SaveSession> session);
  // Marks `session` aborted with `status`, answers its waiters and deletes
  // its attempt's objects (on a worker thread).
  void AbortSession(const std::shared_ptr<SaveSession>& session,
                    const absl::Status& status);
  void AbortSessionLocked(const std::shared_ptr<SaveSession>& session,
                          const absl::Status& status,
                          std::vector<std::function<void()>>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // GetCheckpoint once the step is known; the manifest (of a committed
  // step) is read from storage when `with_manifest`.
  absl::StatusOr<v1::GetCheckpointResponse> GetCheckpointOfStep(
      const std::string& job, int64_t step, bool with_manifest);
  // PlanLoad once the step is known.
  absl::StatusOr<std::shared_ptr<const EncodedLoadPlan>> PlanLoadOfStep(
      const v1::PlanLoadRequest& request, int64_t step);

  // The manifest of a committed step with its load planner, from manifests_
  // or read and indexed once: callers asking while it is being built wait
  // for that build (the ranks of a load round all ask at once).
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> LoadCheckpoint(
      const std::string& job, int64_t step);
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> BuildLoadedCheckpoint(
      const std::string& job, int64_t step);
  // The newest committed checkpoint of `job` that can be restored now: a
  // persistent one, or a memory one every rank of which has a live copy
  // (once the agents' holdings are known after a restart: Settle).
  // NOT_FOUND naming the job when there is none.
  absl::StatusOr<v1::CheckpointRecord> NewestRestorable(const std::string& job);
  // Waits (up to the holdings' lease after start) until every node named by
  // a memory checkpoint of `job` has reported since cairnd started.
  void SettleHoldings(const std::vector<v1::CheckpointRecord>& records);
  // Fills a record's live fields (live_copies, live_holder_nodes,
  // restorable, unrestorable_reason) from the holdings at `now`.
  void AnnotateRecord(v1::CheckpointRecord* record, absl::Time now) const;
  // The store that holds the MANIFEST of `record`'s checkpoint: storage, or
  // cairnd's own memory-manifest store for a memory checkpoint.
  storage::ShardStore& ManifestStore(const v1::CheckpointRecord& record) const;
  absl::StatusOr<storage::ShardStore*> ManifestStoreOf(const std::string& job,
                                                       int64_t step);
  // The tier of a session whose ranks have all arrived (ChooseTier with the
  // job's policy and the live agents).
  absl::StatusOr<TierChoice> ChooseSessionTier(const SaveSession& session);
  // Once a second (from the reaper): drives the promotions in progress,
  // starts one for a memory checkpoint whose live copies fell below its
  // replicas + 1, and orders copies made on live nodes for its ranks that
  // have too few (a replacement node gets its copies back).
  void TendMemoryCheckpoints();
  // Starts (or joins) the promotion of `record` to storage; `done` (may be
  // null) is answered when it ends.
  void StartPromotion(const v1::CheckpointRecord& record,
                      Done<v1::PersistCheckpointResponse> done,
                      absl::Time deadline, const std::string& why);
  // Every rank's shards are on storage: publishes the MANIFEST there and
  // records the checkpoint persistent.
  absl::StatusOr<v1::CheckpointRecord> FinishPromotion(const std::string& job,
                                                       int64_t step);
  // Retention after a commit of `tier`: the job's policy (keep_memory,
  // keep_persistent), else --keep-last for persistent checkpoints.
  void RetainAfterCommit(const std::string& job, v1::Tier tier);

  // CoordinatorOptions::prepare_loads, for the step just committed (on a
  // worker; a failure is logged: the first PlanLoad builds it then).
  void PrepareLoad(const std::string& job, int64_t step);
  // Deletes all but the newest `keep_last` committed checkpoints of `job`
  // in `tier` (memory and persistent ones are retained apart).
  absl::StatusOr<v1::GarbageCollectResponse> ApplyRetention(
      const std::string& job, int keep_last, bool dry_run, v1::Tier tier);
  // Deletes a step whose (job, step) is in deleting_: record DELETING,
  // MANIFEST, data, record (see the top of this file).
  absl::Status DeleteStepRecord(v1::CheckpointRecord record);
  void ForgetCheckpoint(const std::string& job, int64_t step);
  // OK while the storage lease allows changing the storage; else its
  // status, prefixed with `what` (the save or checkpoint concerned).
  absl::Status CheckStorageLease(absl::string_view what) const;

  // Registers every metric (coordinator_metrics.cc).
  void RegisterMetrics();
  // Counts bytes a PlanLoad answer tells its rank to read.
  void RecordLoadPlanned(const EncodedLoadPlan& plan);

  // Declared first: destroyed last (scrape callbacks read the members).
  metrics::Registry metrics_;
  struct Metrics {
    metrics::Histogram* save_seconds = nullptr;
    metrics::Histogram* commit_seconds = nullptr;
    metrics::Histogram* load_plan_seconds = nullptr;
    metrics::Counter* bytes_saved = nullptr;
    metrics::Counter* bytes_loaded = nullptr;
    metrics::Counter* saves_committed = nullptr;
    metrics::Family<metrics::Counter>* save_failures = nullptr;  // by code
    metrics::Counter* save_plan_hits = nullptr;
    metrics::Counter* save_plan_misses = nullptr;
    metrics::Counter* load_plan_hits = nullptr;
    metrics::Counter* load_plan_misses = nullptr;
    metrics::Counter* load_indexes_built = nullptr;
    metrics::Counter* load_indexes_prepared = nullptr;
  };
  Metrics m_;  // set by RegisterMetrics, constant after construction

  // Constant after construction.
  const CoordinatorOptions options_;
  const std::unique_ptr<storage::ShardStore> store_;
  // Its own handle on the storage (renewals do not queue behind the
  // coordinator's I/O), and the lease; released after the workers drained.
  std::unique_ptr<storage::ShardStore> lease_store_;
  std::unique_ptr<storage::StorageLease> lease_;
  const std::unique_ptr<storage::Catalog> catalog_;
  // The MANIFESTs of memory checkpoints (CoordinatorOptions::
  // memory_manifest_path); set by Create.
  std::unique_ptr<storage::ShardStore> memory_store_;
  MemoryHoldings holdings_;
  // Promotions to storage in progress, the copies ordered, and the orders
  // waiting for their nodes' next reports (coordinator_memory.cc).
  struct Promotion;
  using RankKey = std::tuple<std::string, int64_t, int>;  // job, step, rank
  absl::Mutex tend_mu_;
  std::map<SaveKey, std::shared_ptr<Promotion>> promotions_
      ABSL_GUARDED_BY(tend_mu_);
  std::map<RankKey, std::pair<int, absl::Time>> copies_ordered_
      ABSL_GUARDED_BY(tend_mu_);
  std::map<int, v1::ReportHoldingsResponse> orders_ ABSL_GUARDED_BY(tend_mu_);
  const std::string storage_settings_;     // part of every plan cache key
  std::unique_ptr<AgentRegistry> agents_;  // set by Create

  planner::PlanCache plan_cache_;  // thread-safe
  LruCache<SaveKey, LoadedCheckpoint> manifests_;
  // LoadCheckpoint builds in progress, each waited for by later askers.
  struct LoadingCheckpoint;
  absl::Mutex loading_mu_;
  absl::flat_hash_map<SaveKey, std::shared_ptr<LoadingCheckpoint>> loading_
      ABSL_GUARDED_BY(loading_mu_);
  LruCache<std::string, EncodedLoadPlan> load_plans_;
  // Keys of load_plans_ asked for once: an answer is cached on the second ask.
  LruCache<std::string, bool> load_layouts_seen_;
  LoadRounds load_rounds_;  // thread-safe (its own mutex, never held with mu_)

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  // Saves in progress; an aborted one leaves at once (to tombstones_).
  absl::flat_hash_map<SaveKey, std::shared_ptr<SaveSession>> sessions_
      ABSL_GUARDED_BY(mu_);
  // What late calls of a recently aborted save are told: its abort status,
  // for the newest kMaxTombstones aborts (older ones are answered from the
  // catalog's ABORTED record).
  struct Tombstone {
    absl::Status status;
    uint64_t seq = 0;
    // A save its ranks' world sizes broke: until its begin deadline, a rank
    // that had not arrived (not in `arrived`, sorted) gets `status` rather
    // than a new attempt waiting for ranks that were already answered.
    absl::Time refuse_until = absl::InfinitePast();
    std::vector<int> arrived;
  };
  absl::flat_hash_map<SaveKey, Tombstone> tombstones_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<SaveKey, uint64_t>> tombstone_order_
      ABSL_GUARDED_BY(mu_);
  uint64_t tombstone_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // The last local plan each (job, rank) sent, for fingerprint-only saves.
  struct KnownPlan {
    std::string fingerprint;
    std::shared_ptr<const planner::PackedLocalPlan> plan;
  };
  // Bounded by bytes (known_plan_cache_bytes): an evicted plan is asked again
  // (resend_plan), so this is only a cache.
  LruCache<std::pair<std::string, int>, KnownPlan> known_plans_;
  // The fqns, dtypes and shapes of local plans, once for all the ranks that
  // name the same ones (thread-safe).
  mutable planner::EntryInterner interner_;
  // Plan version of each job (informational): bounded by kMaxPlanVersionJobs,
  // then the versions of jobs without a save in progress are forgotten.
  absl::flat_hash_map<std::string, uint64_t> plan_versions_
      ABSL_GUARDED_BY(mu_);
  // Steps being deleted by this process: no save may start on them.
  absl::flat_hash_set<SaveKey> deleting_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // shutting_down_, read without mu_ by load index builds (which stop).
  std::atomic<bool> stopping_{false};

  std::unique_ptr<ThreadPool> workers_;
  std::thread reaper_;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_H_
