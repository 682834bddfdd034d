#include "server/coordinator/server_tls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/grpc.h"

namespace cairn::coordinator {
namespace {

// grpc::ServerCredentials over a core grpc_server_credentials. gRPC 1.51's
// C++ wrapper of core credentials (SecureServerCredentials) is not public;
// ServerCredentials is, and the server binds a port through its
// AddPortToServer, which for core credentials is grpc_server_add_http2_port.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* creds)
      : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    // Not wired to the core credentials: say so rather than silently not
    // running it (Credentials() takes a core processor instead).
    CAIRN_LOG(error,
              "cairnd TLS credentials take no AuthMetadataProcessor (ignored)");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ServerTls>> ServerTls::Load(
    const ServerTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (!files.enabled() && !files.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)");
  }
  std::unique_ptr<ServerTls> tls(new ServerTls(files));
  absl::StatusOr<Material> material = tls->Read();
  if (!material.ok()) return material.status();
  if (absl::Status valid = tls::CheckValidNow(material->pair.cert_chain,
                                              "--tls-cert " + files.cert_file);
      !valid.ok()) {
    // Served anyway: clients refuse it, and a renewed file can be loaded
    // with SIGHUP without a restart.
    CAIRN_LOG(warn, "cairnd: {}", std::string(valid.message()));
  }
  absl::MutexLock lock(&tls->mu_);
  tls->material_ = *std::move(material);
  tls->generation_ = 1;
  return tls;
}

ServerTls::~ServerTls() = default;

absl::StatusOr<ServerTls::Material> ServerTls::Read() const {
  Material m;
  absl::StatusOr<tls::KeyCertPair> pair = tls::ReadKeyCertPair(
      files_.cert_file, "--tls-cert", files_.key_file, "--tls-key");
  if (!pair.ok()) return pair.status();
  m.pair = *std::move(pair);
  if (!files_.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        tls::ReadCertificates(files_.client_ca_file, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    m.client_ca = *std::move(ca);
  }
  return m;
}

absl::Status ServerTls::Reload() {
  absl::StatusOr<Material> material = Read();
  if (!material.ok()) return material.status();
  if (absl::Status valid = tls::CheckValidNow(material->pair.cert_chain,
                                              "--tls-cert " + files_.cert_file);
      !valid.ok()) {
    CAIRN_LOG(warn, "cairnd: {}", std::string(valid.message()));
  }
  absl::MutexLock lock(&mu_);
  material_ = *std::move(material);
  ++generation_;
  return absl::OkStatus();
}

int64_t ServerTls::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

grpc_ssl_certificate_config_reload_status ServerTls::Fetch(
    void* self, grpc_ssl_server_certificate_config** config) {
  ServerTls* tls = static_cast<ServerTls*>(self);
  absl::MutexLock lock(&tls->mu_);
  // One security connector per listening port asks before every handshake:
  // build a new configuration only when Reload() changed the files.
  if (tls->served_generation_ == tls->generation_) {
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  }
  grpc_ssl_pem_key_cert_pair pair{tls->material_.pair.private_key.c_str(),
                                  tls->material_.pair.cert_chain.c_str()};
  // gRPC takes ownership of the configuration. gRPC 1.51 asserts that a
  // fetched configuration has root certificates even when no client
  // certificate is requested: without mutual TLS the server's own chain
  // stands in (never used: clients are not asked for certificates).
  const std::string& roots = tls->material_.client_ca.empty()
                                 ? tls->material_.pair.cert_chain
                                 : tls->material_.client_ca;
  *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
  tls->served_generation_ = tls->generation_;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

std::shared_ptr<grpc::ServerCredentials> ServerTls::Credentials(
    const grpc_auth_metadata_processor* processor) {
  grpc_ssl_client_certificate_request_type request =
      files_.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  {
    absl::MutexLock lock(&mu_);
    served_generation_ = 0;  // the new credentials' first fetch loads
  }
  grpc_ssl_server_credentials_options* options =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          request, &ServerTls::Fetch, this);
  grpc_server_credentials* creds =
      grpc_ssl_server_credentials_create_with_options(options);
  if (processor != nullptr) {
    grpc_server_credentials_set_auth_metadata_processor(creds, *processor);
  }
  return std::make_shared<CoreServerCredentials>(creds);
}

}  // namespace cairn::coordinator
