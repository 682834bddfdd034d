#include "server/coordinator/coordinator_service.h"

#include <utility>

#include "common/grpc_status.h"

namespace cairn::coordinator {
namespace {

// Finishes `reactor` with `result`, moving the value into `response`.
template <typename T>
void FinishWith(grpc::ServerUnaryReactor* reactor, T* response,
                absl::StatusOr<T> result) {
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
}

// Runs a blocking library call on the worker pool, then finishes the call.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* RunOnWorkers(Coordinator* c,
                                       grpc::CallbackServerContext* context,
                                       const Req* request, Resp* response,
                                       Fn fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  c->workers().Schedule([c, reactor, request, response, fn] {
    FinishWith<Resp>(reactor, response, fn(*c, *request));
  });
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::BeginSave(
    grpc::CallbackServerContext* context, const v1::BeginSaveRequest* request,
    v1::BeginSaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->BeginSave(
      *request, [reactor, response](absl::StatusOr<v1::BeginSaveResponse> r) {
        FinishWith(reactor, response, std::move(r));
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::CommitSave(
    grpc::CallbackServerContext* context, const v1::CommitSaveRequest* request,
    v1::CommitSaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->CommitSave(
      *request, [reactor, response](absl::StatusOr<v1::CommitSaveResponse> r) {
        FinishWith(reactor, response, std::move(r));
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::AbortSave(
    grpc::CallbackServerContext* context, const v1::AbortSaveRequest* request,
    v1::AbortSaveResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::AbortSaveRequest& r)
                          -> absl::StatusOr<v1::AbortSaveResponse> {
                        absl::Status s = c.AbortSave(r);
                        if (!s.ok()) return s;
                        return v1::AbortSaveResponse();
                      });
}

grpc::ServerUnaryReactor* CoordinatorService::PlanLoad(
    grpc::CallbackServerContext* context, const v1::PlanLoadRequest* request,
    v1::PlanLoadResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::PlanLoadRequest& r) {
                        return c.PlanLoad(r);
                      });
}

grpc::ServerUnaryReactor* CoordinatorService::VerifyLoad(
    grpc::CallbackServerContext* context, const v1::VerifyLoadRequest* request,
    v1::VerifyLoadResponse* response) {
  // The manifest may have to be read first: start on a worker; the call then
  // parks without a thread until every rank of the load has reported.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Coordinator* c = coordinator_;
  c->workers().Schedule([c, reactor, request, response] {
    c->VerifyLoad(*request, [reactor, response](
                                absl::StatusOr<v1::VerifyLoadResponse> r) {
      FinishWith(reactor, response, std::move(r));
    });
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::ListCheckpointsRequest& r) {
                        return c.ListCheckpoints(r);
                      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::GetCheckpointRequest* request,
    v1::GetCheckpointResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::GetCheckpointRequest& r) {
                        return c.GetCheckpoint(r);
                      });
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::DeleteCheckpointRequest* request,
    v1::DeleteCheckpointResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::DeleteCheckpointRequest& r)
                          -> absl::StatusOr<v1::DeleteCheckpointResponse> {
                        absl::Status s = c.DeleteCheckpoint(r);
                        if (!s.ok()) return s;
                        return v1::DeleteCheckpointResponse();
                      });
}

grpc::ServerUnaryReactor* CoordinatorService::GarbageCollect(
    grpc::CallbackServerContext* context,
    const v1::GarbageCollectRequest* request,
    v1::GarbageCollectResponse* response) {
  return RunOnWorkers(coordinator_, context, request, response,
                      [](Coordinator& c, const v1::GarbageCollectRequest& r) {
                        return c.GarbageCollect(r);
                      });
}

}  // namespace cairn::coordinator
