#include "server/coordinator/load_rounds.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/task_group.h"
#include "google/protobuf/io/coded_stream.h"
#include "server/coordinator/messages.h"
#include "storage/checksum.h"

namespace cairn::coordinator {

namespace {

// Appends v as protobuf writes a varint (LEB128: 7 bits a byte, low first).
void PutVarint(uint64_t v, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + google::protobuf::io::CodedOutputStream::VarintSize64(v));
  google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
      v, out->data() + at);
}

// Reads a varint PutVarint wrote (protobuf's array reader is internal).
uint64_t GetVarint(const uint8_t*& p) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) return v;
  }
}

}  // namespace

void LoadRounds::Pieces::Reserve(size_t n) {
  chunk_id_.reserve(n);
  crc_term_.reserve(n);
  at_.reserve(n);
  // box_ grows as pieces are added: its size depends on their dims, which
  // come from the request and are checked piece by piece.
}

void LoadRounds::Pieces::Add(uint32_t chunk_id, const planner::ChunkBox& stored,
                             uint32_t crc_term,
                             absl::Span<const int64_t> offsets,
                             absl::Span<const int64_t> sizes) {
  chunk_id_.push_back(chunk_id);
  crc_term_.push_back(crc_term);
  at_.push_back(static_cast<uint32_t>(box_.size()));
  for (size_t d = 0; d < offsets.size(); ++d) {
    PutVarint(static_cast<uint64_t>(offsets[d] - stored.offsets[d]), &box_);
  }
  for (int64_t size : sizes) PutVarint(static_cast<uint64_t>(size), &box_);
}

void LoadRounds::Pieces::ReportInto(size_t i, int rank,
                                    const planner::ChunkBox& stored,
                                    ChunkPieceReport* out) const {
  out->rank = rank;
  out->index = static_cast<int>(i);
  out->crc_term = crc_term_[i];
  const size_t dims = stored.offsets.size();
  out->overlap.offsets.resize(dims);
  out->overlap.sizes.resize(dims);
  const uint8_t* p = box_.data() + at_[i];
  for (size_t d = 0; d < dims; ++d) {
    out->overlap.offsets[d] =
        stored.offsets[d] + static_cast<int64_t>(GetVarint(p));
  }
  for (size_t d = 0; d < dims; ++d) {
    out->overlap.sizes[d] = static_cast<int64_t>(GetVarint(p));
  }
}

// One round: the ranks of a job that load one step together.
struct LoadRounds::Round {
  uint64_t id = 0;
  std::string job;
  int64_t step = 0;
  int world_size = 0;
  absl::Time last_join;  // the membership closes join_grace after it
  bool closed = false;   // no rank joins any more
  absl::Time deadline;   // for the next report (after a join or report)
  absl::Status failed;   // the ranks disagreed: every member gets this
  absl::Time failed_at;  // when (its grace runs from here too)
  std::shared_ptr<const planner::LoadPlanner> stored;  // the checkpoint's
  struct Member {
    bool reports = true;           // calls Report (else counted as reported)
    absl::Time joined_at;          // a retry comes within the grace of it
    std::optional<Pieces> pieces;  // set once reported
    Done<v1::VerifyLoadResponse> waiter;  // a parked report
  };
  std::map<int, Member> members;  // by rank
  int reported = 0;               // members whose pieces are set

  bool AllReported() const {
    return reported == static_cast<int>(members.size());
  }
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

LoadRounds::LoadRounds(Options options, uint64_t first_id, Schedule schedule)
    : options_(options), schedule_(std::move(schedule)), next_id_(first_id) {}

absl::StatusOr<LoadRounds::Joined> LoadRounds::Join(const std::string& job,
                                                    int rank, int world,
                                                    bool reports, int64_t step,
                                                    int64_t newest_committed,
                                                    absl::Time now) {
  Answers answers;
  absl::StatusOr<Joined> joined = [&]() -> absl::StatusOr<Joined> {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("cairnd is shutting down");
    // Memberships whose grace is over close first (a failed round's too),
    // so that the choices below see every round as it stands at `now`.
    AdvanceRoundsLocked(now, /*shutdown=*/false, &answers);
    const bool latest = step < 0;
    // A rank calling again for a round it is in gets the same round and
    // step. A failed round answers its failure while its grace lasts; after
    // it the rank is one starting again (nullopt: not a round to call again
    // in).
    const auto again = [&](Round& r) -> std::optional<absl::StatusOr<Joined>> {
      if (!r.failed.ok()) {
        if (now > GraceEnd(r)) return std::nullopt;
        return r.failed;
      }
      r.deadline = std::max(r.deadline, now + options_.verify_deadline);
      return Joined{r.id, r.step};
    };
    // Asked to resend, or not reporting in a round retired within the
    // grace: rejoins_ says where.
    if (auto it = rejoins_.find(RejoinKey{job, rank, world, reports});
        it != rejoins_.end() && now <= it->second.until &&
        (latest || it->second.joined.step == step)) {
      const Joined remembered = it->second.joined;
      // From now on remembered for retries of this call only.
      it->second.until = std::min(it->second.until, now + options_.join_grace);
      auto live = rounds_.find(remembered.round);
      // Retired: its step, unless `latest` has moved on since (a commit
      // after the round; a rank whose resend went elsewhere, through its
      // agent say, must not pin a later load to the old step).
      if (live == rounds_.end()) {
        if (!latest || newest_committed <= remembered.step) return remembered;
      } else if (live->second->members.count(rank) > 0) {
        if (auto j = again(*live->second)) return *std::move(j);
      }
    }
    // A retried PlanLoad (the answer to the first was lost) finds its round:
    // the rank is a member that has not reported yet (or, not reporting,
    // of a round still open or within the grace of its join), with the same
    // world size and verification.
    std::shared_ptr<Round> newest_live;  // that this rank is not part of
    std::shared_ptr<Round> open;  // for the step, this rank not part of it
    for (auto& [id, r] : rounds_) {
      if (r->job != job) continue;
      auto m = r->members.find(rank);
      if (m != r->members.end()) {
        const bool pending = m->second.reports
                                 ? !m->second.pieces.has_value()
                                 : !r->closed || now <= m->second.joined_at +
                                                            options_.join_grace;
        if (pending && m->second.reports == reports &&
            (latest || r->step == step) && r->world_size == world) {
          if (auto j = again(*r)) return *std::move(j);
        }
        continue;
      }
      if (newest_live == nullptr || r->id > newest_live->id) newest_live = r;
    }
    if (latest) {
      if (newest_live != nullptr) {
        step = newest_live->step;
      } else if (newest_committed >= 0) {
        step = newest_committed;
      } else {
        return absl::NotFoundError(
            absl::StrCat("job '", job, "' has no committed checkpoint"));
      }
    }
    // The newest open round of the step with this world size; else the
    // newest with another size, which this rank fails if it is still within
    // the grace (ranks of one load disagree) and leaves to itself if not (a
    // load by other ranks still reading, say an evaluation of the step).
    std::shared_ptr<Round> other_world;
    int64_t live_of_job = 0;
    for (auto& [id, r] : rounds_) {
      if (r->job != job) continue;
      ++live_of_job;
      if (r->step != step || r->closed || r->members.count(rank) > 0) {
        continue;
      }
      std::shared_ptr<Round>& newest =
          r->world_size == world ? open : other_world;
      if (newest == nullptr || r->id > newest->id) newest = r;
    }
    if (open == nullptr && other_world != nullptr &&
        now <= GraceEnd(*other_world)) {
      open = other_world;
    }
    if (open != nullptr && !open->failed.ok()) return open->failed;
    if (open != nullptr && open->world_size != world) {
      const absl::Status status = absl::InvalidArgumentError(absl::StrCat(
          "load of ", SaveName(job, step), ": rank ", rank, " says world_size ",
          world, " but ranks ", RankList(open->Ranks(), open->world_size),
          " of the load say world_size ", open->world_size,
          "; every rank of a load must pass the same world_size"));
      CAIRN_LOG(warn, "{}", std::string(status.message()));
      FailLocked(*open, status, now, &answers);
      return status;
    }
    if (open == nullptr) {
      // A new round: within the caps (a client opening rounds without end,
      // by a new world size or step each time, must not exhaust cairnd).
      if (live_of_job >= options_.max_rounds_per_job) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "load of ", SaveName(job, step), ": rank ", rank, " of ", world,
            " would open a load round, but job '", job, "' has ", live_of_job,
            " live load rounds, the most cairnd keeps for one "
            "job (--max-load-rounds-per-job ",
            options_.max_rounds_per_job,
            "); they end when their ranks have reported or at the verify "
            "deadline"));
      }
      if (static_cast<int64_t>(rounds_.size()) >= options_.max_rounds) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "load of ", SaveName(job, step), ": rank ", rank, " of ", world,
            " would open a load round, but cairnd has ", rounds_.size(),
            " live load rounds of all jobs, the most it keeps "
            "(--max-load-rounds ",
            options_.max_rounds,
            "); they end when their ranks have reported or at the verify "
            "deadline"));
      }
      open = std::make_shared<Round>();
      open->id = next_id_++;
      open->job = job;
      open->step = step;
      open->world_size = world;
      rounds_[open->id] = open;
    }
    Round::Member& m = open->members[rank];
    m.reports = reports;
    m.joined_at = now;
    if (!reports) {
      m.pieces.emplace();
      ++open->reported;
    }
    open->last_join = now;
    open->deadline = now + options_.verify_deadline;
    MaybeCloseLocked(*open, now);
    const Joined j{open->id, open->step};
    MaybeFinishLocked(open, now, &answers);
    return j;
  }();
  for (auto& a : answers) a();
  return joined;
}

void LoadRounds::Leave(uint64_t id, int rank, absl::Time now) {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    auto live = rounds_.find(id);
    if (live == rounds_.end()) return;
    const std::shared_ptr<Round> round = live->second;
    auto m = round->members.find(rank);
    if (m == round->members.end()) return;
    if (m->second.pieces.has_value()) {
      if (m->second.reports) return;  // it reported: no longer planning
      --round->reported;
    }
    rejoins_.erase(
        RejoinKey{round->job, rank, round->world_size, m->second.reports});
    round->members.erase(m);
    if (round->members.empty()) {
      rounds_.erase(live);
      return;
    }
    // Open again for the rank that left (it may plan again) unless the
    // others are done.
    round->closed = false;
    MaybeCloseLocked(*round, now);
    MaybeFinishLocked(round, now, &answers);
  }
  for (auto& a : answers) a();
}

void LoadRounds::Resend(const Joined& joined, const std::string& job, int rank,
                        int world, bool reports, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  RememberLocked(RejoinKey{job, rank, world, reports}, joined,
                 now + options_.verify_deadline);
  auto live = rounds_.find(joined.round);
  if (live != rounds_.end()) {
    Round& round = *live->second;
    round.deadline = std::max(round.deadline, now + options_.verify_deadline);
  }
}

void LoadRounds::Report(uint64_t id, const std::string& job, int64_t step,
                        int rank, int world, const std::string& who,
                        std::shared_ptr<const planner::LoadPlanner> stored,
                        Pieces pieces, absl::Time now,
                        Done<v1::VerifyLoadResponse> done) {
  std::optional<absl::StatusOr<v1::VerifyLoadResponse>> reply;
  Done<v1::VerifyLoadResponse> superseded;
  Answers answers;
  {
    reply = [&]() -> std::optional<absl::StatusOr<v1::VerifyLoadResponse>> {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::UnavailableError("cairnd is shutting down");
      auto it = rounds_.find(id);
      if (it == rounds_.end()) {
        return absl::NotFoundError(absl::StrCat(
            who, ": load round ", id,
            " is over (it expired, or cairnd restarted); verify partly read "
            "chunks locally"));
      }
      const std::shared_ptr<Round> round = it->second;  // may be erased
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
      Round::Member& member = m->second;
      if (member.pieces.has_value()) {
        // A retry (the first call's connection dropped): the newest wins.
        superseded = std::move(member.waiter);
        member.waiter = nullptr;
      } else {
        ++round->reported;
      }
      ++stats_.reports;
      const bool has_pieces = !pieces.empty();
      member.pieces = std::move(pieces);
      round->stored = std::move(stored);
      round->deadline = now + options_.verify_deadline;
      MaybeCloseLocked(*round, now);
      MaybeFinishLocked(round, now, &answers);
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

void LoadRounds::Advance(absl::Time now) {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    AdvanceLocked(now, /*shutdown=*/false, &answers);
  }
  for (auto& a : answers) a();
}

void LoadRounds::Shutdown() {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    AdvanceLocked(absl::InfiniteFuture(), /*shutdown=*/true, &answers);
  }
  for (auto& a : answers) a();
}

LoadRounds::Stats LoadRounds::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.live_rounds = static_cast<int64_t>(rounds_.size());
  return stats;
}

void LoadRounds::FailLocked(Round& round, const absl::Status& status,
                            absl::Time now, Answers* answers) {
  round.failed = status;
  round.failed_at = now;
  for (auto& [rank, m] : round.members) {
    if (!m.waiter) continue;
    answers->push_back([done = std::move(m.waiter), status] { done(status); });
    m.waiter = nullptr;
  }
}

absl::Time LoadRounds::GraceEnd(const Round& round) const {
  const absl::Time last = round.failed.ok()
                              ? round.last_join
                              : std::max(round.last_join, round.failed_at);
  return last + options_.join_grace;
}

void LoadRounds::RememberLocked(const RejoinKey& key, const Joined& joined,
                                absl::Time until) {
  auto [it, inserted] = rejoins_.try_emplace(key, Rejoin{joined, until});
  if (!inserted &&
      (it->second.joined.round != joined.round || it->second.until < until)) {
    it->second = Rejoin{joined, until};
  }
}

void LoadRounds::MaybeCloseLocked(Round& round, absl::Time now) const {
  // A failed round takes no rank after the grace either: its members were
  // answered, and ranks starting again must not find the old failure.
  const bool grace_over = now > GraceEnd(round);
  if (static_cast<int>(round.members.size()) == round.world_size ||
      (grace_over && (round.AllReported() || !round.failed.ok()))) {
    round.closed = true;
  }
}

void LoadRounds::MaybeFinishLocked(const std::shared_ptr<Round>& round,
                                   absl::Time now, Answers* answers) {
  if (!round->closed || !round->AllReported()) return;
  rounds_.erase(round->id);
  if (!round->failed.ok()) return;  // its waiters were answered
  // A member not reporting may still call again (its answer lost): within
  // the grace of its join it finds the retired round, and opens no round
  // that could refuse another load of the step.
  for (const auto& [rank, m] : round->members) {
    if (m.reports || m.joined_at + options_.join_grace < now) continue;
    RememberLocked(RejoinKey{round->job, rank, round->world_size, false},
                   Joined{round->id, round->step},
                   m.joined_at + options_.join_grace);
  }
  answers->push_back(
      [this, round] { schedule_([this, round] { Finish(round); }); });
}

void LoadRounds::Finish(std::shared_ptr<Round> round) {
  // Every member has reported: the round is out of rounds_ and owned here.
  // The pieces are grouped by stored chunk with a counting sort over dense
  // chunk ids (a tensor's first id + the chunk's index): no map, no vector
  // per chunk (VerifyLoad at 3072 ranks combines 8 M pieces).
  // No stored chunks when no member called Report (none verifies in the
  // round).
  const planner::LoadPlanner* stored_tensors = round->stored.get();
  const int tensors =
      stored_tensors != nullptr ? stored_tensors->num_tensors() : 0;
  const uint32_t ids =
      stored_tensors != nullptr ? stored_tensors->num_chunk_ids() : 0;
  // The members that reported pieces, by ordinal; a piece is (ordinal, i).
  std::vector<std::pair<int, const Pieces*>> reporters;
  for (const auto& [rank, m] : round->members) {
    if (m.pieces.has_value() && !m.pieces->empty()) {
      reporters.emplace_back(rank, &*m.pieces);
    }
  }
  // Answers by rank (ranks are < world_size), given to the parked members.
  std::vector<v1::VerifyLoadResponse> answers(round->world_size);
  std::vector<int64_t> chunks_verified(round->world_size, 0);
  const auto answer_members = [&] {
    for (auto& [rank, m] : round->members) {
      if (!m.waiter) continue;
      answers[rank].set_chunks_verified(chunks_verified[rank]);
      m.waiter(std::move(answers[rank]));
    }
  };
  size_t total = 0;
  for (const auto& [rank, pieces] : reporters) total += pieces->size();
  if (total > std::numeric_limits<uint32_t>::max()) {
    // 4 G pieces (~80 GB of reports) do not fit the offsets: none is
    // combined, every rank verifies its pieces by reading their chunks whole.
    CAIRN_LOG(warn,
              "{}: {} pieces reported, more than can be combined; the "
              "ranks verify every partly read chunk locally",
              round->Name(), total);
    for (const auto& [rank, pieces] : reporters) {
      for (size_t i = 0; i < pieces->size(); ++i) {
        answers[rank].add_verify_locally(static_cast<int>(i));
      }
    }
    answer_members();
    return;
  }
  // Stored chunk id's pieces will lie in by_chunk[at[id], at[id + 1]): at[]
  // is first each chunk's count, then where its pieces end, and filling
  // by_chunk from the back (the last reporter's last piece first, so each
  // chunk's pieces keep the reporters' order) leaves it where they start.
  // 32-bit offsets: 4 bytes a stored chunk (18.3 M at 16k ranks of a 70B
  // model) instead of the 16 that two 64-bit arrays would take.
  std::vector<uint32_t> at(static_cast<size_t>(ids) + 1, 0);
  for (const auto& [rank, pieces] : reporters) {
    for (size_t i = 0; i < pieces->size(); ++i) ++at[pieces->chunk_id(i)];
  }
  for (size_t id = 1; id < ids; ++id) at[id] += at[id - 1];
  at[ids] = static_cast<uint32_t>(total);
  struct PieceRef {
    uint32_t reporter;
    uint32_t i;
  };
  std::vector<PieceRef> by_chunk(total);
  for (size_t r = reporters.size(); r-- > 0;) {
    const Pieces& pieces = *reporters[r].second;
    for (size_t i = pieces.size(); i-- > 0;) {
      by_chunk[--at[pieces.chunk_id(i)]] =
          PieceRef{static_cast<uint32_t>(r), static_cast<uint32_t>(i)};
    }
  }
  // The tensors are combined in shards of about equal pieces, one thread
  // each (every report is in: the round's ranks are waiting, and at 16k
  // ranks this is seconds of CPU). Shards keep tensor order, so each rank's
  // verify_locally indexes come out as one thread would give them.
  struct Shard {
    int t_begin = 0, t_end = 0;
    std::vector<std::pair<int, int>> verify_locally;  // (rank, index)
    std::vector<int64_t> chunks_verified;             // by rank
    int64_t verified = 0, unverified = 0;
  };
  const int threads = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(
          options_.combine_threads,
          static_cast<int64_t>(
              total / std::max<uint64_t>(options_.min_pieces_per_thread, 1))),
      1, std::max(tensors, 1)));
  std::vector<Shard> shards(threads);
  {
    int t = 0;
    for (int s = 0; s < threads; ++s) {
      shards[s].t_begin = t;
      // Pieces of tensors [0, t) reach at least (s + 1) / threads of all.
      const uint64_t until = total * static_cast<uint64_t>(s + 1) / threads;
      while (t < tensors &&
             (s == threads - 1 || at[stored_tensors->Id(t, 0)] < until)) {
        ++t;
      }
      shards[s].t_end = t;
    }
  }
  const auto combine = [&](Shard& shard) {
    std::vector<ChunkPieceReport> reports;  // of one chunk, reused
    planner::StoredChunkView stored;        // the chunk, reused
    storage::Crc32cFromPiecesMemo crc_of_pieces;
    std::vector<int> ranks;
    shard.chunks_verified.assign(round->world_size, 0);
    for (int t = shard.t_begin; t < shard.t_end; ++t) {
      for (int c = 0; c < stored_tensors->num_chunks(t); ++c) {
        const uint32_t id = stored_tensors->Id(t, c);
        if (at[id] == at[id + 1]) continue;
        stored_tensors->Fill(t, c, &stored);
        reports.clear();
        ranks.clear();
        for (uint32_t i = at[id]; i < at[id + 1]; ++i) {
          const auto& [rank, pieces] = reporters[by_chunk[i].reporter];
          pieces->ReportInto(by_chunk[i].i, rank, stored.box,
                             &reports.emplace_back());
          ranks.push_back(rank);
        }
        std::sort(ranks.begin(), ranks.end());
        ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
        const ChunkVerdict verdict = VerifyChunk(
            stored.box, stored.length, stored.crc32c, reports, &crc_of_pieces);
        if (verdict == ChunkVerdict::kVerified) {
          ++shard.verified;
          for (int r : ranks) ++shard.chunks_verified[r];
          continue;
        }
        ++shard.unverified;
        for (const ChunkPieceReport& r : reports) {
          shard.verify_locally.emplace_back(r.rank, r.index);
        }
        if (verdict != ChunkVerdict::kNotCovered) {
          CAIRN_LOG(warn,
                    "{}: stored chunk {} of '{}' at {}@{}: {} (read by ranks "
                    "{}); they re-read it whole",
                    round->Name(), planner::BoxToString(stored.box),
                    stored_tensors->fqn(t), std::string(stored.object_key),
                    stored.offset, ChunkVerdictName(verdict),
                    absl::StrJoin(ranks, ", "));
        }
      }
    }
  };
  {
    TaskGroup::Options parallel;
    parallel.thread_per_task = true;
    TaskGroup group(parallel);
    for (int s = 1; s < threads; ++s) {
      group.Run([&, s] {
        combine(shards[s]);
        return absl::OkStatus();
      });
    }
    combine(shards[0]);
    group.Wait().IgnoreError();  // the tasks cannot fail
  }
  int64_t verified = 0, unverified = 0;
  for (const Shard& shard : shards) {
    verified += shard.verified;
    unverified += shard.unverified;
    for (const auto& [rank, index] : shard.verify_locally) {
      answers[rank].add_verify_locally(index);
    }
    for (int r = 0; r < round->world_size; ++r) {
      chunks_verified[r] += shard.chunks_verified[r];
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.chunks_verified += verified;
    stats_.chunks_unverified += unverified;
  }
  answer_members();
}

void LoadRounds::AdvanceLocked(absl::Time now, bool shutdown,
                               Answers* answers) {
  absl::erase_if(rejoins_, [&](const auto& entry) {
    return shutdown || entry.second.until < now;
  });
  AdvanceRoundsLocked(now, shutdown, answers);
}

void LoadRounds::AdvanceRoundsLocked(absl::Time now, bool shutdown,
                                     Answers* answers) {
  std::vector<std::shared_ptr<Round>> rounds;
  for (auto& [id, round] : rounds_) rounds.push_back(round);
  for (const std::shared_ptr<Round>& round : rounds) {
    if (shutdown) {
      round->closed = true;
    } else {
      MaybeCloseLocked(*round, now);
      MaybeFinishLocked(round, now, answers);
      if (!rounds_.contains(round->id)) continue;
      // Every member reported: the round waits for its grace, not expiry.
      if (now <= round->deadline || round->AllReported()) continue;
    }
    rounds_.erase(round->id);
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
                       absl::FormatDuration(options_.verify_deadline),
                       " of the round's previous PlanLoad or report; verify "
                       "partly read chunks locally"));
    for (auto& [rank, m] : round->members) {
      if (!m.waiter) continue;
      answers->push_back(
          [done = std::move(m.waiter), status] { done(status); });
      m.waiter = nullptr;
    }
  }
}

}  // namespace cairn::coordinator
