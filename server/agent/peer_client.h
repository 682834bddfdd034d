// PeerClient: this agent's side of a call to a peer agent — a control
// request (PeerRequest) sent with a tag the peer answers on, and the reply
// (PeerResponse) waited for — over the peer transport. Replication and peer
// loads call peers through it; tags it makes are unique to this node.
//
// Thread-safe: every method may be called concurrently. The transport must
// outlive it.
#ifndef CAIRN_SERVER_AGENT_PEER_CLIENT_H_
#define CAIRN_SERVER_AGENT_PEER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "server/agent/transport/transport.h"

namespace cairn::agent {

class PeerClient {
 public:
  // `timeout`: how long a reply (or a data message Receive waits for) may
  // take.
  PeerClient(Transport& transport, int node_id, absl::Duration timeout)
      : transport_(transport), node_id_(node_id), timeout_(timeout) {}
  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;

  // A tag no other message of this node carries: the node id in bits 40-62,
  // a counter below.
  uint64_t NewTag();

  // Sends `request` (its reply tag and from_node set here) to node `peer`
  // as a control message, then runs `after_send` (optional: the data
  // messages that go with it), then waits for the reply. Errors: the
  // transport's (UNAVAILABLE, DEADLINE_EXCEEDED after the timeout), DATA_LOSS
  // for an unparsable reply; the reply's own code is the caller's to read
  // (StatusOf).
  absl::StatusOr<v1::PeerResponse> Call(
      int peer, v1::PeerRequest request,
      const std::function<absl::Status()>& after_send = nullptr);

  // A data message with `tag` from `peer` (a fetch's answer), waited for as
  // long as a reply.
  absl::StatusOr<std::string> Receive(int peer, uint64_t tag) {
    return transport_.RecvMessage(peer, tag, timeout_);
  }
  absl::Status Send(int peer, uint64_t tag, absl::Span<const char> data) {
    return transport_.Send(peer, tag, data);
  }

  int node_id() const { return node_id_; }

  // A reply's code and message as a status.
  static absl::Status StatusOf(const v1::PeerResponse& r) {
    if (r.code() == 0) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
  }

 private:
  Transport& transport_;
  const int node_id_;
  const absl::Duration timeout_;
  std::atomic<uint64_t> next_tag_{1};
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_PEER_CLIENT_H_
