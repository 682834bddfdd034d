#include "planner/save_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "planner/layout.h"
#include "planner/packed_plan.h"

namespace cairn::planner {
namespace {

constexpr size_t kMaxFqnBytes = 1024;
// Largest item and largest object, in bytes: 2^62 (4 EiB). Offsets stay far
// from 2^63, where signed file offsets (off_t) and int64 arithmetic wrap,
// and offset + length + alignment can never overflow uint64.
constexpr uint64_t kMaxObjectBytes = uint64_t{1} << 62;

// One occurrence of an fqn in some rank's plan.
struct Occurrence {
  int rank;
  int item;  // index into plans[rank].items
};

// Every occurrence of one fqn, in rank order.
struct Entry {
  absl::string_view fqn;
  const PlanEntry* def = nullptr;  // defines kind, dtype and shape
  uint64_t first_length = 0;       // of the first occurrence
  int first_rank = 0;
  // The occurrences are occurrences_[begin, begin + count). For tensors, the
  // box of the k-th is at keys_[key_begin + k * 2 * dims]: its offsets, then
  // its sizes, so MakeUnits sorts and groups without touching the items.
  size_t begin = 0;
  size_t count = 0;
  size_t key_begin = 0;
};

// A distinct piece of data to write once: a distinct tensor box or a bytes
// entry, with the ranks that hold it (ascending).
// 24 bytes (one per distinct chunk: 35 M at 16k ranks of a 70B model).
struct Unit {
  uint64_t bytes;
  int entry;
  int holders_begin;  // range in the flat holders array
  int holders_count;
  int writer = -1;  // index into holders, chosen by the balancer
};
static_assert(sizeof(Unit) == 24);

class SavePlanBuilder {
 public:
  SavePlanBuilder(absl::string_view job, int64_t step,
                  absl::Span<const PackedLocalPlan* const> plans,
                  const SavePlanOptions& options)
      : prefix_(absl::StrCat("job '", job, "' step ", step, ": ")),
        plans_(plans),
        options_(options) {}

  absl::StatusOr<GlobalSavePlan> Build() {
    if (plans_.empty()) return Error("no local plans (world size 0)");
    if (options_.alignment == 0 || options_.alignment > (uint64_t{1} << 30)) {
      return Error(absl::StrCat("alignment must be in [1, 2^30], got ",
                                options_.alignment));
    }
    if (absl::Status s = CollectEntries(); !s.ok()) return s;
    if (absl::Status s = MakeUnits(); !s.ok()) return s;
    // Not needed any more: free before Layout allocates the plan.
    std::vector<Occurrence>().swap(occurrences_);
    std::vector<int64_t>().swap(keys_);
    AssignWriters();
    GlobalSavePlan plan;
    if (absl::Status s = Layout(&plan); !s.ok()) return s;
    return plan;
  }

 private:
  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, message));
  }

  const PackedLocalPlan& PlanOf(const Occurrence& o) const {
    return *plans_[o.rank];
  }
  const PackedItem& ItemOf(const Occurrence& o) const {
    return plans_[o.rank]->items[o.item];
  }

  // The checks of an entry, once per entry of each table: `rank` is the
  // first that names it.
  absl::Status ValidateEntry(int rank, const PlanEntry& entry) const {
    if (entry.fqn.empty()) {
      return Error(
          absl::StrCat("rank ", rank, " has an item with an empty fqn"));
    }
    if (entry.fqn.size() > kMaxFqnBytes ||
        entry.fqn.find('\0') != std::string::npos) {
      return Error(absl::StrCat("rank ", rank, " fqn '",
                                entry.fqn.substr(0, 64), "...' is longer than ",
                                kMaxFqnBytes, " bytes or contains NUL"));
    }
    if (entry.kind == WriteItem::Kind::kBytes) return absl::OkStatus();
    if (entry.kind != WriteItem::Kind::kTensorChunk) {
      return Error(absl::StrCat("rank ", rank, " '", entry.fqn,
                                "': unknown write item kind"));
    }
    if (DTypeSize(entry.dtype) == 0) {
      return Error(absl::StrCat("rank ", rank, " '", entry.fqn,
                                "': unknown dtype ", DTypeName(entry.dtype)));
    }
    if (absl::Status s = ValidateShape(entry.global_shape); !s.ok()) {
      return Error(
          absl::StrCat("rank ", rank, " '", entry.fqn, "': ", s.message()));
    }
    return absl::OkStatus();
  }

  // The checks of an item whose entry passed ValidateEntry.
  absl::Status ValidateItem(int rank, const PackedLocalPlan& plan,
                            const PackedItem& item) const {
    const PlanEntry& entry = plan.EntryOf(item);
    if (item.length > kMaxObjectBytes) {
      return Error(absl::StrCat("rank ", rank, " '", entry.fqn, "' has length ",
                                item.length, " bytes; at most 2^62 (",
                                kMaxObjectBytes, ") are supported"));
    }
    if (entry.kind == WriteItem::Kind::kBytes) return absl::OkStatus();
    const absl::Span<const int64_t> offsets = plan.Offsets(item);
    const absl::Span<const int64_t> sizes = plan.Sizes(item);
    const Shape& shape = entry.global_shape;
    uint64_t volume = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      // offsets[d] <= shape[d] - sizes[d] avoids overflow of offset + size.
      if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > shape[d] - sizes[d]) {
        // The message of the check every other box goes through.
        return Error(absl::StrCat(
            "rank ", rank, " '", entry.fqn,
            "': ", ValidateBoxInShape(plan.Unpack(item).box, shape).message()));
      }
      volume *= static_cast<uint64_t>(sizes[d]);
    }
    // The shape has at most 2^60 elements, so neither product wraps.
    const uint64_t want = volume * DTypeSize(entry.dtype);
    if (item.length != want) {
      return Error(absl::StrCat(
          "rank ", rank, " chunk ", BoxToString(plan.Unpack(item).box), " of '",
          entry.fqn, "' has length ", item.length, " bytes; ",
          DTypeName(entry.dtype), " needs ", want));
    }
    return absl::OkStatus();
  }

  // Validates every item and groups the items by fqn, checking that kind,
  // dtype and shape agree across ranks. Two passes, as a counting sort: the
  // first validates, numbers the fqns and counts their occurrences; the
  // second fills each fqn's occurrences and keys into flat arrays sized
  // exactly (no per-fqn vectors growing and copying).
  absl::Status CollectEntries() {
    size_t total_items = 0;
    for (const PackedLocalPlan* p : plans_) total_items += p->items.size();
    by_fqn_.reserve(total_items / plans_.size() + 16);
    std::vector<int> ids;  // entry of every item, in (rank, item) order
    ids.reserve(total_items);
    // The entry of each id of each table, once checked (-1: not yet met).
    absl::flat_hash_map<const EntryTable*, std::vector<int>> entry_of;
    for (int r = 0; r < static_cast<int>(plans_.size()); ++r) {
      const PackedLocalPlan& plan = *plans_[r];
      if (plan.rank != r) {
        return Error(absl::StrCat(
            "the plan at position ", r, " is rank ", plan.rank,
            "'s; plans must be ordered by rank 0..", plans_.size() - 1));
      }
      if (plan.items.empty()) continue;
      std::vector<int>& of_table = entry_of[plan.table.get()];
      if (of_table.empty()) of_table.assign(plan.table->size(), -1);
      for (const PackedItem& item : plan.items) {
        int& id = of_table[item.entry];
        if (id < 0) {
          const PlanEntry& def = plan.EntryOf(item);
          if (absl::Status s = ValidateEntry(r, def); !s.ok()) return s;
          auto [it, inserted] =
              by_fqn_.try_emplace(def.fqn, static_cast<int>(entries_.size()));
          if (inserted) {
            entries_.push_back(Entry{def.fqn, &def, item.length, r, 0, 0, 0});
          } else {
            const Entry& e = entries_[it->second];
            if (absl::Status s = CheckAgrees(e, r, def); !s.ok()) return s;
          }
          id = it->second;
        }
        if (absl::Status s = ValidateItem(r, plan, item); !s.ok()) return s;
        ++entries_[id].count;
        ids.push_back(id);
      }
    }
    size_t occurrences = 0, keys = 0;
    for (Entry& e : entries_) {
      e.begin = occurrences;
      e.key_begin = keys;
      occurrences += e.count;
      if (e.def->kind == WriteItem::Kind::kTensorChunk) {
        keys += e.count * 2 * e.def->global_shape.size();
      }
      e.count = 0;  // refilled below
    }
    occurrences_.resize(occurrences);
    keys_.resize(keys);
    size_t next = 0;
    for (int r = 0; r < static_cast<int>(plans_.size()); ++r) {
      const PackedLocalPlan& plan = *plans_[r];
      for (int i = 0; i < static_cast<int>(plan.items.size()); ++i) {
        Entry& e = entries_[ids[next++]];
        occurrences_[e.begin + e.count] = Occurrence{r, i};
        if (e.def->kind == WriteItem::Kind::kTensorChunk) {
          const size_t n = 2 * e.def->global_shape.size();
          const int64_t* box = plan.coords.data() + plan.items[i].box_begin;
          std::copy(box, box + n, keys_.data() + e.key_begin + e.count * n);
        }
        ++e.count;
      }
    }
    // Canonical order: by fqn.
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) { return a.fqn < b.fqn; });
    return absl::OkStatus();
  }

  static std::string Describe(const PlanEntry& entry) {
    if (entry.kind == WriteItem::Kind::kBytes) return "a bytes entry";
    return absl::StrCat(DTypeName(entry.dtype), " ",
                        ShapeToString(entry.global_shape));
  }

  absl::Status CheckAgrees(const Entry& e, int rank,
                           const PlanEntry& entry) const {
    const PlanEntry& first = *e.def;
    const bool same = entry.kind == first.kind &&
                      (entry.kind == WriteItem::Kind::kBytes ||
                       (entry.dtype == first.dtype &&
                        entry.global_shape == first.global_shape));
    if (!same) {
      return Error(absl::StrCat("rank ", rank, " has '", entry.fqn, "' as ",
                                Describe(entry), " but rank ", e.first_rank,
                                " has it as ", Describe(first)));
    }
    return absl::OkStatus();
  }

  // Groups identical boxes into units, checks exact cover per tensor.
  absl::Status MakeUnits() {
    for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
      Entry& entry = entries_[e];
      const absl::Span<const Occurrence> occ(occurrences_.data() + entry.begin,
                                             entry.count);
      if (entry.def->kind == WriteItem::Kind::kBytes) {
        // Replicas of one blob: same length, each rank lists it once.
        for (size_t k = 1; k < occ.size(); ++k) {
          const PackedItem& item = ItemOf(occ[k]);
          if (occ[k].rank == occ[k - 1].rank) {
            return Error(absl::StrCat("rank ", occ[k].rank,
                                      " lists bytes entry '", entry.fqn,
                                      "' twice"));
          }
          if (item.length != entry.first_length) {
            return Error(absl::StrCat(
                "rank ", occ[k].rank, " has bytes entry '", entry.fqn,
                "' with ", item.length, " bytes but rank ", entry.first_rank,
                " has ", entry.first_length, " (replicas must be identical)"));
          }
        }
        AddUnit(e, entry.first_length, occ.begin(), occ.end());
        continue;
      }
      // Tensor: drop empty boxes, sort by (box, rank), comparing the
      // gathered keys (every box has the shape's dims).
      const size_t nd = entry.def->global_shape.size();
      const size_t stride = 2 * nd;
      const int64_t* keys = keys_.data() + entry.key_begin;
      auto key_of = [&](int k) {
        return keys + static_cast<size_t>(k) * stride;
      };
      order_.clear();
      for (int k = 0; k < static_cast<int>(occ.size()); ++k) {
        const int64_t* sizes = key_of(k) + nd;
        if (std::all_of(sizes, sizes + nd, [](int64_t v) { return v > 0; })) {
          order_.push_back(k);
        }
      }
      SortByBoxThenRank(occ, keys, stride);
      sorted_.clear();
      for (int k : order_) sorted_.push_back(occ[k]);
      distinct_.clear();
      holder_.clear();
      const size_t elem = DTypeSize(entry.def->dtype);
      for (size_t k = 0; k < order_.size();) {
        const int64_t* key = key_of(order_[k]);
        size_t end = k + 1;
        while (end < order_.size() &&
               std::equal(key, key + stride, key_of(order_[end]))) {
          if (sorted_[end].rank == sorted_[end - 1].rank) {
            const Occurrence& o = sorted_[end];
            return Error(
                absl::StrCat("rank ", o.rank, " lists chunk ",
                             BoxToString(PlanOf(o).Unpack(ItemOf(o)).box),
                             " of '", entry.fqn, "' twice"));
          }
          ++end;
        }
        ChunkBox& box = distinct_.emplace_back();
        box.offsets.assign(key, key + nd);
        box.sizes.assign(key + nd, key + stride);
        holder_.push_back(sorted_[k].rank);
        AddUnit(e, static_cast<uint64_t>(Volume(box)) * elem,
                sorted_.data() + k, sorted_.data() + end);
        k = end;
      }
      if (absl::Status s = internal::CheckDisjointCover(
              entry.fqn, entry.def->global_shape, distinct_, holder_);
          !s.ok()) {
        return Error(s.message());
      }
    }
    return absl::OkStatus();
  }

  // Sorts order_ (indices into occ, whose boxes are in keys) by (box, rank).
  // Local plans arrive in rank order and DTensor layouts list boxes in rank
  // order, so order_ is usually a few ascending runs (one per replica): those
  // are merged in linear time; anything else is sorted.
  void SortByBoxThenRank(absl::Span<const Occurrence> occ, const int64_t* keys,
                         size_t stride) {
    auto less = [&](int a, int b) {
      const int64_t* ka = keys + static_cast<size_t>(a) * stride;
      const int64_t* kb = keys + static_cast<size_t>(b) * stride;
      for (size_t d = 0; d < stride; ++d) {
        if (ka[d] != kb[d]) return ka[d] < kb[d];
      }
      return occ[a].rank < occ[b].rank;
    };
    constexpr size_t kMaxRuns = 16;
    run_ends_.clear();
    for (size_t k = 1; k < order_.size(); ++k) {
      if (less(order_[k], order_[k - 1])) {
        run_ends_.push_back(k);
        if (run_ends_.size() >= kMaxRuns) {
          std::sort(order_.begin(), order_.end(), less);
          return;
        }
      }
    }
    run_ends_.push_back(order_.size());
    // Merge adjacent runs pairwise until one is left.
    while (run_ends_.size() > 1) {
      size_t begin = 0, w = 0;
      for (size_t r = 0; r < run_ends_.size(); r += 2) {
        if (r + 1 < run_ends_.size()) {
          std::inplace_merge(order_.begin() + begin,
                             order_.begin() + run_ends_[r],
                             order_.begin() + run_ends_[r + 1], less);
          begin = run_ends_[r + 1];
        } else {
          begin = run_ends_[r];
        }
        run_ends_[w++] = begin;
      }
      run_ends_.resize(w);
    }
  }

  void AddUnit(int entry, uint64_t bytes, const Occurrence* begin,
               const Occurrence* end) {
    units_.push_back(Unit{bytes, entry, static_cast<int>(holders_.size()),
                          static_cast<int>(end - begin), -1});
    holders_.insert(holders_.end(), begin, end);
  }

  // LPT over the bytes each rank writes: forced units first, then replicated
  // ones by decreasing size to their least-loaded holder (ties: lowest rank,
  // holders are sorted by rank).
  void AssignWriters() {
    load_.assign(plans_.size(), 0);
    // (bytes, unit) of the replicated units.
    std::vector<std::pair<uint64_t, int>> replicated;
    replicated.reserve(units_.size());
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      Unit& unit = units_[u];
      if (unit.holders_count == 1) {
        unit.writer = 0;
        load_[holders_[unit.holders_begin].rank] += unit.bytes;
      } else {
        replicated.emplace_back(unit.bytes, u);
      }
    }
    // Decreasing size; units are in (fqn, box) order, kept for equal sizes.
    std::sort(replicated.begin(), replicated.end(),
              [](const std::pair<uint64_t, int>& a,
                 const std::pair<uint64_t, int>& b) {
                return a.first != b.first ? a.first > b.first
                                          : a.second < b.second;
              });
    for (const std::pair<uint64_t, int>& r : replicated) {
      Unit& unit = units_[r.second];
      int best = 0;
      uint64_t best_load = UINT64_MAX;
      for (int h = 0; h < unit.holders_count; ++h) {
        const uint64_t l = load_[holders_[unit.holders_begin + h].rank];
        if (l < best_load) {
          best_load = l;
          best = h;
        }
      }
      unit.writer = best;
      load_[holders_[unit.holders_begin + best].rank] += unit.bytes;
    }
  }

  // Lays each writer's units out in (fqn, box) order at aligned offsets.
  // INVALID_ARGUMENT when a rank's object would exceed kMaxObjectBytes.
  absl::Status Layout(GlobalSavePlan* out) const {
    GlobalSavePlan& plan = *out;
    const int world = static_cast<int>(plans_.size());
    plan.world_size = world;
    plan.ranks.resize(world);
    // Pass 1, in unit order: each unit's offset in its writer's object.
    const uint64_t align = options_.alignment;
    std::vector<uint64_t> offsets(units_.size());
    std::vector<int> count(world + 1, 0);
    for (size_t u = 0; u < units_.size(); ++u) {
      const Unit& unit = units_[u];
      const Occurrence& o = holders_[unit.holders_begin + unit.writer];
      RankSavePlan& rp = plan.ranks[o.rank];
      // object_bytes <= 2^62 and align <= 2^30 (checked in Build): rounding
      // up cannot wrap; then offset + bytes is checked.
      const uint64_t offset = (rp.object_bytes + align - 1) / align * align;
      if (offset > kMaxObjectBytes || unit.bytes > kMaxObjectBytes - offset) {
        return Error(absl::StrCat(
            "rank ", o.rank, " would write '", entries_[unit.entry].fqn, "' (",
            unit.bytes, " bytes) at offset ", offset, " of its object, past ",
            "the largest supported object size 2^62 (", kMaxObjectBytes,
            " bytes)"));
      }
      offsets[u] = offset;
      rp.object_bytes = offset + unit.bytes;
      ++count[o.rank + 1];
      if (unit.bytes > kMaxObjectBytes * 2 - plan.total_bytes) {
        return Error(
            absl::StrCat("the checkpoint would exceed 2^63 bytes at rank ",
                         o.rank, " '", entries_[unit.entry].fqn, "'"));
      }
      plan.total_bytes += unit.bytes;
    }
    // The units grouped by writer, in unit order within a writer.
    for (int r = 0; r < world; ++r) count[r + 1] += count[r];
    std::vector<int> by_writer(units_.size());
    {
      std::vector<int> next(count.begin(), count.end() - 1);
      for (size_t u = 0; u < units_.size(); ++u) {
        const Unit& unit = units_[u];
        by_writer[next[holders_[unit.holders_begin + unit.writer].rank]++] =
            static_cast<int>(u);
      }
    }
    // Pass 2, writer by writer: the copies read each writer's own plan and
    // fill its writes in order, instead of hopping between 2 x world places.
    for (int r = 0; r < world; ++r) {
      RankSavePlan& rp = plan.ranks[r];
      rp.rank = r;
      if (count[r] == count[r + 1]) continue;
      rp.object_key = ObjectKeyForRank(options_, r);
      rp.writes.resize(static_cast<size_t>(count[r + 1] - count[r]));
      BoxInterner boxes(&rp.coords);
      for (int i = count[r]; i < count[r + 1]; ++i) {
        const Unit& unit = units_[by_writer[i]];
        const Occurrence& o = holders_[unit.holders_begin + unit.writer];
        const PackedItem& item = ItemOf(o);
        PlannedWrite& w = rp.writes[static_cast<size_t>(i - count[r])];
        w.entry = static_cast<uint32_t>(unit.entry);
        w.offset = offsets[by_writer[i]];
        w.length = unit.bytes;
        if (entries_[unit.entry].def->kind == WriteItem::Kind::kTensorChunk) {
          const size_t begin =
              boxes.Add(PlanOf(o).Offsets(item), PlanOf(o).Sizes(item));
          w.box_begin = static_cast<uint32_t>(begin);
          if (rp.coords.size() > UINT32_MAX) {
            return Error(absl::StrCat(
                "rank ", r, " would write ", count[r + 1] - count[r],
                " chunks; their boxes exceed 2^32 numbers"));
          }
        }
      }
      rp.coords.shrink_to_fit();
    }
    plan.entries.reserve(entries_.size());
    for (const Entry& e : entries_) {
      const PlanEntry& f = *e.def;
      if (f.kind == WriteItem::Kind::kBytes) {
        plan.entries.push_back(
            PlannedEntry{f.kind, f.fqn, DType::kUnspecified, Shape{}});
      } else {
        plan.entries.push_back(
            PlannedEntry{f.kind, f.fqn, f.dtype, f.global_shape});
      }
    }
    return absl::OkStatus();
  }

  const std::string prefix_;
  const absl::Span<const PackedLocalPlan* const> plans_;
  const SavePlanOptions& options_;

  absl::flat_hash_map<absl::string_view, int> by_fqn_;
  std::vector<Entry> entries_;
  std::vector<Occurrence> occurrences_;  // grouped by entry, rank order
  std::vector<int64_t> keys_;            // tensor boxes, as occurrences_
  std::vector<Unit> units_;
  std::vector<Occurrence> holders_;
  std::vector<uint64_t> load_;
  // Scratch for MakeUnits.
  std::vector<ChunkBox> distinct_;
  std::vector<int> holder_;
  std::vector<int> order_;  // occurrences with non-empty boxes, then sorted
  std::vector<Occurrence> sorted_;  // those occurrences in that order
  std::vector<size_t> run_ends_;
};

}  // namespace

WriteItem GlobalSavePlan::ItemOf(int rank, const PlannedWrite& w) const {
  const PlannedEntry& e = EntryOf(w);
  WriteItem item;
  item.kind = e.kind;
  item.fqn = e.fqn;
  item.length = w.length;
  if (e.kind == WriteItem::Kind::kTensorChunk) {
    item.dtype = e.dtype;
    item.global_shape = e.global_shape;
    item.box = BoxOf(rank, w);
  }
  return item;
}

ChunkBox GlobalSavePlan::BoxOf(int rank, const PlannedWrite& w) const {
  const RankSavePlan& rp = ranks[static_cast<size_t>(rank)];
  const size_t dims = EntryOf(w).global_shape.size();
  const absl::Span<const int64_t> offsets = rp.Offsets(w, dims);
  const absl::Span<const int64_t> sizes = rp.Sizes(w, dims);
  ChunkBox box;
  box.offsets.assign(offsets.begin(), offsets.end());
  box.sizes.assign(sizes.begin(), sizes.end());
  return box;
}

std::string ObjectKeyForRank(const SavePlanOptions& options, int rank) {
  return absl::StrCat(options.object_prefix, absl::StrFormat("%05d", rank),
                      ".bin");
}

std::string StorageSettingsKey(const SavePlanOptions& options) {
  return absl::StrCat("alignment=", options.alignment,
                      ";object_prefix=", options.object_prefix.size(), ":",
                      options.object_prefix);
}

absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    absl::Span<const PackedLocalPlan* const> plans,
    const SavePlanOptions& options) {
  return SavePlanBuilder(job, step, plans, options).Build();
}

absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    absl::Span<const LocalSavePlan* const> plans,
    const SavePlanOptions& options) {
  EntryInterner interner;
  std::vector<PackedLocalPlan> packed;
  packed.reserve(plans.size());
  for (const LocalSavePlan* p : plans) {
    absl::StatusOr<PackedLocalPlan> one = interner.Pack(*p);
    if (!one.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job, "' step ", step, ": ", one.status().message()));
    }
    packed.push_back(*std::move(one));
  }
  std::vector<const PackedLocalPlan*> pointers;
  pointers.reserve(packed.size());
  for (const PackedLocalPlan& p : packed) pointers.push_back(&p);
  return BuildGlobalSavePlan(job, step, pointers, options);
}

absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    absl::string_view job, int64_t step,
    const std::vector<LocalSavePlan>& plans, const SavePlanOptions& options) {
  std::vector<const LocalSavePlan*> pointers;
  pointers.reserve(plans.size());
  for (const LocalSavePlan& p : plans) pointers.push_back(&p);
  return BuildGlobalSavePlan(job, step, pointers, options);
}

}  // namespace cairn::planner
