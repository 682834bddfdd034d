#include "server/coordinator/coordinator_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_metrics.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "grpc/impl/codegen/grpc_types.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace cairn::coordinator {
namespace {

// Binds (without SO_REUSEPORT) every address `listen_address` resolves to and
// releases it: FAILED_PRECONDITION naming the address when one is in use.
// Port 0 and non-TCP addresses (unix:) are not checked.
absl::Status CheckAddressFree(const std::string& listen_address) {
  if (absl::StartsWith(listen_address, "unix:")) return absl::OkStatus();
  const size_t colon = listen_address.rfind(':');
  if (colon == std::string::npos) return absl::OkStatus();
  std::string host = listen_address.substr(0, colon);
  const std::string port = listen_address.substr(colon + 1);
  if (port == "0") return absl::OkStatus();
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                  &found) != 0) {
    return absl::OkStatus();  // gRPC reports what it cannot resolve
  }
  absl::Status result;
  for (addrinfo* a = found; a != nullptr && result.ok(); a = a->ai_next) {
    const UniqueFd fd(
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) {
      result = absl::FailedPreconditionError(absl::StrCat(
          "cannot listen on ", listen_address,
          ": address already in use (is another cairnd running there?)"));
    }
  }
  freeaddrinfo(found);
  return result;
}

// Whether every address `listen_address` names is a loopback one (or a unix
// socket): only those may serve plaintext without --allow-insecure. A
// wildcard (0.0.0.0, [::], no host) or a name that resolves elsewhere is not.
bool IsLoopback(const std::string& listen_address) {
  if (absl::StartsWith(listen_address, "unix:")) return true;
  const size_t colon = listen_address.rfind(':');
  std::string host = colon == std::string::npos
                         ? listen_address
                         : listen_address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool loopback = found != nullptr;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      loopback &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) != 0;
    } else {
      loopback = false;
    }
  }
  freeaddrinfo(found);
  return loopback;
}

// Plaintext server credentials that run a core auth metadata processor
// (gRPC's InsecureServerCredentials() takes none). The server binds the port
// through AddPortToServer.
class InsecureCredentialsWithProcessor final : public grpc::ServerCredentials {
 public:
  explicit InsecureCredentialsWithProcessor(
      const grpc_auth_metadata_processor& processor)
      : creds_(grpc_insecure_server_credentials_create()) {
    grpc_server_credentials_set_auth_metadata_processor(creds_, processor);
  }
  ~InsecureCredentialsWithProcessor() override {
    grpc_server_credentials_release(creds_);
  }
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    CAIRN_LOG(error,
              "cairnd credentials take no C++ AuthMetadataProcessor (ignored)");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

// Drops the reflection plugin that InitProtoReflectionServerBuilderPlugin
// registered for every ServerBuilder of the process.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->erase(
        std::remove_if(plugins->begin(), plugins->end(),
                       [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                         return absl::StrContains(p->name(), "reflection");
                       }),
        plugins->end());
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const Spec& spec_in) {
  Spec spec = spec_in;
  if (spec.max_request_memory_bytes < (int64_t{16} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request memory budget (--max-request-memory-mib) must be at "
        "least 16 MiB, not ",
        spec.max_request_memory_bytes, " bytes"));
  }
  if (spec.max_streams_per_connection < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-streams-per-connection must be at least 1, not ",
                     spec.max_streams_per_connection));
  }
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  // Bad TLS files fail the start before anything else happens.
  if (spec.tls.enabled() || !spec.tls.client_ca_file.empty()) {
    CAIRN_ASSIGN_OR_RETURN(s->tls_, ServerTls::Load(spec.tls));
  }
  if (spec.listen_address.empty()) {
    spec.listen_address =
        s->tls_ != nullptr ? "0.0.0.0:7070" : "127.0.0.1:7070";
  }
  if (s->tls_ == nullptr && !IsLoopback(spec.listen_address)) {
    if (!spec.allow_insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to serve plaintext on ", spec.listen_address,
          ", which is not a loopback address: give --tls-cert and --tls-key, "
          "or --allow-insecure to serve without TLS anyway"));
    }
    CAIRN_LOG(warn,
              "cairnd: serving WITHOUT TLS on {} (--allow-insecure): calls, "
              "checkpoint names and tokens travel in plaintext",
              spec.listen_address);
  }
  // Refuse a port in use before recovery touches the catalog or storage.
  CAIRN_RETURN_IF_ERROR(CheckAddressFree(spec.listen_address));
  CAIRN_ASSIGN_OR_RETURN(s->coordinator_,
                         Coordinator::Create(spec.coordinator));
  if (!spec.auth_tokens_path.empty()) {
    absl::StatusOr<std::unique_ptr<Authorizer>> a =
        Authorizer::Create(spec.auth_tokens_path);
    if (!a.ok()) {
      return absl::Status(
          a.status().code(),
          absl::StrCat("--auth-tokens: ", a.status().message()));
    }
    s->authorizer_ = *std::move(a);
  }
  s->service_ = std::make_unique<CoordinatorService>(s->coordinator_.get(),
                                                     s->authorizer_.get());
  s->reflection_ = spec.reflection.value_or(s->authorizer_ == nullptr);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!s->reflection_) {
    builder.SetOption(std::make_unique<WithoutReflection>());
  }
  // gRPC sets SO_REUSEPORT by default: a second cairnd on the same port
  // would then also "listen" and clients would alternate between two
  // catalogs. Without it a port in use is an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Memory against any client: every connection's buffers draw on one
  // quota (see Spec::max_request_memory_bytes), and a connection carries
  // at most so many calls at once.
  grpc::ResourceQuota quota("cairnd-requests");
  quota.Resize(static_cast<size_t>(spec.max_request_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             spec.max_streams_per_connection);
  // With authentication, a call without valid credentials is refused on
  // its metadata, before gRPC reads (and buffers) its request.
  std::optional<grpc_auth_metadata_processor> processor;
  if (s->authorizer_ != nullptr) {
    const CoordinatorService* service = s->service_.get();
    processor = NewAuthMetadataProcessor(
        s->authorizer_.get(),
        absl::StrCat("/", v1::Coordinator::service_full_name(), "/"),
        [service](absl::string_view reason, absl::string_view method,
                  absl::string_view message) {
          service->AuditEarlyAuthFailure(reason, method, message);
        });
  }
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (s->tls_ != nullptr) {
    credentials = s->tls_->Credentials(processor ? &*processor : nullptr);
  } else if (processor) {
    credentials =
        std::make_shared<InsecureCredentialsWithProcessor>(*processor);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  builder.AddListeningPort(spec.listen_address, credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      metrics::RpcMetricsInterceptorFactory(&s->coordinator_->metrics()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(spec.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(spec.max_send_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cairnd cannot listen on ", spec.listen_address,
                     ": the address is in use (another cairnd?) or not local"));
  }
  // The storage lease names where this cairnd serves (port 0 resolved).
  const size_t port_colon = spec.listen_address.rfind(':');
  s->coordinator_->SetServingAddress(
      absl::StartsWith(spec.listen_address, "unix:") ||
              port_colon == std::string::npos
          ? spec.listen_address
          : absl::StrCat(spec.listen_address.substr(0, port_colon), ":",
                         s->port_));
  if (!spec.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> http =
        metrics::MetricsHttpServer::Start(spec.metrics_listen,
                                          &s->coordinator_->metrics());
    if (!http.ok()) {
      return absl::Status(
          http.status().code(),
          absl::StrCat("--metrics-listen: ", http.status().message()));
    }
    s->metrics_http_ = std::move(*http);
    CAIRN_LOG(info, "cairnd serving metrics on port {} (GET /metrics)",
              s->metrics_http_->port());
  }
  if (!spec.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthOnlyServer>> health =
        HealthOnlyServer::Start(spec.health_listen);
    if (!health.ok()) {
      return absl::Status(
          health.status().code(),
          absl::StrCat("--health-listen: ", health.status().message()));
    }
    s->health_server_ = std::move(*health);
    CAIRN_LOG(info,
              "cairnd serving grpc.health.v1 in plaintext on port {} "
              "(for probes)",
              s->health_server_->port());
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  if (s->health_server_ != nullptr) s->health_server_->SetServing(true);
  if (s->authorizer_ == nullptr) {
    CAIRN_LOG(warn,
              "cairnd: authentication is OFF (no --auth-tokens): anyone "
              "who can reach port {} may list, read, save, delete and gc "
              "every job's checkpoints",
              s->port_);
  } else {
    std::shared_ptr<const AuthTable> t = s->authorizer_->table();
    CAIRN_LOG(info,
              "cairnd: authentication on: {} tokens and {} certificate "
              "identities from {} (reloaded on SIGHUP); reflection {}",
              t->num_tokens(), t->num_certificates(), spec.auth_tokens_path,
              s->reflection_ ? "on" : "off");
  }
  CAIRN_LOG(info, "cairnd listening on {} port {} ({}; storage {}, catalog {})",
            spec.listen_address, s->port_,
            s->tls_ == nullptr                ? "plaintext"
            : spec.tls.client_ca_file.empty() ? "TLS"
                                              : "mutual TLS",
            spec.coordinator.storage_uri, spec.coordinator.catalog_path);
  return s;
}

absl::Status CoordinatorServer::ReloadAuthTokens() {
  if (authorizer_ == nullptr) {
    return absl::FailedPreconditionError(
        "authentication is off (no --auth-tokens): no token file to reload");
  }
  CAIRN_RETURN_IF_ERROR(authorizer_->Reload());
  std::shared_ptr<const AuthTable> t = authorizer_->table();
  CAIRN_LOG(info,
            "cairnd: reloaded {}: {} tokens and {} certificate identities",
            authorizer_->path(), t->num_tokens(), t->num_certificates());
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ReloadTls() {
  if (tls_ == nullptr) {
    return absl::FailedPreconditionError(
        "cairnd serves without TLS: nothing to reload");
  }
  return tls_->Reload();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_ != nullptr) health_server_->SetServing(false);
  // Answer parked BeginSave/CommitSave calls so the drain can finish.
  coordinator_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
  server_->Wait();
  if (health_server_ != nullptr) health_server_->Shutdown(absl::Seconds(1));
  CAIRN_LOG(info, "cairnd stopped");
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cairn::coordinator
