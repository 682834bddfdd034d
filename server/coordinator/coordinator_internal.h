// Internal to the coordinator library: the state records its parts share
// (a save in progress, a loaded manifest, a load round) and small helpers
// for their messages. Not part of the public interface (coordinator.h).
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_

#include <algorithm>
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
#include "absl/time/time.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/load_verifier.h"

namespace cairn::coordinator {

// "job '<job>' step <step>", as every message names a checkpoint.
inline std::string SaveName(absl::string_view job, int64_t step) {
  return absl::StrCat("job '", job, "' step ", step);
}

// Summarises a list of ranks for an error message: "[3, 5, 9] (3 of 8)".
inline std::string RankList(const std::vector<int>& ranks, int world_size) {
  std::vector<int> shown(ranks.begin(),
                         ranks.begin() + std::min<size_t>(ranks.size(), 16));
  return absl::StrCat("[", absl::StrJoin(shown, ", "),
                      ranks.size() > shown.size() ? ", ..." : "", "] (",
                      ranks.size(), " of ", world_size, ")");
}

// Aborted saves remembered to answer their late calls.
inline constexpr size_t kMaxTombstones = 4096;
// Bytes of local plans kept for fingerprint-only saves.
inline constexpr size_t kKnownPlanBytes = size_t{256} << 20;
// Jobs whose plan version is remembered.
inline constexpr size_t kMaxPlanVersionJobs = 4096;
// ABORTED catalog records kept per job (the newest): every abort used to add
// one for good, until ListCheckpoints outgrew clients' message limits.
inline constexpr size_t kMaxAbortedRecordsPerJob = 64;

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

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_INTERNAL_H_
