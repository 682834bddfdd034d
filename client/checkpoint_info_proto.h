// Conversions from cairnd's wire records (cairn.v1) to libcairn's public
// result types (CheckpointInfo, CheckpointSummary). Internal to libcairn: not
// a public header (it includes generated proto headers).
#ifndef CAIRN_CLIENT_CHECKPOINT_INFO_PROTO_H_
#define CAIRN_CLIENT_CHECKPOINT_INFO_PROTO_H_

#include "absl/status/statusor.h"
#include "cairn/v1/cairn.pb.h"
#include "client/checkpointer.h"

namespace cairn::client {

CheckpointState CheckpointStateFromProto(v1::CheckpointState state);

CheckpointInfo CheckpointInfoFromProto(const v1::CheckpointRecord& record);

// The summary of a committed checkpoint's manifest. INVALID_ARGUMENT naming
// the tensor if the manifest has a dtype, shape or chunk box this library
// cannot read.
absl::StatusOr<CheckpointSummary> SummaryFromProto(
    const v1::CheckpointRecord& record, const v1::Manifest& manifest);

}  // namespace cairn::client

#endif  // CAIRN_CLIENT_CHECKPOINT_INFO_PROTO_H_
