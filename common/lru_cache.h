// A bounded least-recently-used map from K to shared_ptr<const V>.
//
// Values are shared so that a reader keeps using an entry after it is
// evicted. Capacity is in "charge" units: each Insert() states the entry's
// charge (1 for an entry count bound, or its approximate bytes for a byte
// bound); the least recently used entries are evicted until the total charge
// fits. An entry larger than the whole capacity is not cached.
//
// Thread-safe: every method may be called concurrently.
//
// Example:
//   LruCache<std::string, Manifest> manifests(/*capacity=*/64);
//   manifests.Insert(key, std::make_shared<const Manifest>(m), /*charge=*/1);
//   if (auto m = manifests.Lookup(key)) Use(*m);
#ifndef CAIRN_COMMON_LRU_CACHE_H_
#define CAIRN_COMMON_LRU_CACHE_H_

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace cairn {

template <typename K, typename V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // nullptr on a miss.
  std::shared_ptr<const V> Lookup(const K& key) {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->value;
  }

  // Inserts or replaces `key`.
  void Insert(const K& key, std::shared_ptr<const V> value, size_t charge) {
    absl::MutexLock lock(&mu_);
    EraseLocked(key);
    if (charge > capacity_) return;
    order_.push_front(Entry{key, std::move(value), charge});
    index_[key] = order_.begin();
    charge_ += charge;
    while (charge_ > capacity_) EraseLocked(order_.back().key);
  }

  void Erase(const K& key) {
    absl::MutexLock lock(&mu_);
    EraseLocked(key);
  }

  // Erases every entry whose key satisfies `pred`.
  void EraseIf(const std::function<bool(const K&)>& pred) {
    absl::MutexLock lock(&mu_);
    for (auto it = order_.begin(); it != order_.end();) {
      auto next = std::next(it);
      if (pred(it->key)) EraseLocked(it->key);
      it = next;
    }
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return index_.size();
  }
  size_t charge() const {
    absl::MutexLock lock(&mu_);
    return charge_;
  }

 private:
  struct Entry {
    K key;
    std::shared_ptr<const V> value;
    size_t charge;
  };

  void EraseLocked(const K& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    charge_ -= it->second->charge;
    order_.erase(it->second);
    index_.erase(it);
  }

  // Constant after construction.
  const size_t capacity_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::list<Entry> order_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<K, typename std::list<Entry>::iterator> index_
      ABSL_GUARDED_BY(mu_);
  size_t charge_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn

#endif  // CAIRN_COMMON_LRU_CACHE_H_
