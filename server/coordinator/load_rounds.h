// Load rounds: the ranks of a job that load one step together, so that
// `latest` is resolved once for all of them and the chunks they read only in
// part are verified by combining their pieces (load_verifier.h).
//
// A rank that names its world size joins a round of its job and step: the
// membership stays open until all world_size ranks have joined, or until
// every member has reported and `join_grace` has passed since the last
// join. A rank that starts late therefore still joins while the others are
// reading, and their pieces are combined with its own.
// A rank naming another world size fails a round still within the grace of
// its last join (ranks of one load disagree); after that it loads in a
// round of its own (another load of the step, an evaluation say).
// `latest` is resolved once per round: a rank asking for it gets the step of
// the newest live round of the job it has not taken part in, else the newest
// committed step (and opens a round), so a commit landing between two ranks'
// PlanLoads never hands them different steps. Ranks of one round that
// disagree on world_size get INVALID_ARGUMENT naming both sizes, at once,
// and so does every member waiting in VerifyLoad. After reading, every
// member reports the pieces it read in part; a report is parked until the
// membership is closed and every member has reported (a report without
// pieces is answered at once), then each chunk the ranks read completely
// between them is checked and every rank is told which of its pieces it must
// still verify by reading the chunk whole. A round whose members stop
// reporting expires `verify_deadline` after its previous join or report
// (DEADLINE_EXCEEDED naming the missing ranks).
//
// A rank calling again finds its round again (same id and step), whether
// the round is still live or already retired:
//   - asked to send its request again (Resend: PlanLoad's resend_wanted),
//     its next Join with the same job, world size and verification within
//     `verify_deadline` joins the round it was asked from, so a load whose
//     ranks all plan twice never leaves a second round behind that could
//     refuse another load of the step;
//   - a retry (its answer was lost): a member that has not reported yet, or
//     one that does not report, while its round is open or within
//     `join_grace` of its join.
// A round failed by disagreeing ranks answers its error to every member,
// and to every rank that joins it, until `join_grace` after its last join
// or the failure, whichever is later; after that it takes nobody, and a
// rank starting again (a job restarted after a crash, say) opens a fresh
// round even if it was a member of the failed one. The failed round stays
// until its members have reported or its verify deadline, so members still
// reading are told at their report.
// At most `max_rounds_per_job` rounds of one job and `max_rounds` of all
// jobs are live at once: a join that would open one more is refused with
// RESOURCE_EXHAUSTED naming the job and the cap.
//
// Times are arguments (tests drive the rounds with explicit times); the
// combining of a complete round runs through `schedule` (the coordinator's
// workers). Thread-safe: every method may be called concurrently; answers
// are given with no lock held.
#ifndef CAIRN_SERVER_COORDINATOR_LOAD_ROUNDS_H_
#define CAIRN_SERVER_COORDINATOR_LOAD_ROUNDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/load_plan.h"
#include "server/coordinator/load_verifier.h"

namespace cairn::coordinator {

class LoadRounds {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  using Schedule = std::function<void(std::function<void()>)>;

  struct Options {
    // Once every member has reported, a round's membership closes this long
    // after the last rank joined.
    absl::Duration join_grace = absl::Seconds(2);
    // A round missing reports expires this long after its previous join or
    // report.
    absl::Duration verify_deadline = absl::Minutes(1);
    // Threads combining a finished round's pieces, each given at least
    // min_pieces_per_thread of them (a small round takes one).
    int combine_threads = 2;
    uint64_t min_pieces_per_thread = 1 << 16;
    // Live rounds (joining or waiting for reports) of one job, and of all
    // jobs: a join that would open one more is refused.
    int max_rounds_per_job = 64;
    int max_rounds = 1024;
  };

  // Round ids start at `first_id` (random in cairnd, so a report for a round
  // of a previous process never lands in a new one).
  LoadRounds(Options options, uint64_t first_id, Schedule schedule);

  LoadRounds(const LoadRounds&) = delete;
  LoadRounds& operator=(const LoadRounds&) = delete;

  // Puts `rank` (of `world` ranks) in a round of `job` at `now`; a retry or
  // a resend finds its round again (see the top). `step` >= 0 names the
  // step; -1 asks for `latest`: the newest live round's step, else
  // `newest_committed` (NOT_FOUND when that is -1 too). `reports`: the rank
  // will call Report (else it counts as reported). INVALID_ARGUMENT (and the
  // round failed for every member) when the world sizes disagree;
  // RESOURCE_EXHAUSTED when a new round would pass a cap; UNAVAILABLE once
  // shut down.
  struct Joined {
    uint64_t round = 0;
    int64_t step = 0;
  };
  absl::StatusOr<Joined> Join(const std::string& job, int rank, int world,
                              bool reports, int64_t step,
                              int64_t newest_committed, absl::Time now);

  // Takes `rank` out of `round` (its PlanLoad failed after joining); while
  // the grace lasts the round opens again for it.
  void Leave(uint64_t round, int rank, absl::Time now);

  // The answer to `joined` asks `rank` to send its request again (the
  // request named tensors by a digest that is not the checkpoint's): the
  // rank's next Join of `job` with the same world size and `reports` within
  // the verify deadline gets `joined` again, live or retired.
  void Resend(const Joined& joined, const std::string& job, int rank, int world,
              bool reports, absl::Time now);

  // One rank's pieces, packed for the wait until every rank of the round
  // has reported. A piece is its stored chunk's id (LoadPlanner::Id), its
  // crc32c term and its box as varints relative to the stored chunk's box:
  // ~20 bytes (2-D) where a ChunkPieceReport takes ~104. A 4096 -> 3072-rank
  // load of a 70B model parks 8.3 M pieces. Piece i is the report's piece i
  // (VerifyLoadResponse.verify_locally names it so).
  class Pieces {
   public:
    // Room for `n` pieces.
    void Reserve(size_t n);
    // The next piece: the stored chunk `chunk_id` with box `stored`, the
    // crc32c term and the box read, which must be non-empty and inside
    // `stored` (offsets and sizes with its dims).
    void Add(uint32_t chunk_id, const planner::ChunkBox& stored,
             uint32_t crc_term, absl::Span<const int64_t> offsets,
             absl::Span<const int64_t> sizes);

    size_t size() const { return chunk_id_.size(); }
    bool empty() const { return chunk_id_.empty(); }
    uint32_t chunk_id(size_t i) const { return chunk_id_[i]; }
    // Piece i as reported by `rank`, into `out` (reusing its box's storage);
    // `stored` is its stored chunk's box, as given to Add.
    void ReportInto(size_t i, int rank, const planner::ChunkBox& stored,
                    ChunkPieceReport* out) const;

   private:
    std::vector<uint32_t> chunk_id_;
    std::vector<uint32_t> crc_term_;
    std::vector<uint32_t> at_;  // piece i's box starts at box_[at_[i]]
    std::vector<uint8_t> box_;  // offsets - stored offsets, then sizes
  };
  // `rank`'s VerifyLoad report for `round` (checked against the job, step
  // and world size it joined with; `who` names the rank in messages), with
  // its pieces checked against `stored` (the checkpoint's stored chunks)
  // already and their chunk ids below stored->num_chunk_ids(). `done` is
  // answered at once when it has no pieces or the call is refused, else when
  // the round is complete. A retry replaces a parked report (the first is
  // answered ABORTED).
  void Report(uint64_t round, const std::string& job, int64_t step, int rank,
              int world, const std::string& who,
              std::shared_ptr<const planner::LoadPlanner> stored, Pieces pieces,
              absl::Time now, Done<v1::VerifyLoadResponse> done);

  // Closes memberships whose grace is over at `now`, completes full rounds
  // and expires rounds past their verify deadline.
  void Advance(absl::Time now);

  // Answers every parked report UNAVAILABLE and refuses new calls.
  void Shutdown();

  struct Stats {
    int64_t reports = 0;            // Report calls accepted
    int64_t chunks_verified = 0;    // by combining ranks' pieces
    int64_t chunks_unverified = 0;  // sent back to verify locally
    int64_t live_rounds = 0;        // joining or waiting for reports now
  };
  Stats stats() const;

 private:
  struct Round;
  using Answers = std::vector<std::function<void()>>;
  // Where a rank calling again goes: its job, rank, world size and reports.
  using RejoinKey = std::tuple<std::string, int, int, bool>;
  struct Rejoin {
    Joined joined;
    absl::Time until;  // then forgotten
  };

  void FailLocked(Round& round, const absl::Status& status, absl::Time now,
                  Answers* answers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes `round`'s membership when every rank of the world has joined, or
  // when every member has reported and the grace since the last join is over
  // (a failed round: when the grace since the failure is over).
  void MaybeCloseLocked(Round& round, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of `round`'s grace: join_grace after its last join or failure.
  absl::Time GraceEnd(const Round& round) const;
  // Remembers that `rank` may call again for `joined` until `until` (a
  // longer memory of the same rank stays).
  void RememberLocked(const RejoinKey& key, const Joined& joined,
                      absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes memberships, finishes complete rounds, expires late ones (every
  // round when `shutdown`), and forgets rejoins that are over.
  void AdvanceLocked(absl::Time now, bool shutdown, Answers* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rounds' part of it (every Join: O(rounds), where rejoins_ may hold
  // an entry for every rank of a large load).
  void AdvanceRoundsLocked(absl::Time now, bool shutdown, Answers* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If `round` is closed and every member has reported: removes it and
  // schedules Finish.
  void MaybeFinishLocked(const std::shared_ptr<Round>& round, absl::Time now,
                         Answers* answers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the chunks of a complete round (no longer in rounds_) and answers
  // its parked members.
  void Finish(std::shared_ptr<Round> round);

  // Constant after construction.
  const Options options_;
  const Schedule schedule_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds_
      ABSL_GUARDED_BY(mu_);
  // Ranks that may call again for a round (asked to resend, or members not
  // reporting of a round retired within the grace), forgotten at `until`.
  absl::flat_hash_map<RejoinKey, Rejoin> rejoins_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_LOAD_ROUNDS_H_
