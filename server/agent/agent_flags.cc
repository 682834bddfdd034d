#include "server/agent/agent_flags.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "protocol/coordinator_call.h"

namespace cairn::agent {

AgentFlags::AgentFlags()
    : first_contact_s(
          absl::ToDoubleSeconds(protocol::kDefaultFirstContactTimeout)),
      max_request_memory_mib(
          static_cast<int>(spec.max_request_memory_bytes >> 20)) {}

void AgentFlags::ApplyUnits() {
  spec.agent.staging_budget_bytes = static_cast<uint64_t>(budget_mib) << 20;
  spec.max_request_memory_bytes = int64_t{max_request_memory_mib} << 20;
  spec.agent.bucket_cap_bytes = static_cast<uint64_t>(bucket_cap_mib) << 20;
  spec.agent.stream_bucket_bytes = static_cast<uint64_t>(stream_bucket_kib)
                                   << 10;
  spec.agent.stream_idle_timeout = absl::Milliseconds(stream_idle_timeout_ms);
  spec.agent.holdings_report_interval = absl::Milliseconds(holdings_report_ms);
  spec.agent.coordinator_first_contact_timeout = absl::Seconds(first_contact_s);
}

NodeIdentityOptions AgentFlags::Identity() const {
  NodeIdentityOptions o;
  o.node_id = node_id;
  o.node_name = node_name;
  o.node_name_given = node_name_option != nullptr && node_name_option->count();
  o.peer_advertise = peer_advertise;
  o.peer_advertise_given =
      peer_advertise_option != nullptr && peer_advertise_option->count();
  o.peers = peers;
  o.peer_dir = peer_dir;
  o.peer_listen = spec.agent.peer_listen;
  o.num_nodes = spec.agent.num_nodes;
  o.num_nodes_given = num_nodes_option != nullptr && num_nodes_option->count();
  o.coordinator = spec.agent.coordinator;
  o.security = spec.agent.coordinator_security;
  o.register_timeout = absl::Seconds(register_timeout_s);
  o.in_kubernetes = std::getenv("KUBERNETES_SERVICE_HOST") != nullptr;
  return o;
}

void AddAgentFlags(CLI::App& app, AgentFlags* f) {
  app.add_option("--node-id", f->node_id,
                 "This node's id (0..num-nodes-1), or 'auto': cairnd gives "
                 "the id of --node-name (the same one on every restart) and "
                 "peers are found through cairnd (no --peers/--peer-dir)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto") return "";
            int id = -1;
            if (!absl::SimpleAtoi(v, &id) || id < 0) {
              return "must be >= 0 or 'auto', got " + v;
            }
            return "";
          },
          "ID|auto"));
  f->node_name_option =
      app.add_option("--node-name", f->node_name,
                     "With --node-id auto: this node's stable name, the key of "
                     "its id at cairnd (Kubernetes: spec.nodeName through the "
                     "downward API; required there) (default: the host name)");
  f->peer_advertise_option =
      app.add_option("--peer-advertise", f->peer_advertise,
                     "With --node-id auto: HOST or HOST:PORT peers connect to, "
                     "registered with cairnd (Kubernetes: status.podIP); the "
                     "port defaults to the bound --peer-listen port (default "
                     "host: --peer-listen's, else the host name)");
  app.add_option("--register-timeout-s", f->register_timeout_s,
                 "With --node-id auto: how long to keep registering while "
                 "cairnd is unreachable before exiting")
      ->capture_default_str()
      ->check(flags::InRange(1, 86400));
  app.add_option("--coordinator-first-contact-s", f->first_contact_s,
                 "How long to try to reach a cairnd that has not answered "
                 "yet: at start (with a fixed --node-id the agent exits if "
                 "--coordinator does not answer within it) and for a save's "
                 "calls; once cairnd has answered, a restart of it is "
                 "retried for about a minute")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--listen-unix", f->spec.unix_socket,
                 "Unix domain socket for this node's ranks")
      ->required();
  app.add_option("--peer-listen", f->spec.agent.peer_listen,
                 "host:port of the peer transport (port 0: any)")
      ->capture_default_str();
  app.add_option("--peers", f->peers,
                 "Every agent's peer address, in node-id order "
                 "(host:port,host:port,...)");
  app.add_option("--peer-dir", f->peer_dir,
                 "Rendezvous directory: this agent writes node-<id> with its "
                 "peer address and reads the others' (shared filesystem)");
  f->num_nodes_option =
      app.add_option("--num-nodes", f->spec.agent.num_nodes,
                     "Number of agents (default: entries of --peers, else 1)")
          ->check(flags::InRange(1, 1 << 20));
  app.add_option("--coordinator", f->spec.agent.coordinator, "cairnd host:port")
      ->required();
  app.add_option("--tls-ca", f->spec.agent.coordinator_security.ca_file,
                 "PEM CA bundle of cairnd's certificate: call cairnd over TLS");
  app.add_option("--tls-cert", f->spec.agent.coordinator_security.cert_file,
                 "PEM client certificate for cairnd with --tls-client-ca "
                 "(with --tls-key)");
  app.add_option("--tls-key", f->spec.agent.coordinator_security.key_file,
                 "PEM private key of --tls-cert");
  app.add_option("--token-file", f->token_file,
                 "File holding the bearer token sent to cairnd (default: "
                 "CAIRN_TOKEN)");
  app.add_option("--staging-budget-mib", f->budget_mib,
                 "Memory for staging, tier 0 and replicas")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 24));
  app.add_option("--replicas", f->spec.agent.replicas,
                 "Peer agents each checkpoint is replicated to (a memory "
                 "checkpoint's copies beyond one, unless the job's policy "
                 "says)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1024));
  app.add_option("--holdings-report-ms", f->holdings_report_ms,
                 "How often the agent tells cairnd what it holds in memory "
                 "(its heartbeat for memory checkpoints; 0: never)")
      ->capture_default_str()
      ->check(flags::InRange(0, 600000));
  app.add_option("--bucket-cap-mib", f->bucket_cap_mib,
                 "Largest peer message (small items are bucketed)")
      ->capture_default_str()
      ->check(flags::InRange(1, 1024));
  app.add_option("--stream-bucket-kib", f->stream_bucket_kib,
                 "Bucket of a save larger than the budget (at most half of "
                 "the budget is used)")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 24));
  app.add_option("--stream-idle-timeout-ms", f->stream_idle_timeout_ms,
                 "A streaming save whose rank stays silent this long is "
                 "aborted")
      ->capture_default_str()
      ->check(flags::Positive());
  app.add_option("--io-threads", f->spec.agent.io_threads,
                 "Parallel storage writes per rank")
      ->capture_default_str()
      ->check(flags::InRange(1, 256));
  app.add_option("--transport", f->transport,
                 "Peer transport for replication and peer loads: tcp (host "
                 "memory over TCP) or nccl (bytes staged into GPU memory and "
                 "moved with ncclSend/ncclRecv; needs a CUDA build and a GPU; "
                 "control messages still use --peer-listen). Every agent of "
                 "a cluster must use the same")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "nccl"}));
  app.add_option("--cuda-device", f->cuda_device,
                 "Device of the cuda copier and the nccl transport (CUDA "
                 "builds)")
      ->capture_default_str()
      ->check(flags::AtLeast(0));
  app.add_option("--peer-token-file", f->peer_token_file,
                 "File holding the cluster token every peer agent must "
                 "present (same on every agent; default: $CAIRN_PEER_TOKEN, "
                 "else none)");
  app.add_option("--peer-tls-ca", f->spec.agent.peer_tls_ca_file,
                 "PEM CA bundle for mutual TLS between agents: every peer "
                 "connection is TLS and a peer's certificate must chain to "
                 "it (host names are not checked, so use a CA dedicated to "
                 "this cluster: whatever it signs is a peer). With "
                 "--peer-tls-cert and --peer-tls-key; SIGHUP re-reads all "
                 "three (default: none, plain TCP)");
  app.add_option("--peer-tls-cert", f->spec.agent.peer_tls_cert_file,
                 "PEM certificate (chain) this agent presents to peers, "
                 "signed by --peer-tls-ca, usable as TLS server and client "
                 "(extended key usage serverAuth and clientAuth, or none)");
  app.add_option("--peer-tls-key", f->spec.agent.peer_tls_key_file,
                 "PEM private key of --peer-tls-cert");
  app.add_option("--socket-mode", f->socket_mode,
                 "Permission bits (octal) of the --listen-unix socket")
      ->capture_default_str();
  app.add_option("--socket-group", f->spec.socket_group,
                 "Group (name or id) owning the socket and the shared memory; "
                 "its members may connect (default: only this user and root)");
  app.add_option("--max-request-memory-mib", f->max_request_memory_mib,
                 "Memory budget of gRPC's buffers for the ranks' connections "
                 "to --listen-unix, in MiB: requests received and not yet "
                 "parsed, connections' buffers (tensor data goes through "
                 "shared memory, not through it). At the budget, idle "
                 "connections are closed and calls in flight cancelled "
                 "(RESOURCE_EXHAUSTED) until they fit")
      ->capture_default_str()
      ->check(flags::InRange(16, 1 << 24));
  app.add_option("--max-streams-per-connection",
                 f->spec.max_streams_per_connection,
                 "Calls in flight on one connection to --listen-unix (a "
                 "rank queues more); a rank process has a few at a time")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 30));
  app.add_option("--max-connections-per-uid", f->spec.max_connections_per_uid,
                 "Connections to --listen-unix open at once from one user "
                 "(all ranks of a job share one); more are logged and their "
                 "calls answered RESOURCE_EXHAUSTED naming the uid and this "
                 "flag")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-connections", f->spec.max_connections,
                 "Connections to --listen-unix open at once in all; more are "
                 "refused as for --max-connections-per-uid")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-peer-connections-per-address",
                 f->spec.agent.peer_max_connections_per_address,
                 "Connections to --peer-listen open at once from one IP "
                 "address, in their handshake or authenticated (a peer agent "
                 "has one, and one replacing it when it reconnects); more "
                 "are closed at once, logged with the address")
      ->capture_default_str()
      ->check(flags::InRange(1, 1 << 20));
  app.add_option("--max-peer-connections", f->spec.agent.peer_max_connections,
                 "Connections to --peer-listen open at once in all; more are "
                 "closed at once, logged with the address (0: 64 in their "
                 "handshake + 2 per node of --num-nodes)")
      ->capture_default_str()
      ->check(flags::InRange(0, 1 << 20));
  app.add_option("--health-listen", f->spec.health_listen,
                 "host:port serving grpc.health.v1 only (Kubernetes gRPC "
                 "probes); NOT_SERVING while draining (default: none)");
  app.add_option("--metrics-listen", f->spec.metrics_listen,
                 "host:port serving Prometheus metrics at GET /metrics "
                 "(port 0 picks a free port; default: none)");
  app.add_option("--metrics-port-file", f->metrics_port_file,
                 "Write the bound metrics port to this file once serving");
  app.add_option("--ready-file", f->ready_file,
                 "Written with the peer port once serving");
  flags::AddLogFlags(app, &f->log);
  flags::AddVersionFlag(app, "cairn-agent");
  flags::AddPrintConfigFlag(app);
  flags::AddEnvironmentVariables(app);
}

}  // namespace cairn::agent
