#include "proto/convert/plan_convert.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cairn::convert {
namespace {

std::string Quoted(absl::string_view fqn) {
  return absl::StrCat("'", fqn, "'");
}

}  // namespace

absl::StatusOr<planner::DType> DTypeFromProto(v1::DType dtype,
                                              absl::string_view fqn) {
  const auto d = static_cast<planner::DType>(static_cast<int>(dtype));
  if (dtype == v1::DTYPE_UNSPECIFIED || planner::DTypeSize(d) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(fqn),
                                                   " has unknown dtype ",
                                                   static_cast<int>(dtype)));
  }
  return d;
}

v1::DType DTypeToProto(planner::DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype));
}

absl::StatusOr<planner::ChunkBox> BoxFromProto(const v1::ChunkBox& box,
                                               absl::string_view fqn) {
  if (box.offsets_size() != box.sizes_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", Quoted(fqn), " has ", box.offsets_size(),
                     " offsets but ", box.sizes_size(), " sizes"));
  }
  if (box.offsets_size() > planner::kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", Quoted(fqn), " has ", box.offsets_size(),
                     " dims; at most ", planner::kMaxDims, " are supported"));
  }
  planner::ChunkBox out;
  out.offsets.assign(box.offsets().begin(), box.offsets().end());
  out.sizes.assign(box.sizes().begin(), box.sizes().end());
  for (size_t d = 0; d < out.sizes.size(); ++d) {
    if (out.offsets[d] < 0 || out.sizes[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of ", Quoted(fqn),
                       " has a negative offset or size in dim ", d));
    }
    // offset + size must not wrap: every later Contains or Intersect adds
    // them.
    if (out.offsets[d] > std::numeric_limits<int64_t>::max() - out.sizes[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of ", Quoted(fqn), " ends past 2^63 - 1 in dim ", d,
          " (offset ", out.offsets[d], ", size ", out.sizes[d], ")"));
    }
  }
  return out;
}

void BoxToProto(const planner::ChunkBox& box, v1::ChunkBox* out) {
  out->mutable_offsets()->Assign(box.offsets.begin(), box.offsets.end());
  out->mutable_sizes()->Assign(box.sizes.begin(), box.sizes.end());
}

bool NonEmptyBoxInside(const v1::ChunkBox& box,
                       const planner::ChunkBox& outer) {
  const int n = static_cast<int>(outer.offsets.size());
  if (box.offsets_size() != n || box.sizes_size() != n) return false;
  for (int d = 0; d < n; ++d) {
    const int64_t offset = box.offsets(d);
    const int64_t size = box.sizes(d);
    if (size <= 0 || size > outer.sizes[d] || offset < outer.offsets[d] ||
        offset - outer.offsets[d] > outer.sizes[d] - size) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<planner::Shape> ShapeFromProto(
    const google::protobuf::RepeatedField<int64_t>& shape,
    absl::string_view fqn) {
  if (shape.size() > planner::kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(fqn), " has ", shape.size(),
                     " dims; at most ", planner::kMaxDims, " are supported"));
  }
  planner::Shape out(shape.begin(), shape.end());
  for (int64_t n : out) {
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(fqn), " has a negative dim in its global shape"));
    }
  }
  return out;
}

planner::StorageLocation LocationFromProto(const v1::StorageLocation& loc) {
  return planner::StorageLocation{loc.object_key(), loc.offset(), loc.length()};
}

void LocationToProto(const planner::StorageLocation& loc,
                     v1::StorageLocation* out) {
  out->set_object_key(loc.object_key);
  out->set_offset(loc.offset);
  out->set_length(loc.length);
}

absl::StatusOr<planner::WriteItem> WriteItemFromProto(
    const v1::WriteItem& item) {
  planner::WriteItem out;
  out.length = item.length();
  switch (item.kind()) {
    case v1::WriteItem::KIND_TENSOR_CHUNK: {
      out.kind = planner::WriteItem::Kind::kTensorChunk;
      out.fqn = item.tensor().fqn();
      CAIRN_ASSIGN_OR_RETURN(out.dtype,
                             DTypeFromProto(item.tensor().dtype(), out.fqn));
      CAIRN_ASSIGN_OR_RETURN(
          out.global_shape,
          ShapeFromProto(item.tensor().global_shape(), out.fqn));
      CAIRN_ASSIGN_OR_RETURN(out.box, BoxFromProto(item.chunk(), out.fqn));
      return out;
    }
    case v1::WriteItem::KIND_BYTES:
      out.kind = planner::WriteItem::Kind::kBytes;
      out.fqn = item.bytes_fqn();
      out.dtype = planner::DType::kUInt8;
      return out;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("write item for ", Quoted(item.tensor().fqn()),
                       item.kind() == v1::WriteItem::KIND_UNSPECIFIED
                           ? " has no kind"
                           : absl::StrCat(" has unknown kind ", item.kind()),
                       " (tensor chunk or bytes)"));
  }
}

namespace {

// Everything of a write item but its chunk box; true for a tensor chunk
// (whose box the caller adds).
bool ItemHeadToProto(planner::WriteItem::Kind kind, const std::string& fqn,
                     planner::DType dtype, const planner::Shape& shape,
                     uint64_t length, v1::WriteItem* out) {
  out->set_length(length);
  if (kind == planner::WriteItem::Kind::kBytes) {
    out->set_kind(v1::WriteItem::KIND_BYTES);
    out->set_bytes_fqn(fqn);
    return false;
  }
  out->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  v1::TensorEntry* t = out->mutable_tensor();
  t->set_fqn(fqn);
  t->set_dtype(DTypeToProto(dtype));
  t->mutable_global_shape()->Assign(shape.begin(), shape.end());
  return true;
}

}  // namespace

void WriteItemToProto(const planner::WriteItem& item, v1::WriteItem* out) {
  if (ItemHeadToProto(item.kind, item.fqn, item.dtype, item.global_shape,
                      item.length, out)) {
    BoxToProto(item.box, out->mutable_chunk());
  }
}

absl::StatusOr<planner::LocalSavePlan> LocalPlanFromProto(
    const v1::LocalSavePlan& plan) {
  planner::LocalSavePlan out;
  out.rank = plan.rank();
  out.items.reserve(plan.items_size());
  for (const v1::WriteItem& item : plan.items()) {
    CAIRN_ASSIGN_OR_RETURN(planner::WriteItem w, WriteItemFromProto(item));
    out.items.push_back(std::move(w));
  }
  return out;
}

void LocalPlanToProto(const planner::LocalSavePlan& plan,
                      v1::LocalSavePlan* out) {
  out->set_rank(plan.rank);
  out->mutable_items()->Reserve(static_cast<int>(plan.items.size()));
  for (const planner::WriteItem& item : plan.items) {
    WriteItemToProto(item, out->add_items());
  }
}

absl::StatusOr<DecodedRankPlan> RankPlanFromProto(
    const v1::RankSavePlan& plan) {
  DecodedRankPlan out;
  out.rank = plan.rank();
  out.items.reserve(plan.writes_size());
  out.locations.reserve(plan.writes_size());
  for (const v1::PlannedWrite& w : plan.writes()) {
    CAIRN_ASSIGN_OR_RETURN(planner::WriteItem item,
                           WriteItemFromProto(w.item()));
    out.items.push_back(std::move(item));
    out.locations.push_back(LocationFromProto(w.location()));
  }
  return out;
}

void RankPlanToProto(const planner::GlobalSavePlan& plan, int rank,
                     v1::RankSavePlan* out) {
  const planner::RankSavePlan& rp = plan.ranks[static_cast<size_t>(rank)];
  out->set_rank(rp.rank);
  out->mutable_writes()->Reserve(static_cast<int>(rp.writes.size()));
  for (const planner::PlannedWrite& w : rp.writes) {
    const planner::PlannedEntry& e = plan.EntryOf(w);
    v1::PlannedWrite* pw = out->add_writes();
    v1::WriteItem* item = pw->mutable_item();
    if (ItemHeadToProto(e.kind, e.fqn, e.dtype, e.global_shape, w.length,
                        item)) {
      const size_t dims = e.global_shape.size();
      const absl::Span<const int64_t> offsets = rp.Offsets(w, dims);
      const absl::Span<const int64_t> sizes = rp.Sizes(w, dims);
      item->mutable_chunk()->mutable_offsets()->Assign(offsets.begin(),
                                                       offsets.end());
      item->mutable_chunk()->mutable_sizes()->Assign(sizes.begin(),
                                                     sizes.end());
    }
    v1::StorageLocation* loc = pw->mutable_location();
    loc->set_object_key(rp.object_key);
    loc->set_offset(w.offset);
    loc->set_length(w.length);
  }
}

absl::StatusOr<planner::DTensorLayout> LayoutFromProto(
    const v1::DTensorLayout& layout, absl::string_view fqn) {
  planner::DTensorLayout out;
  out.mesh.shape.assign(layout.mesh().shape().begin(),
                        layout.mesh().shape().end());
  out.mesh.ranks.assign(layout.mesh().ranks().begin(),
                        layout.mesh().ranks().end());
  for (const v1::Placement& p : layout.placements()) {
    switch (p.kind_case()) {
      case v1::Placement::kShardDim:
        out.placements.push_back(planner::Placement::Shard(p.shard_dim()));
        break;
      case v1::Placement::kReplicate:
        out.placements.push_back(planner::Placement::Replicate());
        break;
      case v1::Placement::kPartial:
        out.placements.push_back(planner::Placement::Partial());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "layout of ", Quoted(fqn), " has a placement with no kind"));
    }
  }
  return out;
}

void LayoutToProto(const planner::DTensorLayout& layout,
                   v1::DTensorLayout* out) {
  out->mutable_mesh()->mutable_shape()->Assign(layout.mesh.shape.begin(),
                                               layout.mesh.shape.end());
  out->mutable_mesh()->mutable_ranks()->Assign(layout.mesh.ranks.begin(),
                                               layout.mesh.ranks.end());
  for (const planner::Placement& p : layout.placements) {
    v1::Placement* q = out->add_placements();
    switch (p.kind) {
      case planner::Placement::Kind::kShard:
        q->set_shard_dim(p.dim);
        break;
      case planner::Placement::Kind::kReplicate:
        q->set_replicate(true);
        break;
      case planner::Placement::Kind::kPartial:
        q->set_partial(true);
        break;
    }
  }
}

namespace {

// The fqn, dtype and shape of `t` into `st` (its chunks are the caller's).
template <typename Chunk>
absl::Status StoredTensorEntryFromProto(const v1::ManifestTensor& t,
                                        planner::StoredTensorOf<Chunk>* st) {
  st->fqn = t.entry().fqn();
  CAIRN_ASSIGN_OR_RETURN(st->dtype, DTypeFromProto(t.entry().dtype(), st->fqn));
  CAIRN_ASSIGN_OR_RETURN(st->global_shape,
                         ShapeFromProto(t.entry().global_shape(), st->fqn));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<planner::StoredTensor> StoredTensorFromProto(
    const v1::ManifestTensor& t) {
  planner::StoredTensor st;
  CAIRN_RETURN_IF_ERROR(StoredTensorEntryFromProto(t, &st));
  st.chunks.reserve(t.chunks_size());
  for (const v1::StoredChunk& c : t.chunks()) {
    planner::StoredChunk sc;
    CAIRN_ASSIGN_OR_RETURN(sc.box, BoxFromProto(c.box(), st.fqn));
    sc.location = LocationFromProto(c.location());
    sc.crc32c = c.crc32c();
    st.chunks.push_back(std::move(sc));
  }
  return st;
}

absl::StatusOr<planner::StoredTensorByIndex> StoredTensorByIndexFromProto(
    const v1::ManifestTensor& t, absl::Span<const uint32_t> chunk_objects) {
  planner::StoredTensorByIndex st;
  if (chunk_objects.size() != static_cast<size_t>(t.chunks_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest tensor '", t.entry().fqn(), "' has ", t.chunks_size(),
        " chunks and ", chunk_objects.size(), " object indexes"));
  }
  CAIRN_RETURN_IF_ERROR(StoredTensorEntryFromProto(t, &st));
  st.chunks.resize(static_cast<size_t>(t.chunks_size()));
  for (int i = 0; i < t.chunks_size(); ++i) {
    const v1::StoredChunk& c = t.chunks(i);
    planner::StoredChunkByIndex& sc = st.chunks[static_cast<size_t>(i)];
    CAIRN_ASSIGN_OR_RETURN(sc.box, BoxFromProto(c.box(), st.fqn));
    sc.object = chunk_objects[static_cast<size_t>(i)];
    sc.offset = c.location().offset();
    sc.length = c.location().length();
    sc.crc32c = c.crc32c();
  }
  return st;
}

absl::StatusOr<std::vector<planner::StoredTensor>> StoredTensorsFromManifest(
    const v1::Manifest& manifest) {
  std::vector<planner::StoredTensor> out;
  out.reserve(manifest.tensors_size());
  for (const v1::ManifestTensor& t : manifest.tensors()) {
    CAIRN_ASSIGN_OR_RETURN(planner::StoredTensor st, StoredTensorFromProto(t));
    out.push_back(std::move(st));
  }
  return out;
}

absl::StatusOr<planner::WantedChunk> WantedFromProto(const v1::WantedChunk& w) {
  planner::WantedChunk out;
  out.fqn = w.tensor().fqn();
  CAIRN_ASSIGN_OR_RETURN(out.dtype,
                         DTypeFromProto(w.tensor().dtype(), out.fqn));
  CAIRN_ASSIGN_OR_RETURN(out.global_shape,
                         ShapeFromProto(w.tensor().global_shape(), out.fqn));
  CAIRN_ASSIGN_OR_RETURN(out.box, BoxFromProto(w.box(), out.fqn));
  return out;
}

void WantedToProto(const planner::WantedChunk& w, v1::WantedChunk* out) {
  out->mutable_tensor()->set_fqn(w.fqn);
  out->mutable_tensor()->set_dtype(DTypeToProto(w.dtype));
  out->mutable_tensor()->mutable_global_shape()->Assign(w.global_shape.begin(),
                                                        w.global_shape.end());
  BoxToProto(w.box, out->mutable_box());
}

void ReadItemToProto(const planner::ReadItem& item, v1::ReadItem* out) {
  out->set_fqn(item.fqn);
  out->set_dest_index(item.dest_index);
  BoxToProto(item.overlap, out->mutable_overlap());
  LocationToProto(item.source, out->mutable_source());
  out->set_source_crc32c(item.source_crc32c);
  out->mutable_segments()->Reserve(static_cast<int>(item.segments.size()));
  for (const planner::CopySegment& s : item.segments) {
    v1::CopySegment* seg = out->add_segments();
    seg->set_src_offset(s.src_offset);
    seg->set_dst_offset(s.dst_offset);
    seg->set_length(s.length);
  }
}

void ReadViewToProto(const planner::LoadPlanner::ReadView& item,
                     v1::ReadItem* out) {
  const planner::StoredChunkView& chunk = *item.source;
  out->set_fqn(std::string(item.fqn));
  out->set_dest_index(item.dest_index);
  BoxToProto(*item.overlap, out->mutable_overlap());
  v1::StorageLocation* source = out->mutable_source();
  source->set_object_key(std::string(chunk.object_key));
  source->set_offset(chunk.offset);
  source->set_length(chunk.length);
  out->set_source_crc32c(chunk.crc32c);
  auto* segments = out->mutable_segments();
  segments->Reserve(static_cast<int>(item.segments->size()));
  for (const planner::CopySegment& s : *item.segments) {
    v1::CopySegment* seg = segments->Add();
    seg->set_src_offset(s.src_offset);
    seg->set_dst_offset(s.dst_offset);
    seg->set_length(s.length);
  }
}

absl::StatusOr<planner::ReadItem> ReadItemFromProto(const v1::ReadItem& item) {
  planner::ReadItem out;
  out.fqn = item.fqn();
  out.dest_index = item.dest_index();
  CAIRN_ASSIGN_OR_RETURN(out.overlap, BoxFromProto(item.overlap(), out.fqn));
  out.source_chunk = -1;
  out.source = LocationFromProto(item.source());
  out.source_crc32c = item.source_crc32c();
  out.segments.reserve(item.segments_size());
  for (const v1::CopySegment& s : item.segments()) {
    out.segments.push_back(
        planner::CopySegment{s.src_offset(), s.dst_offset(), s.length()});
  }
  return out;
}

}  // namespace cairn::convert
