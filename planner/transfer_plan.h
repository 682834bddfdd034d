// Transfer schedules for peer resharding between agents: which rank sends
// which box of which tensor to which rank, then how those sends are packed
// into messages. No all-gather, ever: every destination byte travels once,
// from one source.
//
// Inputs, per tensor: the sources (ranks holding boxes in memory; identical
// boxes on several ranks are replicas) and the destinations (ranks wanting
// boxes; several ranks may want the same or overlapping boxes, each gets its
// own copy).
//
// Algorithm (BuildTransferPlan):
//  1. Per tensor, group identical source boxes into distinct *source boxes*
//     with their holder ranks, and index them with an OverlapIndex. Distinct
//     source boxes must be disjoint (a layout's chunks are); a partial overlap
//     is INVALID_ARGUMENT.
//  2. For each destination box, query the index: each intersection with a
//     source box is one *piece* (dst rank, box, candidate holders). The
//     pieces' volumes must add up to the destination box's volume, otherwise
//     some destination byte has no source: FAILED_PRECONDITION.
//  3. Assign every piece to one holder, balancing the bytes each rank sends:
//     a piece the destination itself holds is a local copy (no network); a
//     piece with one holder goes to it; the rest are assigned in decreasing
//     size (ties by fqn, box, dst rank) to the holder that has sent the fewest
//     bytes so far (ties: the holder after the destination rank in cyclic
//     order, which spreads equal loads over replicas) — LPT scheduling,
//     deterministic.
//  4. Bucketing: network sends are grouped by (src rank, dst rank, dtype) and,
//     in (fqn, box) order, packed greedily into messages of at most
//     `bucket_cap_bytes`; a send at least that large travels alone. Each
//     message lists its sends with their byte offsets in the payload.
// Cost: O(P log P) for P pieces, plus O(D log S) index queries.
#ifndef CAIRN_PLANNER_TRANSFER_PLAN_H_
#define CAIRN_PLANNER_TRANSFER_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/layout.h"

namespace cairn::planner {

// One tensor to move: who holds what, who wants what.
struct TransferTensor {
  std::string fqn;
  DType dtype = DType::kUnspecified;
  Shape global_shape;
  std::vector<RankChunk> sources;       // may include replicas
  std::vector<RankChunk> destinations;  // may repeat boxes on several ranks
};

// One point-to-point copy of `box` (global coordinates).
struct TransferSend {
  int src_rank = 0;
  int dst_rank = 0;
  int tensor = 0;  // index into the input tensors
  std::string fqn;
  DType dtype = DType::kUnspecified;
  ChunkBox box;
  int source_index = 0;  // index into tensors[tensor].sources (the chosen one)
  int dest_index = 0;    // index into tensors[tensor].destinations
  uint64_t bytes = 0;    // Volume(box) * DTypeSize(dtype)
  bool local = false;    // src_rank == dst_rank: a local copy, in no message
};

// One network message: sends between one (src, dst) pair of one dtype,
// packed back to back in `parts` order.
struct TransferMessage {
  int src_rank = 0;
  int dst_rank = 0;
  DType dtype = DType::kUnspecified;
  uint64_t bytes = 0;  // payload size
  struct Part {
    int send = 0;             // index into TransferPlan::sends
    uint64_t payload_offset;  // where the send's bytes start in the payload
  };
  std::vector<Part> parts;
};

struct TransferPlan {
  // Sorted by (src_rank, dst_rank, dtype, fqn, box); local copies included.
  std::vector<TransferSend> sends;
  // Sorted by (src_rank, dst_rank, dtype, first send); local copies excluded.
  std::vector<TransferMessage> messages;
  uint64_t network_bytes = 0;        // sum of non-local send bytes
  uint64_t local_bytes = 0;          // sum of local copy bytes
  uint64_t max_rank_send_bytes = 0;  // busiest sender's network bytes
  uint64_t max_rank_recv_bytes = 0;  // busiest receiver's network bytes
};

struct TransferPlanOptions {
  // Messages carry at most this many payload bytes (a single larger send
  // travels alone). Must be >= 1. Default: 32 MiB.
  uint64_t bucket_cap_bytes = uint64_t{32} << 20;
};

// Errors: INVALID_ARGUMENT for empty/duplicate fqns, unknown dtypes, invalid
// shapes, boxes outside the shape, partially overlapping distinct source
// boxes (all naming fqn, ranks and boxes); FAILED_PRECONDITION when some
// destination box is not fully held by the sources (naming fqn, destination
// rank and box).
absl::StatusOr<TransferPlan> BuildTransferPlan(
    const std::vector<TransferTensor>& tensors,
    const TransferPlanOptions& options);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_TRANSFER_PLAN_H_
