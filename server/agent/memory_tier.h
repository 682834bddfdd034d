// MemoryTier: the committed sets an agent keeps in memory — for fast loads,
// tier 0 (its own ranks' latest committed set per (job, rank)) and replicas
// (peers' latest committed set per (job, source rank)), both already durable
// in storage, so dropping one (EvictOldest, when the staging pool needs room)
// only costs load speed; and the sets of memory checkpoints (own and
// replicas, every step), which exist nowhere else: pinned, never evicted,
// kept until cairnd says they are gone (Drop) or persisted (Unpin).
//
// Thread-safe: every method may be called concurrently. The tier's lock is
// a leaf: it is never held while calling out, and a set it drops is released
// (its segment given back to the staging pool) after the lock is let go.
#ifndef CAIRN_SERVER_AGENT_MEMORY_TIER_H_
#define CAIRN_SERVER_AGENT_MEMORY_TIER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cairn/v1/agent.pb.h"
#include "server/agent/items.h"

namespace cairn::agent {

class MemoryTier {
 public:
  // `node_id` names this agent in messages.
  explicit MemoryTier(int node_id) : node_id_(node_id) {}
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  // Keeps `set` (committed, with its segment) as the newest of its
  // (job, rank) in its tier (`set->replica`: the replicas), replacing an
  // older step; a set older than the one held is not kept.
  void Keep(std::shared_ptr<const ItemSet> set);

  // Drops the replica with the oldest step, else the tier-0 set with the
  // oldest step; never a pinned set. False when there is none to drop.
  bool EvictOldest();

  // Every set held, pinned ones with memory_tier (the agent's report).
  std::vector<v1::HeldShards> Held() const;
  // Frees every set of (job, step, rank), pinned or not. Returns how many.
  int Drop(const std::string& job, int64_t step, int rank);
  // A pinned set of (job, step, rank) is persisted: it becomes an ordinary
  // (evictable) set when it is the newest of its (job, rank), else is freed.
  void Unpin(const std::string& job, int64_t step, int rank);
  // The set of (job, step, rank) held, pinned first; null when none.
  std::shared_ptr<const ItemSet> FindSet(const std::string& job, int64_t step,
                                         int rank) const;

  // Every held set of (job, step), tier 0 first: each item with its crc32c
  // (the answer to a peer's Inventory).
  v1::InventoryResponse Inventory(const std::string& job, int64_t step) const;

  // A held item of (job, step) with `item`'s kind, fqn and box whose bytes
  // have crc32c `crc` (checked now, against memory). NOT_FOUND when no set
  // holds it; DATA_LOSS naming both checksums when every copy held differs.
  absl::StatusOr<std::pair<std::shared_ptr<const ItemSet>, const StagedItem*>>
  Find(const std::string& job, int64_t step, const v1::WriteItem& item,
       uint32_t crc) const;

  struct Counts {
    int tier0_sets = 0;
    int replica_sets = 0;
    int memory_sets = 0;  // pinned
    uint64_t memory_bytes = 0;
  };
  Counts counts() const;

  // Drops every set.
  void Clear();

 private:
  using Slots =
      std::map<std::pair<std::string, int>, std::shared_ptr<const ItemSet>>;

  using Pinned = std::map<std::tuple<std::string, int64_t, int>,
                          std::shared_ptr<const ItemSet>>;  // job, step, rank
  // Keeps `set` in its unpinned slot; what it replaces goes to `*replaced`.
  void KeepUnpinnedLocked(std::shared_ptr<const ItemSet> set,
                          std::shared_ptr<const ItemSet>* replaced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int node_id_;
  mutable absl::Mutex mu_;
  Slots tier0_ ABSL_GUARDED_BY(mu_);
  Slots replicas_ ABSL_GUARDED_BY(mu_);
  Pinned pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_MEMORY_TIER_H_
