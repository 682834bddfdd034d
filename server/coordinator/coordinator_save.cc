// The save protocol of the coordinator: BeginSave (ranks gather, the global
// plan is built or taken from the cache), CommitSave (the manifest is
// published once every rank reported) and AbortSave. See coordinator.h.

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "planner/box.h"
#include "planner/plan_cache.h"
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
namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

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

std::string NewAttemptName() {
  static absl::Mutex* mu = new absl::Mutex;
  static absl::BitGen* gen = new absl::BitGen;
  absl::MutexLock lock(mu);
  return absl::StrFormat("attempt-%012x",
                         absl::Uniform<uint64_t>(*gen) & 0xffffffffffffULL);
}

}  // namespace

// ---------------------------------------------------------------------------
// BeginSave, in named steps: the rank's plan is decoded (no lock), the step
// checked savable in the catalog (no lock), then under the lock the rank
// joins a session (JoinSaveLocked): its plan resolved from a fingerprint,
// the attempt it is in aborted if it restarted, the session found or
// opened, and the rank's arrival given to the session's state machine.

absl::StatusOr<Coordinator::RankPlan> Coordinator::DecodeRankPlan(
    const v1::BeginSaveRequest& request) const {
  const std::string who = absl::StrCat("rank ", request.rank(), " of ",
                                       SaveName(request.job(), request.step()));
  RankPlan mine;
  if (request.held_plan_id().size() > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " sent a held plan id of ", request.held_plan_id().size(),
        " bytes; at most ", kMaxFingerprintBytes, " are accepted"));
  }
  if (request.has_local_plan()) {
    CAIRN_RETURN_IF_ERROR(
        CheckLocalPlanBounds(request.local_plan(), options_, who));
    if (request.local_plan().rank() != request.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, " sent a local plan for rank ", request.local_plan().rank()));
    }
    absl::StatusOr<planner::LocalSavePlan> p =
        convert::LocalPlanFromProto(request.local_plan());
    if (!p.ok()) {
      return Annotate(p.status(), who);
    }
    mine.fingerprint = planner::FingerprintLocalPlan(*p);
    absl::StatusOr<planner::PackedLocalPlan> packed = interner_.Pack(*p);
    if (!packed.ok()) {
      return Annotate(packed.status(), who);
    }
    mine.plan =
        std::make_shared<const planner::PackedLocalPlan>(*std::move(packed));
    return mine;
  }
  if (request.plan_case() == v1::BeginSaveRequest::kPlanFingerprint) {
    if (request.plan_fingerprint().size() > kMaxFingerprintBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, " sent a plan fingerprint of ",
                       request.plan_fingerprint().size(), " bytes; at most ",
                       kMaxFingerprintBytes, " are accepted"));
    }
    mine.fingerprint = request.plan_fingerprint();
    return mine;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(who, " sent neither a local plan nor a plan fingerprint"));
}

absl::Status Coordinator::CheckStepIsSavable(const std::string& job,
                                             int64_t step) {
  // A committed step is never overwritten.
  absl::StatusOr<v1::CheckpointRecord> existing =
      catalog_->GetCheckpoint(job, step);
  if (existing.ok() && existing->state() == v1::CHECKPOINT_STATE_COMMITTED) {
    return absl::AlreadyExistsError(absl::StrCat(
        SaveName(job, step), " is already committed; save a new step"));
  }
  if (existing.ok() && existing->state() == v1::CHECKPOINT_STATE_DELETING) {
    return absl::FailedPreconditionError(
        absl::StrCat(SaveName(job, step),
                     " is being deleted; finish with `cairn rm` first"));
  }
  return absl::OkStatus();
}

void Coordinator::BeginSave(const v1::BeginSaveRequest& request,
                            Done<v1::BeginSaveResponse> done, CallerGone gone) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);
  if (absl::Status s = ValidateRankOfWorld(
          rank, request.world_size(), options_.max_world_size,
          absl::StrCat("rank ", rank, " of ", SaveName(job, step)));
      !s.ok()) {
    return done(s);
  }
  absl::StatusOr<RankPlan> mine = DecodeRankPlan(request);
  if (!mine.ok()) return done(mine.status());
  if (absl::Status s = CheckStepIsSavable(job, step); !s.ok()) return done(s);
  if (absl::Status s = CheckStorageLease(SaveName(job, step)); !s.ok()) {
    return done(s);
  }

  // Either `done` is parked until the plan is built, or `reply` holds the
  // immediate answer, given after the lock.
  std::shared_ptr<SaveSession> to_plan;
  std::optional<absl::StatusOr<v1::BeginSaveResponse>> reply;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    reply = JoinSaveLocked(request, std::move(*mine), done, std::move(gone),
                           &to_plan, &answers);
  }
  // The aborted attempt is recorded and cleaned before the new one can be.
  for (auto& a : answers) a();
  if (reply.has_value()) return done(std::move(*reply));
  if (to_plan != nullptr) {
    workers_->Schedule([this, to_plan] { PlanSession(to_plan); });
  }
}

std::optional<absl::StatusOr<v1::BeginSaveResponse>>
Coordinator::JoinSaveLocked(const v1::BeginSaveRequest& request, RankPlan mine,
                            Done<v1::BeginSaveResponse>& done, CallerGone gone,
                            std::shared_ptr<SaveSession>* to_plan,
                            std::vector<std::function<void()>>* answers) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  const int world = request.world_size();
  if (shutting_down_) {
    return absl::UnavailableError("cairnd is shutting down");
  }
  if (deleting_.contains(SaveKey{job, step})) {
    return absl::FailedPreconditionError(absl::StrCat(
        SaveName(job, step), " is being deleted; save it once it is gone"));
  }
  ResolveKnownPlanLocked(job, rank, &mine);
  ForgetDepartedRanksLocked(request, answers);
  if (absl::Status s = RestartIfRankReturnedLocked(request, answers); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<SaveSession>> joined =
      SessionToJoinLocked(job, step, rank, world);
  if (!joined.ok()) return joined.status();
  const std::shared_ptr<SaveSession> session = *std::move(joined);
  if (session->world_size() != world) {
    // Fail the whole save now: the ranks already parked would otherwise
    // wait for the begin deadline and hear of a missing rank.
    const absl::Status status = session->WorldSizeMismatch(rank, world);
    if (session->phase() == Phase::kGathering) {
      session->set_world_mismatch();
      AbortSessionLocked(session, status, answers);
    }
    return status;
  }
  absl::StatusOr<v1::BeginSaveResponse> answer;
  const int arrived_before = session->arrived();
  if (session->phase() == Phase::kGathering) {
    session->AskTier(rank, TierAsk{request.tier(), request.agent_holds(),
                                   request.replicas()});
  }
  switch (session->Arrive(rank, std::move(mine.plan),
                          std::move(mine.fingerprint), request.held_plan_id(),
                          request.incarnation(),
                          options_.max_plan_items_per_save, absl::Now(), done,
                          std::move(gone), &answer)) {
    case SaveSession::Arrival::kAnswered:
      return answer;
    case SaveSession::Arrival::kAllArrived:
      *to_plan = session;
      break;
    case SaveSession::Arrival::kParked:
      break;
  }
  if (session->arrived() > arrived_before) {  // not a retry
    CAIRN_LOG(debug, "rank {} of {} joined the save ({} of {} ranks)", rank,
              SaveName(job, step), session->arrived(), session->world_size());
  }
  return std::nullopt;
}

void Coordinator::ResolveKnownPlanLocked(const std::string& job, int rank,
                                         RankPlan* mine) {
  if (mine->plan == nullptr) {
    std::shared_ptr<const KnownPlan> known = known_plans_.Lookup({job, rank});
    if (known != nullptr && known->fingerprint == mine->fingerprint) {
      mine->plan = known->plan;
    }
    return;
  }
  known_plans_.Insert(
      {job, rank},
      std::make_shared<const KnownPlan>(
          KnownPlan{mine->fingerprint, mine->plan}),
      mine->plan->ApproximateBytes() + job.size() + mine->fingerprint.size());
}

void Coordinator::ForgetDepartedRanksLocked(
    const v1::BeginSaveRequest& request,
    std::vector<std::function<void()>>* answers) {
  const SaveKey key{request.job(), request.step()};
  auto it = sessions_.find(key);
  if (it == sessions_.end() || it->second->phase() != Phase::kGathering ||
      it->second->world_size() != request.world_size()) {
    return;
  }
  SaveSession& session = *it->second;
  const int rank = request.rank();
  const SaveSession::RankState was = session.Rank(rank);
  std::vector<SaveSession::BeginWaiter> left;
  if (was.in_save) {
    // Another process for the rank: the one in the save may be gone.
    if (request.incarnation() != 0 && was.incarnation != 0 &&
        was.incarnation != request.incarnation()) {
      left = session.WithdrawIfDeparted(rank);
    }
  } else if (session.arrived() + 1 == session.world_size()) {
    // This rank completes the world only if every process in it is there.
    left = session.WithdrawDeparted();
  }
  if (left.empty()) return;
  std::set<int> ranks;
  for (const auto& [r, done] : left) ranks.insert(r);
  CAIRN_LOG(
      info,
      "{}: rank{} {} left the save before it was planned (its BeginSave "
      "call was cancelled: the process exited or gave up); {}",
      SaveName(request.job(), request.step()), ranks.size() > 1 ? "s" : "",
      absl::StrJoin(ranks, ", "),
      absl::StrCat("the save waits for ", ranks.size() > 1 ? "them" : "it",
                   " again (", session.arrived(), " of ", session.world_size(),
                   " ranks in)"));
  for (auto& [r, done] : left) {
    answers->push_back([done = std::move(done), r = r, key] {
      done(absl::CancelledError(
          absl::StrCat("rank ", r, " of ", SaveName(key.first, key.second),
                       " left the save: its BeginSave call was cancelled")));
    });
  }
}

absl::Status Coordinator::RestartIfRankReturnedLocked(
    const v1::BeginSaveRequest& request,
    std::vector<std::function<void()>>* answers) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  const uint64_t incarnation = request.incarnation();
  auto it = sessions_.find(SaveKey{job, step});
  if (it == sessions_.end() ||
      it->second->world_size() != request.world_size()) {
    return absl::OkStatus();
  }
  // Is this rank already in the save, and from which process?
  const SaveSession::RankState was = it->second->Rank(rank);
  // The same process asking again before it reported its writes is a
  // retry (answered by the session). A new process (the rank restarted), or
  // the same one after it reported (it is saving again and may rewrite
  // what it reported), would write into objects whose crc32c cairnd
  // already holds: abort this attempt and give the save a fresh one.
  const bool restarted = was.in_save && incarnation != 0 &&
                         was.incarnation != 0 && was.incarnation != incarnation;
  const bool again = was.in_save && !restarted && was.reported;
  if (!restarted && !again) return absl::OkStatus();
  if (it->second->phase() == Phase::kCommitting) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step),
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
                    " restarted during the save (process %016x replaced "
                    "%016x%s)",
                    incarnation, was.incarnation,
                    was.waiting ? absl::StrCat(", which is still waiting in "
                                               "BeginSave: two processes for "
                                               "rank ",
                                               rank, "?")
                                : "")
              : " called BeginSave again after reporting its writes",
          "; the save starts over")),
      answers);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SaveSession>> Coordinator::SessionToJoinLocked(
    const std::string& job, int64_t step, int rank, int world) {
  const SaveKey key{job, step};
  if (auto it = sessions_.find(key); it != sessions_.end()) return it->second;
  if (auto t = tombstones_.find(key);
      t != tombstones_.end() && absl::Now() < t->second.refuse_until &&
      !std::binary_search(t->second.arrived.begin(), t->second.arrived.end(),
                          rank)) {
    return t->second.status;
  }
  // A new save (or a new attempt after an abort).
  int of_job = 0;
  for (const auto& [k, live] : sessions_) of_job += k.first == job;
  if (of_job >= options_.max_sessions_per_job ||
      static_cast<int>(sessions_.size()) >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                     ": too many saves in progress (", of_job, " of job '", job,
                     "', at most ", options_.max_sessions_per_job, "; ",
                     sessions_.size(), " in total, at most ",
                     options_.max_sessions, "); finish or abort one first"));
  }
  tombstones_.erase(key);
  auto fresh = std::make_shared<SaveSession>(job, step, world, NewAttemptName(),
                                             store_->uri(), absl::Now(),
                                             options_.begin_deadline);
  sessions_.emplace(key, fresh);
  return fresh;
}

// ---------------------------------------------------------------------------
// Planning

void Coordinator::PlanSession(const std::shared_ptr<SaveSession>& session) {
  // Plans are immutable once every rank arrived; read them without the lock.
  planner::PlanCache::Key key{session->job(), session->world_size(),
                              session->fingerprints(), storage_settings_};
  std::shared_ptr<const planner::GlobalSavePlan> plan = plan_cache_.Lookup(key);
  const bool from_cache = plan != nullptr;
  if (plan == nullptr && AskForMissingPlans(session)) return;
  if (plan == nullptr) {
    std::vector<const planner::PackedLocalPlan*> locals;
    locals.reserve(session->world_size());
    for (const auto& p : session->plans()) locals.push_back(p.get());
    absl::StatusOr<planner::GlobalSavePlan> built =
        planner::BuildGlobalSavePlan(session->job(), session->step(), locals,
                                     options_.save_plan);
    if (!built.ok()) {
      AbortSession(session, built.status());
      return;
    }
    plan = std::make_shared<const planner::GlobalSavePlan>(std::move(*built));
    if (const size_t charge = plan_cache_.Insert(key, plan); charge > 0) {
      const size_t mib = (charge + (size_t{1} << 20) - 1) >> 20;
      CAIRN_LOG(warn,
                "{}: its global plan ({} MiB) is larger than the plan cache "
                "(--plan-cache-mib {}), so every save of this job is planned "
                "anew and its ranks may have to resend their plans; set "
                "--plan-cache-mib to at least {}",
                SaveName(session->job(), session->step()), mib,
                plan_cache_.max_bytes() >> 20, mib);
    }
  }
  std::string plan_id = planner::PlanId(key, VersionString("cairnd"));

  // Storage, not the catalog, says what is committed: a step whose MANIFEST
  // is there (its catalog write failed after the publish, say) is never
  // saved over. Its record is repaired; the ranks hear ALREADY_EXISTS.
  if (absl::StatusOr<storage::ManifestSummary> m = storage::ReadManifestSummary(
          *store_, session->job(), session->step());
      m.ok() || !absl::IsNotFound(m.status())) {
    if (m.ok()) {
      (void)catalog_->PutCheckpoint(
          storage::RecordFromManifest(*m, store_->uri()));
    }
    AbortSession(session, m.ok()
                              ? absl::AlreadyExistsError(absl::StrCat(
                                    SaveName(session->job(), session->step()),
                                    " is already committed; save a new step"))
                              : m.status());
    return;
  }

  // The tier: what the ranks asked for, the job's policy, the live agents.
  absl::StatusOr<TierChoice> tier = ChooseSessionTier(*session);
  if (!tier.ok()) {
    AbortSession(session, tier.status());
    return;
  }

  v1::CheckpointRecord record;
  record.set_job(session->job());
  record.set_step(session->step());
  record.set_tier(tier->tier);
  record.set_replicas(tier->replicas);
  record.set_state(v1::CHECKPOINT_STATE_WRITING);
  record.set_world_size(session->world_size());
  record.set_created_unix_micros(absl::ToUnixMicros(session->created()));
  record.set_storage_uri(store_->uri());
  if (absl::Status s = catalog_->PutCheckpoint(record); !s.ok()) {
    AbortSession(session, s);
    return;
  }

  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (session->phase() != Phase::kPlanning) return;  // aborted meanwhile
    if (plan_versions_.size() >= kMaxPlanVersionJobs &&
        !plan_versions_.contains(session->job())) {
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
    uint64_t& version = plan_versions_[session->job()];
    if (!from_cache) ++version;
    if (from_cache) {
      ++stats_.plans_from_cache;
      m_.save_plan_hits->Increment();
    } else {
      ++stats_.plans_built;
      m_.save_plan_misses->Increment();
    }
    session->set_tier(tier->tier, tier->replicas);
    for (auto& [r, done] :
         session->Planned(plan, plan_id, version, from_cache, absl::Now(),
                          options_.commit_deadline)) {
      answers.push_back([session, r = r, done = std::move(done)] {
        done(session->RankResponse(r));
      });
    }
  }
  CAIRN_LOG(info, "{}: plan v{} for {} ranks ({}, {} tier{})",
            SaveName(session->job(), session->step()), session->plan_version(),
            session->world_size(), from_cache ? "cached" : "built",
            TierName(tier->tier),
            tier->tier == v1::TIER_MEMORY
                ? absl::StrCat(", ", tier->replicas, " replicas")
                : std::string());
  for (auto& a : answers) a();
}

bool Coordinator::AskForMissingPlans(
    const std::shared_ptr<SaveSession>& session) {
  std::vector<int> missing;
  const auto& plans = session->plans();
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    if (plans[r] == nullptr) missing.push_back(r);
  }
  if (missing.empty()) return false;
  std::vector<SaveSession::BeginWaiter> resend;
  {
    absl::MutexLock lock(&mu_);
    if (session->phase() != Phase::kPlanning) return true;  // aborted
    resend = session->NeedPlansOf(missing);
  }
  CAIRN_LOG(info,
            "{}: no cached plan, and cairnd no longer holds the local plans of "
            "{} of {} ranks (--known-plan-cache-mib): asking them to resend",
            SaveName(session->job(), session->step()), missing.size(),
            session->world_size());
  for (auto& [r, done] : resend) {
    v1::BeginSaveResponse again;
    again.set_resend_plan(true);
    done(std::move(again));
  }
  return true;
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

  {
    absl::MutexLock lock(&mu_);
    if (session->phase() == Phase::kAborted) {
      return done(session->abort_status());
    }
    if (session->phase() == Phase::kGathering ||
        session->phase() == Phase::kPlanning) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " of ", SaveName(job, step),
                       " called CommitSave before the plan was built")));
    }
  }
  if (rank < 0 || rank >= session->world_size()) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " of ", SaveName(job, step),
        " is out of range for world_size ", session->world_size())));
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = session->CheckIncarnation(rank, request.incarnation());
        !s.ok()) {
      return done(s);
    }
  }
  // The plan is immutable once written to: checked without the lock.
  absl::StatusOr<std::vector<uint32_t>> crc32cs =
      session->CheckResults(rank, request);
  if (!crc32cs.ok()) return done(crc32cs.status());
  // A memory save's rank names where its shards are held; too few copies
  // can never commit, so the save is aborted for every rank at once.
  std::vector<int> holders;
  if (session->tier() == v1::TIER_MEMORY) {
    absl::StatusOr<std::vector<int>> checked = CheckHolders(
        absl::StrCat("rank ", rank, " of ", SaveName(job, step)),
        request.holder_nodes(), session->replicas(), options_.max_agents);
    if (!checked.ok()) {
      if (absl::IsFailedPrecondition(checked.status())) {
        AbortSession(session, checked.status());
      }
      return done(checked.status());
    }
    holders = *std::move(checked);
  }

  bool commit_now = false;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    absl::Status answer;
    if (session->tier() == v1::TIER_MEMORY &&
        session->phase() == Phase::kWriting) {
      session->SetHolders(rank, std::move(holders));
    }
    switch (session->Commit(rank, *std::move(crc32cs), done, &answer)) {
      case SaveSession::Report::kParked:
        break;
      case SaveSession::Report::kAllReported:
        commit_now = true;
        break;
      case SaveSession::Report::kConflict:
        AbortSessionLocked(
            session,
            absl::AbortedError(absl::StrCat(
                "save of ", SaveName(job, step), " aborted: rank ", rank,
                " committed twice with different checksums (its objects may "
                "have been rewritten); the save starts over")),
            &answers);
        answer = session->abort_status();
        [[fallthrough]];
      case SaveSession::Report::kAnswered:
        answers.push_back([done = std::move(done), answer] { done(answer); });
        break;
    }
  }
  for (auto& a : answers) a();
  if (commit_now) {
    workers_->Schedule([this, session] { CommitSession(session); });
  }
}

void Coordinator::CommitSession(std::shared_ptr<SaveSession> session) {
  const absl::Time commit_start = absl::Now();
  const std::string name = SaveName(session->job(), session->step());
  // Built, checked and encoded tensor by tensor from the plan: the manifest
  // is never whole in memory as messages, nor (when large) as bytes.
  // The chunks are gathered and sorted once, for both runs of `build`.
  storage::ManifestSummary published;
  absl::StatusOr<std::shared_ptr<const SaveSession::ManifestParts>> parts =
      session->GatherManifest();
  auto build =
      [&](v1::Manifest* header,
          absl::FunctionRef<absl::Status(const v1::ManifestTensor&)> add) {
        CAIRN_RETURN_IF_ERROR(parts.status());
        return session->BuildManifest(
            **parts, header, [&](v1::ManifestTensor& t) { return add(t); });
      };
  // No commit without the storage's lease: another cairnd may own it now.
  if (absl::Status s = CheckStorageLease(name); !s.ok()) {
    return AbortSession(session, s);
  }
  // A memory checkpoint's MANIFEST goes to cairnd's own store (its bytes
  // are in the agents' memory, which the ranks' holder_nodes vouch for);
  // a persistent one's to storage, where PublishManifest checks that every
  // object holds every planned byte.
  const bool in_memory = session->tier() == v1::TIER_MEMORY;
  storage::ShardStore& target = in_memory ? *memory_store_ : *store_;
  storage::PublishOptions publish;
  publish.max_held_bytes = options_.manifest_held_bytes;
  publish.check_objects = !in_memory;
  if (absl::Status s =
          storage::PublishManifest(target, build, publish, &published);
      !s.ok()) {
    // The MANIFEST may be visible even so (a failure after the rename): it
    // goes before the objects it names, or they stay.
    absl::Status undo =
        target.Delete(storage::ManifestKey(session->job(), session->step()));
    if (!undo.ok() && !absl::IsNotFound(undo)) {
      CAIRN_LOG(error,
                "{}: the commit failed and its MANIFEST cannot be removed "
                "({}); keeping its objects for recovery",
                name, undo.ToString());
      absl::MutexLock lock(&mu_);
      session->set_keep_objects();
    }
    return AbortSession(session, s);
  }
  parts = nullptr;  // the gathered chunks (585 MB at 16k ranks) are done
  CAIRN_CRASH_POINT("coordinator.commit.after_manifest_publish");
  // The record of what was published (its header is the session's job, step,
  // world size and creation time), committed now.
  v1::CheckpointRecord record =
      storage::RecordFromManifest(published, store_->uri());
  record.set_committed_unix_micros(NowMicros());
  record.set_tier(session->tier());
  if (in_memory) {
    record.set_replicas(session->replicas());
    std::set<int> nodes;
    for (const std::vector<int>& h : session->holders()) {
      nodes.insert(h.begin(), h.end());
    }
    for (int n : nodes) record.add_holder_nodes(n);
    // Known before the record is: `latest` may resolve to it at once.
    holdings_.Committed(session->job(), session->step(), session->holders(),
                        absl::Now());
  }
  // The manifest is durable: the checkpoint is committed whatever happens to
  // the catalog write (a restart rebuilds it from storage).
  if (absl::Status s = catalog_->PutCheckpoint(record); !s.ok()) {
    CAIRN_LOG(error, "{}: committed on storage but catalog write failed: {}",
              name, s.ToString());
  }
  const absl::Time committed = absl::Now();
  m_.commit_seconds->Observe(absl::ToDoubleSeconds(committed - commit_start));
  m_.save_seconds->Observe(
      absl::ToDoubleSeconds(committed - session->created()));
  m_.bytes_saved->Increment(static_cast<double>(record.total_bytes()));
  m_.saves_committed->Increment();
  CAIRN_LOG(info, "{}: committed ({} bytes, {} tensors, {} ranks, {}{})", name,
            record.total_bytes(), record.num_tensors(), session->world_size(),
            TierName(record.tier()),
            in_memory ? absl::StrCat(" on nodes ",
                                     absl::StrJoin(record.holder_nodes(), ","))
                      : std::string());
  CAIRN_CRASH_POINT("coordinator.commit.after_catalog_commit");

  std::vector<Done<v1::CommitSaveResponse>> waiters;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.commits;
    waiters = session->TakeCommitWaiters();
    auto it = sessions_.find(SaveKey{session->job(), session->step()});
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
  }
  manifests_.Erase(SaveKey{session->job(), session->step()});
  RetainAfterCommit(session->job(), record.tier());
  // Every other attempt of this step is aborted: what they (or ranks that
  // died mid-write) left in the step is garbage.
  if (!in_memory) SweepCommittedStep(*store_, published.header);
  for (auto& done : waiters) {
    v1::CommitSaveResponse resp;
    *resp.mutable_checkpoint() = record;
    done(std::move(resp));
  }
  // On this worker, after every rank has its answer (a shutdown stops it).
  if (options_.prepare_loads) PrepareLoad(session->job(), session->step());
}

void Coordinator::AbortSessionLocked(
    const std::shared_ptr<SaveSession>& session, const absl::Status& status,
    std::vector<std::function<void()>>* answers) {
  if (session->phase() == Phase::kAborted) return;
  ++stats_.aborts;
  m_.save_failures->Get({absl::StatusCodeToString(status.code())})->Increment();
  // The session leaves at once (its plans and waiters are freed when the
  // last call holding it returns); a tombstone answers late calls.
  const SaveKey key{session->job(), session->step()};
  auto live = sessions_.find(key);
  if (live != sessions_.end() && live->second == session) {
    sessions_.erase(live);
    Tombstone& t = tombstones_[key];
    t = Tombstone();
    t.status = status;
    t.seq = ++tombstone_seq_;
    if (session->world_mismatch()) {
      t.refuse_until = session->deadline();
      t.arrived = session->ArrivedRanks();
    }
    tombstone_order_.emplace_back(key, tombstone_seq_);
    while (tombstone_order_.size() > kMaxTombstones) {
      auto& [old_key, seq] = tombstone_order_.front();
      auto t = tombstones_.find(old_key);
      if (t != tombstones_.end() && t->second.seq == seq) tombstones_.erase(t);
      tombstone_order_.pop_front();
    }
  }
  session->Abort(status, answers);
  // Record the abort and delete this attempt's objects off the lock.
  answers->push_back([this, session, status] {
    CAIRN_LOG(warn, "save of {} aborted: {}",
              SaveName(session->job(), session->step()), status.ToString());
    CAIRN_CRASH_POINT("coordinator.abort.before_cleanup");
    v1::CheckpointRecord record;
    record.set_job(session->job());
    record.set_step(session->step());
    record.set_state(v1::CHECKPOINT_STATE_ABORTED);
    record.set_world_size(session->world_size());
    record.set_created_unix_micros(absl::ToUnixMicros(session->created()));
    record.set_storage_uri(store_->uri());
    record.set_abort_reason(Truncated(status.message(), 4 * kMaxReasonBytes));
    bool newer = false;  // a later attempt owns the record now
    bool keep_objects = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(SaveKey{session->job(), session->step()});
      newer = it != sessions_.end() && it->second != session;
      keep_objects = session->keep_objects();
    }
    absl::StatusOr<v1::CheckpointRecord> prev =
        catalog_->GetCheckpoint(session->job(), session->step());
    if (!newer &&
        (!prev.ok() || (prev->state() != v1::CHECKPOINT_STATE_COMMITTED &&
                        prev->state() != v1::CHECKPOINT_STATE_DELETING))) {
      (void)catalog_->PutCheckpoint(record);
      PruneAbortedRecords(*catalog_, session->job());
    }
    if (keep_objects) return;
    absl::Status del = store_->DeletePrefix(
        absl::StrCat(session->step_prefix(), session->attempt(), "/"));
    if (!del.ok()) {
      CAIRN_LOG(warn, "cleanup of aborted save of {} failed: {}",
                SaveName(session->job(), session->step()), del.ToString());
    }
  });
}

void Coordinator::AbortSession(const std::shared_ptr<SaveSession>& session,
                               const absl::Status& status) {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    AbortSessionLocked(session, status, &answers);
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
    // A process whose BeginSave left the save (its call was cancelled, say
    // by Checkpointer::Cancel) and no other has joined for it still aborts it.
    const SaveSession::RankState was = session->Rank(rank);
    if (request.incarnation() != 0 &&
        ((!was.in_save && !was.departed) ||
         (was.incarnation != 0 && was.incarnation != request.incarnation()))) {
      // An old process of a restarted rank, aborting the save it was in:
      // that one is already gone, and this one is not its to abort.
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d (process %016x) is not part of the save of %s in progress "
          "(the save started over without it); not aborted",
          rank, request.incarnation(),
          SaveName(request.job(), request.step())));
    }
    if (session->phase() == Phase::kCommitting) {
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

}  // namespace cairn::coordinator
