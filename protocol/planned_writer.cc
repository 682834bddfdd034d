// The planned-object writer (see planned_writer.h).
#include "protocol/planned_writer.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/convert/plan_convert.h"
#include "storage/checksum.h"

namespace cairn::protocol {
namespace {

constexpr size_t kZeroPadBytes = 1 << 16;  // alignment padding is < 4096

}  // namespace

std::string ItemName(const v1::WriteItem& item) {
  if (item.kind() == v1::WriteItem::KIND_BYTES) {
    return absl::StrCat("bytes entry '", item.bytes_fqn(), "'");
  }
  const std::string& fqn = item.tensor().fqn();
  absl::StatusOr<planner::ChunkBox> box =
      convert::BoxFromProto(item.chunk(), fqn);
  return absl::StrCat("'", fqn, "' ",
                      box.ok() ? planner::BoxToString(*box) : "[bad box]");
}

absl::StatusOr<std::vector<PlannedObject>> GroupByObject(
    const v1::BeginSaveResponse& plan) {
  const auto& writes = plan.rank_plan().writes();
  std::map<std::string, std::vector<int>> by_object;
  for (int i = 0; i < writes.size(); ++i) {
    by_object[writes[i].location().object_key()].push_back(i);
  }
  std::vector<PlannedObject> objects;
  objects.reserve(by_object.size());
  for (auto& [name, indexes] : by_object) {
    std::stable_sort(indexes.begin(), indexes.end(), [&](int a, int b) {
      return writes[a].location().offset() < writes[b].location().offset();
    });
    PlannedObject o;
    o.key = absl::StrCat(plan.step_prefix(), name);
    for (size_t k = 0; k < indexes.size(); ++k) {
      const v1::StorageLocation& loc = writes[indexes[k]].location();
      if (k > 0) {
        const v1::StorageLocation& prev = writes[indexes[k - 1]].location();
        if (loc.offset() < prev.offset() + prev.length()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "cairnd planned overlapping writes in object ", o.key, ": ",
              ItemName(writes[indexes[k - 1]].item()), " at ", prev.offset(),
              "+", prev.length(), " and ", ItemName(writes[indexes[k]].item()),
              " at ", loc.offset()));
        }
      }
      o.size = std::max<uint64_t>(o.size, loc.offset() + loc.length());
    }
    o.writes = std::move(indexes);
    objects.push_back(std::move(o));
  }
  return objects;
}

PlannedObjectWriter::PlannedObjectWriter(
    const v1::BeginSaveResponse& plan, PlannedObject object,
    v1::CommitSaveRequest* commit,
    std::unique_ptr<storage::ObjectWriter> writer)
    : plan_(plan),
      object_(std::move(object)),
      commit_(commit),
      writer_(std::move(writer)) {}

absl::StatusOr<std::unique_ptr<PlannedObjectWriter>> PlannedObjectWriter::Open(
    storage::ShardStore& store, const v1::BeginSaveResponse& plan,
    const PlannedObject& object, v1::CommitSaveRequest* commit) {
  for (int w : object.writes) {
    if (w < 0 || w >= plan.rank_plan().writes_size() ||
        w >= commit->results_size()) {
      return absl::InternalError(absl::StrCat("object ", object.key, ": write ",
                                              w, " is not in the plan"));
    }
  }
  // The object's planned size: the store reserves exactly that up front.
  storage::WriterOptions wo;
  wo.expected_bytes = object.size;
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectWriter> writer,
                         store.NewWriter(object.key, wo));
  return std::unique_ptr<PlannedObjectWriter>(
      new PlannedObjectWriter(plan, object, commit, std::move(writer)));
}

int PlannedObjectWriter::current_write() const {
  return next_ < object_.writes.size() ? object_.writes[next_] : -1;
}

absl::Status PlannedObjectWriter::Annotate(const absl::Status& s) const {
  // Only called with a current item.
  if (s.ok()) return s;
  const int w = current_write();
  return absl::Status(s.code(),
                      absl::StrCat(s.message(), " (writing ",
                                   ItemName(plan_.rank_plan().writes(w).item()),
                                   " to object ", object_.key, ")"));
}

absl::Status PlannedObjectWriter::PadToItem() {
  static const std::string* zeros = new std::string(kZeroPadBytes, '\0');
  const uint64_t offset =
      plan_.rank_plan().writes(current_write()).location().offset();
  while (cursor_ < offset) {
    const uint64_t n = std::min<uint64_t>(offset - cursor_, zeros->size());
    CAIRN_RETURN_IF_ERROR(Annotate(writer_->Append(
        absl::MakeConstSpan(zeros->data(), static_cast<size_t>(n)))));
    cursor_ += n;
  }
  return absl::OkStatus();
}

absl::Status PlannedObjectWriter::Append(absl::Span<const char> data) {
  const int w = current_write();
  if (w < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("object ", object_.key, ": ", data.size(),
                     " bytes appended after its last planned item"));
  }
  const v1::PlannedWrite& pw = plan_.rank_plan().writes(w);
  if (item_done_ + data.size() > pw.location().length()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ItemName(pw.item()), " has ", item_done_ + data.size(),
                     " bytes here, more than the ", pw.location().length(),
                     " cairnd planned at ", pw.location().offset(),
                     " of object ", object_.key));
  }
  CAIRN_RETURN_IF_ERROR(PadToItem());
  if (data.empty()) return absl::OkStatus();
  CAIRN_RETURN_IF_ERROR(Annotate(writer_->Append(data)));
  crc_ = storage::Crc32cExtend(crc_, data.data(), data.size());
  item_done_ += data.size();
  cursor_ += data.size();
  return absl::OkStatus();
}

absl::Status PlannedObjectWriter::FinishItem() {
  const int w = current_write();
  if (w < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "object ", object_.key, ": every planned item is already written"));
  }
  const v1::PlannedWrite& pw = plan_.rank_plan().writes(w);
  if (item_done_ != pw.location().length()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ItemName(pw.item()), " has ", item_done_, " bytes here, not the ",
        pw.location().length(), " cairnd planned at ", pw.location().offset(),
        " of object ", object_.key));
  }
  CAIRN_RETURN_IF_ERROR(PadToItem());  // an empty item: its offset still
  commit_->mutable_results(w)->set_crc32c(crc_);
  ++next_;
  item_done_ = 0;
  crc_ = 0;
  return absl::OkStatus();
}

absl::Status PlannedObjectWriter::WriteItem(absl::Span<const char> data) {
  CAIRN_RETURN_IF_ERROR(Append(data));
  return FinishItem();
}

absl::Status PlannedObjectWriter::Close() {
  if (next_ != object_.writes.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "object ", object_.key, " closed with ", object_.writes.size() - next_,
        " of its ", object_.writes.size(), " planned items not written"));
  }
  absl::Status s = writer_->Close();
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (closing object ",
                                             object_.key, ")"));
}

}  // namespace cairn::protocol
