#include "server/agent/memory_tier.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "storage/checksum.h"

namespace cairn::agent {

using internal::ItemBox;
using internal::ItemFqn;
using internal::SameItem;

void MemoryTier::KeepUnpinnedLocked(std::shared_ptr<const ItemSet> set,
                                    std::shared_ptr<const ItemSet>* replaced) {
  Slots& slots = set->replica ? replicas_ : tier0_;
  std::shared_ptr<const ItemSet>& slot = slots[{set->job, set->rank}];
  if (slot == nullptr || slot->step <= set->step) {
    *replaced = std::move(slot);
    slot = std::move(set);
  } else {
    *replaced = std::move(set);
  }
}

void MemoryTier::Keep(std::shared_ptr<const ItemSet> set) {
  std::shared_ptr<const ItemSet> replaced;  // released after the lock
  absl::MutexLock l(&mu_);
  if (set->memory_tier) {
    std::shared_ptr<const ItemSet>& slot =
        pinned_[{set->job, set->step, set->rank}];
    replaced = std::move(slot);
    slot = std::move(set);
    return;
  }
  KeepUnpinnedLocked(std::move(set), &replaced);
}

std::vector<v1::HeldShards> MemoryTier::Held() const {
  std::vector<v1::HeldShards> out;
  absl::MutexLock l(&mu_);
  auto add = [&](const ItemSet& set, bool pinned) {
    v1::HeldShards h;
    h.set_job(set.job);
    h.set_step(set.step);
    h.set_rank(set.rank);
    uint64_t bytes = 0;
    for (const StagedItem& it : set.items) bytes += it.item.length();
    h.set_bytes(bytes);
    h.set_memory_tier(pinned);
    out.push_back(std::move(h));
  };
  for (const auto& [key, set] : pinned_) add(*set, true);
  for (const Slots* m : {&tier0_, &replicas_}) {
    for (const auto& [key, set] : *m) add(*set, false);
  }
  return out;
}

int MemoryTier::Drop(const std::string& job, int64_t step, int rank) {
  std::vector<std::shared_ptr<const ItemSet>> dropped;  // after the lock
  absl::MutexLock l(&mu_);
  if (auto it = pinned_.find({job, step, rank}); it != pinned_.end()) {
    dropped.push_back(std::move(it->second));
    pinned_.erase(it);
  }
  for (Slots* m : {&tier0_, &replicas_}) {
    auto it = m->find({job, rank});
    if (it != m->end() && it->second->step == step) {
      dropped.push_back(std::move(it->second));
      m->erase(it);
    }
  }
  return static_cast<int>(dropped.size());
}

void MemoryTier::Unpin(const std::string& job, int64_t step, int rank) {
  std::shared_ptr<const ItemSet> replaced;  // released after the lock
  absl::MutexLock l(&mu_);
  auto it = pinned_.find({job, step, rank});
  if (it == pinned_.end()) return;
  std::shared_ptr<const ItemSet> set = std::move(it->second);
  pinned_.erase(it);
  KeepUnpinnedLocked(std::move(set), &replaced);
}

std::shared_ptr<const ItemSet> MemoryTier::FindSet(const std::string& job,
                                                   int64_t step,
                                                   int rank) const {
  absl::MutexLock l(&mu_);
  if (auto it = pinned_.find({job, step, rank}); it != pinned_.end()) {
    return it->second;
  }
  for (const Slots* m : {&tier0_, &replicas_}) {
    auto it = m->find({job, rank});
    if (it != m->end() && it->second->step == step) return it->second;
  }
  return nullptr;
}

bool MemoryTier::EvictOldest() {
  std::shared_ptr<const ItemSet> victim;  // released after the lock
  {
    absl::MutexLock l(&mu_);
    for (Slots* m : {&replicas_, &tier0_}) {
      auto oldest = m->end();
      for (auto it = m->begin(); it != m->end(); ++it) {
        if (oldest == m->end() || it->second->step < oldest->second->step) {
          oldest = it;
        }
      }
      if (oldest != m->end()) {
        victim = std::move(oldest->second);
        m->erase(oldest);
        break;
      }
    }
  }
  if (victim == nullptr) return false;
  CAIRN_LOG(info, "node {}: evicting {} of {} from memory", node_id_,
            victim->replica ? "replica" : "tier 0",
            internal::Where(victim->job, victim->step, victim->rank));
  return true;
}

v1::InventoryResponse MemoryTier::Inventory(const std::string& job,
                                            int64_t step) const {
  v1::InventoryResponse response;
  absl::MutexLock l(&mu_);
  auto add = [&](const ItemSet& set) {
    v1::HeldSet* h = response.add_sets();
    h->set_source_rank(set.rank);
    for (const StagedItem& it : set.items) {
      v1::HeldItem* hi = h->add_items();
      *hi->mutable_item() = it.item;
      hi->set_crc32c(it.crc32c);
    }
  };
  for (auto it =
           pinned_.lower_bound({job, step, std::numeric_limits<int>::min()});
       it != pinned_.end() && std::get<0>(it->first) == job &&
       std::get<1>(it->first) == step;
       ++it) {
    add(*it->second);
  }
  for (const Slots* m : {&tier0_, &replicas_}) {
    for (const auto& [key, set] : *m) {
      if (set->job != job || set->step != step) continue;
      v1::HeldSet* h = response.add_sets();
      h->set_source_rank(set->rank);
      for (const StagedItem& it : set->items) {
        v1::HeldItem* hi = h->add_items();
        *hi->mutable_item() = it.item;
        hi->set_crc32c(it.crc32c);
      }
    }
  }
  return response;
}

absl::StatusOr<std::pair<std::shared_ptr<const ItemSet>, const StagedItem*>>
MemoryTier::Find(const std::string& job, int64_t step,
                 const v1::WriteItem& item, uint32_t crc) const {
  std::vector<std::shared_ptr<const ItemSet>> candidates;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [key, set] : pinned_) {
      if (set->job == job && set->step == step) candidates.push_back(set);
    }
    for (const Slots* m : {&tier0_, &replicas_}) {
      for (const auto& [key, set] : *m) {
        if (set->job == job && set->step == step) candidates.push_back(set);
      }
    }
  }
  absl::Status last = absl::NotFoundError(absl::StrCat(
      "node ", node_id_, " holds no '", ItemFqn(item), "' ",
      planner::BoxToString(ItemBox(item)), " of job '", job, "' step ", step));
  for (const auto& set : candidates) {
    for (const StagedItem& it : set->items) {
      if (!SameItem(it.item, item)) continue;
      const uint32_t got =
          storage::Crc32c(set->segment->data() + it.offset, it.item.length());
      if (got != crc) {
        last = absl::DataLossError(absl::StrFormat(
            "node %d: in-memory '%s' %s of job '%s' step %d has crc32c 0x%08x, "
            "manifest says 0x%08x",
            node_id_, ItemFqn(item), planner::BoxToString(ItemBox(item)), job,
            step, got, crc));
        continue;
      }
      return std::make_pair(set, &it);
    }
  }
  return last;
}

MemoryTier::Counts MemoryTier::counts() const {
  absl::MutexLock l(&mu_);
  Counts c;
  c.tier0_sets = static_cast<int>(tier0_.size());
  c.replica_sets = static_cast<int>(replicas_.size());
  c.memory_sets = static_cast<int>(pinned_.size());
  for (const auto& [key, set] : pinned_) {
    for (const StagedItem& it : set->items) c.memory_bytes += it.item.length();
  }
  return c;
}

void MemoryTier::Clear() {
  Slots tier0, replicas;  // released after the lock
  Pinned pinned;
  absl::MutexLock l(&mu_);
  tier0.swap(tier0_);
  replicas.swap(replicas_);
  pinned.swap(pinned_);
}

}  // namespace cairn::agent
