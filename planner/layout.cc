#include "planner/layout.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/overlap_index.h"

namespace cairn::planner {
namespace {

std::string MeshToString(const DeviceMesh& mesh) {
  return absl::StrCat("mesh ", ShapeToString(mesh.shape));
}

// The chunk held by the rank at row-major mesh position `pos`. The layout is
// valid. Mirrors compute_local_shape_and_global_offset: Shard placements are
// applied in mesh-dim order to the piece left by the previous ones.
ChunkBox ChunkAtPosition(const DTensorLayout& layout, const Shape& shape,
                         int64_t pos) {
  const size_t mesh_dims = layout.mesh.shape.size();
  int64_t coord[kMaxDims];
  for (size_t i = mesh_dims; i-- > 0;) {
    coord[i] = pos % layout.mesh.shape[i];
    pos /= layout.mesh.shape[i];
  }
  ChunkBox box = FullBox(shape);
  for (size_t i = 0; i < mesh_dims; ++i) {
    const Placement& p = layout.placements[i];
    if (p.kind != Placement::Kind::kShard) continue;
    const size_t d = static_cast<size_t>(p.dim);
    const int64_t n = box.sizes[d];
    const int64_t k = layout.mesh.shape[i];
    const int64_t piece = (n + k - 1) / k;  // torch.chunk: ceil(n / k)
    const int64_t start = std::min(n, piece * coord[i]);
    const int64_t end = std::min(n, start + piece);
    box.offsets[d] += start;
    box.sizes[d] = end - start;
  }
  return box;
}

}  // namespace

std::string PlacementToString(const Placement& p) {
  switch (p.kind) {
    case Placement::Kind::kShard:
      return absl::StrCat("Shard(", p.dim, ")");
    case Placement::Kind::kReplicate:
      return "Replicate()";
    case Placement::Kind::kPartial:
      return "Partial()";
  }
  return "Placement(?)";
}

absl::Status ValidateLayout(const DTensorLayout& layout,
                            const Shape& global_shape) {
  CAIRN_RETURN_IF_ERROR(ValidateShape(global_shape));
  const DeviceMesh& mesh = layout.mesh;
  if (mesh.shape.empty() || mesh.shape.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(
        absl::StrCat(MeshToString(mesh), " must have 1 to ", kMaxDims,
                     " dims, has ", mesh.shape.size()));
  }
  int64_t size = 1;
  for (int64_t d : mesh.shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(MeshToString(mesh), " has a dim < 1"));
    }
    if (size > (int64_t{1} << 31) / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(MeshToString(mesh), " has more than 2^31 positions"));
    }
    size *= d;
  }
  if (static_cast<int64_t>(mesh.ranks.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(MeshToString(mesh), " has ", size, " positions but lists ",
                     mesh.ranks.size(), " ranks"));
  }
  absl::flat_hash_set<int> seen;
  seen.reserve(mesh.ranks.size());
  for (int r : mesh.ranks) {
    if (r < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(MeshToString(mesh), " lists negative rank ", r));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(MeshToString(mesh), " lists rank ", r, " twice"));
    }
  }
  if (layout.placements.size() != mesh.shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        MeshToString(mesh), " has ", mesh.shape.size(), " dims but ",
        layout.placements.size(), " placements are given"));
  }
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    const Placement& p = layout.placements[i];
    if (p.kind == Placement::Kind::kShard &&
        (p.dim < 0 || static_cast<size_t>(p.dim) >= global_shape.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement ", PlacementToString(p), " on mesh dim ", i,
          " names a dim outside shape ", ShapeToString(global_shape)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChunkBox>> LocalChunks(const DTensorLayout& layout,
                                                  const Shape& global_shape,
                                                  int rank) {
  CAIRN_RETURN_IF_ERROR(ValidateLayout(layout, global_shape));
  std::vector<ChunkBox> out;
  const auto& ranks = layout.mesh.ranks;
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) return out;
  out.push_back(ChunkAtPosition(layout, global_shape, it - ranks.begin()));
  return out;
}

absl::StatusOr<std::vector<RankChunk>> AllChunks(const DTensorLayout& layout,
                                                 const Shape& global_shape) {
  CAIRN_RETURN_IF_ERROR(ValidateLayout(layout, global_shape));
  std::vector<RankChunk> out;
  out.reserve(layout.mesh.ranks.size());
  for (size_t pos = 0; pos < layout.mesh.ranks.size(); ++pos) {
    out.push_back(RankChunk{
        layout.mesh.ranks[pos],
        ChunkAtPosition(layout, global_shape, static_cast<int64_t>(pos))});
  }
  return out;
}

absl::Status CheckSavable(const DTensorLayout& layout, absl::string_view fqn) {
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    if (layout.placements[i].kind == Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", fqn, "' has a Partial() placement on mesh dim ", i,
                       " (a pending reduction); reduce it before saving"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckExactCover(absl::string_view fqn, const Shape& global_shape,
                             const std::vector<RankChunk>& chunks) {
  if (absl::Status s = ValidateShape(global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", fqn, "': ", s.message()));
  }
  // Distinct non-empty boxes, each with the lowest rank holding it.
  std::vector<int> order;
  order.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const RankChunk& c = chunks[i];
    if (absl::Status s = ValidateBoxInValidShape(c.box, global_shape);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", c.rank, " of '", fqn, "': ", s.message()));
    }
    if (!IsEmpty(c.box)) order.push_back(static_cast<int>(i));
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const int c = CompareBoxes(chunks[a].box, chunks[b].box);
    return c != 0 ? c < 0 : chunks[a].rank < chunks[b].rank;
  });
  std::vector<ChunkBox> distinct;
  std::vector<int> holder;  // rank of the first holder of distinct[i]
  for (int i : order) {
    if (!distinct.empty() && distinct.back() == chunks[i].box) continue;
    distinct.push_back(chunks[i].box);
    holder.push_back(chunks[i].rank);
  }
  return internal::CheckDisjointCover(fqn, global_shape, distinct, holder);
}

namespace internal {

absl::Status CheckDisjointCover(absl::string_view fqn,
                                const Shape& global_shape,
                                const std::vector<ChunkBox>& distinct,
                                const std::vector<int>& holder) {
  if (TilesAsGrid(global_shape, distinct)) return absl::OkStatus();
  OverlapIndex index(distinct);
  int64_t covered = 0;
  for (int i = 0; i < static_cast<int>(distinct.size()); ++i) {
    int hit = -1;
    if (index.AnyOverlap(distinct[i], i, &hit)) {
      const int a = std::min(i, hit), b = std::max(i, hit);
      return absl::InvalidArgumentError(
          absl::StrCat("'", fqn, "': rank ", holder[b], " chunk ",
                       BoxToString(distinct[b]), " partially overlaps rank ",
                       holder[a], " chunk ", BoxToString(distinct[a]),
                       " (chunks must be identical replicas or disjoint)"));
    }
    covered += Volume(distinct[i]);
  }
  const int64_t total = NumElements(global_shape);
  if (covered != total) {
    std::string example;
    ChunkBox gap;
    if (FindUncovered(index, FullBox(global_shape), &gap)) {
      example = absl::StrCat("; e.g. ", BoxToString(gap), " is not covered");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "'", fqn, "': chunks cover ", covered, " of ", total,
        " elements of shape ", ShapeToString(global_shape), example));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace cairn::planner
