// What the agent holds for ranks: items placed in a shared-memory segment
// (StagedItem), one rank's items of one step (ItemSet: being staged, tier 0
// or a peer's replica), and helpers over v1::WriteItem shared by the agent's
// components.
#ifndef CAIRN_SERVER_AGENT_ITEMS_H_
#define CAIRN_SERVER_AGENT_ITEMS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cairn/v1/agent.pb.h"
#include "common/shm/shm_segment.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "proto/convert/plan_convert.h"

namespace cairn::agent {

struct StagedItem {
  v1::WriteItem item;
  uint64_t offset = 0;  // in the set's segment
  uint32_t crc32c = 0;
};

// One rank's items of one step, in one segment: in flight, tier 0 or a
// replica.
struct ItemSet {
  std::string job;
  int64_t step = 0;
  int rank = 0;
  int world_size = 0;
  uint64_t incarnation = 0;  // of the rank's process; 0: not sent
  bool replica = false;
  // A memory checkpoint's set (BeginSaveResponse.tier): pinned in the
  // memory tier until cairnd says it is gone or persisted.
  bool memory_tier = false;
  // The tier the rank asked for (BeginStageRequest.tier).
  v1::Tier tier_asked = v1::TIER_UNSPECIFIED;
  std::vector<StagedItem> items;
  std::shared_ptr<shm::ShmSegment> segment;
  // The rank cancelled this save (Persister::Cancel); guarded by the
  // Persister's lock.
  bool cancelled = false;
};

namespace internal {

constexpr uint64_t kAlign = 64;

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline planner::DType DTypeOf(v1::DType d) {
  absl::StatusOr<planner::DType> r = convert::DTypeFromProto(d, "");
  return r.ok() ? *r : planner::DType::kUnspecified;
}

inline bool IsBytes(const v1::WriteItem& item) {
  return item.kind() == v1::WriteItem::KIND_BYTES;
}

inline const std::string& ItemFqn(const v1::WriteItem& item) {
  return IsBytes(item) ? item.bytes_fqn() : item.tensor().fqn();
}

// The box of an item: its chunk, or [0, length) for a bytes entry (which the
// transfer planner sees as a 1-D uint8 tensor).
inline planner::ChunkBox ItemBox(const v1::WriteItem& item) {
  planner::ChunkBox box;
  if (IsBytes(item)) {
    box.offsets = {0};
    box.sizes = {static_cast<int64_t>(item.length())};
    return box;
  }
  box.offsets.assign(item.chunk().offsets().begin(),
                     item.chunk().offsets().end());
  box.sizes.assign(item.chunk().sizes().begin(), item.chunk().sizes().end());
  return box;
}

inline size_t ItemElemSize(const v1::WriteItem& item) {
  if (IsBytes(item)) return 1;
  return planner::DTypeSize(DTypeOf(item.tensor().dtype()));
}

// Transfer-planner name of an item: bytes entries get their own namespace.
inline std::string PlanName(const v1::WriteItem& item) {
  return IsBytes(item) ? absl::StrCat("\x01bytes:", item.bytes_fqn())
                       : item.tensor().fqn();
}

inline bool SameItem(const v1::WriteItem& a, const v1::WriteItem& b) {
  return a.kind() == b.kind() && ItemFqn(a) == ItemFqn(b) &&
         ItemBox(a) == ItemBox(b);
}

inline std::string Where(absl::string_view job, int64_t step, int rank) {
  return absl::StrCat("job '", job, "' step ", step, " rank ", rank);
}

}  // namespace internal
}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_ITEMS_H_
