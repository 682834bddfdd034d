// LoopbackDeviceLink: a DeviceLink for the agents of one process, through
// host memory. It keeps NCCL's contract — Init is collective (every node,
// same ids, within the timeout), a Send blocks until the peer's matching
// Recv took the bytes, sends and receives between a pair match in issue
// order, a length mismatch is an error, and a transfer the peer does not
// complete within its timeout aborts that direction — so NcclTransport's
// host-side
// logic (announces, ordering, locking, bootstrap) is tested without a GPU.
//
// Example:
//   auto fabric = std::make_shared<LoopbackFabric>();
//   auto link0 = std::make_unique<LoopbackDeviceLink>(fabric);
//
// Thread-safe.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_LOOPBACK_DEVICE_LINK_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_LOOPBACK_DEVICE_LINK_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/agent/transport/nccl/device_link.h"

namespace cairn::agent {

// What the links of one "cluster" share.
class LoopbackFabric {
 public:
  // Messages sent from `from` to `to` and not yet received.
  size_t in_flight(int from, int to);

 private:
  friend class LoopbackDeviceLink;
  struct Transfer {
    absl::Span<const char> data;
    bool taken = false;
    bool failed = false;
  };
  absl::Mutex mu_;
  // Ids each node joined with, by (up id, down id): nodes joined.
  std::map<std::pair<std::string, std::string>, int> joined_
      ABSL_GUARDED_BY(mu_);
  // (from, to) -> sends waiting for their Recv, in issue order.
  std::map<std::pair<int, int>, std::deque<Transfer*>> queues_
      ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_id_{1};
};

class LoopbackDeviceLink : public DeviceLink {
 public:
  explicit LoopbackDeviceLink(std::shared_ptr<LoopbackFabric> fabric)
      : fabric_(std::move(fabric)) {}

  absl::StatusOr<std::string> NewUniqueId() override;
  absl::Status Init(int num_nodes, int node, const std::string& up_id,
                    const std::string& down_id,
                    absl::Duration timeout) override;
  absl::Status Send(int peer, absl::Span<const char> data,
                    absl::Duration timeout) override;
  absl::Status Recv(int peer, absl::Span<char> out,
                    absl::Duration timeout) override;

 private:
  // FAILED_PRECONDITION when the direction to `peer` was aborted (as an
  // aborted NCCL communicator), else OK.
  absl::Status CheckDirection(int peer);
  // Marks the direction to `peer` aborted for `reason`.
  void AbortDirection(int peer, const absl::Status& reason);

  const std::shared_ptr<LoopbackFabric> fabric_;
  int node_ = -1;
  int num_nodes_ = 0;
  absl::Mutex mu_;
  absl::Status aborted_up_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_down_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_LOOPBACK_DEVICE_LINK_H_
