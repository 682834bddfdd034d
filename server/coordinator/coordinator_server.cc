#include "server/coordinator/coordinator_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace cairn::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const Spec& spec) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  CAIRN_ASSIGN_OR_RETURN(s->coordinator_,
                         Coordinator::Create(spec.coordinator));
  s->service_ = std::make_unique<CoordinatorService>(s->coordinator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(spec.listen_address,
                           grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(spec.max_message_bytes);
  builder.SetMaxSendMessageSize(spec.max_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cairnd could not listen on ", spec.listen_address));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  CAIRN_LOG(info, "cairnd listening on port {} (storage {}, catalog {})",
            s->port_, spec.coordinator.storage_uri,
            spec.coordinator.catalog_path);
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  // Answer parked BeginSave/CommitSave calls so the drain can finish.
  coordinator_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
  server_->Wait();
  CAIRN_LOG(info, "cairnd stopped");
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cairn::coordinator
