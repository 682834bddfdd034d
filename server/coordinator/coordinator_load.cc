// The load protocol of the coordinator: PlanLoad (load rounds, `latest`
// resolved once per round, the load plan cache) and VerifyLoad (ranks'
// pieces combined per stored chunk). See coordinator.h.

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
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {

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

}  // namespace cairn::coordinator
