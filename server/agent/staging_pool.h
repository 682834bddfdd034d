// StagingPool: the agent's memory budget. Every byte the agent holds for
// ranks — sets being staged, tier 0, peers' replicas, streaming buckets and
// load segments — is a shared-memory segment allocated here and counted
// against `budget_bytes` until it is destroyed.
//
// Segments are handed out as shared_ptrs whose deleter gives them back to the
// pool. A released segment is kept (still counted) and handed out again to
// the next allocation of the same size: the rank keeps its mapping of it, so
// a steady-state save copies into memory that is already mapped and faulted.
// Kept segments are destroyed when an allocation needs their space. When
// even that is not enough, Allocate asks `evict` to drop one held set (tier 0
// or a replica, both durable in storage) and tries again; with nothing left
// to evict it waits until a segment is released, the deadline passes or the
// caller gives up.
//
// Segment names are "/cairn-agent-<node>-<family>-<seq>": the pool claims a
// shm::SegmentFamily (and removes what a crashed agent of the same node left
// behind) when it is created. Segments are 0600, or 0660 owned by
// `shm_group` when one is given (the ranks' socket group).
//
// Thread-safe: every method may be called concurrently. Allocate blocks
// (with no lock held while it calls `evict`); the pool's lock is never held
// while calling out. Segments may be released from any thread, also after
// the pool is destroyed: what they need of it lives until the last one is.
#ifndef CAIRN_SERVER_AGENT_STAGING_POOL_H_
#define CAIRN_SERVER_AGENT_STAGING_POOL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shm/shm_segment.h"

namespace cairn::agent {

class StagingPool {
 public:
  // Segment sizes are multiples of this.
  static constexpr uint64_t kSegmentGranule = 4096;

  struct Options {
    // The agent's node id: segment names and messages carry it. Default: 0.
    int node_id = 0;
    // Bytes of segments the pool may hold at once. Default: 1 GiB.
    uint64_t budget_bytes = uint64_t{1} << 30;
    // Group owning the segments (mode 0660); -1: none (mode 0600).
    // Default: -1.
    gid_t shm_group = static_cast<gid_t>(-1);
    // Drops one held set to make room; returns false when there is none.
    // Called by Allocate with no lock of the pool held. Default: none
    // (nothing is ever evicted).
    std::function<bool()> evict;
  };

  // Claims the node's segment family. Errors: those of
  // shm::SegmentFamily::Claim.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(Options options);

  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // The size of the segment Allocate(bytes) hands out: `bytes` (at least 1)
  // rounded up to kSegmentGranule.
  static uint64_t SegmentSize(uint64_t bytes);

  // A segment of SegmentSize(bytes) bytes, waiting until `deadline` for
  // space (see the top). RESOURCE_EXHAUSTED at once when it exceeds the
  // whole budget, or when no space was freed in time; CANCELLED as soon as
  // `caller_gone` (if given) returns true, which is checked every 100 ms
  // while waiting.
  absl::StatusOr<std::shared_ptr<shm::ShmSegment>> Allocate(
      uint64_t bytes, absl::Time deadline,
      const std::function<bool()>& caller_gone = nullptr);

  // `segment` (one of this pool's, still handed out) is destroyed when it is
  // released instead of being kept for reuse: a rank may still be writing
  // into it (a failed stream's bucket).
  void Discard(const shm::ShmSegment* segment);

  uint64_t budget() const { return state_->budget; }
  struct Stats {
    uint64_t used_bytes = 0;  // segments handed out and kept for reuse
    uint64_t peak_used_bytes = 0;
  };
  Stats stats() const;

 private:
  // What the segments' deleters need: shared with them, so a segment may be
  // released after the pool is destroyed.
  struct State {
    // This pool's claim on its segment names; first member, so it is
    // released after every segment it kept.
    std::unique_ptr<shm::SegmentFamily> family;
    std::string prefix;  // family->name_prefix()
    int node_id = 0;
    uint64_t budget = 0;
    gid_t shm_group = static_cast<gid_t>(-1);

    absl::Mutex mu;
    uint64_t used ABSL_GUARDED_BY(mu) = 0;
    uint64_t peak ABSL_GUARDED_BY(mu) = 0;
    uint64_t seq ABSL_GUARDED_BY(mu) = 0;  // of the last segment's name
    // Released segments kept for reuse.
    std::vector<std::unique_ptr<shm::ShmSegment>> free ABSL_GUARDED_BY(mu);
    // Releases so far (a waiting Allocate wakes on a new one).
    int64_t releases ABSL_GUARDED_BY(mu) = 0;
    // Handed-out segments to destroy instead of keep when released.
    std::set<const shm::ShmSegment*> discard ABSL_GUARDED_BY(mu);

    void Release(shm::ShmSegment* segment);
  };

  StagingPool(std::shared_ptr<State> state, std::function<bool()> evict)
      : state_(std::move(state)), evict_(std::move(evict)) {}

  // Constant after construction.
  const std::shared_ptr<State> state_;
  const std::function<bool()> evict_;
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_STAGING_POOL_H_
