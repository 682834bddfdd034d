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
//
// With an Authorizer every call is authenticated (UNAUTHENTICATED without a
// known token or client certificate) and checked against the caller's grants
// for the call's action and job (PERMISSION_DENIED naming both) before the
// library sees it; a listing of every job is filtered to the jobs the caller
// may read. Deletes, gcs, aborts, agent forgets and auth failures are
// audited: one log line with the identity (never a token) and
// cairn_audit_events_total / cairn_auth_failures_total.
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>

#include "cairn/v1/cairn.grpc.pb.h"
#include "server/coordinator/auth.h"
#include "server/coordinator/coordinator.h"

namespace cairn::coordinator {

namespace internal {
struct ServiceGuard;  // authorization and audit (coordinator_service.cc)
}  // namespace internal

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `coordinator` and `authorizer` must outlive the service. A null
  // `authorizer`: no authentication, every caller may do everything (audit
  // lines then name the caller "anonymous").
  explicit CoordinatorService(Coordinator* coordinator,
                              const Authorizer* authorizer = nullptr);
  ~CoordinatorService() override;

  // Audits a call refused before it reached the service (auth.h's metadata
  // processor, which authenticates before the request is read) as a refusal
  // in the service is: the audit line and cairn_auth_failures_total.
  void AuditEarlyAuthFailure(absl::string_view reason, absl::string_view method,
                             absl::string_view message) const;

 private:
  std::unique_ptr<internal::ServiceGuard> guard_;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
