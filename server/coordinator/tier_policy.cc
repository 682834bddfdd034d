// Multi-tier saves, the pure parts (tier_policy.h).
#include "server/coordinator/tier_policy.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cairn::coordinator {
namespace {

std::string SaveOf(absl::string_view job, int64_t step) {
  return absl::StrCat("job '", job, "' step ", step);
}

}  // namespace

std::string TierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_MEMORY:
      return "memory";
    case v1::TIER_PERSISTENT:
    case v1::TIER_UNSPECIFIED:
    default:
      return "persistent";
  }
}

absl::StatusOr<TierChoice> ChooseTier(absl::string_view job, int64_t step,
                                      const std::map<int, TierAsk>& asks,
                                      const v1::JobPolicy* policy,
                                      int live_nodes) {
  int named_rank = -1;
  v1::Tier named = v1::TIER_UNSPECIFIED;
  int agent_replicas = 0;
  for (const auto& [rank, ask] : asks) {
    agent_replicas = std::max(agent_replicas, ask.replicas);
    if (ask.tier == v1::TIER_UNSPECIFIED) continue;
    if (named_rank >= 0 && ask.tier != named) {
      return absl::InvalidArgumentError(absl::StrCat(
          SaveOf(job, step), ": rank ", named_rank, " asked for the ",
          TierName(named), " tier and rank ", rank, " for the ",
          TierName(ask.tier), " tier; every rank of a save names the same"));
    }
    named_rank = rank;
    named = ask.tier;
  }
  TierChoice choice;
  if (named != v1::TIER_UNSPECIFIED) {
    choice.tier = named;
  } else if (policy != nullptr && policy->persist_every() > 0) {
    choice.tier = step % policy->persist_every() == 0 ? v1::TIER_PERSISTENT
                                                      : v1::TIER_MEMORY;
  }
  if (choice.tier != v1::TIER_MEMORY) return choice;
  for (const auto& [rank, ask] : asks) {
    if (ask.agent_holds) continue;
    if (named == v1::TIER_UNSPECIFIED) {
      choice.tier = v1::TIER_PERSISTENT;  // the policy's: persist instead
      return choice;
    }
    return absl::FailedPreconditionError(
        absl::StrCat(SaveOf(job, step),
                     ": a memory save needs every rank to save through "
                     "a cairn-agent, and rank ",
                     rank, " saves directly"));
  }
  choice.replicas = policy != nullptr ? policy->replicas() : agent_replicas;
  if (choice.replicas + 1 > live_nodes) {
    return absl::FailedPreconditionError(
        absl::StrCat(SaveOf(job, step), ": a memory save with ",
                     choice.replicas, " replicas needs ", choice.replicas + 1,
                     " cairn-agents on distinct nodes, and ", live_nodes,
                     live_nodes == 1 ? " reports" : " report", " to cairnd"));
  }
  return choice;
}

absl::Status ValidatePolicy(const v1::JobPolicy& p,
                            const PolicyContext& context) {
  const std::string of = absl::StrCat("the policy of job '", p.job(), "'");
  if (p.memory_every() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        of, ": memory_every must be >= 1, got ", p.memory_every()));
  }
  if (p.persist_every() < p.memory_every() ||
      p.persist_every() % p.memory_every() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(of, ": persist_every (", p.persist_every(),
                     ") must be a positive multiple of memory_every (",
                     p.memory_every(), ")"));
  }
  if (p.replicas() < 0 || p.keep_persistent() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        of, ": replicas (", p.replicas(), ") and keep_persistent (",
        p.keep_persistent(), ") must be >= 0"));
  }
  if (p.keep_memory() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(of, ": keep_memory must be >= 1, got ", p.keep_memory()));
  }
  if (p.persist_every() == p.memory_every()) return absl::OkStatus();
  if (p.replicas() + 1 > context.live_nodes) {
    return absl::FailedPreconditionError(
        absl::StrCat(of, " cannot be met: ", p.replicas(), " replicas need ",
                     p.replicas() + 1, " cairn-agents on distinct nodes, and ",
                     context.live_nodes, " report to cairnd"));
  }
  const double needed = static_cast<double>(context.job_bytes) *
                        (p.replicas() + 1) * p.keep_memory();
  if (context.job_bytes > 0 &&
      needed > static_cast<double>(context.budget_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        of, " cannot be met: ", p.keep_memory(),
        " memory checkpoints of the job's ", context.job_bytes, " bytes, ",
        p.replicas() + 1, " copies each, need ", static_cast<uint64_t>(needed),
        " bytes, and the ", context.live_nodes,
        " agents' memory budgets add up to ", context.budget_bytes,
        " bytes (raise the agents' --staging-budget-mib, or lower keep_memory "
        "or replicas)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> CheckHolders(
    absl::string_view where,
    const google::protobuf::RepeatedField<int32_t>& holder_nodes, int replicas,
    int max_nodes) {
  std::set<int> seen;
  std::vector<int> nodes;
  for (int n : holder_nodes) {
    if (n < 0 || n >= max_nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": holder node ", n, " is outside [0, ", max_nodes, ")"));
    }
    if (!seen.insert(n).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": holder node ", n,
                       " is named twice; copies must be on "
                       "distinct nodes"));
    }
    nodes.push_back(n);
  }
  if (static_cast<int>(nodes.size()) < replicas + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": its shards are held by ", nodes.size(), " node(s) (",
        absl::StrJoin(nodes, ", "), "); the save needs ", replicas + 1));
  }
  return nodes;
}

}  // namespace cairn::coordinator
