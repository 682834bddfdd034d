// The agent registry: node ids for cairn-agents started with --node-id auto,
// and every agent's peer address (cairn.v1 RegisterAgent / ListAgents /
// ForgetAgent).
//
// In Kubernetes the agent is a DaemonSet pod: it has no stable ordinal and a
// new IP after every restart, but its node has a stable name
// (spec.nodeName). Replicas are placed by node id ((id + i) % num_nodes) and
// a restarted agent must come back as the same node, so ids are keyed by node
// name, not by address or arrival order:
//   * a name seen before gets its id back (the table is in the catalog, so
//     this holds across cairnd restarts too);
//   * a new name gets the lowest id no recorded name holds; it must be below
//     the registering agent's num_nodes (RESOURCE_EXHAUSTED naming the limit
//     and the holders otherwise) and the table holds at most max_agents
//     names;
//   * the peer address is replaced on every registration (empty: the agent
//     is starting and not serving yet);
//   * Forget removes a name for good (a node decommissioned or replaced), so
//     its id can go to a new name. Only the operator knows the node is gone:
//     ids are never reclaimed automatically, because two live agents with
//     one id would corrupt replica placement.
//
// Thread-safe: every method may be called concurrently. mu_ is held across
// the catalog write of a registration so two new names can never be given
// one id; registrations are rare (an agent's start), so this costs nothing.
#ifndef CAIRN_SERVER_COORDINATOR_AGENT_REGISTRY_H_
#define CAIRN_SERVER_COORDINATOR_AGENT_REGISTRY_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cairn/v1/cairn.pb.h"
#include "storage/catalog/catalog.h"

namespace cairn::coordinator {

// Longest node name accepted (a DNS subdomain, what Kubernetes node names
// are).
inline constexpr size_t kMaxNodeNameBytes = 253;

// INVALID_ARGUMENT naming `field` unless `name` is 1 to kMaxNodeNameBytes
// bytes of [A-Za-z0-9._-].
absl::Status ValidateNodeName(absl::string_view name, absl::string_view field);
// INVALID_ARGUMENT naming `field` unless `address` is host:port with a host
// name or IPv4 address (not a wildcard: 0.0.0.0 cannot be connected to) and
// a port in 1..65535.
absl::Status ValidatePeerAddress(absl::string_view address,
                                 absl::string_view field);

class AgentRegistry {
 public:
  // Loads the table from `catalog` (which must outlive the registry).
  // DATA_LOSS when two recorded names hold one id.
  static absl::StatusOr<std::unique_ptr<AgentRegistry>> Open(
      storage::Catalog* catalog, int max_agents);

  absl::StatusOr<v1::RegisterAgentResponse> Register(
      const v1::RegisterAgentRequest& request);
  v1::ListAgentsResponse List() const;
  absl::StatusOr<v1::ForgetAgentResponse> Forget(
      const v1::ForgetAgentRequest& request);

 private:
  AgentRegistry(storage::Catalog* catalog, int max_agents)
      : catalog_(catalog), max_agents_(max_agents) {}

  // Constant after construction.
  storage::Catalog* const catalog_;
  const int max_agents_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::map<std::string, v1::AgentRecord> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_AGENT_REGISTRY_H_
