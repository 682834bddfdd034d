#include "common/grpc_health_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace cairn {

// gRPC wants at least one service to poll for; this one answers every
// method the health service does not serve with UNIMPLEMENTED.
class HealthOnlyServer::OnlyHealth : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(const std::string& method) {
        Finish(grpc::Status(
            grpc::StatusCode::UNIMPLEMENTED,
            absl::StrCat(method, ": this port serves grpc.health.v1 only")));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(ctx->method());
  }
};

absl::StatusOr<std::unique_ptr<HealthOnlyServer>> HealthOnlyServer::Start(
    const std::string& address) {
  std::unique_ptr<HealthOnlyServer> s(new HealthOnlyServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // A second daemon on the same port is an error, not a shared port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  s->fallback_ = std::make_unique<OnlyHealth>();
  builder.RegisterCallbackGenericService(s->fallback_.get());
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &s->port_);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve health on ", address, " (address in use or not local?)"));
  }
  s->SetServing(false);
  return s;
}

HealthOnlyServer::~HealthOnlyServer() { Shutdown(absl::ZeroDuration()); }

void HealthOnlyServer::SetServing(bool serving) {
  if (server_ != nullptr && !shut_down_) {
    server_->GetHealthCheckService()->SetServingStatus(serving);
  }
}

void HealthOnlyServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  SetServing(false);
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
  server_->Wait();
}

}  // namespace cairn
