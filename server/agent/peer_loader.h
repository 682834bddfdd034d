// PeerLoader: serves a rank's load from the agents' memory once its step is
// resolved. It asks every reachable agent what it holds of (job, step)
// (Inventory; this agent's tier directly, an unreachable peer skipped),
// plans the transfers from those holders to the rank's wanted boxes
// (PlanPeerLoad: each destination byte moved once, from one holder), copies
// local pieces and fetches remote ones (one Fetch per planned message, at
// most `fetch_threads` at once) into a load segment the rank maps. The
// segment is held until Release. Any failure is returned as an error (the
// rank then loads from storage).
//
// Thread-safe: every method may be called concurrently. The PeerClient,
// tier and pool must outlive it.
#ifndef CAIRN_SERVER_AGENT_PEER_LOADER_H_
#define CAIRN_SERVER_AGENT_PEER_LOADER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "common/shm/shm_segment.h"
#include "common/thread_pool.h"
#include "server/agent/memory_tier.h"
#include "server/agent/peer_client.h"
#include "server/agent/staging_pool.h"

namespace cairn::agent {

class PeerLoader {
 public:
  struct Options {
    int node_id = 0;
    int num_nodes = 1;
    // Transfer-plan bucket cap: the largest fetched message.
    uint64_t bucket_cap_bytes = uint64_t{32} << 20;
    // How long the load segment's memory may be waited for.
    absl::Duration peer_timeout = absl::Seconds(30);
    // Fetches in flight at once, whatever the plan's size.
    int fetch_threads = 8;
  };
  PeerLoader(Options options, PeerClient& peers, MemoryTier& tier,
             StagingPool& pool);
  PeerLoader(const PeerLoader&) = delete;
  PeerLoader& operator=(const PeerLoader&) = delete;

  // The rank's wanted boxes of `step` (resolved; `manifest` is its
  // manifest) from memory: the response names the load segment and its id
  // (for Release), with the bytes moved locally and over the network.
  absl::StatusOr<v1::AgentLoadResponse> Load(
      const v1::AgentLoadRequest& request, int64_t step,
      const v1::Manifest& manifest);
  // Frees load `load_id`'s segment. NOT_FOUND when there is none.
  absl::Status Release(uint64_t load_id);
  // Frees every load's segment.
  void Clear();

 private:
  const Options options_;
  PeerClient& peers_;
  MemoryTier& tier_;
  StagingPool& pool_;
  ThreadPool fetch_pool_;
  std::atomic<uint64_t> next_id_{1};
  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<shm::ShmSegment>> loads_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_PEER_LOADER_H_
