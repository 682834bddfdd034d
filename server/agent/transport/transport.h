// Transport: point-to-point, tagged, checksummed messages between the agents
// of a cluster (peers are numbered by node id). Replication and peer load use
// it for bulk bytes; both sides derive the same schedule from the planner's
// transfer plan, so every Send has exactly one matching Recv.
//
// Implementations (cairn-agent --transport=tcp|nccl):
//   tcp  (transport/tcp/):  host memory over plain sockets.
//   nccl (transport/nccl/): bulk bytes staged into GPU memory and moved with
//        ncclSend/ncclRecv to the peer's GPU; control messages, announces
//        and bootstrap go over an owned tcp transport. Its host-side logic is
//        always built; the device link needs CAIRN_HAVE_CUDA and a device.
//
// Callers pass host memory; memory_kind() says where the transport moves the
// bytes on the wire (a device transport stages them through GPU memory).
// Every implementation runs the conformance suite in
// transport/transport_conformance_test.cc.
//
// Thread-safe: every method may be called concurrently. Messages between one
// (sender, receiver) pair with different tags may be sent concurrently and
// received in any order.
//
// Example:
//   CAIRN_RETURN_IF_ERROR(t.Send(peer, tag, payload));        // node A
//   CAIRN_RETURN_IF_ERROR(t.Recv(a, tag, buffer, absl::Seconds(30)));  // B
#ifndef CAIRN_SERVER_AGENT_TRANSPORT_TRANSPORT_H_
#define CAIRN_SERVER_AGENT_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cairn::agent {

// Where a transport moves a message's bytes: host memory (tcp) or device
// memory (nccl).
enum class MemoryKind { kHost, kDevice };

class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // "tcp" or "nccl".
  virtual absl::string_view name() const = 0;
  // The memory the bytes travel through.
  virtual MemoryKind memory_kind() const = 0;
  // This agent's node id.
  virtual int node_id() const = 0;
  // The TCP port peers reach this node at (what their resolve_peer returns
  // for this node, with its host).
  virtual int port() const = 0;

  // Sends `data` as one message with `tag` to node `peer`. Returns once the
  // buffer may be reused. UNAVAILABLE when the peer cannot be reached
  // (naming the peer); INVALID_ARGUMENT for a bad peer id.
  virtual absl::Status Send(int peer, uint64_t tag,
                            absl::Span<const char> data) = 0;

  // Receives the message with `tag` from node `peer` into `out`. DATA_LOSS
  // when its checksum does not match or its size differs from out.size();
  // UNAVAILABLE when the peer's connection broke before the message came;
  // DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status Recv(int peer, uint64_t tag, absl::Span<char> out,
                            absl::Duration timeout) = 0;

  // Receives the message with `tag` from `peer`, whatever its size (control
  // replies, pushes, fetches). A message whose Recv timed out or failed is
  // abandoned (see Abandon). Errors as Recv.
  virtual absl::StatusOr<std::string> RecvMessage(int peer, uint64_t tag,
                                                  absl::Duration timeout) = 0;

  // Gives up on message `tag` from `peer`: it is dropped now if it is here,
  // or when it arrives, so a message nobody will Recv does not stay in
  // memory forever.
  virtual void Abandon(int peer, uint64_t tag) = 0;

  // Messages received and waiting for a Recv.
  virtual size_t mailbox_size() = 0;

  // Re-reads the peer TLS certificates for connections opened from now on
  // (TcpTransportOptions::tls_*). FAILED_PRECONDITION without TLS.
  virtual absl::Status ReloadTls() {
    return absl::FailedPreconditionError("the peer transport has no TLS");
  }
};

// Tags with this bit set are control messages: they are handed to the
// registered ControlHandler instead of being queued for Recv.
inline constexpr uint64_t kControlTagBit = uint64_t{1} << 63;

// (sender node, tag, payload). Runs on a transport thread; may block briefly.
using ControlHandler =
    std::function<void(int peer, uint64_t tag, std::string payload)>;

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TRANSPORT_H_
