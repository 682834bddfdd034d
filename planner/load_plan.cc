#include "planner/load_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cairn::planner {
namespace {

std::string Describe(DType dtype, const Shape& shape) {
  return absl::StrCat(DTypeName(dtype), " ", ShapeToString(shape));
}

}  // namespace

LoadPlanner::LoadPlanner(std::vector<IndexedTensor> tensors)
    : tensors_(std::move(tensors)) {
  by_fqn_.reserve(tensors_.size());
  for (int i = 0; i < static_cast<int>(tensors_.size()); ++i) {
    by_fqn_.emplace(tensors_[i].tensor.fqn, i);
  }
}

absl::StatusOr<std::unique_ptr<LoadPlanner>> LoadPlanner::Create(
    std::vector<StoredTensor> tensors) {
  std::vector<IndexedTensor> indexed;
  indexed.reserve(tensors.size());
  absl::flat_hash_set<std::string> seen;  // copies: tensors are moved below
  for (StoredTensor& t : tensors) {
    if (t.fqn.empty()) {
      return absl::InvalidArgumentError("manifest has a tensor with no fqn");
    }
    if (!seen.insert(t.fqn).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest lists tensor '", t.fqn, "' twice"));
    }
    const size_t elem = DTypeSize(t.dtype);
    if (elem == 0) {
      return absl::InvalidArgumentError(absl::StrCat("manifest tensor '", t.fqn,
                                                     "' has unknown dtype ",
                                                     DTypeName(t.dtype)));
    }
    std::vector<ChunkBox> boxes;
    boxes.reserve(t.chunks.size());
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const StoredChunk& chunk = t.chunks[c];
      if (absl::Status s = ValidateBoxInShape(chunk.box, t.global_shape);
          !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("manifest tensor '",
                                                       t.fqn, "' stored chunk ",
                                                       c, ": ", s.message()));
      }
      const uint64_t want = static_cast<uint64_t>(Volume(chunk.box)) * elem;
      if (chunk.location.length != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "manifest tensor '", t.fqn, "' stored chunk ",
            BoxToString(chunk.box), " in '", chunk.location.object_key,
            "' has length ", chunk.location.length, " bytes; ",
            DTypeName(t.dtype), " needs ", want));
      }
      boxes.push_back(chunk.box);
    }
    if (absl::Status s = ValidateShape(t.global_shape); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest tensor '", t.fqn, "': ", s.message()));
    }
    OverlapIndex index(boxes);
    boxes = {};  // the index keeps no copy; the chunks hold the boxes
    for (int c = 0; c < index.size(); ++c) {
      int hit = -1;
      if (index.AnyOverlap(t.chunks[c].box, c, &hit)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "manifest tensor '", t.fqn, "': stored chunks ",
            BoxToString(t.chunks[std::min(c, hit)].box), " and ",
            BoxToString(t.chunks[std::max(c, hit)].box), " overlap"));
      }
    }
    indexed.push_back(IndexedTensor{std::move(t), std::move(index)});
  }
  return std::unique_ptr<LoadPlanner>(new LoadPlanner(std::move(indexed)));
}

absl::StatusOr<std::vector<ReadItem>> LoadPlanner::Plan(
    const std::vector<WantedChunk>& wanted) const {
  std::vector<ReadItem> reads;
  reads.reserve(wanted.size());  // at least one read per non-empty chunk
  const absl::Status planned = PlanEach(wanted, [&](const ReadView& r) {
    const StoredChunk& chunk = r.tensor->chunks[r.source_chunk];
    ReadItem& item = reads.emplace_back();
    item.fqn = r.tensor->fqn;
    item.dest_index = r.dest_index;
    item.overlap = *r.overlap;
    item.source_chunk = r.source_chunk;
    item.source = chunk.location;
    item.source_crc32c = chunk.crc32c;
    item.segments = *r.segments;
  });
  if (!planned.ok()) return planned;
  return reads;
}

absl::Status LoadPlanner::PlanEach(
    const std::vector<WantedChunk>& wanted,
    absl::FunctionRef<void(const ReadView&)> sink) const {
  std::vector<int> hits;
  ChunkBox overlap;
  std::vector<CopySegment> segments_of_item;  // reused for every item
  uint64_t segments = 0;  // so far, checked before each allocation
  for (int w = 0; w < static_cast<int>(wanted.size()); ++w) {
    const WantedChunk& want = wanted[w];
    const IndexedTensor* it = FindIndexed(want.fqn);
    if (it == nullptr) {
      return absl::NotFoundError(absl::StrCat("'", want.fqn, "' (wanted chunk ",
                                              w, ") is not in the checkpoint"));
    }
    const StoredTensor& t = it->tensor;
    if (want.dtype != t.dtype || want.global_shape != t.global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", want.fqn, "': saved ", Describe(t.dtype, t.global_shape),
          ", requested ", Describe(want.dtype, want.global_shape)));
    }
    if (absl::Status s = ValidateBoxInShape(want.box, t.global_shape);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", want.fqn, "' wanted chunk ", w, ": ", s.message()));
    }
    const int64_t need = Volume(want.box);
    if (need == 0) continue;
    const size_t elem = DTypeSize(t.dtype);
    hits.clear();
    it->index.Query(want.box, &hits);
    int64_t covered = 0;
    for (int c : hits) {
      const StoredChunk& chunk = t.chunks[c];
      Intersect(chunk.box, want.box, &overlap);
      covered += Volume(overlap);
      const uint64_t n = NumCopySegments(chunk.box, want.box, overlap);
      if (n > kMaxCopySegmentsPerPlan - segments) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "'", want.fqn, "' wanted chunk ", w, " ", BoxToString(want.box),
            ": reading it needs more than ", kMaxCopySegmentsPerPlan,
            " copy segments in one plan (stored chunk ", BoxToString(chunk.box),
            " alone needs ", n, "); load it as smaller chunks"));
      }
      segments += n;
      segments_of_item.clear();
      AppendCopySegments(chunk.box, want.box, overlap, elem, &segments_of_item);
      sink(ReadView{w, &t, c, &overlap, &segments_of_item});
    }
    if (covered != need) {
      ChunkBox gap;
      std::string example;
      if (FindUncovered(it->index, want.box, &gap)) {
        example = absl::StrCat("; e.g. ", BoxToString(gap), " is missing");
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint holds ", covered, " of the ", need, " elements of '",
          want.fqn, "' wanted chunk ", BoxToString(want.box), example));
    }
  }
  return absl::OkStatus();
}

const StoredTensor* LoadPlanner::Find(absl::string_view fqn) const {
  const IndexedTensor* t = FindIndexed(fqn);
  return t == nullptr ? nullptr : &t->tensor;
}

const LoadPlanner::IndexedTensor* LoadPlanner::FindIndexed(
    absl::string_view fqn) const {
  auto it = by_fqn_.find(fqn);
  return it == by_fqn_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace cairn::planner
