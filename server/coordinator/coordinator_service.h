// cairn.v1.Coordinator over gRPC's callback API: a thin adapter that hands
// each request to the Coordinator library and finishes the reactor when the
// library answers. Blocking handlers run on the coordinator's worker pool so
// gRPC's callback threads never block; BeginSave/CommitSave park without a
// thread until every rank has arrived.
//
// Every method is registered raw (bytes in, bytes out) and parses its request
// itself: gRPC's generated handlers answer a request that does not parse
// with UNIMPLEMENTED and an empty message, which reads as "wrong server";
// here it is INVALID_ARGUMENT naming the method and the request type.
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include "cairn/v1/cairn.grpc.pb.h"
#include "server/coordinator/coordinator.h"

namespace cairn::coordinator {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `coordinator` must outlive the service.
  explicit CoordinatorService(Coordinator* coordinator);
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
