// Local save plans as cairnd holds them between a rank's BeginSave and the
// global plan.
//
// Spelled out, a WriteItem is ~225 bytes: its fqn (a heap copy), dtype,
// global shape and box. A 70B model under FSDP x TP has ~2,200 items on every
// rank, so spelled-out local plans would take ~2 GB at 4096 ranks and ~8 GB
// at 16k, most of it the same fqns and shapes once per rank. A PackedLocalPlan
// names each item's tensor by its id in an EntryTable that every plan with
// the same tensors shares, and keeps each distinct box once in a flat array:
// 16 bytes an item, plus 16 per box dimension of each distinct box.
//
// EntryInterner finds, for a plan, a recent table holding all of its entries,
// or builds one from the plan; tables live as long as a plan refers to them.
#ifndef CAIRN_PLANNER_PACKED_PLAN_H_
#define CAIRN_PLANNER_PACKED_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/save_plan.h"

namespace cairn::planner {

// What items name: a tensor (kind, fqn, dtype, global shape) or a bytes
// entry (kind, fqn; dtype kUnspecified, no shape). Not validated: the
// planner checks entries as it checks items.
struct PlanEntry {
  WriteItem::Kind kind = WriteItem::Kind::kTensorChunk;
  std::string fqn;
  DType dtype = DType::kUnspecified;
  Shape global_shape;
};

// An immutable list of distinct entries, shared by the plans naming them.
class EntryTable {
 public:
  size_t size() const { return entries_.size(); }
  const PlanEntry& operator[](uint32_t id) const { return entries_[id]; }

  // The id of the entry `item` names, or -1.
  int64_t Find(const WriteItem& item) const;

 private:
  friend class EntryInterner;
  // Adds `item`'s entry unless present; its id.
  uint32_t Add(const WriteItem& item);

  std::vector<PlanEntry> entries_;
  // fqn -> the first entry with that fqn; further ones (another kind, dtype
  // or shape: an error the planner reports) chain through next_.
  absl::flat_hash_map<std::string, uint32_t> first_;
  std::vector<uint32_t> next_;
};

// Keeps a flat array of boxes (a box of n dims is its n offsets, then its n
// sizes), each distinct box once. The ranks of an FSDP x TP job hold the same
// few boxes for most of their tensors (layer after layer has the same
// shapes), so a plan that stores each distinct box once keeps ~no
// coordinates: at 16k ranks of a 70B model, 35 M boxes of 32 bytes (1.1 GB)
// in the global plan, and as much again in the local plans.
class BoxInterner {
 public:
  // Appends to *coords, which must outlive this and not change elsewhere.
  explicit BoxInterner(std::vector<int64_t>* coords);
  BoxInterner(const BoxInterner&) = delete;  // the set's hasher points here
  BoxInterner& operator=(const BoxInterner&) = delete;

  // Where the box starts in *coords, appended unless already there.
  // offsets.size() == sizes.size().
  size_t Add(absl::Span<const int64_t> offsets,
             absl::Span<const int64_t> sizes);

 private:
  struct Stored {
    size_t begin;
    size_t dims;
  };
  struct Probe {
    absl::Span<const int64_t> offsets;
    absl::Span<const int64_t> sizes;
  };
  Probe View(const Stored& s) const;
  struct Hash {
    using is_transparent = void;
    const BoxInterner* self;
    size_t operator()(const Probe& p) const;
    size_t operator()(const Stored& s) const { return (*this)(self->View(s)); }
  };
  struct Eq {
    using is_transparent = void;
    const BoxInterner* self;
    bool operator()(const Probe& a, const Probe& b) const;
    bool operator()(const Stored& a, const Stored& b) const {
      return (*this)(self->View(a), self->View(b));
    }
    bool operator()(const Stored& a, const Probe& b) const {
      return (*this)(self->View(a), b);
    }
    bool operator()(const Probe& a, const Stored& b) const {
      return (*this)(a, self->View(b));
    }
  };

  std::vector<int64_t>* coords_;
  absl::flat_hash_set<Stored, Hash, Eq> boxes_;
};

// One item: its entry, its box (tensor chunks: offsets at
// coords[box_begin, +dims), sizes at [box_begin + dims, +dims), dims = the
// entry's shape's; items with the same box share it) and its length in bytes.
struct PackedItem {
  uint32_t entry = 0;
  uint32_t box_begin = 0;
  uint64_t length = 0;
};

struct PackedLocalPlan {
  int rank = 0;
  std::shared_ptr<const EntryTable> table;
  std::vector<PackedItem> items;
  std::vector<int64_t> coords;

  const PlanEntry& EntryOf(const PackedItem& item) const {
    return (*table)[item.entry];
  }
  absl::Span<const int64_t> Offsets(const PackedItem& item) const {
    return absl::MakeConstSpan(coords.data() + item.box_begin,
                               EntryOf(item).global_shape.size());
  }
  absl::Span<const int64_t> Sizes(const PackedItem& item) const {
    const size_t dims = EntryOf(item).global_shape.size();
    return absl::MakeConstSpan(coords.data() + item.box_begin + dims, dims);
  }
  // The item spelled out (copies: for messages and tests).
  WriteItem Unpack(const PackedItem& item) const;
  LocalSavePlan Unpack() const;
  // Heap bytes of the items and boxes, not of the shared table.
  size_t ApproximateBytes() const;
};

// Thread-safe.
class EntryInterner {
 public:
  // How many recently built tables a plan is matched against.
  static constexpr size_t kRecentTables = 64;

  // `plan` packed against a recent table holding every entry it names, or a
  // new table of its own. INVALID_ARGUMENT (the rank and fqn named) when a
  // tensor chunk's box has other dims than its shape, which the packed form
  // cannot hold; every other check is the planner's.
  absl::StatusOr<PackedLocalPlan> Pack(const LocalSavePlan& plan);

  // Tables still referred to by some plan (for tests and stats).
  size_t LiveTables();

 private:
  absl::Mutex mu_;
  // Most recently matched first; expired ones are dropped as met.
  std::vector<std::weak_ptr<const EntryTable>> recent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_PACKED_PLAN_H_
