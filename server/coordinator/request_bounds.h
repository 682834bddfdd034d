// Input validation and bounds of the coordinator's requests: the names and
// sizes every RPC is checked against before any work is done, so bad input
// from a client is refused with a message naming the job, step and rank and
// never grows cairnd's memory beyond the configured limits.
#ifndef CAIRN_SERVER_COORDINATOR_REQUEST_BOUNDS_H_
#define CAIRN_SERVER_COORDINATOR_REQUEST_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cairn/v1/cairn.pb.h"
#include "server/coordinator/coordinator_options.h"

namespace cairn::coordinator {

// Bounds of what cairnd keeps for clients beyond the configurable ones.
// Free text a client sends (an abort reason) is kept and logged up to this.
inline constexpr size_t kMaxReasonBytes = 1024;
// A plan fingerprint is a hash (planner::FingerprintLocalPlan: 32 hex).
inline constexpr size_t kMaxFingerprintBytes = 64;

// Validates the (job, step) every RPC names.
absl::Status ValidateJobStep(absl::string_view job, int64_t step);

// Validates a rank's (rank, world_size) pair; `who` names the rank and the
// checkpoint for the message.
absl::Status ValidateRankOfWorld(int rank, int world, int max_world_size,
                                 absl::string_view who);

// `text` cut to `max` bytes, marked when cut.
std::string Truncated(absl::string_view text, size_t max);

// Checks the sizes of a rank's local plan before it is decoded.
absl::Status CheckLocalPlanBounds(const v1::LocalSavePlan& plan,
                                  const CoordinatorOptions& options,
                                  absl::string_view who);

// Checks the sizes of a PlanLoad or VerifyLoad request before any work:
// as many chunks as a save plan may have items, fqns as long as a save's.
absl::Status CheckLoadRequestBounds(int chunks, int bytes_entries,
                                    const std::vector<const std::string*>& fqns,
                                    const CoordinatorOptions& options,
                                    absl::string_view who);
absl::Status CheckLoadRequestBounds(const v1::PlanLoadRequest& r,
                                    const CoordinatorOptions& options);
absl::Status CheckLoadRequestBounds(const v1::VerifyLoadRequest& r,
                                    const CoordinatorOptions& options);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_REQUEST_BOUNDS_H_
