// cairn-agent: one per node. Parses flags, starts the agent (UDS control
// service for the node's ranks + peer transport), waits for SIGTERM/SIGINT;
// SIGHUP reloads the peer TLS certificates (--peer-tls-*).
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
// peers in cairnd's agent table (server/agent/agent_directory.h).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/protocol/client_security.h"
#include "client/protocol/coordinator_call.h"
#include "common/cli_flags.h"
#include "common/gpu/gpu_info.h"
#include "common/grpc_logging.h"
#include "common/logging.h"
#include "server/agent/agent_directory.h"
#include "server/agent/agent_server.h"
#include "server/agent/transport/tcp/tcp_transport.h"
#ifdef CAIRN_HAVE_CUDA
#include "server/agent/copier/cuda/cuda_copier.h"
#include "server/agent/transport/nccl/nccl_device_link.h"
#endif

// Ends the usage errors main reports after parsing, like the parser's own.
constexpr char kSeeHelp[] = "Run with --help for more information.\n";

int main(int argc, char** argv) {
  // Debian's Abseil is built with Mutex deadlock detection on: every lock
  // and every Mutex's destruction updates one global lock graph (CPU on
  // every lock, and one more lock that every thread shares). The tests keep
  // it; the daemons do not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using cairn::agent::AgentServer;
  CLI::App app{
      "cairn-agent: node-local staging, async persistence, in-memory tier and "
      "peer replication for Cairn checkpoints. Ranks connect over a Unix "
      "domain socket (cairn.v1.Agent); agents talk over the peer transport.",
      "cairn-agent"};
  AgentServer::Spec spec;
  std::string peers, peer_dir, ready_file;
  int budget_mib = 1024, bucket_cap_mib = 32, cuda_device = 0;
  int stream_bucket_kib = 64 << 10, stream_idle_timeout_ms = 60000;
  std::string node_id_flag, node_name, peer_advertise;
  int register_timeout_s = 120;
  double first_contact_s =
      absl::ToDoubleSeconds(cairn::protocol::kDefaultFirstContactTimeout);
  app.add_option("--node-id", node_id_flag,
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
  app.add_option("--node-name", node_name,
                 "With --node-id auto: this node's stable name, the key of "
                 "its id at cairnd (Kubernetes: spec.nodeName through the "
                 "downward API; required there) (default: the host name)");
  app.add_option("--peer-advertise", peer_advertise,
                 "With --node-id auto: HOST or HOST:PORT peers connect to, "
                 "registered with cairnd (Kubernetes: status.podIP); the "
                 "port defaults to the bound --peer-listen port (default "
                 "host: --peer-listen's, else the host name)");
  app.add_option("--register-timeout-s", register_timeout_s,
                 "With --node-id auto: how long to keep registering while "
                 "cairnd is unreachable before exiting")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 86400));
  app.add_option("--coordinator-first-contact-s", first_contact_s,
                 "How long to try to reach a cairnd that has not answered "
                 "yet: at start (with a fixed --node-id the agent exits if "
                 "--coordinator does not answer within it) and for a save's "
                 "calls; once cairnd has answered, a restart of it is "
                 "retried for about a minute")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--listen-unix", spec.unix_socket,
                 "Unix domain socket for this node's ranks")
      ->required();
  app.add_option("--peer-listen", spec.agent.peer_listen,
                 "host:port of the peer transport (port 0: any)")
      ->capture_default_str();
  app.add_option("--peers", peers,
                 "Every agent's peer address, in node-id order "
                 "(host:port,host:port,...)");
  app.add_option("--peer-dir", peer_dir,
                 "Rendezvous directory: this agent writes node-<id> with its "
                 "peer address and reads the others' (shared filesystem)");
  app.add_option("--num-nodes", spec.agent.num_nodes,
                 "Number of agents (default: entries of --peers, else 1)")
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--coordinator", spec.agent.coordinator, "cairnd host:port")
      ->required();
  cairn::protocol::ClientSecurity& security = spec.agent.coordinator_security;
  std::string token_file;
  app.add_option("--tls-ca", security.ca_file,
                 "PEM CA bundle of cairnd's certificate: call cairnd over TLS");
  app.add_option("--tls-cert", security.cert_file,
                 "PEM client certificate for cairnd with --tls-client-ca "
                 "(with --tls-key)");
  app.add_option("--tls-key", security.key_file,
                 "PEM private key of --tls-cert");
  app.add_option("--token-file", token_file,
                 "File holding the bearer token sent to cairnd (default: "
                 "CAIRN_TOKEN)");
  app.add_option("--staging-budget-mib", budget_mib,
                 "Memory for staging, tier 0 and replicas")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 24));
  app.add_option("--replicas", spec.agent.replicas,
                 "Peer agents each checkpoint is replicated to")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1024));
  app.add_option("--bucket-cap-mib", bucket_cap_mib,
                 "Largest peer message (small items are bucketed)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1024));
  app.add_option("--stream-bucket-kib", stream_bucket_kib,
                 "Bucket of a save larger than the budget (at most half of "
                 "the budget is used)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 24));
  app.add_option("--stream-idle-timeout-ms", stream_idle_timeout_ms,
                 "A streaming save whose rank stays silent this long is "
                 "aborted")
      ->capture_default_str()
      ->check(cairn::flags::Positive());
  app.add_option("--io-threads", spec.agent.io_threads,
                 "Parallel storage writes per rank")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 256));
  std::string transport = "tcp";
  app.add_option("--transport", transport,
                 "Peer transport for replication and peer loads: tcp (host "
                 "memory over TCP) or nccl (bytes staged into GPU memory and "
                 "moved with ncclSend/ncclRecv; needs a CUDA build and a GPU; "
                 "control messages still use --peer-listen). Every agent of "
                 "a cluster must use the same")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "nccl"}));
  app.add_option("--cuda-device", cuda_device,
                 "Device of the cuda copier and the nccl transport (CUDA "
                 "builds)")
      ->capture_default_str()
      ->check(cairn::flags::AtLeast(0));
  std::string peer_token_file, socket_mode = "0660";
  app.add_option("--peer-token-file", peer_token_file,
                 "File holding the cluster token every peer agent must "
                 "present (same on every agent; default: $CAIRN_PEER_TOKEN, "
                 "else none)");
  app.add_option("--peer-tls-ca", spec.agent.peer_tls_ca_file,
                 "PEM CA bundle for mutual TLS between agents: every peer "
                 "connection is TLS and a peer's certificate must chain to "
                 "it (host names are not checked, so use a CA dedicated to "
                 "this cluster: whatever it signs is a peer). With "
                 "--peer-tls-cert and --peer-tls-key; SIGHUP re-reads all "
                 "three (default: none, plain TCP)");
  app.add_option("--peer-tls-cert", spec.agent.peer_tls_cert_file,
                 "PEM certificate (chain) this agent presents to peers, "
                 "signed by --peer-tls-ca, usable as TLS server and client "
                 "(extended key usage serverAuth and clientAuth, or none)");
  app.add_option("--peer-tls-key", spec.agent.peer_tls_key_file,
                 "PEM private key of --peer-tls-cert");
  app.add_option("--socket-mode", socket_mode,
                 "Permission bits (octal) of the --listen-unix socket")
      ->capture_default_str();
  app.add_option("--socket-group", spec.socket_group,
                 "Group (name or id) owning the socket and the shared memory; "
                 "its members may connect (default: only this user and root)");
  int max_request_memory_mib =
      static_cast<int>(spec.max_request_memory_bytes >> 20);
  app.add_option("--max-request-memory-mib", max_request_memory_mib,
                 "Memory budget of gRPC's buffers for the ranks' connections "
                 "to --listen-unix, in MiB: requests received and not yet "
                 "parsed, connections' buffers (tensor data goes through "
                 "shared memory, not through it). At the budget, idle "
                 "connections are closed and calls in flight cancelled "
                 "(RESOURCE_EXHAUSTED) until they fit")
      ->capture_default_str()
      ->check(cairn::flags::InRange(16, 1 << 24));
  app.add_option("--max-streams-per-connection",
                 spec.max_streams_per_connection,
                 "Calls in flight on one connection to --listen-unix (a "
                 "rank queues more); a rank process has a few at a time")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 30));
  app.add_option("--max-connections-per-uid", spec.max_connections_per_uid,
                 "Connections to --listen-unix open at once from one user "
                 "(all ranks of a job share one); more are logged and their "
                 "calls answered RESOURCE_EXHAUSTED naming the uid and this "
                 "flag")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--max-connections", spec.max_connections,
                 "Connections to --listen-unix open at once in all; more are "
                 "refused as for --max-connections-per-uid")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--max-peer-connections-per-address",
                 spec.agent.peer_max_connections_per_address,
                 "Connections to --peer-listen open at once from one IP "
                 "address, in their handshake or authenticated (a peer agent "
                 "has one, and one replacing it when it reconnects); more "
                 "are closed at once, logged with the address")
      ->capture_default_str()
      ->check(cairn::flags::InRange(1, 1 << 20));
  app.add_option("--max-peer-connections", spec.agent.peer_max_connections,
                 "Connections to --peer-listen open at once in all; more are "
                 "closed at once, logged with the address (0: 64 in their "
                 "handshake + 2 per node of --num-nodes)")
      ->capture_default_str()
      ->check(cairn::flags::InRange(0, 1 << 20));
  app.add_option("--health-listen", spec.health_listen,
                 "host:port serving grpc.health.v1 only (Kubernetes gRPC "
                 "probes); NOT_SERVING while draining (default: none)");
  std::string metrics_port_file;
  app.add_option("--metrics-listen", spec.metrics_listen,
                 "host:port serving Prometheus metrics at GET /metrics "
                 "(port 0 picks a free port; default: none)");
  app.add_option("--metrics-port-file", metrics_port_file,
                 "Write the bound metrics port to this file once serving");
  app.add_option("--ready-file", ready_file,
                 "Written with the peer port once serving");
  cairn::flags::LogFlags log;
  cairn::flags::AddLogFlags(app, &log);
  cairn::flags::AddVersionFlag(app, "cairn-agent");
  cairn::flags::AddPrintConfigFlag(app);
  cairn::flags::AddEnvironmentVariables(app);
  if (std::optional<int> exit_code =
          cairn::flags::Parse(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }

  // Checked by the flags' own validators above.
  (void)cairn::SetLogFormat(log.format);
  cairn::RouteGrpcLogsToCairnLogger();
  if (absl::Status s = cairn::SetLogLevel(log.level); !s.ok()) {
    std::fprintf(stderr, "cairn-agent: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  {
    unsigned long mode = 0;
    char* end = nullptr;
    mode = std::strtoul(socket_mode.c_str(), &end, 8);
    if (socket_mode.empty() || *end != '\0' || mode > 0777) {
      std::fprintf(stderr,
                   "cairn-agent: --socket-mode '%s' is not an octal mode "
                   "like 0660\n",
                   socket_mode.c_str());
      return 2;
    }
    spec.socket_mode = static_cast<mode_t>(mode);
  }
  // Tokens from their files, else the environment; a bad file fails the
  // start, naming its flag.
  auto token = [](const char* flag, const std::string& path, const char* env,
                  size_t max_bytes, std::string* out) {
    absl::StatusOr<std::string> t =
        cairn::protocol::TokenFromFileOrEnv(flag, path, env, max_bytes);
    if (!t.ok()) {
      std::fprintf(stderr, "cairn-agent: %s\n",
                   std::string(t.status().message()).c_str());
      return false;
    }
    *out = *std::move(t);
    return true;
  };
  if (!token("--peer-token-file", peer_token_file, "CAIRN_PEER_TOKEN",
             cairn::agent::kMaxTokenBytes, &spec.agent.peer_token) ||
      !token("--token-file", token_file, "CAIRN_TOKEN",
             std::numeric_limits<size_t>::max(), &security.token)) {
    return 2;
  }
  // A missing or bad TLS file fails the start, naming it.
  if (absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
          cairn::protocol::CoordinatorChannelCredentials(security);
      !creds.ok()) {
    std::fprintf(stderr, "cairn-agent: %s\n",
                 std::string(creds.status().message()).c_str());
    return 2;
  }
  {
    // Before registering with cairnd: a TLS file problem fails the start.
    cairn::agent::TcpTransportOptions tls;
    tls.tls_ca_file = spec.agent.peer_tls_ca_file;
    tls.tls_cert_file = spec.agent.peer_tls_cert_file;
    tls.tls_key_file = spec.agent.peer_tls_key_file;
    if (absl::Status s = cairn::agent::TcpTransport::CheckTlsOptions(tls);
        !s.ok()) {
      std::fprintf(
          stderr, "cairn-agent: %s\n%s", std::string(s.message()).c_str(),
          absl::StrContains(s.message(), "is missing") ? kSeeHelp : "");
      return 2;
    }
  }
  const bool peer_tls = !spec.agent.peer_tls_ca_file.empty();
  const bool auto_id = node_id_flag == "auto";
  if (auto_id) {
    if (!peers.empty() || !peer_dir.empty()) {
      std::fprintf(stderr,
                   "cairn-agent: --node-id auto finds peers through cairnd; "
                   "drop --peers and --peer-dir\n%s",
                   kSeeHelp);
      return 2;
    }
    if (node_name.empty() && std::getenv("KUBERNETES_SERVICE_HOST")) {
      // A pod's host name is the pod's name, new with every pod: each
      // restart would register a new node and take a new id.
      std::fprintf(stderr,
                   "cairn-agent: --node-id auto in Kubernetes needs "
                   "--node-name (CAIRN_NODE_NAME from the downward API's "
                   "spec.nodeName): the pod's host name changes with every "
                   "pod\n%s",
                   kSeeHelp);
      return 2;
    }
    if (node_name.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      node_name = host;
    }
  } else {
    if (app.count("--node-name") || app.count("--peer-advertise")) {
      std::fprintf(stderr,
                   "cairn-agent: --node-name and --peer-advertise need "
                   "--node-id auto\n%s",
                   kSeeHelp);
      return 2;
    }
    (void)absl::SimpleAtoi(node_id_flag, &spec.agent.node_id);  // checked
  }
  std::vector<std::string> peer_list;
  if (!peers.empty()) peer_list = absl::StrSplit(peers, ',');
  if (!peer_list.empty() && !app.count("--num-nodes")) {
    spec.agent.num_nodes = static_cast<int>(peer_list.size());
  }
  if (spec.agent.num_nodes > 1 && spec.agent.peer_token.empty() && !peer_tls) {
    CAIRN_LOG(warn,
              "cairn-agent: no peer token (--peer-token-file or "
              "CAIRN_PEER_TOKEN): any host that reaches the peer port may act "
              "as a peer agent");
  }
  spec.agent.staging_budget_bytes = static_cast<uint64_t>(budget_mib) << 20;
  spec.max_request_memory_bytes = int64_t{max_request_memory_mib} << 20;
  spec.agent.bucket_cap_bytes = static_cast<uint64_t>(bucket_cap_mib) << 20;
  spec.agent.stream_bucket_bytes = static_cast<uint64_t>(stream_bucket_kib)
                                   << 10;
  spec.agent.stream_idle_timeout = absl::Milliseconds(stream_idle_timeout_ms);
  spec.agent.coordinator_first_contact_timeout = absl::Seconds(first_contact_s);
  // Local checks before cairnd is contacted: a wrong --transport fails at
  // once with its own reason, not after the first-contact timeout.
  if (transport == "nccl") {
#ifdef CAIRN_HAVE_CUDA
    auto link = cairn::agent::NcclDeviceLink::Create(cuda_device);
    if (!link.ok()) {
      std::fprintf(stderr, "cairn-agent: --transport=nccl: %s\n",
                   std::string(link.status().message()).c_str());
      return 1;
    }
    spec.agent.transport = cairn::agent::AgentOptions::TransportKind::kNccl;
    spec.agent.device_link = std::move(*link);
#else
    std::fprintf(stderr,
                 "cairn-agent: --transport=nccl: this cairn-agent was built "
                 "without CUDA/NCCL (configure with -DCAIRN_WITH_CUDA=ON "
                 "where nvcc and NCCL are installed); use --transport=tcp\n");
    return 1;
#endif
  }
  if (!auto_id) {
    // A wrong --coordinator (or TLS setup cairnd refuses) fails here, naming
    // the address, not at the first save. With --node-id auto, registering
    // is the check (it waits --register-timeout-s: in Kubernetes the agents
    // may start before cairnd).
    absl::Status reached = cairn::protocol::CoordinatorContact::Probe(
        spec.agent.coordinator, security,
        spec.agent.coordinator_first_contact_timeout);
    if (!reached.ok()) {
      std::fprintf(stderr, "cairn-agent: --coordinator %s: %s\n",
                   spec.agent.coordinator.c_str(), reached.ToString().c_str());
      return 1;
    }
  }
  // --node-id auto: the advertised address (the port may only be known once
  // the transport is bound) and the id from cairnd's registry.
  std::shared_ptr<cairn::agent::AgentDirectory> directory;
  std::string advertise_host;
  int advertise_port = 0;
  if (auto_id) {
    const std::string listen_host =
        spec.agent.peer_listen.substr(0, spec.agent.peer_listen.rfind(':'));
    int listen_port = 0;
    (void)absl::SimpleAtoi(
        spec.agent.peer_listen.substr(spec.agent.peer_listen.rfind(':') + 1),
        &listen_port);
    advertise_host = peer_advertise;
    advertise_port = listen_port;
    if (const size_t colon = peer_advertise.rfind(':');
        colon != std::string::npos) {
      advertise_host = peer_advertise.substr(0, colon);
      if (!absl::SimpleAtoi(peer_advertise.substr(colon + 1),
                            &advertise_port) ||
          advertise_port < 1 || advertise_port > 65535) {
        std::fprintf(stderr,
                     "cairn-agent: --peer-advertise '%s': the port must be "
                     "1 to 65535\n%s",
                     peer_advertise.c_str(), kSeeHelp);
        return 2;
      }
    }
    if (advertise_host.empty()) {
      advertise_host = listen_host;
      if (advertise_host == "0.0.0.0" || advertise_host.empty()) {
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        advertise_host = host;
      }
    }
    cairn::agent::AgentDirectoryOptions dir_options;
    dir_options.coordinator = spec.agent.coordinator;
    dir_options.security = security;
    dir_options.node_name = node_name;
    dir_options.num_nodes = spec.agent.num_nodes;
    dir_options.register_timeout = absl::Seconds(register_timeout_s);
    directory = std::make_shared<cairn::agent::AgentDirectory>(dir_options);
    // Before the transport is bound the port may be unknown: registered
    // without an address, peers are told this node is starting.
    absl::StatusOr<int> id = directory->Register(
        advertise_port > 0 ? absl::StrCat(advertise_host, ":", advertise_port)
                           : "");
    if (!id.ok()) {
      std::fprintf(stderr, "cairn-agent: registering node '%s': %s\n",
                   node_name.c_str(), id.status().ToString().c_str());
      return 1;
    }
    spec.agent.node_id = *id;
    CAIRN_LOG(info, "cairn-agent: node '{}' registered with cairnd as node {}",
              node_name, *id);
  }
  if (directory != nullptr) {
    spec.agent.resolve_peer = [directory](int node) {
      return directory->Resolve(node);
    };
  } else {
    spec.agent.resolve_peer =
        [peer_list, peer_dir](int node) -> absl::StatusOr<std::string> {
      if (node >= 0 && node < static_cast<int>(peer_list.size())) {
        return peer_list[node];
      }
      if (!peer_dir.empty()) {
        std::ifstream in(absl::StrCat(peer_dir, "/node-", node));
        std::string address;
        if (in >> address) return address;
      }
      return absl::NotFoundError(
          absl::StrCat("no peer address known for node ", node));
    };
  }
#ifdef CAIRN_HAVE_CUDA
  {
    absl::StatusOr<int> devices = cairn::gpu::DeviceCount();
    if (devices.ok() && *devices > 0) {
      auto copier = cairn::agent::CudaCopier::Create(cuda_device);
      if (copier.ok()) {
        spec.agent.device_copier = std::move(*copier);
      } else {
        CAIRN_LOG(warn, "cairn-agent: no cuda copier: {}",
                  copier.status().ToString());
      }
    }
  }
#else
  (void)cuda_device;
#endif

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const int node_id = spec.agent.node_id;
  const std::string spec_peer_host =
      spec.agent.peer_listen.substr(0, spec.agent.peer_listen.rfind(':'));
  absl::StatusOr<std::unique_ptr<AgentServer>> server =
      AgentServer::Start(std::move(spec));
  if (!server.ok()) {
    std::fprintf(stderr, "cairn-agent: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->agent().peer_port();
  if (directory != nullptr && advertise_port == 0) {
    absl::StatusOr<int> id =
        directory->Register(absl::StrCat(advertise_host, ":", port));
    if (!id.ok() || *id != node_id) {
      std::fprintf(
          stderr,
          "cairn-agent: registering node '%s' with its peer "
          "address: %s\n",
          node_name.c_str(),
          id.ok() ? absl::StrCat("cairnd now gives id ", *id, ", not ", node_id)
                        .c_str()
                  : id.status().ToString().c_str());
      (*server)->Shutdown();
      return 1;
    }
  }
  if (!peer_dir.empty()) {
    std::filesystem::create_directories(peer_dir);
    const std::string f = absl::StrCat(peer_dir, "/node-", node_id);
    std::string host = spec_peer_host;
    if (host == "0.0.0.0") {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      host = name;
    }
    std::ofstream(f + ".tmp") << host << ":" << port << "\n";
    std::filesystem::rename(f + ".tmp", f);
  }
  if (!metrics_port_file.empty() && (*server)->metrics_port() > 0) {
    std::ofstream(metrics_port_file + ".tmp")
        << (*server)->metrics_port() << "\n";
    std::filesystem::rename(metrics_port_file + ".tmp", metrics_port_file);
  }
  if (!ready_file.empty()) {
    std::ofstream(ready_file + ".tmp") << port << "\n";
    std::filesystem::rename(ready_file + ".tmp", ready_file);
  }
  CAIRN_LOG(info, "cairn-agent: node {} serving on {} (peer port {})", node_id,
            (*server)->target(), port);
  int sig = 0;
  while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
    if (!peer_tls) {
      CAIRN_LOG(info, "cairn-agent: SIGHUP: no peer TLS to reload");
      continue;
    }
    // New peer connections use the new files; open ones keep theirs. A bad
    // file keeps the loaded certificates.
    if (absl::Status s = (*server)->agent().ReloadPeerTls(); s.ok()) {
      CAIRN_LOG(info,
                "cairn-agent: SIGHUP: peer TLS certificate, key and CA "
                "reloaded");
    } else {
      CAIRN_LOG(error,
                "cairn-agent: SIGHUP: peer TLS reload failed, keeping the "
                "loaded certificates: {}",
                std::string(s.message()));
    }
  }
  CAIRN_LOG(info, "cairn-agent: signal {} received, stopping", sig);
  (*server)->Shutdown();
  return 0;
}
