// Plan cache: skip global save planning when no rank's plan changed.
//
// Each rank fingerprints the canonical form of its local plan: every item is
// encoded field by field (kind, fqn, dtype, shape, box, length; integers as
// fixed-width little-endian, strings length-prefixed so no two different
// items share an encoding), the encodings are sorted (so item order does not
// matter), and the sorted list is hashed with MurmurHash3_x64_128 (seed 0,
// written out in plan_cache.cc; the test pins its published test vector). It
// is stable across runs, processes and machines, unlike absl::Hash, which is
// seeded per process. It is not cryptographic: fingerprints guard against
// accidental change, not against a rank forging a collision. The fingerprint is
// the 32-character lower-case hex of those 128 bits.
//
// The coordinator keys cached global plans by (job, world size, the
// fingerprints of all ranks in rank order, storage settings). Lookup hashes the
// key to find a bucket but always compares the FULL key, so a cached plan is
// never returned for a different key (PyTorch's plan cache shipped exactly
// that bug). Eviction is LRU, bounded by the approximate bytes of the cached
// plans plus their keys; a plan larger than the bound is not cached.
#ifndef CAIRN_PLANNER_PLAN_CACHE_H_
#define CAIRN_PLANNER_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "planner/save_plan.h"

namespace cairn::planner {

// 32 lower-case hex chars (128 bits) of the plan's canonical form. Independent
// of item order and of the plan's rank field; any change to any field of any
// item changes it.
std::string FingerprintLocalPlan(const LocalSavePlan& plan);

// The 128-bit hash behind the fingerprint, as 32 lower-case hex chars.
// Exposed for tests and for other stable content hashes.
std::string StableHash128Hex(absl::string_view data);

// Fields encoded for a stable hash (fingerprints, digests, plan ids) or a
// cache key: integers as 8 bytes little-endian, strings and lists prefixed by
// their length, so that no two different lists of fields encode alike and
// the bytes are the same on every machine.
class StableKey {
 public:
  void Reserve(size_t bytes) { bytes_.reserve(bytes); }
  void PutU64(uint64_t v);
  void PutInt(int64_t v) { PutU64(static_cast<uint64_t>(v)); }
  void PutString(absl::string_view s);
  void PutInts(absl::Span<const int64_t> values);
  // Bytes already encoded (another StableKey's).
  void Append(absl::string_view encoded) {
    bytes_.append(encoded.data(), encoded.size());
  }

  const std::string& bytes() const { return bytes_; }
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// The same fields hashed as they are put instead of held: the 128-bit XXH3
// (libxxhash) of exactly the bytes a StableKey given the same calls would
// hold, as 32 lower-case hex chars. For in-memory cache keys of large inputs
// (a PlanLoad request's ~70 KB of wanted boxes at 16k ranks): nothing is
// copied, and XXH3 hashes several times faster than StableHash128Hex. Not
// for what must stay the same across releases (fingerprints, digests, plan
// ids): those are StableHash128Hex's.
class StreamedKeyHash {
 public:
  StreamedKeyHash();
  void PutU64(uint64_t v);
  void PutInt(int64_t v) { PutU64(static_cast<uint64_t>(v)); }
  void PutString(absl::string_view s);
  void PutInts(absl::Span<const int64_t> values);
  std::string Hex() const;

 private:
  void Update(const void* data, size_t n);

  // XXH3's streaming state (its size is checked in plan_cache.cc).
  alignas(64) unsigned char state_[640];
};

// XXH3-128 of `data` as StreamedKeyHash::Hex writes it (what a StreamedKeyHash
// given a StableKey's calls returns for its bytes).
std::string StreamedKeyHashOf(absl::string_view data);

// Approximate heap bytes held by a plan (what PlanCache charges for it).
size_t ApproximatePlanBytes(const GlobalSavePlan& plan);

// Thread-safe: every method may be called concurrently without external
// locking. LRU bounded by approximate bytes of cached plans.
class PlanCache {
 public:
  struct Key {
    std::string job;
    int world_size = 0;
    std::vector<std::string> fingerprints;  // one per rank, rank order
    std::string storage_settings;           // e.g. StorageSettingsKey()

    friend bool operator==(const Key& a, const Key& b) {
      return a.world_size == b.world_size && a.job == b.job &&
             a.storage_settings == b.storage_settings &&
             a.fingerprints == b.fingerprints;
    }
  };

  explicit PlanCache(size_t max_bytes);
  // A cache whose key hash is constant, so every key collides and lookups
  // rest entirely on full-key comparison. Tests use it to prove that.
  static std::unique_ptr<PlanCache> NewWithCollidingHashesForTest(
      size_t max_bytes);
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The plan cached under exactly `key` (marked most recently used), or
  // nullptr on a miss.
  std::shared_ptr<const GlobalSavePlan> Lookup(const Key& key);

  // Caches `plan` under `key`, replacing any plan cached under the same key,
  // then evicts least recently used plans until bytes() <= max_bytes. A plan
  // whose own charge exceeds max_bytes is not cached: returns its charge
  // then (0 when cached). Null plans are ignored.
  size_t Insert(const Key& key, std::shared_ptr<const GlobalSavePlan> plan);

  // Drops every plan of `job` (e.g. when its checkpoints are deleted).
  void EraseJob(absl::string_view job);

  size_t size() const;
  size_t bytes() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  // The index stores pointers to the keys inside lru_ entries; hashing and
  // equality dereference them, so lookups compare FULL keys.
  struct KeyPtrHash {
    bool constant = false;  // ForTest: every key hashes to 0
    size_t operator()(const Key* key) const;
  };
  struct KeyPtrEq {
    bool operator()(const Key* a, const Key* b) const { return *a == *b; }
  };
  struct Entry {
    Key key;
    std::shared_ptr<const GlobalSavePlan> plan;
    size_t charge = 0;
  };
  using LruList = std::list<Entry>;  // front = most recently used

  PlanCache(size_t max_bytes, bool colliding_hashes);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const size_t max_bytes_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  LruList lru_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<const Key*, LruList::iterator, KeyPtrHash, KeyPtrEq> index_
      ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The id of the global plan built from `key` by the planner of
// `planner_build` (cairnd passes its version): 32 hex chars of a stable hash
// of both. The planner is deterministic, so equal ids mean equal plans; a
// rank holding its part of the plan by id needs it sent again only when the
// id changes. A planner whose output changes for the same key must change
// `planner_build` (a new cairnd version does).
std::string PlanId(const PlanCache::Key& key, absl::string_view planner_build);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_PLAN_CACHE_H_
