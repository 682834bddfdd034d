// PeerServer: what an agent serves its peers over the peer transport's
// control messages —
//   Push       a peer's committed set, kept as a replica in the memory tier
//              once every item's crc32c is checked (memory from the staging
//              pool);
//   Inventory  what the memory tier holds of (job, step);
//   Fetch      regions of held items, sent as one data message (each source
//              item's crc32c checked against memory first).
// Every request is checked against what it indexes and the staging budget
// before anything is allocated: the sizes come from the network.
//
// Thread-safe: Handle runs on the transport's control threads, several at
// once. The transport, tier and pool must outlive it.
#ifndef CAIRN_SERVER_AGENT_PEER_SERVER_H_
#define CAIRN_SERVER_AGENT_PEER_SERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "common/metrics.h"
#include "server/agent/memory_tier.h"
#include "server/agent/staging_pool.h"
#include "server/agent/transport/transport.h"

namespace cairn::agent {

class PeerServer {
 public:
  struct Options {
    // This agent's node id (in messages).
    int node_id = 0;
    // How long a push's data messages and its memory may be waited for.
    absl::Duration peer_timeout = absl::Seconds(30);
    // Counts the bytes of every replica received (optional).
    metrics::Counter* received_bytes = nullptr;
  };
  PeerServer(Options options, Transport& transport, MemoryTier& tier,
             StagingPool& pool)
      : options_(options), transport_(transport), tier_(tier), pool_(pool) {}
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // Serves one control message from node `peer` and sends the reply to its
  // reply tag (an unparsable message is logged and dropped).
  void Handle(int peer, uint64_t tag, const std::string& payload);

 private:
  absl::Status HandlePush(int peer, const v1::PushReplica& push);
  absl::StatusOr<uint64_t> HandleFetch(int peer, const v1::FetchRequest& req);

  const Options options_;
  Transport& transport_;
  MemoryTier& tier_;
  StagingPool& pool_;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_PEER_SERVER_H_
