// AgentDirectory: an agent started with --node-id auto registers its node
// name with cairnd's agent registry (server/coordinator/agent_registry.h) to
// learn its node id, and finds its peers' addresses in the registry's table
// instead of a --peers list or a --peer-dir.
//
// Register retries while cairnd is unreachable (it may start after the
// agents: a DaemonSet and a StatefulSet come up in any order), with
// exponential backoff, until register_timeout; then, or at once for an
// answer that retrying cannot change (a bad name, no free id), it fails with
// the reason.
//
// Resolve(node) is the transport's resolve_peer. The transport calls it on
// every (re)connect — the first connection to a peer, or after one failed or
// went idle — which is exactly when a peer may have moved (a restarted pod
// has a new IP). So Resolve asks cairnd for the table again unless it did so
// within min_refresh_interval (the transport's connect retries and a load's
// connects to every node then share one ListAgents), and falls back to the
// last table it got when cairnd is unreachable: peers already known stay
// reachable while cairnd restarts.
//
// Thread-safe: every method may be called concurrently.
#ifndef CAIRN_SERVER_AGENT_AGENT_DIRECTORY_H_
#define CAIRN_SERVER_AGENT_AGENT_DIRECTORY_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "protocol/client_security.h"

namespace cairn::agent {

struct AgentDirectoryOptions {
  // cairnd's address. Required.
  std::string coordinator;
  // TLS and token for the calls to cairnd. Default: none.
  protocol::ClientSecurity security;
  // This node's stable name (Kubernetes: spec.nodeName). Required.
  std::string node_name;
  // The cluster size (--num-nodes): the id cairnd gives must be below it.
  // Default: 1.
  int num_nodes = 1;
  // How long Register keeps retrying while cairnd is unreachable.
  // Default: 2 minutes.
  absl::Duration register_timeout = absl::Minutes(2);
  // Deadline of one RPC to cairnd. Default: 5 s.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Resolve reuses a table fetched this recently. Default: 100 ms.
  absl::Duration min_refresh_interval = absl::Milliseconds(100);
};

class AgentDirectory {
 public:
  explicit AgentDirectory(AgentDirectoryOptions options);
  AgentDirectory(const AgentDirectory&) = delete;
  AgentDirectory& operator=(const AgentDirectory&) = delete;

  // Registers this node with `peer_address` (host:port, or empty while the
  // agent is not serving yet) and returns its node id. Retries UNAVAILABLE
  // and DEADLINE_EXCEEDED until register_timeout (then DEADLINE_EXCEEDED
  // naming cairnd and the last error); any other error at once.
  absl::StatusOr<int> Register(const std::string& peer_address);

  // Node `node`'s peer address from cairnd's table. FAILED_PRECONDITION when
  // no agent has registered as `node` (retrying a connect cannot help);
  // UNAVAILABLE when it registered but is not serving yet, or when cairnd
  // cannot be asked and the node is not in the last table.
  absl::StatusOr<std::string> Resolve(int node);

  // ListAgents calls made (for tests).
  int64_t refreshes() const;

 private:
  absl::Status RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const AgentDirectoryOptions options_;
  // The channel's setup error (a bad TLS file), returned by every call;
  // stub_ is null then.
  absl::Status channel_status_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;

  // State below is protected by mu_ (held across a refresh, so concurrent
  // Resolves wait for one ListAgents instead of each sending their own).
  mutable absl::Mutex mu_;
  std::map<int, v1::AgentRecord> table_ ABSL_GUARDED_BY(mu_);
  bool have_table_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time refreshed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_DIRECTORY_H_
