// AgentServer: the Agent library behind the cairn.v1.Agent gRPC service,
// listening on a Unix domain socket (ranks of this node) — a thin adapter,
// as CoordinatorServer is for cairnd.
//
// Access: the socket file is created with exactly `socket_mode` (default
// 0660) and `socket_group`, race-free: it is bound inside a private 0700
// directory next to the path, given its mode and group there, and renamed
// into place, so it is never reachable with the umask's bits. Every
// connection is then checked with SO_PEERCRED before gRPC sees it: only the
// agent's own user, root, and (when socket_group is set) members of that
// group are served; anyone else is closed at once with a log line. The
// shared-memory segments ranks map follow the same rule (0600, or 0660 for
// the socket group). A socket path where another agent still answers is
// an error (FAILED_PRECONDITION), not silently taken over.
//
// Limits: connections open at once are capped per user (uid, from
// SO_PEERCRED; all ranks of a job share one) and in all. A connection over
// a cap is logged (naming its pid, uid and the cap) and handed to a second,
// small gRPC server that answers each of its calls RESOURCE_EXHAUSTED with
// the same words and closes it within seconds, so the rank sees why
// instead of a reset. Its requests draw on a gRPC memory budget (see
// max_request_memory_bytes), its calls per connection are capped.
//
// Health: with `health_listen` set, a second gRPC server on that TCP address
// serves only grpc.health.v1 (what Kubernetes' gRPC probes and load
// balancers call; the Agent service itself is never on TCP). SERVING once the
// agent is up, NOT_SERVING from the moment Shutdown() starts draining.
//
// Example:
//   AgentServer::Spec spec;
//   spec.unix_socket = "/run/cairn/agent.sock";
//   spec.agent.node_id = 0;
//   spec.agent.coordinator = "cairnd:7070";
//   CAIRN_ASSIGN_OR_RETURN(auto server, AgentServer::Start(std::move(spec)));
#ifndef CAIRN_SERVER_AGENT_AGENT_SERVER_H_
#define CAIRN_SERVER_AGENT_AGENT_SERVER_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/grpc_health_server.h"
#include "common/metrics_http.h"
#include "common/unique_fd.h"
#include "grpcpp/server.h"
#include "server/agent/agent.h"

namespace cairn::agent {

class AgentServer {
 public:
  struct Spec {
    // Path of the Unix domain socket ranks connect to. Required.
    std::string unix_socket;
    // Permission bits of the socket file (connecting needs write access).
    // Default: 0660.
    mode_t socket_mode = 0660;
    // Group name or number owning the socket (and the shm segments); its
    // members may connect. Empty: the agent's group, and only the agent's
    // user and root are served. Default: empty.
    std::string socket_group;
    // host:port of the health server ("" = none; port 0 picks one, see
    // health_port()). Default: none.
    std::string health_listen;
    // host:port serving Prometheus metrics at GET /metrics ("" = none; port
    // 0 picks one, see metrics_port()). Default: none.
    std::string metrics_listen;
    // Memory budget of gRPC's buffers for the socket's connections (ranks'
    // requests received and not yet parsed, connections' read buffers): at
    // the budget gRPC closes idle connections and cancels calls in flight
    // (RESOURCE_EXHAUSTED) until they fit, overshooting by what arrives
    // meanwhile. Tensor data never passes through it (it goes through
    // shared memory). Default: 1 GiB.
    int64_t max_request_memory_bytes = int64_t{1} << 30;
    // Calls in flight on one connection (HTTP/2 MAX_CONCURRENT_STREAMS;
    // clients queue more). A rank process has a few at a time. Default:
    // 1024.
    int max_streams_per_connection = 1024;
    // Connections open at once from one uid, and in all (see Limits).
    // Default: 1024, 4096.
    int max_connections_per_uid = 1024;
    int max_connections = 4096;
    AgentOptions agent;
  };

  static absl::StatusOr<std::unique_ptr<AgentServer>> Start(Spec spec);
  ~AgentServer();

  Agent& agent() { return *agent_; }
  // gRPC target for ranks: "unix:<path>".
  const std::string& target() const { return target_; }

  void Shutdown();
  void Wait();

  // The health server's bound port (0 without one).
  int health_port() const {
    return health_server_ == nullptr ? 0 : health_server_->port();
  }
  // The metrics server's bound port (0 without one).
  int metrics_port() const {
    return metrics_http_ == nullptr ? 0 : metrics_http_->port();
  }

  // Connections refused by the peer-credential check so far.
  int64_t refused_connections() const { return refused_.load(); }
  // Connections refused for a connection cap so far.
  int64_t over_cap_connections() const { return over_cap_.load(); }

 private:
  class Service;
  class Refusals;
  // A connection handed to a gRPC server: its fd stays the same socket
  // (same inode) for as long as gRPC has not closed it.
  struct Conn {
    dev_t dev = 0;
    ino_t ino = 0;
    uid_t uid = 0;
  };
  AgentServer() = default;
  absl::Status Listen(const Spec& spec, gid_t group);
  void AcceptLoop();
  // Why a new connection of `cred` is over a cap ("" when it is not),
  // counting the connections still open.
  std::string OverCap(const ucred& cred);
  // Hands an accepted connection to `server`, recorded in `conns`.
  static void Hand(grpc::Server* server, UniqueFd fd, uid_t uid,
                   std::map<int, Conn>* conns);

  // Constant after Start.
  std::unique_ptr<Agent> agent_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  // Answers the calls of connections over a cap (see Limits).
  std::unique_ptr<Refusals> refusals_;
  std::unique_ptr<grpc::Server> refusal_server_;
  int max_connections_per_uid_ = 0;
  int max_connections_ = 0;
  std::unique_ptr<HealthOnlyServer> health_server_;
  // After agent_: stops serving before the agent's registry goes.
  std::unique_ptr<metrics::MetricsHttpServer> metrics_http_;
  std::string target_;
  std::string socket_path_;
  dev_t socket_dev_ = 0;  // the socket file we created (not a successor's)
  ino_t socket_ino_ = 0;
  gid_t group_ = static_cast<gid_t>(-1);  // -1: none configured
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;

  std::thread acceptor_;
  // Connections handed to server_ and to refusal_server_, by fd (acceptor
  // thread only).
  std::map<int, Conn> conns_;
  std::map<int, Conn> refused_conns_;
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> over_cap_{0};
  bool shut_down_ = false;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_SERVER_H_
