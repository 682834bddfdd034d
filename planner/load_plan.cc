#include "planner/load_plan.h"

#include <utility>

#include "absl/status/status.h"

namespace cairn::planner {

LoadPlanner::LoadPlanner(std::vector<IndexedTensor> tensors)
    : tensors_(std::move(tensors)) {}

absl::StatusOr<std::unique_ptr<LoadPlanner>> LoadPlanner::Create(
    std::vector<StoredTensor> tensors) {
  (void)tensors;
  return absl::UnimplementedError("LoadPlanner: not implemented yet");
}

absl::StatusOr<std::vector<ReadItem>> LoadPlanner::Plan(
    const std::vector<WantedChunk>& wanted) const {
  (void)wanted;
  return absl::UnimplementedError("LoadPlanner: not implemented yet");
}

const StoredTensor* LoadPlanner::Find(absl::string_view fqn) const {
  const IndexedTensor* t = FindIndexed(fqn);
  return t == nullptr ? nullptr : &t->tensor;
}

const LoadPlanner::IndexedTensor* LoadPlanner::FindIndexed(
    absl::string_view fqn) const {
  auto it = by_fqn_.find(fqn);
  return it == by_fqn_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace cairn::planner
