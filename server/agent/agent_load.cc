// Agent::Load: resolves a rank's load's step with cairnd (joining its load
// round for "latest") and has the PeerLoader serve it from memory; what it
// cannot serve is answered "unserved" with the step, for the rank's storage
// fallback.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/agent/agent.h"
#include "server/agent/items.h"

namespace cairn::agent {

using internal::Where;

absl::StatusOr<v1::AgentLoadResponse> Agent::Load(
    const v1::AgentLoadRequest& request) {
  const absl::Duration rpc_timeout = absl::Seconds(60);
  const bool latest = request.ref_case() == v1::AgentLoadRequest::kLatest;
  v1::GetCheckpointRequest gr;
  gr.set_job(request.job());
  if (latest && request.world_size() > 0) {
    // The ranks of the load join cairnd's load round of the job, which
    // resolves `latest` once for all of them: a save committing between two
    // ranks' loads never hands them different steps. (Only the step is
    // taken: memory tiers serve the bytes, so nothing is read or reported.)
    v1::PlanLoadRequest pr;
    pr.set_job(request.job());
    pr.set_latest(true);
    pr.set_rank(request.rank());
    pr.set_world_size(request.world_size());
    pr.set_verify_in_round(false);
    v1::PlanLoadResponse round;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(coordinator_->PlanLoad(&ctx, pr, &round)));
    gr.set_step(round.step());
  } else if (latest) {
    gr.set_latest(true);  // a rank on its own: cairnd resolves it
  } else {
    gr.set_step(request.step());
  }
  v1::GetCheckpointResponse got;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    CAIRN_RETURN_IF_ERROR(
        FromGrpcStatus(coordinator_->GetCheckpoint(&ctx, gr, &got)));
  }
  const int64_t step = got.checkpoint().step();
  if (got.checkpoint().state() != v1::CHECKPOINT_STATE_COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(request.job(), step, request.rank()),
                     ": checkpoint is not committed"));
  }
  absl::StatusOr<v1::AgentLoadResponse> served =
      loader_->Load(request, step, got.manifest());
  if (served.ok()) return served;
  // The step is resolved: the rank's storage fallback must load that one.
  v1::AgentLoadResponse unserved;
  unserved.set_step(step);
  unserved.set_unserved_code(static_cast<int32_t>(served.status().code()));
  unserved.set_unserved_message(std::string(served.status().message()));
  return unserved;
}

absl::Status Agent::ReleaseLoad(uint64_t load_id) {
  return loader_->Release(load_id);
}

}  // namespace cairn::agent
