// The state machine of one save attempt: (job, step) saved by world_size
// ranks. It holds what the ranks sent and their parked calls, and decides
// the answer to each call; it does no I/O, reads no clock (times are
// arguments) and takes no lock, so every transition is tested without
// storage, threads or gRPC (save_session_test.cc).
//
//   kGathering --every rank arrived--> kPlanning --Planned()--> kWriting
//   kPlanning --NeedPlansOf(ranks)--> kGathering (those ranks must resend)
//   kWriting --every rank reported--> kCommitting --(committed: dropped)
//   any phase but kCommitting --Abort()--> kAborted
//
// Gathering costs what the ranks that arrived sent, never what the world
// size the first rank claims would need; once every rank is in, the arrivals
// are laid out densely by rank.
//
// A rank whose every parked BeginSave call has gone (its caller cancelled
// it: the process died or gave up waiting) can leave the gathering
// (WithdrawDeparted): nothing was planned for it, so nothing of its process
// can be in the attempt, and the rank is missing again, as if it had never
// arrived. A restarted job's new process for that rank then joins the
// attempt instead of restarting it, and the other ranks never get a plan
// made with a process that is gone.
//
// Not thread-safe: the coordinator owns its sessions under its mutex and
// calls every method with that mutex held, except the accessors of what is
// immutable once the phase is kPlanning (plans(), fingerprints(), and plan()
// once kWriting), which its planning and commit steps read without it.
#ifndef CAIRN_SERVER_COORDINATOR_SAVE_SESSION_H_
#define CAIRN_SERVER_COORDINATOR_SAVE_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.pb.h"
#include "google/protobuf/repeated_field.h"
#include "planner/packed_plan.h"
#include "planner/save_plan.h"
#include "server/coordinator/tier_policy.h"

namespace cairn::coordinator {

class SaveSession {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  using BeginWaiter = std::pair<int, Done<v1::BeginSaveResponse>>;
  // Whether the caller of a parked call has gone (the call was cancelled:
  // its process died, or gave up waiting). May be called until the call is
  // answered, never after. Null: not known (never counted as gone).
  using CallerGone = std::function<bool()>;

  enum class Phase { kGathering, kPlanning, kWriting, kCommitting, kAborted };

  // A fresh attempt; ranks must all arrive by `now + begin_deadline`.
  // `attempt` names the directory of its objects under "<job>/<step>/";
  // `storage_uri` is told to the ranks.
  SaveSession(std::string job, int64_t step, int world_size,
              std::string attempt, std::string storage_uri, absl::Time now,
              absl::Duration begin_deadline);

  SaveSession(const SaveSession&) = delete;
  SaveSession& operator=(const SaveSession&) = delete;

  // --- BeginSave.

  // What this attempt knows of `rank`: whether it arrived, the incarnation
  // of its process (0: not sent), and whether it reported its writes. While
  // gathering: `waiting` when a BeginSave call of its process is parked and
  // known not to have gone; `departed` (with its process's incarnation) when
  // it left (WithdrawDeparted) and has not arrived again.
  struct RankState {
    bool in_save = false;
    uint64_t incarnation = 0;
    bool reported = false;
    bool waiting = false;
    bool departed = false;
  };
  RankState Rank(int rank) const;

  // INVALID_ARGUMENT naming `rank`, `world`, the ranks that arrived and the
  // session's world size, for a rank whose world size differs.
  absl::Status WorldSizeMismatch(int rank, int world) const;

  // A rank's BeginSave at `now`. kParked: `done` was taken and is answered
  // when the plan is built; kAllArrived: the same, and it was the last rank
  // (the phase is kPlanning: build the plan); kAnswered: `*answer` holds the
  // answer now (a retry after the plan was built, or an error: a different
  // plan from a rank that arrived, a rank arriving after the plan was built,
  // or more than `max_plan_items` items in the save). `held_plan_id`: the
  // plan id whose rank plan the rank's process holds
  // (BeginSaveRequest.held_plan_id). `gone` (may be null) is kept with a
  // parked `done`.
  enum class Arrival { kParked, kAllArrived, kAnswered };
  Arrival Arrive(int rank, std::shared_ptr<const planner::PackedLocalPlan> plan,
                 std::string fingerprint, std::string held_plan_id,
                 uint64_t incarnation, int64_t max_plan_items, absl::Time now,
                 Done<v1::BeginSaveResponse>& done, CallerGone gone,
                 absl::StatusOr<v1::BeginSaveResponse>* answer);

  // kGathering: `rank` leaves the attempt when every parked BeginSave call
  // of its process has gone (see the top of this file); a rank with a call
  // whose caller is not known to have gone stays. Returns the calls of the
  // rank that left, to be answered (CANCELLED: nobody reads it) off the
  // lock; empty when it stays. Its process is remembered as departed
  // (Rank()) until the rank arrives again.
  std::vector<BeginWaiter> WithdrawIfDeparted(int rank);
  // The same for every rank that arrived. Once any rank has left, the begin
  // deadline counts from the earliest arrival still there (from the next
  // one when none is): the ranks that are waiting get the whole begin
  // deadline, never what a process that is gone had left of it.
  std::vector<BeginWaiter> WithdrawDeparted();
  // Parked BeginSave calls whose caller has gone (tests).
  int CallsGone() const;

  // Planning needs the local plans of `ranks`, which arrived with a
  // fingerprint only (plan() null) that cairnd no longer holds the plan of,
  // and the global plan is not cached: back to kGathering without them.
  // Returns their parked BeginSave calls, to be answered resend_plan off the
  // lock; they arrive again with their plans.
  std::vector<BeginWaiter> NeedPlansOf(const std::vector<int>& ranks);

  // The plan is built (phase kPlanning -> kWriting): every rank must report
  // by `now + commit_deadline`. `plan_id` identifies it (planner::PlanId).
  // Returns the parked BeginSave calls, to be answered with
  // RankResponse(rank) off the lock.
  std::vector<BeginWaiter> Planned(
      std::shared_ptr<const planner::GlobalSavePlan> plan, std::string plan_id,
      uint64_t version, bool from_cache, absl::Time now,
      absl::Duration commit_deadline);

  // `rank`'s part of the plan, its object keys in this attempt's directory;
  // only `rank_plan_unchanged` when the rank holds the plan of this id.
  // Requires phase kWriting or later.
  absl::StatusOr<v1::BeginSaveResponse> RankResponse(int rank) const;

  // --- CommitSave.

  // ABORTED when `incarnation` (non-zero) is not the process of `rank` in
  // this attempt (requires phase kWriting or later).
  absl::Status CheckIncarnation(int rank, uint64_t incarnation) const;
  // The checksums of `rank`'s writes from its CommitSave, in plan order.
  // Long form (`results`): INVALID_ARGUMENT unless they are exactly the
  // rank's planned writes: their count, object keys (in this attempt),
  // offsets and lengths. Short form (`crc32cs`): FAILED_PRECONDITION unless
  // its plan id and attempt are this save's, INVALID_ARGUMENT unless there is
  // one checksum per planned write. Reads only the plan (immutable once
  // kWriting).
  absl::StatusOr<std::vector<uint32_t>> CheckResults(
      int rank, const v1::CommitSaveRequest& request) const;

  // A rank's CommitSave with checked results. kParked: `done` was taken and
  // is answered by the commit; kAllReported: the same, and it was the last
  // rank (the phase is kCommitting: publish the manifest); kConflict: the
  // rank reported other checksums than before while writing (its objects may
  // have been rewritten), the caller must abort the attempt; kAnswered:
  // `*answer` holds the answer now (the attempt was aborted, or the rank
  // reported other checksums once the commit had begun).
  enum class Report { kParked, kAllReported, kConflict, kAnswered };
  // `crc32cs`: of the rank's checked results (CheckResults), in plan order:
  // the locations are the plan's, so only the checksums are kept.
  Report Commit(int rank, std::vector<uint32_t> crc32cs,
                Done<v1::CommitSaveResponse>& done, absl::Status* answer);

  // The manifest of a session whose ranks have all reported (kCommitting),
  // tensor by tensor: fills `*header` with every field but the tensors, then
  // passes each tensor to `on_tensor` in fqn order (an error from it stops
  // the build and is returned), so the manifest of a large job (millions of
  // chunks) need never be whole in memory as messages. Not validated here:
  // storage::ManifestEncoder and PublishManifest validate what is published.
  absl::Status BuildManifest(
      v1::Manifest* header,
      absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor) const;
  // The same into one message (tests, small jobs).
  absl::Status BuildManifest(v1::Manifest* m) const;
  // What BuildManifest makes the manifest from (every write's chunk, sorted
  // by box within its tensor, ~32 bytes each), gathered once: PublishManifest
  // runs its source twice for a large manifest, and each run then only
  // makes and passes the messages.
  struct ManifestParts;
  absl::StatusOr<std::shared_ptr<const ManifestParts>> GatherManifest() const;
  // BuildManifest from `parts`, this session's GatherManifest.
  absl::Status BuildManifest(
      const ManifestParts& parts, v1::Manifest* header,
      absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor) const;

  // The commit is done: the parked CommitSave calls, to be answered.
  std::vector<Done<v1::CommitSaveResponse>> TakeCommitWaiters();

  // --- Deadlines and aborts.

  // Ranks that have not arrived (kGathering) or not reported (otherwise).
  std::vector<int> MissingRanks() const;
  // Past its deadline while waiting for ranks (kGathering or kWriting).
  bool Expired(absl::Time now) const;
  // DEADLINE_EXCEEDED naming the missing ranks and the deadline's length.
  absl::Status DeadlineStatus(absl::Duration begin_deadline,
                              absl::Duration commit_deadline) const;

  // Marks the attempt aborted with `status` and appends to `answers` the
  // answers of every parked call. False (and nothing done) if it already
  // was aborted.
  bool Abort(const absl::Status& status,
             std::vector<std::function<void()>>* answers);

  // --- Tiers. What a rank asked for (BeginSaveRequest.tier, agent_holds,
  // replicas), kept from its BeginSave until the plan is built; the tier
  // chosen then (ChooseTier) goes to every rank with its plan. A memory
  // save's ranks commit with the nodes holding their shards.
  void AskTier(int rank, const TierAsk& ask) { tier_asks_[rank] = ask; }
  // By rank, for the ranks that asked (every rank once kPlanning).
  const std::map<int, TierAsk>& tier_asks() const { return tier_asks_; }
  void set_tier(v1::Tier tier, int replicas) {
    tier_ = tier;
    replicas_ = replicas;
  }
  v1::Tier tier() const { return tier_; }
  int replicas() const { return replicas_; }
  // Memory saves: `rank`'s holder nodes, from its CommitSave (the last
  // report wins; a retry names the same).
  void SetHolders(int rank, std::vector<int> nodes);
  // By rank (empty for ranks that have not reported); sized world_size once
  // planned.
  const std::vector<std::vector<int>>& holders() const { return holders_; }

  // --- State.
  const std::string& job() const { return job_; }
  int64_t step() const { return step_; }
  int world_size() const { return world_size_; }
  const std::string& attempt() const { return attempt_; }
  const std::string& step_prefix() const { return step_prefix_; }
  absl::Time created() const { return created_; }
  absl::Time deadline() const { return deadline_; }
  Phase phase() const { return phase_; }
  const absl::Status& abort_status() const { return abort_status_; }
  // Ranks that arrived so far (world_size once kPlanning).
  int arrived() const { return arrived_; }
  // Ranks that arrived, sorted (kGathering; empty afterwards).
  std::vector<int> ArrivedRanks() const;
  // By rank, while kPlanning (released once planned); a plan is null when
  // its rank sent only a fingerprint cairnd no longer holds the plan of (see
  // NeedPlansOf).
  const std::vector<std::shared_ptr<const planner::PackedLocalPlan>>& plans()
      const {
    return plans_;
  }
  const std::vector<std::string>& fingerprints() const { return fingerprints_; }
  // Once kWriting.
  const std::shared_ptr<const planner::GlobalSavePlan>& plan() const {
    return plan_;
  }
  uint64_t plan_version() const { return plan_version_; }
  const std::string& plan_id() const { return plan_id_; }
  bool plan_from_cache() const { return plan_from_cache_; }
  // The commit failed after the MANIFEST may have become visible and it
  // could not be removed: the objects it names stay (recovery decides).
  bool keep_objects() const { return keep_objects_; }
  void set_keep_objects() { keep_objects_ = true; }
  // Aborted because its ranks disagreed on world_size.
  bool world_mismatch() const { return world_mismatch_; }
  void set_world_mismatch() { world_mismatch_ = true; }

 private:
  struct Arrived {
    std::shared_ptr<const planner::PackedLocalPlan> plan;
    std::string fingerprint;
    std::string held_plan_id;
    uint64_t incarnation = 0;  // of the rank's process; 0: not sent
    absl::Time at;             // when it arrived (first, for a retried call)
  };
  // A parked BeginSave call.
  struct ParkedBegin {
    Done<v1::BeginSaveResponse> done;
    CallerGone gone;  // may be null
  };

  const std::string job_;
  const int64_t step_;
  const int world_size_;
  const std::string attempt_;
  const std::string storage_uri_;
  const std::string step_prefix_;  // "<job>/<step>/"
  const absl::Time created_;
  const absl::Duration begin_deadline_;
  absl::Time deadline_;
  Phase phase_ = Phase::kGathering;
  bool keep_objects_ = false;
  bool world_mismatch_ = false;

  // Gathering: one entry per rank that arrived.
  absl::flat_hash_map<int, Arrived> arrivals_;
  int arrived_ = 0;
  int64_t plan_items_ = 0;  // of every arrived plan
  absl::flat_hash_map<int, std::vector<ParkedBegin>> begin_waiters_;
  // Ranks that left (WithdrawIfDeparted) and have not arrived again: the
  // incarnation of the process that left.
  absl::flat_hash_map<int, uint64_t> departed_;
  bool any_departed_ = false;  // the begin deadline may count from later
  // Once every rank arrived (kPlanning on): the arrivals by rank.
  std::vector<std::shared_ptr<const planner::PackedLocalPlan>> plans_;
  std::vector<std::string> fingerprints_;
  std::vector<std::string> held_plan_ids_;
  std::vector<uint64_t> incarnations_;

  // Planned.
  std::shared_ptr<const planner::GlobalSavePlan> plan_;
  std::string plan_id_;
  uint64_t plan_version_ = 0;
  bool plan_from_cache_ = false;

  // Committing (sized world_size once planned).
  std::vector<std::optional<std::vector<uint32_t>>> results_;  // crc32cs
  int reported_ = 0;
  std::vector<Done<v1::CommitSaveResponse>> commit_waiters_;

  absl::Status abort_status_;

  std::map<int, TierAsk> tier_asks_;
  v1::Tier tier_ = v1::TIER_PERSISTENT;
  int replicas_ = 0;
  std::vector<std::vector<int>> holders_;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_SAVE_SESSION_H_
