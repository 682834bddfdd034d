#include "proto/convert/load_request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/plan_cache.h"
#include "proto/convert/plan_convert.h"

namespace cairn::convert {

void TensorsDigest::Add(absl::string_view fqn, v1::DType dtype,
                        absl::Span<const int64_t> global_shape) {
  key_.PutString(fqn);
  key_.PutU64(static_cast<uint64_t>(dtype));
  key_.PutInts(global_shape);
  ++count_;
}

std::string TensorsDigest::Finish() && {
  key_.PutU64(static_cast<uint64_t>(count_));
  return planner::StableHash128Hex(key_.bytes());
}

std::string TensorsDigestOf(const planner::LoadPlanner& planner,
                            std::vector<int>* order) {
  order->resize(static_cast<size_t>(planner.num_tensors()));
  for (int t = 0; t < planner.num_tensors(); ++t) (*order)[t] = t;
  std::sort(order->begin(), order->end(), [&planner](int a, int b) {
    return planner.fqn(a) < planner.fqn(b);
  });
  TensorsDigest digest;
  for (int t : *order) {
    digest.Add(planner.fqn(t), DTypeToProto(planner.dtype(t)),
               planner.global_shape(t));
  }
  return std::move(digest).Finish();
}

bool CompactWanted(const v1::PlanLoadRequest& full,
                   v1::PlanLoadRequest* compact) {
  TensorsDigest digest;
  int values = 0;
  for (int i = 0; i < full.wanted_size(); ++i) {
    const v1::WantedChunk& w = full.wanted(i);
    if (i > 0 && !(full.wanted(i - 1).tensor().fqn() < w.tensor().fqn())) {
      return false;
    }
    const int dims = w.tensor().global_shape_size();
    if (w.box().offsets_size() != dims || w.box().sizes_size() != dims) {
      return false;
    }
    digest.Add(w.tensor().fqn(), w.tensor().dtype(), w.tensor().global_shape());
    values += 2 * dims;
  }
  *compact = full;
  compact->clear_wanted();
  compact->set_tensors_digest(std::move(digest).Finish());
  google::protobuf::RepeatedField<int64_t>& boxes =
      *compact->mutable_wanted_boxes();
  boxes.Clear();
  boxes.Reserve(values);
  for (const v1::WantedChunk& w : full.wanted()) {
    boxes.Add(w.box().offsets().begin(), w.box().offsets().end());
    boxes.Add(w.box().sizes().begin(), w.box().sizes().end());
  }
  return true;
}

absl::Status CheckWantedBoxes(const v1::PlanLoadRequest& request,
                              const planner::LoadPlanner& planner,
                              absl::Span<const int> order) {
  size_t values = 0;
  for (int t : order) values += 2 * planner.global_shape(t).size();
  if (static_cast<size_t>(request.wanted_boxes_size()) != values) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wanted_boxes holds ", request.wanted_boxes_size(), " values but the ",
        order.size(),
        " tensors of the checkpoint (whose digest the request names) need ",
        values, ": an offset and a size per dim of each"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<planner::WantedBox>> WantedFromCompact(
    const v1::PlanLoadRequest& request, const planner::LoadPlanner& planner,
    absl::Span<const int> order) {
  CAIRN_RETURN_IF_ERROR(CheckWantedBoxes(request, planner, order));
  std::vector<planner::WantedBox> wanted(order.size());
  const int64_t* v = request.wanted_boxes().data();
  for (size_t i = 0; i < order.size(); ++i) {
    planner::WantedBox& w = wanted[i];
    w.tensor = order[i];
    const size_t dims = planner.global_shape(w.tensor).size();
    w.box.offsets.assign(v, v + dims);
    w.box.sizes.assign(v + dims, v + 2 * dims);
    v += 2 * dims;
  }
  return wanted;
}

}  // namespace cairn::convert
