// Save planning: every rank's local plan -> one global plan.
//
// Algorithm (BuildGlobalSavePlan):
//  1. Validate each item (lengths, dtypes, boxes inside shapes) and group the
//     items by fqn; an fqn must be the same kind, dtype and global shape on
//     every rank. Grouping is a counting sort into flat arrays: each fqn's
//     occurrences (rank, item) and a copy of their boxes' coordinates, taken
//     while the item is in cache, so later steps never revisit the items.
//  2. Per tensor, sort the boxes and group identical ones: a box held by
//     several ranks is one *unit* with several candidate writers (replicas).
//     The copied boxes arrive in rank order, usually a few ascending runs
//     (one per replica), which are merged; others are sorted. The distinct
//     non-empty boxes must tile the tensor exactly: a grid check accepts
//     DTensor-style tilings in O(n log n) (CheckDisjointCover); otherwise an
//     OverlapIndex finds partial overlaps and a volume sum finds gaps. Bytes
//     entries with the same fqn are replicas of one unit.
//  3. Dedupe with balancing: units held by one rank are assigned to it; the
//     replicated units are then assigned in decreasing size (ties by fqn, box)
//     to their least-loaded holder (ties: lowest rank) — LPT scheduling over
//     the bytes each rank writes. This beats PyTorch's greedy-by-arrival
//     dedupe, which hands every replicated item to the first rank that lists
//     it, and it is deterministic: the result depends only on the canonical
//     (sorted) content of the local plans, never on item order.
//  4. Each writer gets one object (prefix + 5-digit rank + ".bin"); its items,
//     sorted by (fqn, box), are laid out back to back, each offset rounded up
//     to `alignment` for O_DIRECT. Offsets are computed in unit order, then
//     each writer's writes are copied from its own plan, writer by writer.
// Cost: O(N log N) for N items in total. Scratch memory is O(N), about 20
// bytes per item plus 16 per box dim (most of it freed before the plan is
// built), besides the returned plan: per unit, one 24-byte PlannedWrite;
// per rank, 16 bytes per box dim of each distinct box it writes (an FSDP x TP
// rank writes the same few boxes layer after layer); per fqn, one
// PlannedEntry.
#ifndef CAIRN_PLANNER_SAVE_PLAN_H_
#define CAIRN_PLANNER_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/box.h"
#include "planner/dtype.h"

namespace cairn::planner {

// What a rank holds and could write: a chunk of a tensor or a bytes entry.
struct WriteItem {
  enum class Kind { kTensorChunk, kBytes };
  Kind kind = Kind::kTensorChunk;
  std::string fqn;
  DType dtype = DType::kUnspecified;  // kTensorChunk only
  Shape global_shape;                 // kTensorChunk only
  ChunkBox box;                       // kTensorChunk only
  uint64_t length = 0;  // bytes: Volume(box) * DTypeSize(dtype), or blob size
};

struct LocalSavePlan {
  int rank = 0;
  std::vector<WriteItem> items;
};

// [offset, offset + length) of object_key (relative to the step's prefix).
struct StorageLocation {
  std::string object_key;
  uint64_t offset = 0;
  uint64_t length = 0;

  friend bool operator==(const StorageLocation& a, const StorageLocation& b) {
    return a.object_key == b.object_key && a.offset == b.offset &&
           a.length == b.length;
  }
};

// One write of the global plan: a distinct tensor chunk or bytes entry, at
// [offset, offset + length) of its writer's object. Compact (24 bytes, no
// heap): the fqn, kind, dtype and shape are the plan's entries[entry]; a
// tensor chunk's box is in its RankSavePlan's coords; the object key is the
// RankSavePlan's. A 4096-rank x 1000-item plan is ~2M writes, so this is
// what the planner builds and cairnd's plan cache holds.
struct PlannedWrite {
  uint32_t entry = 0;      // index into GlobalSavePlan::entries
  uint32_t box_begin = 0;  // kTensorChunk: offsets at coords[box_begin, +n),
                           // then sizes at [box_begin + n, +n); n = dims
  uint64_t offset = 0;     // in the writer's object
  uint64_t length = 0;     // bytes: Volume(box) * dtype size, or blob size
};

// The items one rank must write, sorted by (fqn, box), laid out in one object.
struct RankSavePlan {
  int rank = 0;
  std::string object_key;  // relative to the step's prefix; "" if no writes
  std::vector<PlannedWrite> writes;
  std::vector<int64_t> coords;  // the tensor writes' boxes (see PlannedWrite),
                                // each distinct box once
  uint64_t object_bytes = 0;    // size of the rank's object (0: no object)

  // Write `w`'s box, `dims` = its tensor's number of dimensions.
  absl::Span<const int64_t> Offsets(const PlannedWrite& w, size_t dims) const {
    return absl::MakeConstSpan(coords.data() + w.box_begin, dims);
  }
  absl::Span<const int64_t> Sizes(const PlannedWrite& w, size_t dims) const {
    return absl::MakeConstSpan(coords.data() + w.box_begin + dims, dims);
  }
  StorageLocation LocationOf(const PlannedWrite& w) const {
    return StorageLocation{object_key, w.offset, w.length};
  }
};

// Every entry of the checkpoint, including tensors with no elements (which
// have no writes) — what the manifest lists.
struct PlannedEntry {
  WriteItem::Kind kind = WriteItem::Kind::kTensorChunk;
  std::string fqn;
  DType dtype = DType::kUnspecified;  // kTensorChunk only
  Shape global_shape;                 // kTensorChunk only
};

struct GlobalSavePlan {
  int world_size = 0;
  std::vector<RankSavePlan> ranks;    // ranks[r].rank == r
  std::vector<PlannedEntry> entries;  // sorted by fqn
  uint64_t total_bytes = 0;           // sum of write lengths (no padding)

  const PlannedEntry& EntryOf(const PlannedWrite& w) const {
    return entries[w.entry];
  }
  // Write `w` of rank `rank`'s plan spelled out as a WriteItem (copies the
  // fqn and box: for tests, conversions and messages, not hot loops).
  WriteItem ItemOf(int rank, const PlannedWrite& w) const;
  // The box of tensor write `w` of rank `rank`.
  ChunkBox BoxOf(int rank, const PlannedWrite& w) const;
};

struct SavePlanOptions {
  // Byte alignment of every write's offset within its object (>= 1).
  // Default: 4096 (O_DIRECT).
  uint64_t alignment = 4096;
  // Object key = object_prefix + 5-digit zero-padded rank + ".bin".
  // Default: "data/rank-" (rank 3 -> "data/rank-00003.bin").
  std::string object_prefix = "data/rank-";
};

// The object key rank `rank` writes under `options`.
std::string ObjectKeyForRank(const SavePlanOptions& options, int rank);

// A canonical string of the options, for PlanCache::Key::storage_settings.
std::string StorageSettingsKey(const SavePlanOptions& options);

// Validates (every error is INVALID_ARGUMENT and names job, step, rank and
// fqn): plans.size() >= 1 and plans[r].rank == r; non-empty fqns; tensor
// items have a known dtype, a valid shape, a box inside it and length ==
// Volume * DTypeSize; an fqn has the same kind, dtype and shape on every rank;
// the chunks of each tensor cover it exactly once up to replication
// (identical boxes on several ranks are replicas; partial overlaps or gaps are
// errors); bytes entries with the same fqn are replicas and must have the same
// length. Then dedupes replicas deterministically, balancing bytes across
// writers, and assigns aligned storage locations. Empty boxes are dropped.
absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    const std::vector<LocalSavePlan>& plans, const SavePlanOptions& options);
// The same over plans held elsewhere (none null; plans[r]->rank == r).
absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    absl::Span<const LocalSavePlan* const> plans,
    const SavePlanOptions& options);
// The same over packed plans (packed_plan.h), as cairnd holds them: the
// overloads above pack theirs and call this one.
struct PackedLocalPlan;
absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    absl::Span<const PackedLocalPlan* const> plans,
    const SavePlanOptions& options);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_SAVE_PLAN_H_
