// HealthOnlyServer: a plaintext gRPC server on its own TCP port that serves
// grpc.health.v1 and nothing else. Kubernetes' gRPC probes speak neither TLS
// nor bearer tokens, so a daemon whose real service needs both (cairnd with
// --tls-cert) or is not on TCP at all (cairn-agent's Unix socket) gives the
// kubelet this port instead. Every other method is UNIMPLEMENTED: nothing
// but the serving status is reachable through it.
//
// Example:
//   CAIRN_ASSIGN_OR_RETURN(auto health,
//   HealthOnlyServer::Start("0.0.0.0:7072")); health->SetServing(true);   //
//   once the daemon serves
//   ...
//   health->SetServing(false);  // draining: probes see NOT_SERVING
//   health->Shutdown(absl::Seconds(1));
#ifndef CAIRN_COMMON_GRPC_HEALTH_SERVER_H_
#define CAIRN_COMMON_GRPC_HEALTH_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"

namespace cairn {

class HealthOnlyServer {
 public:
  // Listens on `address` (host:port; port 0 picks one, see port()). Starts
  // NOT_SERVING. UNAVAILABLE when the address is in use or not local.
  static absl::StatusOr<std::unique_ptr<HealthOnlyServer>> Start(
      const std::string& address);
  ~HealthOnlyServer();

  int port() const { return port_; }
  // The overall status ("" service) every probe asks for.
  void SetServing(bool serving);
  // Stops the server; calls in flight get until `grace`.
  void Shutdown(absl::Duration grace);

 private:
  class OnlyHealth;
  HealthOnlyServer() = default;

  std::unique_ptr<OnlyHealth> fallback_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace cairn

#endif  // CAIRN_COMMON_GRPC_HEALTH_SERVER_H_
