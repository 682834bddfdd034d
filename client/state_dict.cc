#include "client/state_dict.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "protocol/load_protocol.h"
namespace cairn::client {

absl::Status StateDict::CheckNewName(const std::string& fqn) const {
  if (fqn.empty() || fqn.size() > 1024 || fqn.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict entry name '", fqn, "' must be 1..1024 bytes without NUL"));
  }
  if (names_.contains(fqn)) {
    return absl::AlreadyExistsError(
        absl::StrCat("state dict already has an entry '", fqn, "'"));
  }
  return absl::OkStatus();
}

absl::Status StateDict::AddDTensor(std::string fqn, planner::DType dtype,
                                   planner::Shape global_shape,
                                   const planner::DTensorLayout& layout,
                                   int rank, absl::Span<char> data) {
  absl::Status valid = planner::ValidateLayout(layout, global_shape);
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat("tensor '", fqn, "': ", valid.message()));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<planner::ChunkBox> boxes,
                         planner::LocalChunks(layout, global_shape, rank));
  std::vector<TensorChunk> chunks;
  for (planner::ChunkBox& b : boxes) {
    chunks.push_back(TensorChunk{std::move(b), data});
  }
  if (chunks.empty() && !data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", fqn, "': rank ", rank, " is not in the mesh of its layout ",
        "but passed a buffer of ", data.size(), " bytes"));
  }
  return AddTensor(std::move(fqn), dtype, std::move(global_shape), layout,
                   std::move(chunks));
}

absl::Status StateDict::AddChunks(std::string fqn, planner::DType dtype,
                                  planner::Shape global_shape,
                                  std::vector<TensorChunk> chunks) {
  return AddTensor(std::move(fqn), dtype, std::move(global_shape), std::nullopt,
                   std::move(chunks));
}

absl::Status StateDict::AddTensor(std::string fqn, planner::DType dtype,
                                  planner::Shape global_shape,
                                  std::optional<planner::DTensorLayout> layout,
                                  std::vector<TensorChunk> chunks) {
  CAIRN_RETURN_IF_ERROR(CheckNewName(fqn));
  const size_t elem = planner::DTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", fqn, "' has no valid dtype"));
  }
  for (const TensorChunk& c : chunks) {
    CAIRN_RETURN_IF_ERROR(
        protocol::CheckChunkBuffer(fqn, dtype, global_shape, c.box, c.data));
  }
  names_[fqn] = static_cast<int>(tensors_.size());
  tensors_.push_back(TensorShard{std::move(fqn), dtype, std::move(global_shape),
                                 std::move(layout), std::move(chunks)});
  return absl::OkStatus();
}

absl::Status StateDict::AddBytes(std::string fqn, std::string* blob) {
  CAIRN_RETURN_IF_ERROR(CheckNewName(fqn));
  if (blob == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes entry '", fqn, "' has no blob"));
  }
  names_[fqn] = -1;
  bytes_.push_back(BytesEntry{std::move(fqn), blob});
  return absl::OkStatus();
}

absl::StatusOr<planner::LocalSavePlan> StateDict::ToLocalPlan(int rank) const {
  planner::LocalSavePlan plan;
  plan.rank = rank;
  for (const TensorShard& t : tensors_) {
    if (t.layout.has_value()) {
      CAIRN_RETURN_IF_ERROR(planner::CheckSavable(*t.layout, t.fqn));
    }
    const uint64_t elem = planner::DTypeSize(t.dtype);
    for (const TensorChunk& c : t.chunks) {
      planner::WriteItem item;
      item.kind = planner::WriteItem::Kind::kTensorChunk;
      item.fqn = t.fqn;
      item.dtype = t.dtype;
      item.global_shape = t.global_shape;
      item.box = c.box;
      item.length = static_cast<uint64_t>(planner::Volume(c.box)) * elem;
      plan.items.push_back(std::move(item));
    }
  }
  for (const BytesEntry& b : bytes_) {
    planner::WriteItem item;
    item.kind = planner::WriteItem::Kind::kBytes;
    item.fqn = b.fqn;
    item.dtype = planner::DType::kUInt8;
    item.length = b.blob->size();
    plan.items.push_back(std::move(item));
  }
  return plan;
}

absl::Status StateDict::CheckLoadable() const {
  for (const TensorShard& t : tensors_) {
    if (!t.layout.has_value()) continue;
    for (size_t i = 0; i < t.layout->placements.size(); ++i) {
      if (t.layout->placements[i].kind == planner::Placement::Kind::kPartial) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", t.fqn, "' has a Partial() placement on mesh dim ", i,
            " (a pending reduction): a checkpoint cannot be loaded into it; "
            "load it Replicate() and reduce as needed"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace cairn::client
