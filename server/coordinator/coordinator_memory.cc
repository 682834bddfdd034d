// Multi-tier saves on the coordinator: the job policies, the agents'
// reports of what they hold, which checkpoint `latest` is (the newest that
// can be restored now), and the live copies records show. See
// tier_policy.h and memory_holdings.h for the pure parts.
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
  // What the node holds of checkpoints that are gone, or persisted.
  v1::ReportHoldingsResponse resp;
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
