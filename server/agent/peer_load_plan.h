// Peer load planning: the pure "who holds what -> transfers" step of a peer
// load. From the inventories of the nodes (which saved items each holds in
// memory), the checkpoint's manifest and a rank's wanted chunks/bytes, it
// lays out the load segment and builds the planner::TransferPlan that fills
// it. No I/O, no Agent state, no RPCs: PeerLoader::Load gathers the
// inventories, calls PlanPeerLoad, then executes the plan.
#ifndef CAIRN_SERVER_AGENT_PEER_LOAD_PLAN_H_
#define CAIRN_SERVER_AGENT_PEER_LOAD_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cairn/v1/agent.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/box.h"
#include "planner/transfer_plan.h"

namespace cairn::agent {

// Where a destination box lands in the load segment.
struct PeerLoadDest {
  uint64_t offset = 0;  // in the load segment
  planner::ChunkBox box;
};

// The saved copy a planned send reads from.
struct PeerLoadSource {
  v1::WriteItem item;     // the held item (as a holder reported it)
  planner::ChunkBox box;  // its box
  uint32_t crc32c = 0;    // the manifest's crc of that box
};

struct PeerLoadPlan {
  // Planner tensors: one per wanted tensor fqn, one per wanted bytes entry
  // (named "\x01bytes:<fqn>", a 1-D uint8 tensor). Sources are the holders
  // of the manifest's chunks; destinations are this node's wanted boxes.
  std::vector<planner::TransferTensor> tensors;
  // dests[t][d]: where tensors[t].destinations[d] lands in the segment.
  std::vector<std::vector<PeerLoadDest>> dests;
  planner::TransferPlan transfers;
  uint64_t total_bytes = 0;  // load segment size needed
  // Filled: step, wanted_offsets, wanted_bytes_offsets, wanted_bytes_lengths.
  v1::AgentLoadResponse response;

  // The held copy `send` reads (its item, box and expected crc).
  PeerLoadSource SourceOf(const planner::TransferSend& send) const;

  // (plan name, box) -> a held item / the manifest's crc.
  std::map<std::pair<std::string, planner::ChunkBox>, v1::WriteItem> items;
  std::map<std::pair<std::string, planner::ChunkBox>, uint32_t> expected;
};

struct PeerLoadPlanOptions {
  int node_id = 0;  // the loading node (destination of every transfer)
  uint64_t bucket_cap_bytes = uint64_t{32} << 20;
};

// held_by[n]: the sets node n reported holding for (job, step) (empty if
// unreachable). Errors name job, step, rank and fqn: NOT_FOUND for a wanted
// tensor/bytes entry the manifest lacks; INVALID_ARGUMENT for a dtype/shape
// mismatch or bad box; the planner's errors (e.g. FAILED_PRECONDITION with
// the fqn and missing box when no holder has a wanted region) prefixed with
// "<where>: memory tiers cannot serve it: ".
absl::StatusOr<PeerLoadPlan> PlanPeerLoad(
    const v1::AgentLoadRequest& request, int64_t step,
    const v1::Manifest& manifest,
    const std::vector<std::vector<v1::HeldSet>>& held_by,
    const PeerLoadPlanOptions& options);

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_PEER_LOAD_PLAN_H_
