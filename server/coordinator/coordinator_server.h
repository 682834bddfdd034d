// cairnd as an embeddable server: the Coordinator library, its gRPC service,
// grpc.health.v1 and server reflection, on one listening port, in plaintext
// or TLS (optionally mutual, certificates reloadable); with
// Spec::auth_tokens_path, callers authenticated and authorized (auth.h).
//
// Example (tests bind port 0 and ask for the port):
//   CoordinatorServer::Spec spec;
//   spec.listen_address = "127.0.0.1:0";
//   spec.coordinator.storage_uri = "file:///tmp/ckpt";
//   spec.coordinator.catalog_path = "/tmp/catalog";
//   CAIRN_ASSIGN_OR_RETURN(auto server, CoordinatorServer::Start(spec));
//   Connect(absl::StrCat("127.0.0.1:", server->port()));
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVER_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_health_server.h"
#include "common/metrics_http.h"
#include "grpcpp/server.h"
#include "server/coordinator/auth.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/server_tls.h"

namespace cairn::coordinator {

class CoordinatorServer {
 public:
  struct Spec {
    // host:port to listen on; port 0 picks a free port. Default (empty):
    // 0.0.0.0:7070 with TLS, 127.0.0.1:7070 without.
    std::string listen_address;
    // TLS certificate, key and (mutual TLS) client CA; none: plaintext.
    ServerTlsFiles tls;
    // Without TLS, an address other than loopback (127.0.0.0/8, ::1,
    // localhost, unix:) is refused unless this is set (then a warning is
    // logged): plaintext exposes the catalog and any bearer token.
    bool allow_insecure = false;
    CoordinatorOptions coordinator;
    // Largest request cairnd parses. A BeginSave of the largest accepted
    // local plan (CoordinatorOptions::max_plan_items_per_rank = 65,536 items,
    // ~100-200 bytes each with fqns of typical length) is ~6-13 MiB; a
    // PlanLoad or VerifyLoad of as many chunks is of the same order.
    // Default: 128 MiB.
    int max_receive_message_bytes = 128 << 20;
    // Largest answer: a rank's PlanLoad read items or a whole manifest
    // (GetCheckpoint) of a large checkpoint. Clients (libcairn, cairn) accept
    // answers of this size. Default: 1 GiB.
    int max_send_message_bytes = 1 << 30;
    // Memory budget of gRPC's buffers for this port: request bytes received
    // and not yet parsed (in flight on the wire, or waiting for a worker),
    // connections' read buffers and calls' state. When they reach it, gRPC
    // closes idle connections and cancels calls in flight, one at a time
    // (their callers get RESOURCE_EXHAUSTED), until they fit again; it may
    // overshoot by what arrives meanwhile (up to ~200 MiB measured on loopback;
    // request_memory_e2e_test holds it to 2 x the budget). With
    // auth_tokens_path, calls without valid credentials are refused before
    // their request is read and take no part of it. Requests being parsed
    // and handled are outside it (their size is bounded by
    // max_receive_message_bytes and the worker count). Raise it for jobs
    // whose ranks together send more than this at once (e.g. a first save
    // of R ranks with plans of P bytes each: R x P). Default: 1 GiB.
    int64_t max_request_memory_bytes = int64_t{1} << 30;
    // Calls in flight on one connection (HTTP/2 MAX_CONCURRENT_STREAMS);
    // clients queue the ones beyond it. Ranks of one process share a
    // connection and each keeps a BeginSave parked until every rank has
    // called, so this must exceed the ranks any one process runs.
    // Default: 4096.
    int max_streams_per_connection = 4096;
    // host:port serving Prometheus metrics at GET /metrics (port 0 picks a
    // free port, see metrics_port()); empty serves none. Default: empty.
    std::string metrics_listen;
    // host:port of a plaintext server answering grpc.health.v1 only, with
    // the main port's status (port 0 picks one, see health_port()): for
    // Kubernetes' gRPC probes, which cannot speak TLS. Empty: none (health
    // is always also served on the main port). Default: empty.
    std::string health_listen;
    // The token file (auth.h): every cairn.v1.Coordinator call then needs a
    // token or client certificate it lists, with a role allowing the call
    // on its job (grpc.health.v1 stays open). Empty: no authentication,
    // anyone reaching the port may do everything. Default: empty.
    std::string auth_tokens_path;
    // Serve grpc.reflection (schema discovery, e.g. grpcurl). Unset: on
    // without auth_tokens_path, off with it (reflection is not authorized).
    std::optional<bool> reflection;
  };

  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const Spec& spec);
  ~CoordinatorServer();

  // The bound port (useful with port 0).
  int port() const { return port_; }
  // The bound metrics port; 0 without Spec::metrics_listen.
  int metrics_port() const {
    return metrics_http_ == nullptr ? 0 : metrics_http_->port();
  }
  // The bound health port; 0 without Spec::health_listen.
  int health_port() const {
    return health_server_ == nullptr ? 0 : health_server_->port();
  }
  Coordinator& coordinator() { return *coordinator_; }
  bool tls_enabled() const { return tls_ != nullptr; }
  // Null without Spec::auth_tokens_path.
  Authorizer* authorizer() { return authorizer_.get(); }
  bool reflection_enabled() const { return reflection_; }

  // Re-reads the token file (SIGHUP). On error the tokens in use stay and
  // the error names the file and line. FAILED_PRECONDITION without
  // Spec::auth_tokens_path.
  absl::Status ReloadAuthTokens();

  // Re-reads the TLS files (SIGHUP): new handshakes use them, open
  // connections are kept. On error (naming the file) the previous ones stay
  // in use. FAILED_PRECONDITION when serving without TLS.
  absl::Status ReloadTls();

  // Stops accepting calls, aborts in-flight saves (their ranks get
  // UNAVAILABLE), waits up to `grace` for running calls, then stops.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until Shutdown() completes.
  void Wait();

 private:
  CoordinatorServer() = default;

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Authorizer> authorizer_;  // outlives service_ and server_
  // Before server_: the credentials refer to it until the server is gone.
  std::unique_ptr<ServerTls> tls_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthOnlyServer> health_server_;
  // Declared after coordinator_: stops serving before the registry goes.
  std::unique_ptr<metrics::MetricsHttpServer> metrics_http_;
  int port_ = 0;
  bool reflection_ = false;
  bool shut_down_ = false;
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_SERVER_H_
