/// \file
/// The planned-object writer: how a rank writes the items cairnd planned for
/// it (BeginSaveResponse.rank_plan) into the checkpoint's data objects.
///
/// cairnd places every item at an aligned offset of some object. A rank
/// writes each of its objects once, front to back: its planned writes in
/// offset order, zeros in the alignment gaps before each item, and the
/// crc32c of each item's bytes computed while writing (the CommitSaveRequest
/// reports it). Close() makes the object durable before CommitSave.
///
/// Both libcairn (bytes already in the caller's buffers) and cairn-agent
/// (bytes arriving in streamed buckets) write through this one writer.
#ifndef CAIRN_CLIENT_PROTOCOL_PLANNED_WRITER_H_
#define CAIRN_CLIENT_PROTOCOL_PLANNED_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/shard_store.h"

namespace cairn::protocol {

// One data object of a rank's save plan.
struct PlannedObject {
  std::string key;          // full key: the plan's step prefix + object name
  uint64_t size = 0;        // planned size: end of its last planned write
  std::vector<int> writes;  // indexes into rank_plan().writes(), by offset
};

// The writes of `plan` grouped by object (objects sorted by key, each one's
// writes by offset). INVALID_ARGUMENT naming the object and both items when
// two planned writes of an object overlap.
absl::StatusOr<std::vector<PlannedObject>> GroupByObject(
    const v1::BeginSaveResponse& plan);

// "'model.wq' [0:4, 0:8]" for a tensor chunk, "bytes entry 'rng'" for a
// bytes entry: how messages name a planned item.
std::string ItemName(const v1::WriteItem& item);

// Writes one planned object. Items are written in the object's order: the
// bytes of the current item are appended (in one piece or several), then
// FinishItem() records its crc32c and moves to the next one.
//
// Thread-compatible. Writers of different objects of one save may run
// concurrently, each recording into its own entries of the commit request.
class PlannedObjectWriter {
 public:
  // Starts writing `object` to `store`, which reserves its planned size
  // (RESOURCE_EXHAUSTED naming the object when it cannot). Each finished
  // item's crc32c goes to commit->results(write index), whose locations the
  // caller prefilled (PlannedSave does); `commit` must outlive the writer.
  static absl::StatusOr<std::unique_ptr<PlannedObjectWriter>> Open(
      storage::ShardStore& store, const v1::BeginSaveResponse& plan,
      const PlannedObject& object, v1::CommitSaveRequest* commit);

  // The plan index of the item the next Append belongs to; -1 once every
  // item of the object is finished.
  int current_write() const;

  // Appends bytes of the current item (zeros up to its planned offset
  // first). INVALID_ARGUMENT naming the item and the object if the bytes
  // run past the item's planned length, or FAILED_PRECONDITION if every
  // item is already finished; a storage error names the item and object.
  absl::Status Append(absl::Span<const char> data);

  // Finishes the current item: FAILED_PRECONDITION naming the item and the
  // object if fewer bytes than its planned length were appended.
  absl::Status FinishItem();

  // Append(data) and FinishItem(): one whole item.
  absl::Status WriteItem(absl::Span<const char> data);

  // Makes the object durable and visible. FAILED_PRECONDITION naming the
  // object if planned items were not written.
  absl::Status Close();

  const PlannedObject& object() const { return object_; }

 private:
  PlannedObjectWriter(const v1::BeginSaveResponse& plan, PlannedObject object,
                      v1::CommitSaveRequest* commit,
                      std::unique_ptr<storage::ObjectWriter> writer);
  // Appends zeros up to the current item's planned offset.
  absl::Status PadToItem();
  absl::Status Annotate(const absl::Status& s) const;

  // Constant after construction.
  const v1::BeginSaveResponse& plan_;
  const PlannedObject object_;
  v1::CommitSaveRequest* const commit_;
  std::unique_ptr<storage::ObjectWriter> writer_;

  size_t next_ = 0;         // position of the current item in object_.writes
  uint64_t cursor_ = 0;     // bytes of the object written so far
  uint64_t item_done_ = 0;  // bytes of the current item appended so far
  uint32_t crc_ = 0;        // crc32c of those bytes
};

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_PLANNED_WRITER_H_
