// The short form of a PlanLoad request's wanted chunks (cairn.proto's
// PlanLoadRequest.tensors_digest and wanted_boxes).
//
// A rank loading the model it saved (resharded or not) wants one box of every
// tensor of the checkpoint. Both sides know those tensors' fqns, dtypes and
// global shapes, so the rank sends only their digest and its boxes: a small
// fraction of the full form's bytes, and no string per tensor for cairnd to
// parse.
//
//   rank:   CompactWanted(full, &wire)            // full: one chunk per
//                                                 // tensor, in fqn order
//   cairnd: if (wire.tensors_digest() == TensorsDigestOf(planner, &order))
//             WantedFromCompact(wire, planner, order)  // == full's chunks
//           else answer resend_wanted; the rank sends `full`.

#ifndef CAIRN_PROTO_CONVERT_LOAD_REQUEST_H_
#define CAIRN_PROTO_CONVERT_LOAD_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.pb.h"
#include "planner/load_plan.h"
#include "planner/plan_cache.h"

namespace cairn::convert {

// A 128-bit digest (32 hex chars) of a list of tensors' fqns, dtypes (as
// their cairn.proto values) and global shapes, in the order added. Stable
// across versions and machines: it is compared between a rank and cairnd.
class TensorsDigest {
 public:
  void Add(absl::string_view fqn, v1::DType dtype,
           absl::Span<const int64_t> global_shape);
  // The digest; the last call.
  std::string Finish() &&;

 private:
  planner::StableKey key_;
  int64_t count_ = 0;
};

// The digest of `planner`'s stored tensors in fqn order (byte-wise), and that
// order (`*order`: stored tensor indexes).
std::string TensorsDigestOf(const planner::LoadPlanner& planner,
                            std::vector<int>* order);

// `full`'s request with its wanted chunks in the short form: everything but
// `wanted` copied, tensors_digest and wanted_boxes set. False (`*compact`
// unspecified) when `full`'s wanted chunks are not one per tensor with fqns in
// strictly increasing order, or a box does not have its tensor's dims.
bool CompactWanted(const v1::PlanLoadRequest& full,
                   v1::PlanLoadRequest* compact);

// INVALID_ARGUMENT unless a short-form request's wanted_boxes hold exactly
// the offsets and sizes of the stored tensors of `planner` in `order` (whose
// digest the request named); the boxes themselves are checked by the
// planner. A request that passes is planned as
// planner::WantedBoxRun{order, wanted_boxes}.
absl::Status CheckWantedBoxes(const v1::PlanLoadRequest& request,
                              const planner::LoadPlanner& planner,
                              absl::Span<const int> order);

// The wanted chunks of a short-form request (CheckWantedBoxes first), by
// tensor index (LoadPlanner::Named gives the full form).
absl::StatusOr<std::vector<planner::WantedBox>> WantedFromCompact(
    const v1::PlanLoadRequest& request, const planner::LoadPlanner& planner,
    absl::Span<const int> order);

}  // namespace cairn::convert

#endif  // CAIRN_PROTO_CONVERT_LOAD_REQUEST_H_
