// cairnd's TLS: server credentials whose certificate, key and client CA are
// re-read on Reload() (SIGHUP) while the listener keeps serving.
//
// gRPC 1.51's C++ API offers no reload on demand: StaticDataCertificateProvider
// never changes, and FileWatcherCertificateProvider polls the files on an
// interval (a half-written file may be picked up, and a reload cannot
// report a bad file). The core's SSL "certificate config fetcher"
// (grpc_ssl_server_credentials_create_options_using_config_fetcher) is
// asked before every new handshake whether the configuration changed: after
// Reload() validated new files the next handshake uses them, and
// established connections keep their sessions.
#ifndef CAIRN_SERVER_COORDINATOR_SERVER_TLS_H_
#define CAIRN_SERVER_COORDINATOR_SERVER_TLS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tls_pem.h"
#include "grpc/grpc_security.h"
#include "grpcpp/security/server_credentials.h"

namespace cairn::coordinator {

struct ServerTlsFiles {
  // PEM certificate chain (leaf first) and its private key. Both or neither.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle: when set, clients must present a certificate it signed
  // (mutual TLS).
  std::string client_ca_file;

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

class ServerTls {
 public:
  // Reads and checks the files: INVALID_ARGUMENT naming the file that is
  // missing or bad, or naming the flags when only one of cert/key is set.
  static absl::StatusOr<std::unique_ptr<ServerTls>> Load(
      const ServerTlsFiles& files);
  ~ServerTls();

  // Credentials for ServerBuilder::AddListeningPort. They refer to this
  // object, which must outlive the server. With `processor`, they run it on
  // every call's metadata (and own it).
  std::shared_ptr<grpc::ServerCredentials> Credentials(
      const grpc_auth_metadata_processor* processor = nullptr);

  // Re-reads the files. On success new handshakes use them; on error (naming
  // the file) the previous ones stay in use.
  absl::Status Reload();

  // How many successful loads (1 after Load, +1 per Reload).
  int64_t generation() const;

 private:
  explicit ServerTls(ServerTlsFiles files) : files_(std::move(files)) {}
  struct Material {
    tls::KeyCertPair pair;
    std::string client_ca;
  };
  absl::StatusOr<Material> Read() const;
  // The grpc_ssl_server_certificate_config_callback.
  static grpc_ssl_certificate_config_reload_status Fetch(
      void* self, grpc_ssl_server_certificate_config** config);

  const ServerTlsFiles files_;
  mutable absl::Mutex mu_;
  Material material_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation gRPC's handshaker factory was last built from.
  int64_t served_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_SERVER_TLS_H_
