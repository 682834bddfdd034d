#include "server/coordinator/request_bounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "storage/checkpoint_layout.h"

namespace cairn::coordinator {

absl::Status ValidateJobStep(absl::string_view job, int64_t step) {
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
  return storage::ValidateStep(step);
}

absl::Status ValidateRankOfWorld(int rank, int world, int max_world_size,
                                 absl::string_view who) {
  if (world <= 0 || world > max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": world_size ", world, " is not in [1, ", max_world_size, "]"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank is out of range for world_size ", world));
  }
  return absl::OkStatus();
}

std::string Truncated(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "...(truncated, ", text.size(),
                      " bytes)");
}

absl::Status CheckLocalPlanBounds(const v1::LocalSavePlan& plan,
                                  const CoordinatorOptions& options,
                                  absl::string_view who) {
  if (plan.items_size() > options.max_plan_items_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": the local plan has ", plan.items_size(), " items; at most ",
        options.max_plan_items_per_rank,
        " per rank are accepted (cairnd --max-plan-items-per-rank)"));
  }
  for (const v1::WriteItem& item : plan.items()) {
    const std::string& fqn = item.kind() == v1::WriteItem::KIND_BYTES
                                 ? item.bytes_fqn()
                                 : item.tensor().fqn();
    if (fqn.size() > static_cast<size_t>(options.max_fqn_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": fqn '", Truncated(fqn, 64), "' is ", fqn.size(),
          " bytes; at most ", options.max_fqn_bytes, " are accepted"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoadRequestBounds(int chunks, int bytes_entries,
                                    const std::vector<const std::string*>& fqns,
                                    const CoordinatorOptions& options,
                                    absl::string_view who) {
  if (chunks > options.max_plan_items_per_rank ||
      bytes_entries > options.max_plan_items_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": ", chunks, " chunks and ", bytes_entries,
        " bytes entries; at most ", options.max_plan_items_per_rank,
        " of each per rank are accepted (cairnd --max-plan-items-per-rank)"));
  }
  for (const std::string* fqn : fqns) {
    if (fqn->size() > static_cast<size_t>(options.max_fqn_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": fqn '", Truncated(*fqn, 64), "' is ", fqn->size(),
          " bytes; at most ", options.max_fqn_bytes, " are accepted"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoadRequestBounds(const v1::PlanLoadRequest& r,
                                    const CoordinatorOptions& options) {
  std::vector<const std::string*> fqns;
  fqns.reserve(std::min(r.wanted_size() + r.wanted_bytes_size(), 1 << 20));
  for (const v1::WantedChunk& w : r.wanted()) fqns.push_back(&w.tensor().fqn());
  for (const std::string& b : r.wanted_bytes()) fqns.push_back(&b);
  const std::string who = absl::StrCat("rank ", r.rank(), " loading job '",
                                       Truncated(r.job(), 128), "'");
  // The short form: an offset and a size per dim of each tensor.
  const int64_t max_box_values =
      int64_t{2} * planner::kMaxDims * options.max_plan_items_per_rank;
  if (r.wanted_boxes_size() > max_box_values) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": wanted_boxes holds ", r.wanted_boxes_size(),
        " values; at most ", max_box_values, " (", planner::kMaxDims,
        " dims of --max-plan-items-per-rank tensors) are accepted"));
  }
  if (r.tensors_digest().size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": tensors_digest is ",
                                                   r.tensors_digest().size(),
                                                   " bytes; a digest has 32"));
  }
  return CheckLoadRequestBounds(r.wanted_size(), r.wanted_bytes_size(), fqns,
                                options, who);
}

absl::Status CheckLoadRequestBounds(const v1::VerifyLoadRequest& r,
                                    const CoordinatorOptions& options) {
  std::vector<const std::string*> fqns;
  fqns.reserve(std::min(r.pieces_size(), 1 << 20));
  for (const v1::ChunkPiece& p : r.pieces()) fqns.push_back(&p.fqn());
  return CheckLoadRequestBounds(
      r.pieces_size(), 0, fqns, options,
      absl::StrCat("rank ", r.rank(), " verifying its load of job '",
                   Truncated(r.job(), 128), "'"));
}

// A short random name for one save attempt's directory.

}  // namespace cairn::coordinator
