// Multi-tier saves on the coordinator: the job policies, the agents'
// reports of what they hold, which checkpoint `latest` is (the newest that
// can be restored now), and the live copies records show. See
// tier_policy.h and memory_holdings.h for the pure parts.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_internal.h"
#include "server/coordinator/request_bounds.h"
#include "server/coordinator/save_session.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_keys.h"
#include "storage/checkpoint_layout.h"

namespace cairn::coordinator {
namespace {

// Memory checkpoints kept per job without a policy (saves that asked for
// the memory tier themselves).
constexpr int kDefaultKeepMemory = 2;

}  // namespace

storage::ShardStore& Coordinator::ManifestStore(
    const v1::CheckpointRecord& record) const {
  return record.tier() == v1::TIER_MEMORY ? *memory_store_ : *store_;
}

absl::StatusOr<storage::ShardStore*> Coordinator::ManifestStoreOf(
    const std::string& job, int64_t step) {
  absl::StatusOr<v1::CheckpointRecord> rec = catalog_->GetCheckpoint(job, step);
  if (absl::IsNotFound(rec.status())) return store_.get();
  CAIRN_RETURN_IF_ERROR(rec.status());
  return &ManifestStore(*rec);
}

void Coordinator::SettleHoldings(
    const std::vector<v1::CheckpointRecord>& records) {
  std::set<int> expected;
  for (const v1::CheckpointRecord& r : records) {
    if (r.tier() != v1::TIER_MEMORY ||
        r.state() != v1::CHECKPOINT_STATE_COMMITTED) {
      continue;
    }
    expected.insert(r.holder_nodes().begin(), r.holder_nodes().end());
  }
  if (expected.empty()) return;
  bool waited = false;
  while (!holdings_.Settled(expected, absl::Now()) &&
         !stopping_.load(std::memory_order_relaxed)) {
    if (!waited) {
      CAIRN_LOG(info,
                "waiting up to {} for the agents of nodes {} to report what "
                "they hold",
                absl::FormatDuration(holdings_.SettleDeadline() - absl::Now()),
                absl::StrJoin(expected, ","));
      waited = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Coordinator::AnnotateRecord(v1::CheckpointRecord* r,
                                 absl::Time now) const {
  if (r->state() != v1::CHECKPOINT_STATE_COMMITTED) return;
  const MemoryHoldings::Copies copies =
      holdings_.CopiesOf(r->job(), r->step(), r->world_size(), now);
  r->set_live_copies(copies.fewest);
  r->clear_live_holder_nodes();
  for (int n : copies.nodes) r->add_live_holder_nodes(n);
  if (r->tier() != v1::TIER_MEMORY) {
    r->set_restorable(true);
    return;
  }
  r->set_restorable(copies.ranks_without.empty());
  if (!copies.ranks_without.empty()) {
    std::vector<int> ranks = copies.ranks_without;
    std::string more;
    if (ranks.size() > 8) {
      more = absl::StrCat(" and ", ranks.size() - 8, " more");
      ranks.resize(8);
    }
    r->set_unrestorable_reason(absl::StrCat(
        "no live agent holds the shards of rank", ranks.size() > 1 ? "s " : " ",
        absl::StrJoin(ranks, ", "), more, " (held by nodes ",
        absl::StrJoin(r->holder_nodes(), ", "),
        " when it committed; nodes reporting now: ",
        copies.nodes.empty() ? std::string("none of those")
                             : absl::StrJoin(copies.nodes, ", "),
        ")"));
  }
}

absl::StatusOr<v1::CheckpointRecord> Coordinator::NewestRestorable(
    const std::string& job) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         catalog_->ListCheckpoints(job, false));
  if (records.empty()) {
    return absl::NotFoundError(
        absl::StrCat("job '", job, "' has no committed checkpoint"));
  }
  SettleHoldings(records);
  const absl::Time now = absl::Now();
  std::vector<std::string> lost;
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (it->tier() != v1::TIER_MEMORY) return *it;
    AnnotateRecord(&*it, now);
    if (it->restorable()) return *it;
    if (lost.size() < 3) {
      lost.push_back(
          absl::StrCat("step ", it->step(), ": ", it->unrestorable_reason()));
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "job '", job, "' has no checkpoint that can be restored now (",
      absl::StrJoin(lost, "; "), ")"));
}

absl::StatusOr<TierChoice> Coordinator::ChooseSessionTier(
    const SaveSession& session) {
  absl::StatusOr<v1::JobPolicy> policy = catalog_->GetPolicy(session.job());
  if (!policy.ok() && !absl::IsNotFound(policy.status())) {
    return policy.status();
  }
  return ChooseTier(session.job(), session.step(), session.tier_asks(),
                    policy.ok() ? &*policy : nullptr,
                    holdings_.LiveNodes(absl::Now()));
}

void Coordinator::RetainAfterCommit(const std::string& job, v1::Tier tier) {
  absl::StatusOr<v1::JobPolicy> policy = catalog_->GetPolicy(job);
  int keep = 0;
  if (tier == v1::TIER_MEMORY) {
    keep = policy.ok() ? policy->keep_memory() : kDefaultKeepMemory;
  } else {
    keep = policy.ok() && policy->keep_persistent() > 0
               ? policy->keep_persistent()
               : options_.keep_last;
  }
  if (keep <= 0) return;
  absl::StatusOr<v1::GarbageCollectResponse> gc =
      ApplyRetention(job, keep, false, tier);
  if (!gc.ok()) {
    CAIRN_LOG(warn, "retention for job '{}' failed: {}", job,
              gc.status().ToString());
  }
}

absl::StatusOr<v1::SetJobPolicyResponse> Coordinator::SetJobPolicy(
    const v1::SetJobPolicyRequest& request) {
  const v1::JobPolicy& policy = request.policy();
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(policy.job()));
  v1::SetJobPolicyResponse resp;
  if (request.clear()) {
    CAIRN_RETURN_IF_ERROR(catalog_->DeletePolicy(policy.job()));
    CAIRN_LOG(info, "job '{}': policy cleared (every save persistent)",
              policy.job());
    return resp;
  }
  PolicyContext context;
  for (const MemoryHoldings::Node& n : holdings_.Nodes(absl::Now())) {
    if (!n.live) continue;
    ++context.live_nodes;
    context.budget_bytes += n.budget_bytes;
  }
  absl::StatusOr<v1::CheckpointRecord> newest =
      catalog_->LatestCommitted(policy.job());
  if (newest.ok()) context.job_bytes = newest->total_bytes();
  CAIRN_RETURN_IF_ERROR(ValidatePolicy(policy, context));
  CAIRN_RETURN_IF_ERROR(catalog_->PutPolicy(policy));
  CAIRN_LOG(info,
            "job '{}': policy set: memory every {} steps with {} replicas, "
            "persisted every {}, keep {} memory and {} persistent",
            policy.job(), policy.memory_every(), policy.replicas(),
            policy.persist_every(), policy.keep_memory(),
            policy.keep_persistent());
  *resp.mutable_policy() = policy;
  return resp;
}

absl::StatusOr<v1::GetJobPolicyResponse> Coordinator::GetJobPolicy(
    const v1::GetJobPolicyRequest& request) {
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  v1::GetJobPolicyResponse resp;
  absl::StatusOr<v1::JobPolicy> policy = catalog_->GetPolicy(request.job());
  if (absl::IsNotFound(policy.status())) return resp;
  CAIRN_RETURN_IF_ERROR(policy.status());
  *resp.mutable_policy() = *std::move(policy);
  resp.set_set(true);
  return resp;
}

// ---------------------------------------------------------------------------
// Promotion to storage, and copies made again.

namespace {

// An order not answered within this time is sent again (a report may have
// been lost, the agent restarted); so is a copy that did not appear.
constexpr absl::Duration kOrderRetry = absl::Seconds(30);

}  // namespace

struct Coordinator::Promotion {
  std::string job;
  int64_t step = 0;
  int world = 0;
  std::map<int, int> assigned;          // rank -> node writing its shards
  std::map<int, absl::Time> ordered;    // rank -> when its order was queued
  std::map<int, std::set<int>> failed;  // rank -> nodes whose write failed
  std::set<int> done;                   // ranks whose shards are on storage
  bool finishing = false;
  std::string last_error;
  std::vector<std::pair<Done<v1::PersistCheckpointResponse>, absl::Time>>
      waiters;
};

void Coordinator::PersistCheckpoint(const v1::PersistCheckpointRequest& request,
                                    Done<v1::PersistCheckpointResponse> done) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);
  absl::StatusOr<v1::CheckpointRecord> rec = RecordOfStep(*catalog_, job, step);
  if (!rec.ok()) return done(rec.status());
  if (rec->state() != v1::CHECKPOINT_STATE_COMMITTED) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(SaveName(job, step), " is not committed (",
                     v1::CheckpointState_Name(rec->state()), ")")));
  }
  v1::PersistCheckpointResponse resp;
  if (rec->tier() != v1::TIER_MEMORY) {  // already on storage
    *resp.mutable_checkpoint() = *rec;
    return done(std::move(resp));
  }
  SettleHoldings({*rec});
  AnnotateRecord(&*rec, absl::Now());
  if (!rec->restorable()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("cannot persist ", SaveName(job, step), ": ",
                     rec->unrestorable_reason())));
  }
  const absl::Time deadline =
      absl::Now() + (request.timeout_ms() > 0
                         ? absl::Milliseconds(request.timeout_ms())
                         : absl::Minutes(10));
  const std::string why = "asked for (cairn persist)";
  if (request.wait()) {  // answered when it is on storage
    StartPromotion(*rec, std::move(done), deadline, why);
    return;
  }
  StartPromotion(*rec, nullptr, deadline, why);
  rec->set_persisting(true);
  *resp.mutable_checkpoint() = *rec;
  done(std::move(resp));
}

void Coordinator::StartPromotion(const v1::CheckpointRecord& record,
                                 Done<v1::PersistCheckpointResponse> done,
                                 absl::Time deadline, const std::string& why) {
  bool started = false;
  {
    absl::MutexLock l(&tend_mu_);
    std::shared_ptr<Promotion>& p =
        promotions_[SaveKey{record.job(), record.step()}];
    if (p == nullptr) {
      p = std::make_shared<Promotion>();
      p->job = record.job();
      p->step = record.step();
      p->world = record.world_size();
      started = true;
    }
    if (done) p->waiters.emplace_back(std::move(done), deadline);
  }
  if (!started) return;
  v1::CheckpointRecord persisting = record;
  persisting.set_persisting(true);
  persisting.clear_live_copies();
  persisting.clear_live_holder_nodes();
  persisting.clear_restorable();
  persisting.clear_unrestorable_reason();
  if (absl::Status s = catalog_->PutCheckpoint(persisting); !s.ok()) {
    CAIRN_LOG(warn, "{}: {}", SaveName(record.job(), record.step()),
              s.ToString());
  }
  CAIRN_LOG(info, "{}: writing the memory checkpoint to storage ({})",
            SaveName(record.job(), record.step()), why);
}

absl::StatusOr<v1::CheckpointRecord> Coordinator::FinishPromotion(
    const std::string& job, int64_t step) {
  const std::string name = SaveName(job, step);
  CAIRN_ASSIGN_OR_RETURN(v1::Manifest manifest,
                         storage::ReadManifest(*memory_store_, job, step));
  CAIRN_RETURN_IF_ERROR(CheckStorageLease(name));
  // Checks that every object holds every byte the manifest names.
  CAIRN_RETURN_IF_ERROR(storage::PublishManifest(*store_, manifest));
  CAIRN_ASSIGN_OR_RETURN(v1::CheckpointRecord rec,
                         catalog_->GetCheckpoint(job, step));
  rec.set_tier(v1::TIER_PERSISTENT);
  rec.set_persisting(false);
  rec.set_storage_uri(store_->uri());
  // Durable on storage: persistent whatever happens to this write (recovery
  // finds its MANIFEST there).
  if (absl::Status s = catalog_->PutCheckpoint(rec); !s.ok()) {
    CAIRN_LOG(error,
              "{}: persisted on storage but the catalog write failed: "
              "{}",
              name, s.ToString());
  }
  ForgetCheckpoint(job, step);
  if (absl::Status s = storage::DeleteStep(*memory_store_, job, step);
      !s.ok() && !absl::IsNotFound(s)) {
    CAIRN_LOG(warn, "{}: its memory manifest stays: {}", name, s.ToString());
  }
  CAIRN_LOG(info, "{}: persisted to {} (the agents' copies are a cache now)",
            name, store_->uri());
  RetainAfterCommit(job, v1::TIER_PERSISTENT);
  RetainAfterCommit(job, v1::TIER_MEMORY);
  return rec;
}

void Coordinator::TendMemoryCheckpoints() {
  const absl::Time now = absl::Now();
  if (stopping_.load(std::memory_order_relaxed) ||
      now < holdings_.SettleDeadline()) {
    return;  // what the agents hold is not known yet
  }
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records =
      catalog_->ListCheckpoints("", false);
  if (!records.ok()) return;
  std::vector<int> live;
  for (const MemoryHoldings::Node& n : holdings_.Nodes(now)) {
    if (n.live) live.push_back(n.node_id);
  }
  std::vector<v1::CheckpointRecord> to_promote;
  std::vector<SaveKey> to_finish;
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock l(&tend_mu_);
    std::set<SaveKey> memory;
    for (const v1::CheckpointRecord& r : *records) {
      if (r.tier() != v1::TIER_MEMORY) continue;
      const SaveKey key{r.job(), r.step()};
      memory.insert(key);
      const MemoryHoldings::Copies copies =
          holdings_.CopiesOf(r.job(), r.step(), r.world_size(), now);
      if (auto it = promotions_.find(key); it != promotions_.end()) {
        Promotion& p = *it->second;
        for (int rank = 0; rank < p.world; ++rank) {
          if (p.done.count(rank) > 0) continue;
          const std::vector<int>& holders = copies.by_rank[rank];
          std::set<int>& failed = p.failed[rank];
          auto usable = [&](int n) { return failed.count(n) == 0; };
          auto a = p.assigned.find(rank);
          if (a == p.assigned.end() ||
              std::find(holders.begin(), holders.end(), a->second) ==
                  holders.end() ||
              !usable(a->second)) {
            auto h = std::find_if(holders.begin(), holders.end(), usable);
            if (h == holders.end()) {
              if (holders.empty()) {
                p.last_error =
                    absl::StrCat("rank ", rank, " has no live copy to write");
              }
              failed.clear();  // every holder failed: a new round later
              continue;
            }
            p.assigned[rank] = *h;
            p.ordered.erase(rank);
          }
          auto o = p.ordered.find(rank);
          if (o != p.ordered.end() && now - o->second < kOrderRetry) continue;
          v1::PersistOrder* order = orders_[p.assigned[rank]].add_persist();
          order->set_job(p.job);
          order->set_step(p.step);
          order->set_rank(rank);
          p.ordered[rank] = now;
        }
        if (static_cast<int>(p.done.size()) == p.world && !p.finishing) {
          p.finishing = true;
          to_finish.push_back(key);
        }
      } else if (copies.ranks_without.empty() &&
                 copies.fewest < r.replicas() + 1) {
        to_promote.push_back(r);
      }
      // Ranks with too few copies get one on a live node lacking it.
      for (int rank = 0; rank < r.world_size(); ++rank) {
        const std::vector<int>& holders = copies.by_rank[rank];
        if (holders.empty() ||
            static_cast<int>(holders.size()) >= r.replicas() + 1) {
          copies_ordered_.erase(RankKey{r.job(), r.step(), rank});
          continue;
        }
        auto& ordered = copies_ordered_[RankKey{r.job(), r.step(), rank}];
        if (ordered.second != absl::Time() &&
            now - ordered.second < kOrderRetry) {
          continue;
        }
        auto target = std::find_if(live.begin(), live.end(), [&](int n) {
          return std::find(holders.begin(), holders.end(), n) == holders.end();
        });
        if (target == live.end()) continue;  // no node to put it on
        v1::ReplicateOrder* order = orders_[holders[0]].add_replicate();
        order->set_job(r.job());
        order->set_step(r.step());
        order->set_rank(rank);
        order->set_to_node(*target);
        ordered = {*target, now};
      }
    }
    // Promotions of checkpoints no longer in memory (deleted meanwhile).
    for (auto it = promotions_.begin(); it != promotions_.end();) {
      Promotion& p = *it->second;
      if (memory.count(it->first) > 0 || p.finishing) {
        for (auto w = p.waiters.begin(); w != p.waiters.end();) {
          if (now < w->second) {
            ++w;
            continue;
          }
          answers.push_back([done = std::move(w->first), job = p.job,
                             step = p.step, error = p.last_error] {
            done(absl::DeadlineExceededError(absl::StrCat(
                SaveName(job, step), " is still being written to storage",
                error.empty() ? std::string() : absl::StrCat(" (", error, ")"),
                "; `cairn ls` shows when it is persistent")));
          });
          w = p.waiters.erase(w);
        }
        ++it;
        continue;
      }
      for (auto& [done, deadline] : p.waiters) {
        answers.push_back([done = std::move(done), job = p.job, step = p.step] {
          done(absl::NotFoundError(
              absl::StrCat(SaveName(job, step),
                           " is gone: it was deleted while being "
                           "written to storage")));
        });
      }
      it = promotions_.erase(it);
    }
  }
  for (auto& a : answers) a();
  for (const v1::CheckpointRecord& r : to_promote) {
    StartPromotion(
        r, nullptr, absl::InfiniteFuture(),
        absl::StrCat("its live copies fell below ", r.replicas() + 1));
  }
  for (const SaveKey& key : to_finish) {
    workers_->Schedule([this, key] {
      absl::StatusOr<v1::CheckpointRecord> rec =
          FinishPromotion(key.first, key.second);
      std::vector<Done<v1::PersistCheckpointResponse>> waiters;
      {
        absl::MutexLock l(&tend_mu_);
        auto it = promotions_.find(key);
        if (it == promotions_.end()) return;
        Promotion& p = *it->second;
        if (rec.ok()) {
          for (auto& w : p.waiters) waiters.push_back(std::move(w.first));
          promotions_.erase(it);
        } else {
          // Write it again (objects may be missing), from the start.
          p.last_error = std::string(rec.status().message());
          p.finishing = false;
          p.done.clear();
          p.ordered.clear();
          for (auto& w : p.waiters) waiters.push_back(std::move(w.first));
          p.waiters.clear();
        }
      }
      if (!rec.ok()) {
        CAIRN_LOG(warn, "{}: publishing its MANIFEST on storage failed: {}",
                  SaveName(key.first, key.second), rec.status().ToString());
      }
      for (auto& done : waiters) {
        if (!rec.ok()) {
          done(rec.status());
          continue;
        }
        v1::PersistCheckpointResponse resp;
        *resp.mutable_checkpoint() = *rec;
        done(std::move(resp));
      }
    });
  }
}

absl::StatusOr<v1::ReportHoldingsResponse> Coordinator::ReportHoldings(
    const v1::ReportHoldingsRequest& request) {
  if (request.node_id() < 0 || request.node_id() >= options_.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportHoldings: node id ", request.node_id(),
                     " is outside [0, ", options_.max_agents, ")"));
  }
  for (const v1::HeldShards& h : request.held()) {
    if (absl::Status s = ValidateJobStep(h.job(), h.step()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReportHoldings of node ", request.node_id(), ": ", s.message()));
    }
  }
  holdings_.Report(request, absl::Now());
  // The outcomes of its orders, then what it is to do next.
  v1::ReportHoldingsResponse resp;
  {
    absl::MutexLock l(&tend_mu_);
    for (const v1::OrderResult& r : request.results()) {
      const bool ok = r.code() == static_cast<int32_t>(absl::StatusCode::kOk);
      if (r.to_node() >= 0) {  // a copy: its target's report shows it
        if (!ok) {
          CAIRN_LOG(warn, "node {}: copying {} to node {} failed: {}",
                    request.node_id(), SaveName(r.job(), r.step()), r.to_node(),
                    r.message());
          // Ordered again at the next tend (to a node that answers).
          copies_ordered_.erase(RankKey{r.job(), r.step(), r.rank()});
        }
        continue;
      }
      auto it = promotions_.find(SaveKey{r.job(), r.step()});
      if (it == promotions_.end()) continue;
      Promotion& p = *it->second;
      if (ok) {
        p.done.insert(r.rank());
      } else {
        p.failed[r.rank()].insert(request.node_id());
        p.ordered.erase(r.rank());
        p.last_error =
            absl::StrCat("node ", request.node_id(), ": ", r.message());
        CAIRN_LOG(warn, "node {}: writing rank {} of {} to storage failed: {}",
                  request.node_id(), r.rank(), SaveName(r.job(), r.step()),
                  r.message());
      }
    }
    if (auto o = orders_.find(request.node_id()); o != orders_.end()) {
      resp = std::move(o->second);
      orders_.erase(o);
    }
  }
  // What the node holds of checkpoints that are gone, or persisted.
  std::set<std::pair<std::string, int64_t>> seen;
  for (const v1::HeldShards& h : request.held()) {
    if (!h.memory_tier()) continue;
    absl::StatusOr<v1::CheckpointRecord> rec =
        catalog_->GetCheckpoint(h.job(), h.step());
    if (!rec.ok() && !absl::IsNotFound(rec.status())) return rec.status();
    const bool gone = !rec.ok() ||
                      rec->state() == v1::CHECKPOINT_STATE_ABORTED ||
                      rec->state() == v1::CHECKPOINT_STATE_DELETING;
    if (gone) {
      *resp.add_drop() = h;
    } else if (rec->state() == v1::CHECKPOINT_STATE_COMMITTED &&
               rec->tier() != v1::TIER_MEMORY) {
      *resp.add_unpin() = h;
    }
    if (gone && seen.insert({h.job(), h.step()}).second) {
      CAIRN_LOG(debug, "node {}: drop its shards of {} ({})", request.node_id(),
                SaveName(h.job(), h.step()),
                rec.ok() ? v1::CheckpointState_Name(rec->state())
                         : std::string("no record"));
    }
  }
  return resp;
}

}  // namespace cairn::coordinator
