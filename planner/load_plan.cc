#include "planner/load_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cairn::planner {
namespace {

std::string Describe(DType dtype, const Shape& shape) {
  return absl::StrCat(DTypeName(dtype), " ", ShapeToString(shape));
}

}  // namespace

// Stored chunks of one planner, in all: ids are uint32_t, and a tensor's
// chunk indexes are ints.
constexpr uint64_t kMaxStoredChunks = uint64_t{1} << 31;

LoadPlanner::Builder::Builder() : planner_(new LoadPlanner()) {}

LoadPlanner::Builder::Builder(std::vector<std::string> objects)
    : planner_(new LoadPlanner()) {
  LoadPlanner& p = *planner_;
  p.objects_ = std::move(objects);
  p.object_ids_.reserve(p.objects_.size());
  for (size_t o = 0; o < p.objects_.size(); ++o) {
    p.object_ids_.try_emplace(p.objects_[o], static_cast<uint32_t>(o));
  }
}

LoadPlanner::Builder::~Builder() = default;

absl::Status LoadPlanner::Builder::Add(StoredTensor t) {
  LoadPlanner& p = *planner_;
  StoredTensorByIndex indexed{
      std::move(t.fqn), t.dtype, std::move(t.global_shape), {}};
  indexed.chunks.reserve(t.chunks.size());
  for (StoredChunk& chunk : t.chunks) {
    auto [it, added] = p.object_ids_.try_emplace(
        chunk.location.object_key, static_cast<uint32_t>(p.objects_.size()));
    if (added) p.objects_.push_back(std::move(chunk.location.object_key));
    indexed.chunks.push_back(StoredChunkByIndex{
        std::move(chunk.box), it->second, chunk.location.offset,
        chunk.location.length, chunk.crc32c});
  }
  return Add(std::move(indexed));
}

absl::Status LoadPlanner::Builder::Add(StoredTensorByIndex t) {
  if (t.fqn.empty()) {
    return absl::InvalidArgumentError("manifest has a tensor with no fqn");
  }
  LoadPlanner& p = *planner_;
  if (p.by_fqn_.contains(t.fqn)) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest lists tensor '", t.fqn, "' twice"));
  }
  const size_t elem = DTypeSize(t.dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("manifest tensor '", t.fqn,
                                                   "' has unknown dtype ",
                                                   DTypeName(t.dtype)));
  }
  if (absl::Status s = ValidateShape(t.global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest tensor '", t.fqn, "': ", s.message()));
  }
  const uint64_t first = p.chunks_.size();
  if (t.chunks.size() > kMaxStoredChunks - first) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest tensor '", t.fqn, "' brings the checkpoint to ",
                     first + t.chunks.size(), " stored chunks; at most ",
                     kMaxStoredChunks, " are supported"));
  }
  std::vector<ChunkBox> boxes;
  boxes.reserve(t.chunks.size());
  for (size_t c = 0; c < t.chunks.size(); ++c) {
    StoredChunkByIndex& chunk = t.chunks[c];
    if (absl::Status s = ValidateBoxInValidShape(chunk.box, t.global_shape);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest tensor '", t.fqn, "' stored chunk ", c, ": ", s.message()));
    }
    if (chunk.object >= p.objects_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest tensor '", t.fqn, "' stored chunk ", BoxToString(chunk.box),
          " names object ", chunk.object, " of ", p.objects_.size()));
    }
    const uint64_t want = static_cast<uint64_t>(Volume(chunk.box)) * elem;
    if (chunk.length != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest tensor '", t.fqn, "' stored chunk ", BoxToString(chunk.box),
          " in '", p.objects_[chunk.object], "' has length ", chunk.length,
          " bytes; ", DTypeName(t.dtype), " needs ", want));
    }
    boxes.push_back(std::move(chunk.box));
  }
  // Tensors stored in the same tiling share one index (the layers of a
  // model have the same shapes and layouts: a 70B model's 2,169 tensors have
  // a few dozen tilings), checked once for overlaps.
  const size_t tiling = TilingHash(boxes);
  std::shared_ptr<const OverlapIndex> index = Shared(tiling, boxes);
  if (index == nullptr) {
    auto built = std::make_shared<const OverlapIndex>(boxes);
    for (int c = 0; c < built->size(); ++c) {
      int hit = -1;
      if (built->AnyOverlap(boxes[c], c, &hit)) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest tensor '", t.fqn, "': stored chunks ",
                         BoxToString(boxes[std::min(c, hit)]), " and ",
                         BoxToString(boxes[std::max(c, hit)]), " overlap"));
      }
    }
    indexes_[tiling].push_back(built);
    index = std::move(built);
  }
  boxes = {};  // the index holds them now
  for (const StoredChunkByIndex& chunk : t.chunks) {
    p.chunks_.push_back(ChunkRecord{chunk.offset, chunk.object, chunk.crc32c});
  }
  const int t_index = static_cast<int>(p.tensors_.size());
  p.by_fqn_.emplace(t.fqn, t_index);
  p.tensors_.push_back(
      IndexedTensor{std::move(t.fqn), t.dtype, std::move(t.global_shape),
                    static_cast<uint32_t>(first),
                    static_cast<int>(t.chunks.size()), std::move(index)});
  return absl::OkStatus();
}

size_t LoadPlanner::Builder::TilingHash(const std::vector<ChunkBox>& boxes) {
  size_t h = absl::HashOf(boxes.size());
  for (const ChunkBox& box : boxes) h = absl::HashOf(h, box.offsets, box.sizes);
  return h;
}

std::shared_ptr<const OverlapIndex> LoadPlanner::Builder::Shared(
    size_t tiling, const std::vector<ChunkBox>& boxes) const {
  auto it = indexes_.find(tiling);
  if (it == indexes_.end()) return nullptr;
  for (const std::shared_ptr<const OverlapIndex>& index : it->second) {
    if (index->size() != static_cast<int>(boxes.size())) continue;
    int c = 0;
    while (c < index->size() && index->HoldsBox(c, boxes[c])) ++c;
    if (c == index->size()) return index;
  }
  return nullptr;
}

std::unique_ptr<LoadPlanner> LoadPlanner::Builder::Finish() && {
  LoadPlanner& p = *planner_;
  // The tensors of each tiling (sharing an index), in order of first use.
  absl::flat_hash_map<const OverlapIndex*, size_t> run_of;
  std::vector<std::vector<int>> runs;
  for (int t = 0; t < p.num_tensors(); ++t) {
    if (p.tensors_[t].num_chunks == 0) continue;  // no records
    auto [it, added] =
        run_of.try_emplace(p.tensors_[t].index.get(), runs.size());
    if (added) runs.emplace_back();
    runs[it->second].push_back(t);
  }
  // Lay the records out run by run (see chunks_), writing them in order.
  std::vector<ChunkRecord> placed(p.chunks_.size());
  uint32_t base = 0;
  for (const std::vector<int>& tensors : runs) {
    const uint32_t m = static_cast<uint32_t>(tensors.size());
    p.runs_.push_back(
        RecordRun{base, m, static_cast<uint32_t>(p.run_tensors_.size())});
    const int n = p.tensors_[tensors[0]].num_chunks;  // the tiling's
    for (uint32_t j = 0; j < m; ++j) {
      IndexedTensor& tensor = p.tensors_[tensors[j]];
      tensor.record = base + j;
      tensor.stride = m;
      tensor.box_base = p.num_box_ids_;
      p.run_tensors_.push_back(tensors[j]);
    }
    // At most as many as the stored chunks (< 2^31): no overflow.
    p.num_box_ids_ += static_cast<uint32_t>(n);
    for (int c = 0; c < n; ++c) {
      for (uint32_t j = 0; j < m; ++j) {
        placed[base++] = p.chunks_[p.Id(tensors[j], c)];
      }
    }
  }
  p.chunks_ = std::move(placed);
  p.tensors_.shrink_to_fit();
  return std::move(planner_);
}

std::pair<int, int> LoadPlanner::OfRecord(uint32_t record) const {
  // The last run starting at or before `record`.
  auto run = std::upper_bound(
      runs_.begin(), runs_.end(), record,
      [](uint32_t r, const RecordRun& x) { return r < x.base; });
  --run;
  const uint32_t rel = record - run->base;
  return {run_tensors_[run->first + rel % run->tensors],
          static_cast<int>(rel / run->tensors)};
}

void LoadPlanner::SortByLocation() const {
  // Records by (object, offset): counted out by object, in id order (tensor
  // by tensor), which is usually offset order already (a rank writes its
  // chunks tensor by tensor, and the tensors come in fqn order), so a
  // comparison sort runs only over an object whose chunks are not (18 M
  // chunks at 16k ranks).
  std::vector<uint64_t> starts(objects_.size() + 1, 0);
  for (const ChunkRecord& r : chunks_) ++starts[r.object + 1];
  for (size_t o = 1; o < starts.size(); ++o) starts[o] += starts[o - 1];
  by_location_.resize(chunks_.size());
  {
    std::vector<uint64_t> next(starts.begin(), starts.end() - 1);
    for (int t = 0; t < num_tensors(); ++t) {
      for (int c = 0; c < tensors_[t].num_chunks; ++c) {
        const uint32_t r = Record(t, c);
        by_location_[next[chunks_[r].object]++] = r;
      }
    }
  }
  const auto by_offset = [this](uint32_t a, uint32_t b) {
    return chunks_[a].offset < chunks_[b].offset;
  };
  for (size_t o = 0; o + 1 < starts.size(); ++o) {
    const auto begin = by_location_.begin() + starts[o];
    const auto end = by_location_.begin() + starts[o + 1];
    if (!std::is_sorted(begin, end, by_offset)) {
      std::sort(begin, end, by_offset);
    }
  }
}

absl::StatusOr<std::unique_ptr<LoadPlanner>> LoadPlanner::Create(
    std::vector<StoredTensor> tensors) {
  Builder builder;
  // Add takes each by value: its chunks are freed as they are indexed.
  for (StoredTensor& t : tensors)
    CAIRN_RETURN_IF_ERROR(builder.Add(std::move(t)));
  return std::move(builder).Finish();
}

int LoadPlanner::num_indexes() const {
  absl::flat_hash_set<const OverlapIndex*> distinct;
  for (const IndexedTensor& t : tensors_) distinct.insert(t.index.get());
  return static_cast<int>(distinct.size());
}

size_t LoadPlanner::MemoryBytes() const {
  // A string's heap bytes, past what fits in the object itself.
  const auto heap = [](const std::string& s) {
    return s.capacity() > 15 ? s.capacity() + 1 : 0;
  };
  // A flat_hash_map slot's bytes (key, value, control byte), at its capacity.
  const auto slots = [](const auto& map, size_t slot) {
    return map.capacity() * (slot + 1);
  };
  size_t bytes = sizeof(*this) + chunks_.capacity() * sizeof(ChunkRecord) +
                 // ChunkAt's lookup, built by its first call.
                 chunks_.size() * sizeof(uint32_t) +
                 runs_.capacity() * sizeof(RecordRun) +
                 run_tensors_.capacity() * sizeof(int) +
                 tensors_.capacity() * sizeof(IndexedTensor) +
                 slots(by_fqn_, sizeof(std::pair<std::string, int>)) +
                 objects_.capacity() * sizeof(std::string) +
                 slots(object_ids_, sizeof(std::pair<std::string, uint32_t>));
  absl::flat_hash_set<const OverlapIndex*> distinct;
  for (const IndexedTensor& t : tensors_) {
    // The fqn twice: the tensor's and by_fqn_'s key.
    bytes += 2 * heap(t.fqn);
    if (t.global_shape.capacity() > 4) {  // past the inline dims
      bytes += t.global_shape.capacity() * sizeof(int64_t);
    }
    if (t.index != nullptr && distinct.insert(t.index.get()).second) {
      bytes += t.index->MemoryBytes();
    }
  }
  // Each key twice: objects_ and object_ids_.
  for (const std::string& o : objects_) bytes += 2 * heap(o);
  return bytes;
}

void LoadPlanner::Fill(int t, int c, StoredChunkView* out) const {
  const IndexedTensor& tensor = tensors_[t];
  const ChunkRecord& r = chunks_[Record(t, c)];
  tensor.index->BoxInto(c, &out->box);
  out->object_key = objects_[r.object];
  out->offset = r.offset;
  out->length =
      static_cast<uint64_t>(Volume(out->box)) * DTypeSize(tensor.dtype);
  out->crc32c = r.crc32c;
}

StoredChunkView LoadPlanner::chunk(int t, int c) const {
  StoredChunkView out;
  Fill(t, c, &out);
  return out;
}

std::optional<std::pair<int, int>> LoadPlanner::ChunkAt(
    absl::string_view object_key, uint64_t offset) const {
  auto obj = object_ids_.find(object_key);
  if (obj == object_ids_.end()) return std::nullopt;
  const uint32_t o = obj->second;
  absl::call_once(by_location_once_, [this] { SortByLocation(); });
  auto it = std::lower_bound(
      by_location_.begin(), by_location_.end(), std::make_pair(o, offset),
      [this](uint32_t id, const std::pair<uint32_t, uint64_t>& key) {
        return std::make_pair(chunks_[id].object, chunks_[id].offset) < key;
      });
  if (it == by_location_.end() || chunks_[*it].object != o ||
      chunks_[*it].offset != offset) {
    return std::nullopt;
  }
  return OfRecord(*it);
}

std::optional<std::pair<int, int>> LoadPlanner::ChunkOfId(uint32_t id) const {
  if (id >= num_chunk_ids()) return std::nullopt;
  // The tensor holding `id`: the last with first_chunk <= id (ids ascend
  // with tensors; a tensor with no chunks shares its first_chunk with the
  // next, so it is never the last).
  auto t = std::upper_bound(
      tensors_.begin(), tensors_.end(), id,
      [](uint32_t i, const IndexedTensor& x) { return i < x.first_chunk; });
  const int ti = static_cast<int>(t - tensors_.begin()) - 1;
  return std::make_pair(ti, static_cast<int>(id - tensors_[ti].first_chunk));
}

void LoadPlanner::AddRead(const ReadView& r, std::vector<ReadItem>* reads) {
  ReadItem& item = reads->emplace_back();
  item.fqn = std::string(r.fqn);
  item.dest_index = r.dest_index;
  item.overlap = *r.overlap;
  item.source_chunk = r.source_chunk;
  item.source = r.source->location();
  item.source_crc32c = r.source->crc32c;
  item.segments = *r.segments;
}

template <typename Wanted>
absl::StatusOr<std::vector<ReadItem>> LoadPlanner::PlanAll(
    const Wanted& wanted) const {
  std::vector<ReadItem> reads;
  reads.reserve(wanted.size());  // at least one read per non-empty chunk
  const absl::Status planned =
      PlanEach(wanted, [&](const ReadView& r) { AddRead(r, &reads); });
  if (!planned.ok()) return planned;
  return reads;
}

absl::StatusOr<std::vector<ReadItem>> LoadPlanner::Plan(
    const std::vector<WantedChunk>& wanted) const {
  return PlanAll(wanted);
}

absl::StatusOr<std::vector<ReadItem>> LoadPlanner::Plan(
    absl::Span<const WantedBox> wanted) const {
  return PlanAll(wanted);
}

absl::StatusOr<std::vector<ReadItem>> LoadPlanner::Plan(
    const WantedBoxRun& wanted) const {
  return PlanAll(wanted);
}

struct LoadPlanner::PlanScratch {
  // The overlaps of one wanted box with one tiling's stored chunks: the same
  // for every tensor stored in that tiling of which the rank wants that box
  // (a model's layers repeat their shapes and layouts, so a rank of a
  // 2169-tensor load has a dozen of these). Only the chunks' records differ.
  struct Overlaps {
    const OverlapIndex* index = nullptr;
    ChunkBox box;
    std::vector<int> hits;                // the stored chunks overlapping box
    std::vector<StoredChunkView> chunks;  // their boxes; the rest per item
    std::vector<int64_t> chunk_volumes;
    std::vector<ChunkBox> overlaps;
    std::vector<int64_t> overlap_volumes;
    std::vector<uint64_t> segments;  // NumCopySegments of each
    int64_t covered = 0;
  };
  static constexpr size_t kMaxOverlaps = 32;
  std::vector<Overlaps> memo;
  size_t next_evicted = 0;
  Overlaps unshared;  // of a tiling only one tensor has: never looked up
  std::vector<CopySegment> segments_of_item;
  uint64_t segments = 0;  // in the plan so far, checked before each item

  Overlaps& OverlapsOf(const OverlapIndex& index, const ChunkBox& box,
                       bool shared) {
    if (shared) {
      for (Overlaps& o : memo) {
        if (o.index == &index && o.box == box) return o;
      }
    }
    Overlaps* o = nullptr;
    if (!shared) {
      o = &unshared;
    } else if (memo.size() < kMaxOverlaps) {
      o = &memo.emplace_back();
    } else {
      o = &memo[next_evicted];
      next_evicted = (next_evicted + 1) % kMaxOverlaps;
    }
    o->index = &index;
    o->box = box;
    o->hits.clear();
    index.Query(box, &o->hits);
    const size_t n = o->hits.size();
    o->chunks.resize(n);
    o->chunk_volumes.resize(n);
    o->overlaps.resize(n);
    o->overlap_volumes.resize(n);
    o->segments.resize(n);
    o->covered = 0;
    for (size_t k = 0; k < n; ++k) {
      index.BoxInto(o->hits[k], &o->chunks[k].box);
      o->chunk_volumes[k] = Volume(o->chunks[k].box);
      Intersect(o->chunks[k].box, box, &o->overlaps[k]);
      o->overlap_volumes[k] = Volume(o->overlaps[k]);
      o->covered += o->overlap_volumes[k];
      o->segments[k] = NumCopySegments(o->chunks[k].box, box, o->overlaps[k]);
    }
    return *o;
  }
};

absl::Status LoadPlanner::PlanEach(
    const std::vector<WantedChunk>& wanted,
    absl::FunctionRef<void(const ReadView&)> sink, bool with_segments) const {
  PlanScratch scratch;
  for (int w = 0; w < static_cast<int>(wanted.size()); ++w) {
    const WantedChunk& want = wanted[w];
    const int ti = Find(want.fqn);
    // Nothing wanted of a tensor the checkpoint lacks needs nothing from it
    // (a rank's empty box of a tensor only other ranks hold, or of shape 0).
    if (ti < 0 && Volume(want.box) == 0) continue;
    if (ti < 0) {
      return absl::NotFoundError(absl::StrCat("'", want.fqn, "' (wanted chunk ",
                                              w, ") is not in the checkpoint"));
    }
    const IndexedTensor& t = tensors_[ti];
    if (want.dtype != t.dtype || want.global_shape != t.global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", want.fqn, "': saved ", Describe(t.dtype, t.global_shape),
          ", requested ", Describe(want.dtype, want.global_shape)));
    }
    CAIRN_RETURN_IF_ERROR(
        PlanWanted(w, ti, want.box, scratch, sink, with_segments));
  }
  return absl::OkStatus();
}

absl::Status LoadPlanner::PlanEach(
    absl::Span<const WantedBox> wanted,
    absl::FunctionRef<void(const ReadView&)> sink, bool with_segments) const {
  PlanScratch scratch;
  for (int w = 0; w < static_cast<int>(wanted.size()); ++w) {
    const int ti = wanted[w].tensor;
    if (ti < 0 || ti >= num_tensors()) {
      return absl::InvalidArgumentError(
          absl::StrCat("wanted chunk ", w, " names stored tensor ", ti, " of ",
                       num_tensors()));
    }
    CAIRN_RETURN_IF_ERROR(
        PlanWanted(w, ti, wanted[w].box, scratch, sink, with_segments));
  }
  return absl::OkStatus();
}

absl::Status LoadPlanner::PlanEach(
    const WantedBoxRun& wanted, absl::FunctionRef<void(const ReadView&)> sink,
    bool with_segments) const {
  PlanScratch scratch;
  ChunkBox box;  // reused: no allocation per wanted chunk
  const int64_t* v = wanted.values.data();
  const int64_t* const end = v + wanted.values.size();
  for (int w = 0; w < static_cast<int>(wanted.order.size()); ++w) {
    const int ti = wanted.order[w];
    if (ti < 0 || ti >= num_tensors()) {
      return absl::InvalidArgumentError(
          absl::StrCat("wanted chunk ", w, " names stored tensor ", ti, " of ",
                       num_tensors()));
    }
    const size_t dims = tensors_[ti].global_shape.size();
    if (static_cast<size_t>(end - v) < 2 * dims) {
      return absl::InvalidArgumentError(
          absl::StrCat("the wanted boxes end at wanted chunk ", w, " ('",
                       tensors_[ti].fqn, "'): ", wanted.values.size(),
                       " values for ", wanted.order.size(), " wanted chunks"));
    }
    box.offsets.assign(v, v + dims);
    box.sizes.assign(v + dims, v + 2 * dims);
    v += 2 * dims;
    CAIRN_RETURN_IF_ERROR(PlanWanted(w, ti, box, scratch, sink, with_segments));
  }
  if (v != end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the wanted boxes hold ", end - v, " values after those of ",
        "the last of ", wanted.order.size(), " wanted chunks"));
  }
  return absl::OkStatus();
}

WantedChunk LoadPlanner::Named(const WantedBox& w) const {
  const IndexedTensor& t = tensors_[w.tensor];
  return WantedChunk{t.fqn, t.dtype, t.global_shape, w.box};
}

absl::Status LoadPlanner::PlanWanted(
    int w, int ti, const ChunkBox& box, PlanScratch& scratch,
    absl::FunctionRef<void(const ReadView&)> sink, bool with_segments) const {
  const IndexedTensor& t = tensors_[ti];
  // (Its shape was checked when the tensor was indexed.)
  if (absl::Status s = ValidateBoxInValidShape(box, t.global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", t.fqn, "' wanted chunk ", w, ": ", s.message()));
  }
  const int64_t need = Volume(box);
  if (need == 0) return absl::OkStatus();
  const size_t elem = DTypeSize(t.dtype);
  // (The planner's tensors hold the only references to their indexes.)
  PlanScratch::Overlaps& o =
      scratch.OverlapsOf(*t.index, box, t.index.use_count() > 1);
  for (size_t k = 0; k < o.hits.size(); ++k) {
    const int c = o.hits[k];
    StoredChunkView& chunk = o.chunks[k];
    const uint64_t n = o.segments[k];
    if (n > kMaxCopySegmentsPerPlan - scratch.segments) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "'", t.fqn, "' wanted chunk ", w, " ", BoxToString(box),
          ": reading it needs more than ", kMaxCopySegmentsPerPlan,
          " copy segments in one plan (stored chunk ", BoxToString(chunk.box),
          " alone needs ", n, "); load it as smaller chunks"));
    }
    scratch.segments += n;
    const uint32_t id = Id(ti, c);
    const uint32_t at = Record(ti, c);
    const ChunkRecord& record = chunks_[at];
    // A rank wants the tensors of a tiling in the order of their records
    // (fqn order), most often with the same box: the record of the one four
    // on, in the next cache line, is fetched now, while other tilings are
    // planned, not when it is wanted (a miss per record would otherwise be
    // most of this function's time on large checkpoints).
    if (at + 4 < chunks_.size()) __builtin_prefetch(&chunks_[at + 4]);
    chunk.object_key = objects_[record.object];
    chunk.offset = record.offset;
    chunk.length = static_cast<uint64_t>(o.chunk_volumes[k]) * elem;
    chunk.crc32c = record.crc32c;
    if (with_segments) {
      scratch.segments_of_item.clear();
      AppendCopySegments(chunk.box, box, o.overlaps[k], elem,
                         &scratch.segments_of_item);
    }
    sink(ReadView{w, ti, t.fqn, c, &chunk, &o.overlaps[k],
                  with_segments ? &scratch.segments_of_item : nullptr, id,
                  record.object,
                  static_cast<uint64_t>(o.overlap_volumes[k]) * elem,
                  t.box_base + static_cast<uint32_t>(c)});
  }
  if (o.covered != need) {
    ChunkBox gap;
    std::string example;
    if (FindUncovered(*t.index, box, &gap)) {
      example = absl::StrCat("; e.g. ", BoxToString(gap), " is missing");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint holds ", o.covered, " of the ", need, " elements of '",
        t.fqn, "' wanted chunk ", BoxToString(box), example));
  }
  return absl::OkStatus();
}

int LoadPlanner::Find(absl::string_view fqn) const {
  auto it = by_fqn_.find(fqn);
  return it == by_fqn_.end() ? -1 : it->second;
}

}  // namespace cairn::planner
