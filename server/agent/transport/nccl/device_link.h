// DeviceLink: the device half of the NCCL transport — GPU-resident staging
// buffers and ncclSend/ncclRecv between the agents' GPUs. NcclTransport
// (nccl_transport.h) does everything else on the host: framing, announces,
// ordering, mailbox, bootstrap.
//
// Two communicators join every node: "up" carries messages to higher node
// ids, "down" to lower ones. NcclTransport serializes the calls of each
// communicator on a node (one lock per direction), so a node blocked sending
// up only waits for higher nodes, which never wait for it on that
// communicator: no cycle, no deadlock between nodes sending to each other.
//
// Implementations:
//   NcclDeviceLink (nccl_device_link.h): CUDA + NCCL; CAIRN_HAVE_CUDA builds;
//     Create() fails FAILED_PRECONDITION without a device.
//   LoopbackDeviceLink (loopback_device_link.h): the agents of one process
//     hand bytes to each other through host memory with the same blocking
//     rendezvous as NCCL; tests run the host-side logic with it.
//
// Thread-compatible per direction: the caller serializes the calls of one
// direction; Send up and Send down may run concurrently.
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_NCCL_DEVICE_LINK_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_NCCL_DEVICE_LINK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cairn::agent {

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  DeviceLink() = default;
  DeviceLink(const DeviceLink&) = delete;
  DeviceLink& operator=(const DeviceLink&) = delete;

  // A new communicator id (node 0 makes them; ncclGetUniqueId), as bytes.
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;

  // Joins the up and down communicators of `num_nodes` nodes as `node`.
  // Collective: every node calls it with the same ids. DEADLINE_EXCEEDED
  // when not every node joined within `timeout` (the communicators are
  // aborted, so nothing stays stuck).
  virtual absl::Status Init(int num_nodes, int node, const std::string& up_id,
                            const std::string& down_id,
                            absl::Duration timeout) = 0;

  // Copies `data` (host memory) into GPU staging memory and sends it to
  // node `peer` (on "up" when peer > this node, else "down"), in staging-
  // buffer sized pieces. Returns when the peer has received it all.
  //
  // Bounded by `timeout`: a peer that died or stalled mid-transfer never
  // completes its side, so past it the direction's communicator is aborted
  // (nothing stays stuck on the GPU) and Send fails DEADLINE_EXCEEDED; an
  // error the communicator reports fails it the same way at once. Every
  // later call of that direction then fails FAILED_PRECONDITION with that
  // reason until Init joins new communicators.
  virtual absl::Status Send(int peer, absl::Span<const char> data,
                            absl::Duration timeout) = 0;

  // Receives out.size() bytes from `peer` into GPU staging memory and copies
  // them to `out` (host memory). Matches the peer's Sends in issue order.
  // Bounded by `timeout` as Send.
  virtual absl::Status Recv(int peer, absl::Span<char> out,
                            absl::Duration timeout) = 0;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_NCCL_DEVICE_LINK_H_
