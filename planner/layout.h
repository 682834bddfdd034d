// Layouts: how a tensor is split over ranks, and the chunk each rank holds.
//
// DTensor-style layouts follow PyTorch's DTensor exactly. A device mesh has a
// shape (e.g. [2, 4]) and lists its ranks row-major over mesh coordinates; a
// rank's coordinate is the unravelled position of the rank in that list. One
// placement per mesh dim says what that mesh dim does to the tensor:
//   * Shard(d): split tensor dim d into mesh.shape[i] pieces with torch.chunk
//     rules: piece size = ceil(n / k), piece c = [c * size, min(n, (c+1) *
//     size)); trailing pieces may be smaller or empty (an empty piece sits at
//     offset n, as compute_local_shape_and_global_offset reports it).
//   * Replicate(): every coordinate along this mesh dim holds the same data.
//   * Partial(): the data is a pending reduction; it cannot be saved.
// Nested sharding (several mesh dims shard the same tensor dim) is applied in
// mesh-dim order: each Shard(d) splits the piece left by the previous ones,
// and offsets accumulate, as compute_local_shape_and_global_offset does.
//
// Explicit layouts (ShardedTensor-style irregular shards) are plain chunk
// lists per rank; CheckExactCover validates them, and the save planner runs
// the same check over all ranks' write items.
#ifndef CAIRN_PLANNER_LAYOUT_H_
#define CAIRN_PLANNER_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/box.h"

namespace cairn::planner {

struct Placement {
  enum class Kind { kShard, kReplicate, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // the tensor dim, for kShard only

  static Placement Shard(int d) { return {Kind::kShard, d}; }
  static Placement Replicate() { return {Kind::kReplicate, 0}; }
  static Placement Partial() { return {Kind::kPartial, 0}; }

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::kShard || a.dim == b.dim);
  }
};

// "Shard(1)", "Replicate()", "Partial()".
std::string PlacementToString(const Placement& p);

struct DeviceMesh {
  Shape shape;             // every dim >= 1
  std::vector<int> ranks;  // row-major over coordinates; distinct, >= 0
};

struct DTensorLayout {
  DeviceMesh mesh;
  std::vector<Placement> placements;  // one per mesh dim
};

// OK when: the mesh has 1..kMaxDims dims, each >= 1; ranks.size() ==
// product(mesh.shape); ranks distinct and >= 0; placements.size() == mesh
// dims; every Shard(d) has 0 <= d < global_shape.size(); global_shape valid.
// INVALID_ARGUMENT describing the first problem otherwise.
absl::Status ValidateLayout(const DTensorLayout& layout,
                            const Shape& global_shape);

// The chunks `rank` holds: one box (possibly empty, Volume 0, for trailing
// torch.chunk shards) when the rank is in the mesh, an empty vector when it
// is not. Validates the layout first.
//
// Example (PyTorch docs): mesh [4] ranks {0,1,2,3}, Shard(0), shape [10, 4]:
//   ranks 0..3 hold rows [0:3], [3:6], [6:9], [9:10].
absl::StatusOr<std::vector<ChunkBox>> LocalChunks(const DTensorLayout& layout,
                                                  const Shape& global_shape,
                                                  int rank);

// A box held by a rank.
struct RankChunk {
  int rank = 0;
  ChunkBox box;
};

// LocalChunks for every rank of the mesh, in mesh order (ranks[0] first).
absl::StatusOr<std::vector<RankChunk>> AllChunks(const DTensorLayout& layout,
                                                 const Shape& global_shape);

// Partial placements cannot be saved: INVALID_ARGUMENT naming `fqn` and the
// mesh dim. OK otherwise (does not validate the rest of the layout).
absl::Status CheckSavable(const DTensorLayout& layout, absl::string_view fqn);

// Validates an explicit chunk list of one tensor over all ranks: every box
// inside `global_shape`, and the boxes cover the tensor exactly once up to
// replication (identical boxes on several ranks are replicas; partial overlaps
// and gaps are INVALID_ARGUMENT naming fqn, the ranks and the boxes, e.g.
// "'w': rank 1 chunk [0:4, 2:6] partially overlaps rank 0 chunk [0:4, 0:4]"
// or "'w': chunks cover 12 of 16 elements of shape [4, 4]; e.g. [2:4, 2:4] is
// not covered").
// Empty boxes are ignored for coverage. O(n log n) with an OverlapIndex.
absl::Status CheckExactCover(absl::string_view fqn, const Shape& global_shape,
                             const std::vector<RankChunk>& chunks);

namespace internal {
// CheckExactCover's core over distinct non-empty boxes already validated to
// lie inside `global_shape`; holder[i] is a rank holding distinct[i] (for the
// messages).
absl::Status CheckDisjointCover(absl::string_view fqn,
                                const Shape& global_shape,
                                const std::vector<ChunkBox>& distinct,
                                const std::vector<int>& holder);
}  // namespace internal

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_LAYOUT_H_
