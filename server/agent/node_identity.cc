#include "server/agent/node_identity.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"

namespace cairn::agent {
namespace {

// The host of host:port (all of it without a ':').
std::string HostOf(absl::string_view address) {
  return std::string(address.substr(0, address.rfind(':')));
}

// The port of host:port; 0 if it has none or it is not a number.
int PortOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(
          address.substr(colon == absl::string_view::npos ? 0 : colon + 1),
          &port)) {
    return 0;
  }
  return port;
}

}  // namespace

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

absl::StatusOr<AdvertisedAddress> ResolveAdvertisedAddress(
    absl::string_view peer_advertise, absl::string_view peer_listen,
    absl::string_view host_name) {
  AdvertisedAddress out;
  out.host = std::string(peer_advertise);
  out.port = PortOf(peer_listen);
  if (const size_t colon = peer_advertise.rfind(':');
      colon != absl::string_view::npos) {
    out.host = std::string(peer_advertise.substr(0, colon));
    if (!absl::SimpleAtoi(peer_advertise.substr(colon + 1), &out.port) ||
        out.port < 1 || out.port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-advertise '", peer_advertise,
                       "': the port must be 1 to 65535"));
    }
  }
  if (out.host.empty()) {
    out.host = HostOf(peer_listen);
    if (out.host == "0.0.0.0" || out.host.empty()) {
      out.host = std::string(host_name);
    }
  }
  return out;
}

absl::StatusOr<std::string> ResolveListedPeer(
    const std::vector<std::string>& peers, const std::string& peer_dir,
    int node) {
  if (node >= 0 && node < static_cast<int>(peers.size())) return peers[node];
  if (!peer_dir.empty()) {
    std::ifstream in(absl::StrCat(peer_dir, "/node-", node));
    std::string address;
    if (in >> address) return address;
  }
  return absl::NotFoundError(
      absl::StrCat("no peer address known for node ", node));
}

absl::Status PublishPeerAddress(const std::string& peer_dir, int node_id,
                                absl::string_view address) {
  std::error_code ec;
  std::filesystem::create_directories(peer_dir, ec);
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("--peer-dir ", peer_dir));
  }
  return daemon::WriteFileAtomically(absl::StrCat(peer_dir, "/node-", node_id),
                                     absl::StrCat(address, "\n"));
}

absl::StatusOr<std::unique_ptr<NodeIdentity>> NodeIdentity::Create(
    NodeIdentityOptions options) {
  const bool automatic = options.node_id == "auto";
  int node_id = -1;
  if (automatic) {
    if (!options.peers.empty() || !options.peer_dir.empty()) {
      return absl::InvalidArgumentError(
          "--node-id auto finds peers through cairnd; drop --peers and "
          "--peer-dir");
    }
    if (options.node_name.empty() && options.in_kubernetes) {
      // A pod's host name is the pod's name, new with every pod: each
      // restart would register a new node and take a new id.
      return absl::InvalidArgumentError(
          "--node-id auto in Kubernetes needs --node-name (CAIRN_NODE_NAME "
          "from the downward API's spec.nodeName): the pod's host name "
          "changes with every pod");
    }
    if (options.node_name.empty()) options.node_name = options.host_name;
  } else {
    if (options.node_name_given || options.peer_advertise_given) {
      return absl::InvalidArgumentError(
          "--node-name and --peer-advertise need --node-id auto");
    }
    if (!absl::SimpleAtoi(options.node_id, &node_id) || node_id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--node-id: must be >= 0 or 'auto', got ", options.node_id));
    }
  }
  std::vector<std::string> peers;
  if (!options.peers.empty()) peers = absl::StrSplit(options.peers, ',');
  const int num_nodes = !peers.empty() && !options.num_nodes_given
                            ? static_cast<int>(peers.size())
                            : options.num_nodes;
  AdvertisedAddress advertised;
  if (automatic) {
    absl::StatusOr<AdvertisedAddress> a = ResolveAdvertisedAddress(
        options.peer_advertise, options.peer_listen, options.host_name);
    if (!a.ok()) return a.status();
    advertised = *std::move(a);
  }
  std::unique_ptr<NodeIdentity> identity(new NodeIdentity(
      std::move(options), num_nodes, std::move(peers), std::move(advertised)));
  identity->node_id_ = node_id;
  if (automatic) {
    AgentDirectoryOptions dir;
    dir.coordinator = identity->options_.coordinator;
    dir.security = identity->options_.security;
    dir.node_name = identity->options_.node_name;
    dir.num_nodes = num_nodes;
    dir.register_timeout = identity->options_.register_timeout;
    identity->directory_ = std::make_shared<AgentDirectory>(dir);
  }
  return identity;
}

NodeIdentity::NodeIdentity(NodeIdentityOptions options, int num_nodes,
                           std::vector<std::string> peers,
                           AdvertisedAddress advertised)
    : options_(std::move(options)),
      num_nodes_(num_nodes),
      peers_(std::move(peers)),
      advertised_(std::move(advertised)) {}

absl::Status NodeIdentity::Register() {
  if (directory_ == nullptr) return absl::OkStatus();
  // Before the transport is bound the port may be unknown: registered
  // without an address, peers are told this node is starting.
  absl::StatusOr<int> id = directory_->Register(
      advertised_.port > 0
          ? absl::StrCat(advertised_.host, ":", advertised_.port)
          : "");
  if (!id.ok()) {
    return absl::Status(id.status().code(),
                        absl::StrCat("registering node '", options_.node_name,
                                     "': ", id.status().ToString()));
  }
  node_id_ = *id;
  return absl::OkStatus();
}

std::function<absl::StatusOr<std::string>(int node)>
NodeIdentity::PeerResolver() const {
  if (directory_ != nullptr) {
    return
        [directory = directory_](int node) { return directory->Resolve(node); };
  }
  return [peers = peers_, peer_dir = options_.peer_dir](int node) {
    return ResolveListedPeer(peers, peer_dir, node);
  };
}

absl::Status NodeIdentity::Announce(int port) {
  if (directory_ != nullptr && advertised_.port == 0) {
    absl::StatusOr<int> id =
        directory_->Register(absl::StrCat(advertised_.host, ":", port));
    if (!id.ok() || *id != node_id_) {
      return absl::Status(
          id.ok() ? absl::StatusCode::kFailedPrecondition : id.status().code(),
          absl::StrCat("registering node '", options_.node_name,
                       "' with its peer address: ",
                       id.ok() ? absl::StrCat("cairnd now gives id ", *id,
                                              ", not ", node_id_)
                               : id.status().ToString()));
    }
  }
  if (!options_.peer_dir.empty()) {
    std::string host = HostOf(options_.peer_listen);
    if (host == "0.0.0.0") host = options_.host_name;
    return PublishPeerAddress(options_.peer_dir, node_id_,
                              absl::StrCat(host, ":", port));
  }
  return absl::OkStatus();
}

}  // namespace cairn::agent
