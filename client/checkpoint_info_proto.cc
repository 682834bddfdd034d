// Wire records -> libcairn's result types (see checkpoint_info_proto.h).
#include "client/checkpoint_info_proto.h"

#include <algorithm>

#include "common/status_macros.h"
#include "proto/convert/plan_convert.h"

namespace cairn::client {
namespace {

absl::Time FromUnixMicrosOrPast(int64_t micros) {
  return micros > 0 ? absl::FromUnixMicros(micros) : absl::InfinitePast();
}

}  // namespace

absl::string_view CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kWriting:
      return "WRITING";
    case CheckpointState::kCommitted:
      return "COMMITTED";
    case CheckpointState::kAborted:
      return "ABORTED";
    case CheckpointState::kDeleting:
      return "DELETING";
    case CheckpointState::kUnknown:
      break;
  }
  return "UNKNOWN";
}

CheckpointState CheckpointStateFromProto(v1::CheckpointState state) {
  switch (state) {
    case v1::CHECKPOINT_STATE_WRITING:
      return CheckpointState::kWriting;
    case v1::CHECKPOINT_STATE_COMMITTED:
      return CheckpointState::kCommitted;
    case v1::CHECKPOINT_STATE_ABORTED:
      return CheckpointState::kAborted;
    case v1::CHECKPOINT_STATE_DELETING:
      return CheckpointState::kDeleting;
    default:
      return CheckpointState::kUnknown;
  }
}

CheckpointInfo CheckpointInfoFromProto(const v1::CheckpointRecord& record) {
  CheckpointInfo info;
  info.job = record.job();
  info.step = record.step();
  info.state = CheckpointStateFromProto(record.state());
  info.world_size = record.world_size();
  info.bytes = record.total_bytes();
  info.num_tensors = record.num_tensors();
  info.num_bytes_entries = record.num_bytes_entries();
  info.created = FromUnixMicrosOrPast(record.created_unix_micros());
  info.committed = FromUnixMicrosOrPast(record.committed_unix_micros());
  info.storage_uri = record.storage_uri();
  info.abort_reason = record.abort_reason();
  return info;
}

absl::StatusOr<CheckpointSummary> SummaryFromProto(
    const v1::CheckpointRecord& record, const v1::Manifest& manifest) {
  CheckpointSummary summary;
  summary.info = CheckpointInfoFromProto(record);
  summary.tensors.reserve(manifest.tensors_size());
  for (const v1::ManifestTensor& t : manifest.tensors()) {
    TensorSummary s;
    s.fqn = t.entry().fqn();
    CAIRN_ASSIGN_OR_RETURN(s.dtype,
                           convert::DTypeFromProto(t.entry().dtype(), s.fqn));
    CAIRN_ASSIGN_OR_RETURN(
        s.shape, convert::ShapeFromProto(t.entry().global_shape(), s.fqn));
    s.chunks = t.chunks_size();
    s.chunk_boxes.reserve(t.chunks_size());
    for (const v1::StoredChunk& c : t.chunks()) {
      s.bytes += c.location().length();
      CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box,
                             convert::BoxFromProto(c.box(), s.fqn));
      s.chunk_boxes.push_back(std::move(box));
    }
    // The manifest sorts them by offsets; by box makes it a total order.
    std::stable_sort(s.chunk_boxes.begin(), s.chunk_boxes.end());
    summary.tensors.push_back(std::move(s));
  }
  for (const v1::ManifestBytes& b : manifest.bytes_entries()) {
    summary.bytes_entries.push_back({b.fqn(), b.location().length()});
  }
  auto by_fqn = [](const auto& a, const auto& b) { return a.fqn < b.fqn; };
  std::sort(summary.tensors.begin(), summary.tensors.end(), by_fqn);
  std::sort(summary.bytes_entries.begin(), summary.bytes_entries.end(), by_fqn);
  return summary;
}

}  // namespace cairn::client
