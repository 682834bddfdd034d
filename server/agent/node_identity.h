// Who this agent is among its peers and how it finds them: its node id, the
// address peers connect to, and the resolver the transport asks for theirs
// (AgentOptions::resolve_peer). Two ways, as cairn-agent's flags choose:
//
//   --node-id N (0..num-nodes-1): the id is given. Peers' addresses come
//     from --peers (host:port in node-id order) or a shared --peer-dir,
//     where each agent writes node-<id> holding its host:port once it
//     listens and reads the others' (a node missing from both:
//     NOT_FOUND "no peer address known for node N").
//   --node-id auto: cairnd's agent registry (agent_directory.h) gives the id
//     of --node-name (the same one on every restart) and the peers'
//     addresses; no --peers or --peer-dir. This node registers the address
//     --peer-advertise names: HOST:PORT, or HOST with the port --peer-listen
//     binds; without a host, --peer-listen's, or the host name when that is
//     0.0.0.0. A port known only once bound (--peer-listen port 0) is
//     registered then: until that, peers are told the node is starting.
//
// Lifecycle: Create (checks the flags' combination), Register (before the
// transport starts: auto learns its id), PeerResolver() into AgentOptions,
// then Announce(port) once the transport listens.
//
// Thread-compatible: Create, Register and Announce run on the daemon's main
// thread; the resolver they hand out is thread-safe.
#ifndef CAIRN_SERVER_AGENT_NODE_IDENTITY_H_
#define CAIRN_SERVER_AGENT_NODE_IDENTITY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "protocol/client_security.h"
#include "server/agent/agent_directory.h"

namespace cairn::agent {

// This host's name (gethostname); "" if it has none.
std::string HostName();

struct NodeIdentityOptions {
  // --node-id: a number >= 0, or "auto". Required.
  std::string node_id;
  // --node-name and --peer-advertise, and whether either was given at all
  // (even empty): both only with auto. An empty name is the host name,
  // except in Kubernetes (see in_kubernetes).
  std::string node_name;
  bool node_name_given = false;
  std::string peer_advertise;
  bool peer_advertise_given = false;
  // --peers ("host:port,host:port,...") and --peer-dir; empty: none.
  std::string peers;
  std::string peer_dir;
  // --peer-listen, host:port (port 0: any).
  std::string peer_listen;
  // --num-nodes if given (num_nodes_given), else the entries of --peers,
  // else this. Default: 1.
  int num_nodes = 1;
  bool num_nodes_given = false;
  // cairnd, for auto: its address, TLS and token, and how long registering
  // retries while it is unreachable.
  std::string coordinator;
  protocol::ClientSecurity security;
  absl::Duration register_timeout = absl::Minutes(2);
  // The environment: whether this runs in Kubernetes (where a pod's host
  // name changes with every pod, so auto needs --node-name), and this
  // host's name. Default: none, and HostName().
  bool in_kubernetes = false;
  std::string host_name = HostName();
};

// The address peers connect to under --node-id auto.
struct AdvertisedAddress {
  std::string host;
  // 0: the port --peer-listen binds, known once bound.
  int port = 0;
};

// The advertise rules above: INVALID_ARGUMENT "--peer-advertise 'h:x': the
// port must be 1 to 65535" for a bad port.
absl::StatusOr<AdvertisedAddress> ResolveAdvertisedAddress(
    absl::string_view peer_advertise, absl::string_view peer_listen,
    absl::string_view host_name);

// Node `node`'s address from the --peers list (in node-id order), else from
// <peer_dir>/node-<node>; NOT_FOUND "no peer address known for node N".
absl::StatusOr<std::string> ResolveListedPeer(
    const std::vector<std::string>& peers, const std::string& peer_dir,
    int node);

// Writes `address` (host:port) to <peer_dir>/node-<node_id> (atomically,
// creating peer_dir), where ResolveListedPeer finds it.
absl::Status PublishPeerAddress(const std::string& peer_dir, int node_id,
                                absl::string_view address);

class NodeIdentity {
 public:
  // Checks the flags' combination and the advertise address:
  // INVALID_ARGUMENT naming the flags (a usage error).
  static absl::StatusOr<std::unique_ptr<NodeIdentity>> Create(
      NodeIdentityOptions options);
  NodeIdentity(const NodeIdentity&) = delete;
  NodeIdentity& operator=(const NodeIdentity&) = delete;

  // Whether the id comes from cairnd (--node-id auto).
  bool automatic() const { return directory_ != nullptr; }
  // The cluster size.
  int num_nodes() const { return num_nodes_; }
  // This node's name at cairnd (auto only).
  const std::string& node_name() const { return options_.node_name; }
  // This node's id: the given one, or cairnd's once registered.
  int node_id() const { return node_id_; }

  // Auto: registers with cairnd (with the advertised address if its port is
  // known, else as starting) and learns the id; the error says "registering
  // node 'NAME': " and why. A given id: nothing to do.
  absl::Status Register();

  // The resolver for AgentOptions::resolve_peer: cairnd's table (auto), or
  // --peers and --peer-dir.
  std::function<absl::StatusOr<std::string>(int node)> PeerResolver() const;

  // Once the transport listens on `port`: registers the advertised address
  // if its port was not known (cairnd must give the same id back: the error
  // says "registering node 'NAME' with its peer address: " and why), and
  // writes this node's address to --peer-dir (its --peer-listen host, the
  // host name for 0.0.0.0).
  absl::Status Announce(int port);

 private:
  NodeIdentity(NodeIdentityOptions options, int num_nodes,
               std::vector<std::string> peers, AdvertisedAddress advertised);

  // Constant after construction.
  const NodeIdentityOptions options_;
  const int num_nodes_;
  const std::vector<std::string> peers_;
  const AdvertisedAddress advertised_;
  // Auto only; shared with the resolver.
  std::shared_ptr<AgentDirectory> directory_;

  int node_id_ = -1;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_NODE_IDENTITY_H_
