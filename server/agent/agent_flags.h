// cairn-agent's command line: every option bound to an AgentFlags, and what
// they make once parsed: the AgentServer::Spec's fields in the flags' units
// and the NodeIdentityOptions (node_identity.h). agent_daemon.h runs them;
// every option is also CAIRN_<NAME>.
//
// Example (cairn-agent's main):
//   CLI::App app{"cairn-agent: ...", "cairn-agent"};
//   AgentFlags agent_flags;
//   AddAgentFlags(app, &agent_flags);
//   if (std::optional<int> exit_code =
//           flags::Parse(app, argc, argv, std::cout, std::cerr)) {
//     return *exit_code;
//   }
//   return RunAgentDaemon(std::move(agent_flags));
#ifndef CAIRN_SERVER_AGENT_AGENT_FLAGS_H_
#define CAIRN_SERVER_AGENT_AGENT_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "server/agent/agent_server.h"
#include "server/agent/node_identity.h"

namespace cairn::agent {

// The values cairn-agent's options bind: the spec's own fields directly,
// the rest in the flags' units (MiB, KiB, ms, s) and forms (strings).
struct AgentFlags {
  AgentFlags();

  // The spec's fields the flags give in their own units: the staging budget,
  // bucket sizes, request memory and timeouts. The ones needing checks
  // (--socket-mode, the token files, --transport) are agent_daemon.h's.
  void ApplyUnits();

  // The identity flags, with the environment: KUBERNETES_SERVICE_HOST and
  // the host name. Reads whether --node-name, --peer-advertise and
  // --num-nodes were given: only while the app they were added to lives.
  NodeIdentityOptions Identity() const;

  AgentServer::Spec spec;
  std::string node_id;
  std::string node_name;
  std::string peer_advertise;
  std::string peers;
  std::string peer_dir;
  int register_timeout_s = 120;
  double first_contact_s;
  std::string token_file;
  std::string peer_token_file;
  int budget_mib = 1024;
  int bucket_cap_mib = 32;
  int stream_bucket_kib = 64 << 10;
  int stream_idle_timeout_ms = 60000;
  int holdings_report_ms = 1000;
  std::string transport = "tcp";
  int cuda_device = 0;
  std::string socket_mode = "0660";
  int max_request_memory_mib;
  std::string metrics_port_file;
  std::string ready_file;
  flags::LogFlags log;

  // Set by AddAgentFlags.
  const CLI::Option* node_name_option = nullptr;
  const CLI::Option* peer_advertise_option = nullptr;
  const CLI::Option* num_nodes_option = nullptr;
};

// Adds every cairn-agent option to `app`, bound to `*f` (which must outlive
// parsing): the agent's, --log-level and --log-format, --version and
// --print-config, each also settable as CAIRN_<NAME>.
void AddAgentFlags(CLI::App& app, AgentFlags* f);

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_FLAGS_H_
