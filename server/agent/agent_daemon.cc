#include "server/agent/agent_daemon.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/gpu/gpu_info.h"
#include "common/logging.h"
#include "protocol/client_security.h"
#include "protocol/coordinator_call.h"
#include "server/agent/transport/tcp/tcp_transport.h"
#ifdef CAIRN_HAVE_CUDA
#include "server/agent/copier/cuda/cuda_copier.h"
#include "server/agent/transport/nccl/nccl_device_link.h"
#endif

namespace cairn::agent {
namespace {

// Ends the usage errors reported after parsing, like the parser's own.
constexpr char kSeeHelp[] = "Run with --help for more information.\n";

// Reports `message` and returns `exit_code`.
int Fail(int exit_code, absl::string_view message, bool see_help = false) {
  std::fprintf(stderr, "cairn-agent: %s\n%s", std::string(message).c_str(),
               see_help ? kSeeHelp : "");
  return exit_code;
}

// The checks on files and forms the flags' validators cannot make, filling
// the spec: --socket-mode, the token files (else the environment), cairnd's
// TLS files and the peers'. nullopt to go on, or the exit code.
std::optional<int> CheckFiles(AgentFlags& f) {
  {
    char* end = nullptr;
    const unsigned long mode = std::strtoul(f.socket_mode.c_str(), &end, 8);
    if (f.socket_mode.empty() || *end != '\0' || mode > 0777) {
      return Fail(2, absl::StrCat("--socket-mode '", f.socket_mode,
                                  "' is not an octal mode like 0660"));
    }
    f.spec.socket_mode = static_cast<mode_t>(mode);
  }
  // A bad token file fails the start, naming its flag.
  protocol::ClientSecurity& security = f.spec.agent.coordinator_security;
  absl::StatusOr<std::string> peer_token =
      protocol::TokenFromFileOrEnv("--peer-token-file", f.peer_token_file,
                                   "CAIRN_PEER_TOKEN", kMaxTokenBytes);
  if (!peer_token.ok()) return Fail(2, peer_token.status().message());
  f.spec.agent.peer_token = *std::move(peer_token);
  absl::StatusOr<std::string> token =
      protocol::TokenFromFileOrEnv("--token-file", f.token_file, "CAIRN_TOKEN",
                                   std::numeric_limits<size_t>::max());
  if (!token.ok()) return Fail(2, token.status().message());
  security.token = *std::move(token);
  // A missing or bad TLS file fails the start, naming it.
  if (absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
          protocol::CoordinatorChannelCredentials(security);
      !creds.ok()) {
    return Fail(2, creds.status().message());
  }
  // Before registering with cairnd: a peer TLS file problem fails the start.
  TcpTransportOptions tls;
  tls.tls_ca_file = f.spec.agent.peer_tls_ca_file;
  tls.tls_cert_file = f.spec.agent.peer_tls_cert_file;
  tls.tls_key_file = f.spec.agent.peer_tls_key_file;
  if (absl::Status s = TcpTransport::CheckTlsOptions(tls); !s.ok()) {
    return Fail(2, s.message(), absl::StrContains(s.message(), "is missing"));
  }
  return std::nullopt;
}

// --transport nccl: the device link, checked before cairnd is contacted (a
// wrong --transport fails at once with its own reason, not after the
// first-contact timeout). nullopt to go on, or the exit code.
std::optional<int> SetUpTransport(AgentFlags& f) {
  if (f.transport != "nccl") return std::nullopt;
#ifdef CAIRN_HAVE_CUDA
  auto link = NcclDeviceLink::Create(f.cuda_device);
  if (!link.ok()) {
    return Fail(1, absl::StrCat("--transport=nccl: ", link.status().message()));
  }
  f.spec.agent.transport = AgentOptions::TransportKind::kNccl;
  f.spec.agent.device_link = std::move(*link);
  return std::nullopt;
#else
  return Fail(1,
              "--transport=nccl: this cairn-agent was built without "
              "CUDA/NCCL (configure with -DCAIRN_WITH_CUDA=ON where nvcc and "
              "NCCL are installed); use --transport=tcp");
#endif
}

// The cuda copier, when this build and host have a GPU.
void SetUpDeviceCopier(AgentFlags& f) {
#ifdef CAIRN_HAVE_CUDA
  absl::StatusOr<int> devices = gpu::DeviceCount();
  if (devices.ok() && *devices > 0) {
    auto copier = CudaCopier::Create(f.cuda_device);
    if (copier.ok()) {
      f.spec.agent.device_copier = std::move(*copier);
    } else {
      CAIRN_LOG(warn, "cairn-agent: no cuda copier: {}",
                copier.status().ToString());
    }
  }
#else
  (void)f;
#endif
}

// --metrics-port-file and --ready-file, once serving.
absl::Status WriteReadyFiles(const AgentFlags& f, const AgentServer& server,
                             int peer_port) {
  if (!f.metrics_port_file.empty() && server.metrics_port() > 0) {
    if (absl::Status s = daemon::WriteFileAtomically(
            f.metrics_port_file, absl::StrCat(server.metrics_port(), "\n"));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--metrics-port-file: ", s.message()));
    }
  }
  if (!f.ready_file.empty()) {
    if (absl::Status s = daemon::WriteFileAtomically(
            f.ready_file, absl::StrCat(peer_port, "\n"));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--ready-file: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// SIGHUP: new peer connections use the new files; open ones keep theirs. A
// bad file keeps the loaded certificates.
void ReloadPeerTls(AgentServer& server, bool peer_tls) {
  if (!peer_tls) {
    CAIRN_LOG(info, "cairn-agent: SIGHUP: no peer TLS to reload");
    return;
  }
  if (absl::Status s = server.agent().ReloadPeerTls(); s.ok()) {
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

}  // namespace

int RunAgentDaemon(AgentFlags f) {
  daemon::DisableMutexDeadlockDetection();
  if (absl::Status s = daemon::SetUpLogging(f.log); !s.ok()) {
    return Fail(2, s.message());
  }
  if (std::optional<int> exit_code = CheckFiles(f)) return *exit_code;
  // After CheckFiles: registering uses the token it read.
  absl::StatusOr<std::unique_ptr<NodeIdentity>> created =
      NodeIdentity::Create(f.Identity());
  if (!created.ok()) return Fail(2, created.status().message(), true);
  NodeIdentity& identity = **created;
  f.spec.agent.num_nodes = identity.num_nodes();
  const bool peer_tls = !f.spec.agent.peer_tls_ca_file.empty();
  if (f.spec.agent.num_nodes > 1 && f.spec.agent.peer_token.empty() &&
      !peer_tls) {
    CAIRN_LOG(warn,
              "cairn-agent: no peer token (--peer-token-file or "
              "CAIRN_PEER_TOKEN): any host that reaches the peer port may act "
              "as a peer agent");
  }
  f.ApplyUnits();
  if (std::optional<int> exit_code = SetUpTransport(f)) return *exit_code;
  if (!identity.automatic()) {
    // A wrong --coordinator (or TLS setup cairnd refuses) fails here, naming
    // the address, not at the first save. With --node-id auto, registering
    // is the check (it waits --register-timeout-s: in Kubernetes the agents
    // may start before cairnd).
    absl::Status reached = protocol::CoordinatorContact::Probe(
        f.spec.agent.coordinator, f.spec.agent.coordinator_security,
        f.spec.agent.coordinator_first_contact_timeout);
    if (!reached.ok()) {
      return Fail(1, absl::StrCat("--coordinator ", f.spec.agent.coordinator,
                                  ": ", reached.ToString()));
    }
  }
  if (absl::Status s = identity.Register(); !s.ok()) {
    return Fail(1, s.message());
  }
  if (identity.automatic()) {
    CAIRN_LOG(info, "cairn-agent: node '{}' registered with cairnd as node {}",
              identity.node_name(), identity.node_id());
  }
  f.spec.agent.node_id = identity.node_id();
  f.spec.agent.resolve_peer = identity.PeerResolver();
  SetUpDeviceCopier(f);

  const daemon::StopSignals signals;
  absl::StatusOr<std::unique_ptr<AgentServer>> started =
      AgentServer::Start(std::move(f.spec));
  if (!started.ok()) return Fail(1, started.status().ToString());
  AgentServer& server = **started;
  const int port = server.agent().peer_port();
  absl::Status announced = identity.Announce(port);
  if (announced.ok()) announced = WriteReadyFiles(f, server, port);
  if (!announced.ok()) {
    Fail(1, announced.message());
    server.Shutdown();
    return 1;
  }
  CAIRN_LOG(info, "cairn-agent: node {} serving on {} (peer port {})",
            identity.node_id(), server.target(), port);
  daemon::StopSignals::WaitOptions wait;
  wait.on_reload = [&] { ReloadPeerTls(server, peer_tls); };
  const int sig = signals.Wait(wait);
  CAIRN_LOG(info, "cairn-agent: signal {} received, stopping", sig);
  server.Shutdown();
  return 0;
}

}  // namespace cairn::agent
