// cairn-agent the daemon: runs an AgentServer from its parsed flags
// (agent_flags.h) until SIGTERM or SIGINT.
//
//   - Checks before anything is contacted: logging, --socket-mode, the token
//     files, the TLS files of cairnd and of the peers, the identity flags
//     (node_identity.h), --transport. Then, with a given --node-id, that
//     --coordinator answers; with --node-id auto, registering is the check.
//   - SIGTERM, SIGINT and SIGHUP are blocked in every thread and taken by the
//     calling thread (common/daemon.h); SIGHUP reloads the peer TLS files
//     (new peer connections use them; a bad file keeps the loaded ones).
//   - Once serving: the node announced (node_identity.h), then the bound
//     ports written to --metrics-port-file and --ready-file (atomically).
#ifndef CAIRN_SERVER_AGENT_AGENT_DAEMON_H_
#define CAIRN_SERVER_AGENT_AGENT_DAEMON_H_

#include "server/agent/agent_flags.h"

namespace cairn::agent {

// Runs cairn-agent in this process and returns its exit code: 0 after a
// stop signal; 2 for a usage error (a bad flag or file, the flags'
// combination); 1 when it cannot start (cairnd unreachable or refusing the
// node, --transport nccl unusable, the server or its files). The errors go
// to stderr, prefixed "cairn-agent: ". Call from the main thread before any
// other thread starts, once per process, while the app `flags` was parsed
// by lives.
int RunAgentDaemon(AgentFlags flags);

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_DAEMON_H_
