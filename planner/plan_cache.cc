#include "planner/plan_cache.h"

#include "absl/hash/hash.h"

namespace cairn::planner {

std::string FingerprintLocalPlan(const LocalSavePlan& plan) {
  (void)plan;
  return std::string(32, '0');
}

std::string StableHash128Hex(absl::string_view data) {
  (void)data;
  return std::string(32, '0');
}

size_t ApproximatePlanBytes(const GlobalSavePlan& plan) {
  (void)plan;
  return 0;
}

size_t PlanCache::KeyPtrHash::operator()(const Key* key) const {
  return absl::HashOf(key->job, key->world_size, key->fingerprints,
                      key->storage_settings);
}

PlanCache::PlanCache(size_t max_bytes) : max_bytes_(max_bytes) {}

std::shared_ptr<const GlobalSavePlan> PlanCache::Lookup(const Key& key) {
  (void)key;
  return nullptr;
}

void PlanCache::Insert(const Key& key,
                       std::shared_ptr<const GlobalSavePlan> plan) {
  (void)key;
  (void)plan;
}

void PlanCache::EraseJob(absl::string_view job) { (void)job; }

void PlanCache::EvictLocked() {}

size_t PlanCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

size_t PlanCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace cairn::planner
