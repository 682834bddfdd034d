#include "proto/convert/load_answer.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/convert/plan_convert.h"

namespace cairn::convert {
namespace {

using google::protobuf::internal::WireFormatLite;

// Wire tags: (field number << 3) | wire type (0 varint, 2 length-delimited,
// 5 fixed32), of cairn.v1's PlanLoadResponse and what it holds.
constexpr uint8_t kStepTag = 1 << 3 | 0;          // PlanLoadResponse.step
constexpr uint8_t kStorageUriTag = 2 << 3 | 2;    // .storage_uri
constexpr uint8_t kReadsTag = 3 << 3 | 2;         // .reads
constexpr uint8_t kBytesEntriesTag = 4 << 3 | 2;  // .bytes_entries
constexpr uint8_t kStepPrefixTag = 5 << 3 | 2;    // .step_prefix
constexpr uint8_t kLoadRoundTag = 6 << 3 | 0;     // .load_round
constexpr uint8_t kObjectsTag = 7 << 3 | 2;       // .objects
constexpr uint8_t kBoxesTag = 9 << 3 | 2;         // .boxes
constexpr uint8_t kReadColumnsTag = 10 << 3 | 2;  // .read_columns
constexpr uint8_t kFqnTag = 1 << 3 | 2;           // ReadItem.fqn
constexpr uint8_t kDestIndexTag = 2 << 3 | 0;     // .dest_index
constexpr uint8_t kOverlapTag = 3 << 3 | 2;       // .overlap
constexpr uint8_t kSourceTag = 4 << 3 | 2;        // .source
constexpr uint8_t kCrcTag = 5 << 3 | 5;           // .source_crc32c
constexpr uint8_t kSegmentTag = 6 << 3 | 2;       // .segments
constexpr uint8_t kOffsetsTag = 1 << 3 | 2;       // ChunkBox.offsets
constexpr uint8_t kSizesTag = 2 << 3 | 2;         // ChunkBox.sizes
constexpr uint8_t kObjectKeyTag = 1 << 3 | 2;     // StorageLocation.object_key
constexpr uint8_t kLocOffsetTag = 2 << 3 | 0;     // .offset
constexpr uint8_t kLocLengthTag = 3 << 3 | 0;     // .length
constexpr uint8_t kSrcOffsetTag = 1 << 3 | 0;     // CopySegment.src_offset
constexpr uint8_t kDstOffsetTag = 2 << 3 | 0;     // .dst_offset
constexpr uint8_t kSegLengthTag = 3 << 3 | 0;     // .length
// ReadColumns' columns, packed, in field order.
constexpr uint8_t kColDestIndexTag = 1 << 3 | 2;
constexpr uint8_t kColObjectIndexTag = 2 << 3 | 2;
constexpr uint8_t kColOffsetTag = 3 << 3 | 2;
constexpr uint8_t kColCrc32cTag = 4 << 3 | 2;
constexpr uint8_t kColChunkTag = 5 << 3 | 2;
constexpr uint8_t kColBoxTag = 6 << 3 | 2;

size_t VarintSize(uint64_t v) {
  return google::protobuf::io::CodedOutputStream::VarintSize64(v);
}

// A varint field, left out when 0 (a proto3 default).
size_t FieldSize(uint64_t v) { return v == 0 ? 0 : 1 + VarintSize(v); }
size_t StringSize(size_t n) { return n == 0 ? 0 : 1 + VarintSize(n) + n; }
// A length-delimited field that is always written (a set sub-message).
size_t NestedSize(size_t body) { return 1 + VarintSize(body) + body; }

size_t PackedBody(const planner::Dims& v) {
  size_t n = 0;
  for (int64_t x : v) n += VarintSize(static_cast<uint64_t>(x));
  return n;
}
size_t PackedSize(size_t body) { return body == 0 ? 0 : NestedSize(body); }

size_t SegmentBody(const planner::CopySegment& s) {
  return FieldSize(s.src_offset) + FieldSize(s.dst_offset) +
         FieldSize(s.length);
}

size_t LocationBody(absl::string_view object_key, uint64_t offset,
                    uint64_t length) {
  return StringSize(object_key.size()) + FieldSize(offset) + FieldSize(length);
}

// Writes into a buffer sized beforehand.
class Cursor {
 public:
  explicit Cursor(char* p) : p_(p) {}
  char* pos() const { return p_; }
  void Skip(size_t n) { p_ += n; }

  void Byte(uint8_t b) { *p_++ = static_cast<char>(b); }
  void Varint(uint64_t v) {
    p_ = reinterpret_cast<char*>(
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
            v, reinterpret_cast<uint8_t*>(p_)));
  }
  void Field(uint8_t tag, uint64_t v) {
    if (v == 0) return;
    Byte(tag);
    Varint(v);
  }
  void String(uint8_t tag, absl::string_view s) {
    if (s.empty()) return;
    Byte(tag);
    Varint(s.size());
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void Packed(uint8_t tag, const planner::Dims& v, size_t body) {
    if (body == 0) return;
    Byte(tag);
    Varint(body);
    for (int64_t x : v) Varint(static_cast<uint64_t>(x));
  }
  void Fixed32(uint8_t tag, uint32_t v) {
    if (v == 0) return;
    Byte(tag);
    little_endian::Store32(p_, v);
    p_ += 4;
  }

 private:
  char* p_;
};

// Grows *out by n bytes and returns a cursor at the first of them.
Cursor Append(std::string* out, size_t n) {
  const size_t at = out->size();
  out->resize(at + n);
  return Cursor(out->data() + at);
}

// The shared boxes' table (PlanLoadAnswerWriter::box_slots_): 2 KiB to start
// with (a rank's answer names a few hundred boxes), at most 512 KiB (an answer
// naming more boxes lists some of them more than once, a few bytes each,
// while the table stays small enough to be cached).
constexpr int kFirstBoxSlotsLog2 = 8;
constexpr size_t kFirstBoxSlots = size_t{1} << kFirstBoxSlotsLog2;
constexpr size_t kMaxBoxSlots = size_t{1} << 16;

// A column's room to start with (grown by doubling): 4 KiB, a few hundred
// items' values.
constexpr size_t kColumnRoom = size_t{4} << 10;

}  // namespace

PlanLoadAnswerWriter::PlanLoadAnswerWriter(int64_t step,
                                           absl::string_view storage_uri,
                                           AnswerForm form,
                                           size_t expected_bytes)
    : form_(form) {
  out_.reserve(expected_bytes + expected_bytes / 16);
  if (form == AnswerForm::kReadColumns) {
    box_slots_.resize(kFirstBoxSlots);
    box_shift_ = 32 - kFirstBoxSlotsLog2;
  }
  Cursor c(Grow(FieldSize(static_cast<uint64_t>(step)) +
                StringSize(storage_uri.size())));
  c.Field(kStepTag, static_cast<uint64_t>(step));
  c.String(kStorageUriTag, storage_uri);
}

char* PlanLoadAnswerWriter::Grow(size_t n) {
  if (out_.size() - used_ < n) {
    // 64 KiB more at a time (the string's capacity grows geometrically):
    // room reserved and never used is never touched.
    out_.resize(used_ + std::max(n, size_t{64} << 10));
  }
  char* at = out_.data() + used_;
  used_ += n;
  return at;
}

void PlanLoadAnswerWriter::AddRead(const planner::LoadPlanner::ReadView& item) {
  if (form_ == AnswerForm::kReadColumns) return AddColumnsRead(item);
  const planner::StoredChunkView& chunk = *item.source;
  const absl::string_view fqn = item.fqn;
  const uint64_t dest =
      static_cast<uint64_t>(static_cast<int64_t>(item.dest_index));
  const size_t offsets = PackedBody(item.overlap->offsets);
  const size_t sizes = PackedBody(item.overlap->sizes);
  const size_t overlap = PackedSize(offsets) + PackedSize(sizes);
  const size_t source =
      LocationBody(chunk.object_key, chunk.offset, chunk.length);
  size_t body = StringSize(fqn.size()) + FieldSize(dest) + NestedSize(overlap) +
                NestedSize(source) + (chunk.crc32c == 0 ? 0 : 5);
  for (const planner::CopySegment& s : *item.segments) {
    body += NestedSize(SegmentBody(s));
    bytes_to_read_ += s.length;
  }

  Cursor c(Grow(NestedSize(body)));
  c.Byte(kReadsTag);
  c.Varint(body);
  c.String(kFqnTag, fqn);
  c.Field(kDestIndexTag, dest);
  c.Byte(kOverlapTag);
  c.Varint(overlap);
  c.Packed(kOffsetsTag, item.overlap->offsets, offsets);
  c.Packed(kSizesTag, item.overlap->sizes, sizes);
  c.Byte(kSourceTag);
  c.Varint(source);
  c.String(kObjectKeyTag, chunk.object_key);
  c.Field(kLocOffsetTag, chunk.offset);
  c.Field(kLocLengthTag, chunk.length);
  c.Fixed32(kCrcTag, chunk.crc32c);
  for (const planner::CopySegment& s : *item.segments) {
    c.Byte(kSegmentTag);
    c.Varint(SegmentBody(s));
    c.Field(kSrcOffsetTag, s.src_offset);
    c.Field(kDstOffsetTag, s.dst_offset);
    c.Field(kSegLengthTag, s.length);
  }
  ++reads_;
}

void PlanLoadAnswerWriter::AddColumnsRead(
    const planner::LoadPlanner::ReadView& item) {
  const planner::StoredChunkView& chunk = *item.source;
  // The item's object, listed (as `objects`) before its first use.
  if (item.object_id >= object_index_.size()) {
    object_index_.resize(item.object_id + size_t{1}, -1);
  }
  int32_t& object = object_index_[item.object_id];
  if (object < 0) {  // an element of a repeated field: written even when empty
    object = num_objects_++;
    const absl::string_view key = chunk.object_key;
    Cursor c(Grow(NestedSize(key.size())));
    c.Byte(kObjectsTag);
    c.Varint(key.size());
    std::memcpy(c.pos(), key.data(), key.size());
  }
  bytes_to_read_ += item.bytes;
  const uint32_t box_index = BoxIndex(item);
  Columns& c = columns_;
  c.dest_index.AddDifference(item.dest_index);
  c.object_index.AddDifference(object);
  c.offset.AddDifference(static_cast<int64_t>(chunk.offset));
  c.crc32c.AddFixed32(chunk.crc32c);
  c.chunk.AddDifference(item.chunk_id);
  c.box.AddDifference(box_index);
  ++reads_;
}

uint32_t PlanLoadAnswerWriter::BoxIndex(
    const planner::LoadPlanner::ReadView& item) {
  const uint32_t key = item.box_id + 1;  // box ids are < 2^31
  BoxSlot* slot = &box_slots_[(item.box_id * 0x9E3779B1u) >> box_shift_];
  if (slot->id_plus_one == key) return slot->index;
  if (num_boxes_ >= box_slots_.size() / 2 && box_slots_.size() < kMaxBoxSlots) {
    // Half full: twice the slots, keeping what the table holds (where two
    // land on one slot, one is lost: listed again if named again).
    std::vector<BoxSlot> old(box_slots_.size() * 2);
    old.swap(box_slots_);
    --box_shift_;
    for (const BoxSlot& s : old) {
      if (s.id_plus_one != 0) {
        box_slots_[((s.id_plus_one - 1) * 0x9E3779B1u) >> box_shift_] = s;
      }
    }
    slot = &box_slots_[(item.box_id * 0x9E3779B1u) >> box_shift_];
  }
  // Listed (a repeated field's element: written even when empty), before the
  // item naming it.
  const planner::ChunkBox& box = item.source->box;
  const size_t offsets = PackedBody(box.offsets);
  const size_t sizes = PackedBody(box.sizes);
  const size_t body = PackedSize(offsets) + PackedSize(sizes);
  Cursor c(Grow(NestedSize(body)));
  c.Byte(kBoxesTag);
  c.Varint(body);
  c.Packed(kOffsetsTag, box.offsets, offsets);
  c.Packed(kSizesTag, box.sizes, sizes);
  *slot = BoxSlot{key, num_boxes_};
  return num_boxes_++;
}

void PlanLoadAnswerWriter::AddBytesEntry(const v1::ManifestBytes& entry) {
  const size_t body = entry.ByteSizeLong();
  Cursor c(Grow(NestedSize(body)));
  c.Byte(kBytesEntriesTag);
  c.Varint(body);
  entry.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(c.pos()));
  bytes_to_read_ += entry.location().length();
}

void PlanLoadAnswerWriter::Column::Grow() {
  const size_t used = this->used();
  bytes_.resize(std::max(used * 2, kColumnRoom));
  pos_ = bytes_.data() + used;
  end_ = bytes_.data() + bytes_.size();
}

void PlanLoadAnswerWriter::WriteColumns() {
  const Columns& c = columns_;
  const std::pair<uint8_t, absl::string_view> columns[] = {
      {kColDestIndexTag, c.dest_index.body()},
      {kColObjectIndexTag, c.object_index.body()},
      {kColOffsetTag, c.offset.body()},
      {kColCrc32cTag, c.crc32c.body()},
      {kColChunkTag, c.chunk.body()},
      {kColBoxTag, c.box.body()}};
  size_t all = 0;
  for (const auto& [tag, body] : columns) all += PackedSize(body.size());
  Cursor w(Grow(NestedSize(all)));
  w.Byte(kReadColumnsTag);  // set even when empty: the form is told by it
  w.Varint(all);
  for (const auto& [tag, body] : columns) {
    if (body.empty()) continue;  // an empty packed field is left out
    w.Byte(tag);
    w.Varint(body.size());
    std::memcpy(w.pos(), body.data(), body.size());
    w.Skip(body.size());
  }
}

std::string PlanLoadAnswerWriter::Finish(absl::string_view step_prefix) && {
  if (form_ == AnswerForm::kReadColumns) WriteColumns();
  Cursor(Grow(StringSize(step_prefix.size())))
      .String(kStepPrefixTag, step_prefix);
  out_.resize(used_);
  // Room made ahead and not used is given back when it is much (an answer
  // may be cached: its size is what the cache charges).
  if (out_.capacity() > used_ + used_ / 8 + 64) out_.shrink_to_fit();
  return std::move(out_);
}

void AppendLoadRound(uint64_t load_round, std::string* out) {
  Append(out, FieldSize(load_round)).Field(kLoadRoundTag, load_round);
}

namespace {

// The error for a read item cairnd got wrong (a cairnd bug, or not cairnd).
absl::Status BadRead(int i, absl::string_view fqn, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("cairnd returned read item ", i,
                   fqn.empty() ? "" : absl::StrCat(" of '", fqn, "'"),
                   " that cannot be right: ", what));
}

}  // namespace

absl::Status ExpandReadColumns(const v1::PlanLoadRequest& request,
                               v1::PlanLoadResponse* answer) {
  if (!answer->has_read_columns()) return absl::OkStatus();  // the full form
  if (answer->reads_size() != 0) {
    return absl::InternalError(
        absl::StrCat("cairnd returned ", answer->reads_size(),
                     " read items besides read columns"));
  }
  const v1::ReadColumns& c = answer->read_columns();
  const int n = c.dest_index_size();
  if (c.object_index_size() != n || c.offset_size() != n ||
      c.crc32c_size() != n || c.chunk_size() != n || c.box_size() != n) {
    return absl::InternalError(absl::StrCat(
        "cairnd returned read columns of different lengths: ", n,
        " destinations, ", c.object_index_size(), " objects, ", c.offset_size(),
        " offsets, ", c.crc32c_size(), " checksums, ", c.chunk_size(),
        " chunks, ", c.box_size(), " boxes"));
  }
  // Each wanted chunk parsed once, when a read item first names it.
  std::vector<std::optional<planner::WantedChunk>> wanted(
      static_cast<size_t>(request.wanted_size()));
  // Each stored box parsed once, when a read item first names it.
  std::vector<std::optional<planner::ChunkBox>> boxes(
      static_cast<size_t>(answer->boxes_size()));
  planner::ChunkBox overlap;
  std::vector<planner::CopySegment> segments;
  uint64_t total_segments = 0;
  // Each column's running sum, wrapping as the writer's differences did.
  uint64_t dest = 0, object = 0, offset = 0, chunk = 0, box = 0;
  constexpr uint64_t kInt32 = static_cast<uint64_t>(INT32_MAX);
  constexpr uint64_t kUint32 = UINT32_MAX;
  constexpr uint64_t kInt64 = static_cast<uint64_t>(INT64_MAX);
  answer->mutable_reads()->Reserve(n);
  for (int i = 0; i < n; ++i) {
    dest += static_cast<uint64_t>(c.dest_index(i));
    object += static_cast<uint64_t>(c.object_index(i));
    offset += static_cast<uint64_t>(c.offset(i));
    chunk += static_cast<uint64_t>(c.chunk(i));
    box += static_cast<uint64_t>(c.box(i));
    if (dest > kInt32 || object > kInt32 || offset > kInt64 ||
        chunk > kUint32 || box > kUint32) {
      return BadRead(i, "",
                     absl::StrCat("column values out of range: destination ",
                                  static_cast<int64_t>(dest), ", object ",
                                  static_cast<int64_t>(object), ", offset ",
                                  static_cast<int64_t>(offset), ", chunk ",
                                  static_cast<int64_t>(chunk), ", box ",
                                  static_cast<int64_t>(box)));
    }
    const int d = static_cast<int>(dest);
    if (d >= request.wanted_size()) {
      return BadRead(i, "",
                     absl::StrCat("destination ", d, " of ",
                                  request.wanted_size(), " wanted chunks"));
    }
    std::optional<planner::WantedChunk>& want = wanted[d];
    if (!want.has_value()) {
      absl::StatusOr<planner::WantedChunk> w =
          WantedFromProto(request.wanted(d));
      if (!w.ok()) return w.status();
      if (absl::Status s = planner::ValidateBoxInShape(w->box, w->global_shape);
          !s.ok()) {
        return s;
      }
      want = std::move(*w);
    }
    const std::string& fqn = want->fqn;
    const int o = static_cast<int>(object);
    if (o >= answer->objects_size()) {
      return BadRead(
          i, fqn, absl::StrCat("object ", o, " of ", answer->objects_size()));
    }
    if (box >= boxes.size()) {
      return BadRead(i, fqn,
                     absl::StrCat("box ", box, " of ", answer->boxes_size()));
    }
    std::optional<planner::ChunkBox>& stored = boxes[box];
    if (!stored.has_value()) {
      absl::StatusOr<planner::ChunkBox> b =
          BoxFromProto(answer->boxes(static_cast<int>(box)), fqn);
      if (!b.ok()) return BadRead(i, fqn, b.status().message());
      stored = std::move(*b);
    }
    const planner::ChunkBox& source_box = *stored;
    if (absl::Status s =
            planner::ValidateBoxInShape(source_box, want->global_shape);
        !s.ok()) {
      return BadRead(i, fqn, s.message());
    }
    if (!planner::Intersect(source_box, want->box, &overlap)) {
      return BadRead(
          i, fqn,
          absl::StrCat("stored chunk ", planner::BoxToString(source_box),
                       " outside the wanted chunk ",
                       planner::BoxToString(want->box)));
    }
    const uint64_t num =
        planner::NumCopySegments(source_box, want->box, overlap);
    if (num > planner::kMaxCopySegmentsPerPlan - total_segments) {
      return BadRead(i, fqn, "more copy segments than one plan may have");
    }
    total_segments += num;
    const uint64_t elem = planner::DTypeSize(want->dtype);
    segments.clear();
    planner::AppendCopySegments(source_box, want->box, overlap, elem,
                                &segments);
    // The fields in the full form's order (ReadViewToProto's).
    v1::ReadItem& item = *answer->add_reads();
    item.set_fqn(fqn);
    item.set_dest_index(d);
    BoxToProto(overlap, item.mutable_overlap());
    v1::StorageLocation& source = *item.mutable_source();
    source.set_object_key(answer->objects(o));
    source.set_offset(offset);
    // In the shape: at most 2^60 elements, so no overflow.
    source.set_length(static_cast<uint64_t>(planner::Volume(source_box)) *
                      elem);
    item.set_source_crc32c(c.crc32c(i));
    item.mutable_segments()->Reserve(static_cast<int>(segments.size()));
    for (const planner::CopySegment& s : segments) {
      v1::CopySegment* out = item.add_segments();
      out->set_src_offset(s.src_offset);
      out->set_dst_offset(s.dst_offset);
      out->set_length(s.length);
    }
    item.set_chunk(static_cast<uint32_t>(chunk));
  }
  answer->clear_read_columns();
  return absl::OkStatus();
}

}  // namespace cairn::convert
