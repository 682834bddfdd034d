// PlanLoad answers written as wire bytes, without building messages.
//
// cairnd answers every loading rank with a PlanLoadResponse of thousands of
// read items. Built as messages, each item is a ReadItem with a ChunkBox, a
// StorageLocation and one CopySegment per segment: a handful of allocations
// per item, freed again once serialized: allocation would be most of
// PlanLoad's CPU. PlanLoadAnswerWriter appends each
// read item's encoding to one buffer straight from LoadPlanner::PlanEach's
// views instead.
//
// The bytes are exactly those protobuf writes for the message built with
// ReadViewToProto (load_answer_test checks random plans): fields in number
// order, proto3 defaults (0, "") left out, repeated int64 packed, `overlap`
// and `source` always present (ReadViewToProto sets them), every segment
// present. A rank therefore decodes the same answer as before.
#ifndef CAIRN_PROTO_CONVERT_LOAD_ANSWER_H_
#define CAIRN_PROTO_CONVERT_LOAD_ANSWER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cairn/v1/cairn.pb.h"
#include "common/little_endian.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "planner/load_plan.h"

namespace cairn::convert {

// Writes one PlanLoadResponse in field order: the constructor writes `step`
// and `storage_uri`, then AddRead (any number), AddBytesEntry (any number,
// after every read), Finish (`step_prefix`). `load_round` (the last field)
// is appended separately by AppendLoadRound, so that an answer's bytes can be
// cached and shared across rounds.
//
// Example:
//   PlanLoadAnswerWriter w(step, uri);
//   planner.PlanEach(wanted, [&w](const ReadView& r) { w.AddRead(r); });
//   std::string bytes = std::move(w).Finish(prefix);
//   AppendLoadRound(round, &bytes);  // == response.SerializeAsString()
//
// The two forms (cairn.proto's PlanLoadRequest.read_columns). kFull writes
// ReadItem messages that spell everything out, and needs each ReadView's
// segments. kReadColumns writes each read item's stored chunk as columns
// (PlanLoadResponse.read_columns, written by Finish), each object key once
// in `objects` and each stored box once in `boxes` (in the order the items
// first name them; a box again only when the writer's table of listed boxes
// lost it); the rank derives the rest with ExpandReadColumns, so cairnd
// needs no segments (PlanEach(..., /*segments=*/false) skips building them).
enum class AnswerForm { kFull, kReadColumns };
inline constexpr int kNumAnswerForms = 2;

// The form a PlanLoad request asks for.
inline AnswerForm AnswerFormOf(const v1::PlanLoadRequest& request) {
  return request.read_columns() ? AnswerForm::kReadColumns : AnswerForm::kFull;
}

class PlanLoadAnswerWriter {
 public:
  // `expected_bytes`: what the answer will likely take (e.g. the size of
  // another rank's answer to the same checkpoint); room for it and a
  // sixteenth more is made up front, so that a large answer is not copied as
  // it grows. 0 grows it as needed.
  PlanLoadAnswerWriter(int64_t step, absl::string_view storage_uri,
                       AnswerForm form = AnswerForm::kFull,
                       size_t expected_bytes = 0);

  void AddRead(const planner::LoadPlanner::ReadView& item);
  void AddBytesEntry(const v1::ManifestBytes& entry);
  std::string Finish(absl::string_view step_prefix) &&;

  // Read items added so far.
  int reads() const { return reads_; }
  // Bytes the answer tells its rank to read: the lengths of every copy
  // segment and bytes entry added.
  uint64_t bytes_to_read() const { return bytes_to_read_; }

 private:
  void AddColumnsRead(const planner::LoadPlanner::ReadView& item);
  // The index in `boxes` of the item's stored box, listing it first if it
  // is not.
  uint32_t BoxIndex(const planner::LoadPlanner::ReadView& item);
  // Room for n more bytes at the end of the answer: where they go.
  char* Grow(size_t n);
  // The columns, written as PlanLoadResponse.read_columns.
  void WriteColumns();

  // One column's packed body as it will be written (zigzag varints of the
  // differences, or fixed32s), in bytes_ up to pos_, and the previous item's
  // value. Its appends are inline: six per item, each a few
  // instructions (out of line, the calls cost more than the bytes).
  class Column {
   public:
    Column() = default;
    Column(const Column&) = delete;  // pos_ and end_ point into bytes_
    Column& operator=(const Column&) = delete;

    void AddDifference(int64_t value) {
      if (ABSL_PREDICT_FALSE(end_ - pos_ < 10)) Grow();
      // Zigzag: small differences of either sign take one byte.
      pos_ = Out(google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
          google::protobuf::internal::WireFormatLite::ZigZagEncode64(
              static_cast<int64_t>(static_cast<uint64_t>(value) -
                                   static_cast<uint64_t>(last_))),
          In(pos_)));
      last_ = value;
    }
    void AddFixed32(uint32_t value) {
      if (ABSL_PREDICT_FALSE(end_ - pos_ < 4)) Grow();
      little_endian::Store32(pos_, value);
      pos_ += 4;
    }
    absl::string_view body() const { return {bytes_.data(), used()}; }

   private:
    static uint8_t* In(char* p) { return reinterpret_cast<uint8_t*>(p); }
    static char* Out(uint8_t* p) { return reinterpret_cast<char*>(p); }
    size_t used() const {
      return pos_ == nullptr ? 0 : static_cast<size_t>(pos_ - bytes_.data());
    }
    // Twice the room (at least 10 bytes more).
    void Grow();

    std::string bytes_;
    char* pos_ = nullptr;  // the next byte's place in bytes_ (none yet: null)
    char* end_ = nullptr;
    int64_t last_ = 0;
  };
  struct Columns {
    Column dest_index, object_index, offset, crc32c, chunk, box;
  };

  AnswerForm form_;
  // The answer is out_'s first used_ bytes; the rest is room made ahead (a
  // string's resize per item would zero and grow it item by item).
  std::string out_;
  size_t used_ = 0;
  // kReadColumns: the planner's object index -> its index in `objects`, -1
  // while not listed (grown to the largest object index seen: the planner's
  // objects are one per saving rank, so at most a few hundred KB).
  std::vector<int32_t> object_index_;
  int num_objects_ = 0;
  // kReadColumns: the boxes listed, by ReadView.box_id, direct-mapped (a box
  // whose slot another took is listed again: a few bytes, where a hash map's
  // lookup per item would cost more than it saves). The table doubles when
  // half as many boxes were listed as it has slots, up to a bound.
  struct BoxSlot {
    uint32_t id_plus_one = 0;  // 0: empty
    uint32_t index = 0;        // in `boxes`
  };
  std::vector<BoxSlot> box_slots_;
  int box_shift_ = 0;  // slot of id: (id * golden ratio) >> box_shift_
  uint32_t num_boxes_ = 0;
  int reads_ = 0;
  uint64_t bytes_to_read_ = 0;
  Columns columns_;
};

// Turns a kReadColumns answer to `request` into the full form in place:
// each item of read_columns becomes a ReadItem of `reads` (and read_columns
// is cleared) with its wanted chunk's fqn, the overlap of its stored box
// (boxes[box]) with the wanted box, the copy segments
// (planner::AppendCopySegments, exactly what cairnd computes for the full
// form), source (objects[object_index] at offset, of the box's volume times
// the dtype's size), source_crc32c and chunk, the stored chunk's id (for
// ChunkPiece.chunk). A full answer (no read_columns) is left as it is.
// INTERNAL naming the item and fqn when cairnd sent what cannot be right:
// both read items and columns, columns of different lengths or values out of
// their field's range, a destination, object or box index out of range, a
// stored chunk outside the tensor or disjoint from its wanted chunk, more
// than planner::kMaxCopySegmentsPerPlan segments.
absl::Status ExpandReadColumns(const v1::PlanLoadRequest& request,
                               v1::PlanLoadResponse* answer);

// Appends PlanLoadResponse.load_round (omitted when 0, as protobuf does).
void AppendLoadRound(uint64_t load_round, std::string* out);

}  // namespace cairn::convert

#endif  // CAIRN_PROTO_CONVERT_LOAD_ANSWER_H_
