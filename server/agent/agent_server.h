// AgentServer: the Agent library behind the cairn.v1.Agent gRPC service,
// listening on a Unix domain socket (ranks of this node) — a thin adapter,
// as CoordinatorServer is for cairnd.
//
// Example:
//   AgentServer::Spec spec;
//   spec.unix_socket = "/run/cairn/agent.sock";
//   spec.agent.node_id = 0;
//   spec.agent.coordinator = "cairnd:7070";
//   CAIRN_ASSIGN_OR_RETURN(auto server, AgentServer::Start(std::move(spec)));
#ifndef CAIRN_SERVER_AGENT_AGENT_SERVER_H_
#define CAIRN_SERVER_AGENT_AGENT_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "server/agent/agent.h"

namespace cairn::agent {

class AgentServer {
 public:
  struct Spec {
    // Path of the Unix domain socket ranks connect to. Required.
    std::string unix_socket;
    AgentOptions agent;
  };

  static absl::StatusOr<std::unique_ptr<AgentServer>> Start(Spec spec);
  ~AgentServer();

  Agent& agent() { return *agent_; }
  // gRPC target for ranks: "unix:<path>".
  const std::string& target() const { return target_; }

  void Shutdown();
  void Wait();

 private:
  class Service;
  AgentServer() = default;

  std::unique_ptr<Agent> agent_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  bool shut_down_ = false;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_SERVER_H_
