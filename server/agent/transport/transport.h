// Transport: point-to-point, tagged, checksummed messages between the agents
// of a cluster (peers are numbered by node id). Replication and peer load use
// it for bulk bytes; both sides derive the same schedule from the planner's
// transfer plan, so every Send has exactly one matching Recv.
//
// Implementations:
//   tcp  (transport/tcp/):  host memory over plain sockets; always built.
//   nccl (transport/nccl/): device memory with ncclSend/ncclRecv; built when
//        CAIRN_HAVE_CUDA. Its control messages and bootstrap go over tcp.
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
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cairn::agent {

// Where a message's bytes live: host memory (tcp) or device memory (nccl).
enum class MemoryKind { kHost, kDevice };

class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // "tcp" or "nccl".
  virtual absl::string_view name() const = 0;
  // The memory Send/Recv buffers must be in.
  virtual MemoryKind memory_kind() const = 0;
  // This agent's node id.
  virtual int node_id() const = 0;

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
};

// Tags with this bit set are control messages: they are handed to the
// registered ControlHandler instead of being queued for Recv.
inline constexpr uint64_t kControlTagBit = uint64_t{1} << 63;

// (sender node, tag, payload). Runs on a transport thread; may block briefly.
using ControlHandler =
    std::function<void(int peer, uint64_t tag, std::string payload)>;

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_TRANSPORT_TRANSPORT_H_
