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
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {
namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

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

std::string NewAttemptName() {
  static absl::Mutex* mu = new absl::Mutex;
  static absl::BitGen* gen = new absl::BitGen;
  absl::MutexLock lock(mu);
  return absl::StrFormat("attempt-%012x",
                         absl::Uniform<uint64_t>(*gen) & 0xffffffffffffULL);
}

}  // namespace

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
  SweepCommittedStep(*store_, *manifest);
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

}  // namespace cairn::coordinator
