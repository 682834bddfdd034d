// Test helper of the agent's components: an ItemSet in a segment of a
// StagingPool, its items filled with chosen bytes and checksummed, as a
// committed set is.
#ifndef CAIRN_SERVER_AGENT_TESTING_ITEM_SETS_H_
#define CAIRN_SERVER_AGENT_TESTING_ITEM_SETS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/agent/items.h"
#include "server/agent/staging_pool.h"
#include "storage/checksum.h"

namespace cairn::agent::testing {

// A bytes entry `fqn` of `length` bytes.
inline v1::WriteItem BytesItem(const std::string& fqn, uint64_t length) {
  v1::WriteItem w;
  w.set_kind(v1::WriteItem::KIND_BYTES);
  w.set_bytes_fqn(fqn);
  w.set_length(length);
  return w;
}

// A set of (job, step, rank) on `pool` holding `items` (64-byte aligned in
// one segment), item i's byte b being fill(i, b), each item's crc32c set.
inline std::shared_ptr<ItemSet> MakeFilledSet(
    StagingPool& pool, const std::string& job, int64_t step, int rank,
    bool replica, const std::vector<v1::WriteItem>& items,
    const std::function<char(size_t, uint64_t)>& fill) {
  auto set = std::make_shared<ItemSet>();
  set->job = job;
  set->step = step;
  set->rank = rank;
  set->replica = replica;
  uint64_t total = 0;
  for (const v1::WriteItem& w : items) {
    StagedItem it;
    it.item = w;
    it.offset = total;
    total = internal::AlignUp(total + w.length(), internal::kAlign);
    set->items.push_back(std::move(it));
  }
  absl::StatusOr<std::shared_ptr<shm::ShmSegment>> seg =
      pool.Allocate(total, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(seg.ok()) << seg.status();
  if (!seg.ok()) return set;
  set->segment = *std::move(seg);
  for (size_t i = 0; i < set->items.size(); ++i) {
    StagedItem& it = set->items[i];
    char* p = set->segment->data() + it.offset;
    for (uint64_t b = 0; b < it.item.length(); ++b) p[b] = fill(i, b);
    it.crc32c = storage::Crc32c(p, it.item.length());
  }
  return set;
}

}  // namespace cairn::agent::testing

#endif  // CAIRN_SERVER_AGENT_TESTING_ITEM_SETS_H_
