#include "planner/transfer_plan.h"

#include "absl/status/status.h"

namespace cairn::planner {

absl::StatusOr<TransferPlan> BuildTransferPlan(
    const std::vector<TransferTensor>& tensors,
    const TransferPlanOptions& options) {
  (void)tensors;
  (void)options;
  return absl::UnimplementedError("BuildTransferPlan: not implemented yet");
}

}  // namespace cairn::planner
