#include "planner/save_plan.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cairn::planner {

std::string ObjectKeyForRank(const SavePlanOptions& options, int rank) {
  return absl::StrCat(options.object_prefix, absl::StrFormat("%05d", rank),
                      ".bin");
}

std::string StorageSettingsKey(const SavePlanOptions& options) {
  return absl::StrCat("alignment=", options.alignment,
                      ";object_prefix=", options.object_prefix.size(), ":",
                      options.object_prefix);
}

absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    const std::vector<LocalSavePlan>& plans, const SavePlanOptions& options) {
  (void)plans;
  (void)options;
  return absl::UnimplementedError(
      absl::StrCat("job '", job, "' step ", step, ": not implemented yet"));
}

}  // namespace cairn::planner
