// cairn.v1.Coordinator over gRPC's callback API: a thin adapter that hands
// each request to the Coordinator library and finishes the reactor when the
// library answers. Blocking handlers run on the coordinator's worker pool so
// gRPC's callback threads never block; BeginSave/CommitSave park without a
// thread until every rank has arrived.
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include "cairn/v1/cairn.grpc.pb.h"
#include "server/coordinator/coordinator.h"

namespace cairn::coordinator {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `coordinator` must outlive the service.
  explicit CoordinatorService(Coordinator* coordinator)
      : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* BeginSave(grpc::CallbackServerContext* context,
                                      const v1::BeginSaveRequest* request,
                                      v1::BeginSaveResponse* response) override;
  grpc::ServerUnaryReactor* CommitSave(
      grpc::CallbackServerContext* context,
      const v1::CommitSaveRequest* request,
      v1::CommitSaveResponse* response) override;
  grpc::ServerUnaryReactor* AbortSave(grpc::CallbackServerContext* context,
                                      const v1::AbortSaveRequest* request,
                                      v1::AbortSaveResponse* response) override;
  grpc::ServerUnaryReactor* PlanLoad(grpc::CallbackServerContext* context,
                                     const v1::PlanLoadRequest* request,
                                     v1::PlanLoadResponse* response) override;
  grpc::ServerUnaryReactor* VerifyLoad(
      grpc::CallbackServerContext* context,
      const v1::VerifyLoadRequest* request,
      v1::VerifyLoadResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* context,
      const v1::ListCheckpointsRequest* request,
      v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetCheckpoint(
      grpc::CallbackServerContext* context,
      const v1::GetCheckpointRequest* request,
      v1::GetCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* DeleteCheckpoint(
      grpc::CallbackServerContext* context,
      const v1::DeleteCheckpointRequest* request,
      v1::DeleteCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* GarbageCollect(
      grpc::CallbackServerContext* context,
      const v1::GarbageCollectRequest* request,
      v1::GarbageCollectResponse* response) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
