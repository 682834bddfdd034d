// cairn-agent: one per node. Parses flags (agent_flags.h) and runs the agent
// (agent_daemon.h): the UDS control service for the node's ranks and the
// peer transport, until SIGTERM/SIGINT; SIGHUP reloads the peer TLS
// certificates (--peer-tls-*).
//
//   cairn-agent --node-id 0 --listen-unix /run/cairn/agent.sock
//       --peer-listen 0.0.0.0:7071 --peers n0:7071,n1:7071,n2:7071
//       --coordinator cairnd:7070 --staging-budget-mib 65536 --replicas 1
//       --peer-token-file /etc/cairn/peer-token --socket-group training
//       [--transport nccl --cuda-device 0]
//
// In Kubernetes (a DaemonSet; no stable ordinal, no peer list):
//   cairn-agent --node-id auto --node-name $NODE --peer-advertise $POD_IP
//       --peer-listen 0.0.0.0:7071 --num-nodes 16 --coordinator cairnd:7070 ...
// registers the node name with cairnd, which gives it a stable id, and finds
// peers in cairnd's agent table (server/agent/node_identity.h).
#include <malloc.h>

#include <iostream>
#include <optional>
#include <utility>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "server/agent/agent_daemon.h"
#include "server/agent/agent_flags.h"

int main(int argc, char** argv) {
  // The agent's large buffers (replica pushes, fetched pieces, messages of
  // a bucket each, freed on other threads than the ones that made them) are
  // mmapped and returned to the system when freed. glibc's default raises
  // its mmap threshold to the size of every such buffer freed, after which
  // they come from its arenas, which keep the pages: the heap grew by
  // hundreds of MiB over a fault campaign's trials (tests/netns).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  CLI::App app{
      "cairn-agent: node-local staging, async persistence, in-memory tier and "
      "peer replication for Cairn checkpoints. Ranks connect over a Unix "
      "domain socket (cairn.v1.Agent); agents talk over the peer transport.",
      "cairn-agent"};
  cairn::agent::AgentFlags flags;
  cairn::agent::AddAgentFlags(app, &flags);
  if (std::optional<int> exit_code =
          cairn::flags::Parse(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }
  return cairn::agent::RunAgentDaemon(std::move(flags));
}
