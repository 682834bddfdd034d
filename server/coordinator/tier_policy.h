// Multi-tier saves, the pure parts: which tier a save goes to (what its
// ranks asked for and the job's policy), whether a policy can be met by the
// agents that report, and the holders a memory save's rank commits with.
// No state, no I/O: the coordinator passes in what it knows.
#ifndef CAIRN_SERVER_COORDINATOR_TIER_POLICY_H_
#define CAIRN_SERVER_COORDINATOR_TIER_POLICY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cairn/v1/cairn.pb.h"

namespace cairn::coordinator {

// What one rank's BeginSave asked for.
struct TierAsk {
  v1::Tier tier = v1::TIER_UNSPECIFIED;
  bool agent_holds = false;  // the rank saves through a cairn-agent
  int replicas = 0;          // its agent's default copies beyond one
};

struct TierChoice {
  v1::Tier tier = v1::TIER_PERSISTENT;
  int replicas = 0;  // memory saves: k
};

// The tier of the save of (job, step) by `asks` (every rank's), under
// `policy` (null: the job has none), with `live_nodes` agents reporting:
//   * ranks naming a tier must agree (INVALID_ARGUMENT naming two that
//     differ); a named tier wins over the policy;
//   * else with a policy: persistent when step is a multiple of
//     persist_every, memory otherwise; without one: persistent;
//   * a memory save needs every rank to save through an agent: asked for
//     explicitly, FAILED_PRECONDITION naming a rank that does not; by the
//     policy, the save is persisted instead (nothing is lost);
//   * k is the policy's replicas, else the largest the ranks' agents ask
//     for; a memory save needs k + 1 live nodes (FAILED_PRECONDITION naming
//     both numbers).
absl::StatusOr<TierChoice> ChooseTier(absl::string_view job, int64_t step,
                                      const std::map<int, TierAsk>& asks,
                                      const v1::JobPolicy* policy,
                                      int live_nodes);

// What SetJobPolicy checks a policy against.
struct PolicyContext {
  int live_nodes = 0;         // agents reporting now
  uint64_t budget_bytes = 0;  // their memory budgets, summed
  uint64_t job_bytes = 0;     // the job's newest checkpoint (0: none yet)
};

// INVALID_ARGUMENT for a policy that is malformed (memory_every < 1,
// persist_every not a positive multiple of it, replicas or keep_persistent
// < 0, keep_memory < 1); FAILED_PRECONDITION, naming the numbers, for one
// the agents cannot meet: replicas + 1 copies need that many nodes, and
// keep_memory checkpoints of job_bytes, each (replicas + 1) times, must fit
// in the budgets.
absl::Status ValidatePolicy(const v1::JobPolicy& policy,
                            const PolicyContext& context);

// The holders a memory save's rank commits with (CommitSaveRequest.
// holder_nodes): INVALID_ARGUMENT naming the rank for a node id outside
// [0, max_nodes) or a repeated one, FAILED_PRECONDITION for fewer than
// replicas + 1. `where`: "rank 3 of job 'llama' step 100".
absl::StatusOr<std::vector<int>> CheckHolders(
    absl::string_view where,
    const google::protobuf::RepeatedField<int32_t>& holder_nodes, int replicas,
    int max_nodes);

// "TIER_MEMORY" -> "memory", for messages and the CLI.
std::string TierName(v1::Tier tier);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_TIER_POLICY_H_
