// Replicator: pushes a committed set to a peer agent, which keeps it as a
// replica (PeerServer's Push). The push is bucketed with the planner's
// transfer schedule: small items share a data message (by dtype), a large
// one is split at the bucket cap; the peer checks every item's crc32c.
//
// Thread-safe: Push may be called concurrently (it keeps no state). The
// PeerClient must outlive it.
#ifndef CAIRN_SERVER_AGENT_REPLICATOR_H_
#define CAIRN_SERVER_AGENT_REPLICATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "server/agent/items.h"
#include "server/agent/peer_client.h"

namespace cairn::agent {

class Replicator {
 public:
  // `bucket_cap_bytes`: the largest data message of a push.
  Replicator(PeerClient& peers, uint64_t bucket_cap_bytes)
      : peers_(peers), bucket_cap_bytes_(bucket_cap_bytes) {}
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Pushes `set` (with its segment) to node `peer` and waits for the peer's
  // answer: OK once it keeps the replica; the peer's refusal (its code and
  // message) or the transport's error otherwise.
  absl::Status Push(const ItemSet& set, int peer);

 private:
  PeerClient& peers_;
  const uint64_t bucket_cap_bytes_;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_REPLICATOR_H_
