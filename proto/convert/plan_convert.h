// Conversions between cairn.v1 wire messages and the planner's C++ types.
//
// The planner is a pure library with its own structs; the coordinator and the
// client speak cairn.v1. Every *FromProto function validates what the wire
// can get wrong (unknown dtype or write item kind, offsets/sizes of different
// rank, too many dims, negative offsets or sizes, a chunk ending past 2^63 - 1)
// as INVALID_ARGUMENT naming the fqn; deeper semantic checks (empty fqns,
// coverage, bounds against the global shape, lengths) stay in the planner,
// which knows the job and rank for its messages.
#ifndef CAIRN_PROTO_CONVERT_PLAN_CONVERT_H_
#define CAIRN_PROTO_CONVERT_PLAN_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/layout.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"

namespace cairn::convert {

absl::StatusOr<planner::DType> DTypeFromProto(v1::DType dtype,
                                              absl::string_view fqn);
v1::DType DTypeToProto(planner::DType dtype);

absl::StatusOr<planner::ChunkBox> BoxFromProto(const v1::ChunkBox& box,
                                               absl::string_view fqn);
void BoxToProto(const planner::ChunkBox& box, v1::ChunkBox* out);
// Whether `box`, straight from a request, has `outer`'s dims, no empty dim,
// and lies inside `outer` (a box of a validated shape): what BoxFromProto,
// !IsEmpty and Contains say together, without making a ChunkBox of it
// (VerifyLoad at 3072 ranks checks 8 M pieces). Never computes the box's
// end, which a client may make overflow.
bool NonEmptyBoxInside(const v1::ChunkBox& box, const planner::ChunkBox& outer);

absl::StatusOr<planner::Shape> ShapeFromProto(
    const google::protobuf::RepeatedField<int64_t>& shape,
    absl::string_view fqn);

planner::StorageLocation LocationFromProto(const v1::StorageLocation& loc);
void LocationToProto(const planner::StorageLocation& loc,
                     v1::StorageLocation* out);

absl::StatusOr<planner::WriteItem> WriteItemFromProto(
    const v1::WriteItem& item);
void WriteItemToProto(const planner::WriteItem& item, v1::WriteItem* out);

absl::StatusOr<planner::LocalSavePlan> LocalPlanFromProto(
    const v1::LocalSavePlan& plan);
void LocalPlanToProto(const planner::LocalSavePlan& plan,
                      v1::LocalSavePlan* out);

// A rank's share of a global plan as the wire carries it: each write's item
// (fqn, dtype, shape and box spelled out) and location.
struct DecodedRankPlan {
  int rank = 0;
  std::vector<planner::WriteItem> items;
  std::vector<planner::StorageLocation> locations;  // locations[i]: items[i]
};
absl::StatusOr<DecodedRankPlan> RankPlanFromProto(const v1::RankSavePlan& plan);
// Rank `rank`'s share of `plan` (0 <= rank < plan.world_size).
void RankPlanToProto(const planner::GlobalSavePlan& plan, int rank,
                     v1::RankSavePlan* out);

absl::StatusOr<planner::DTensorLayout> LayoutFromProto(
    const v1::DTensorLayout& layout, absl::string_view fqn);
void LayoutToProto(const planner::DTensorLayout& layout,
                   v1::DTensorLayout* out);

// One tensor of a manifest with its stored chunks, for a LoadPlanner.
absl::StatusOr<planner::StoredTensor> StoredTensorFromProto(
    const v1::ManifestTensor& tensor);
// The same, with each chunk's object as its index: chunk_objects[i] for
// chunk i (ManifestValidator::chunk_objects()); INVALID_ARGUMENT if their
// numbers differ.
absl::StatusOr<planner::StoredTensorByIndex> StoredTensorByIndexFromProto(
    const v1::ManifestTensor& tensor, absl::Span<const uint32_t> chunk_objects);
// Every tensor of a manifest with its stored chunks.
absl::StatusOr<std::vector<planner::StoredTensor>> StoredTensorsFromManifest(
    const v1::Manifest& manifest);

absl::StatusOr<planner::WantedChunk> WantedFromProto(const v1::WantedChunk& w);
void WantedToProto(const planner::WantedChunk& w, v1::WantedChunk* out);

void ReadItemToProto(const planner::ReadItem& item, v1::ReadItem* out);
// The same message from LoadPlanner::PlanEach's view of the item, built
// without a planner::ReadItem in between.
void ReadViewToProto(const planner::LoadPlanner::ReadView& item,
                     v1::ReadItem* out);
absl::StatusOr<planner::ReadItem> ReadItemFromProto(const v1::ReadItem& item);

}  // namespace cairn::convert

#endif  // CAIRN_PROTO_CONVERT_PLAN_CONVERT_H_
