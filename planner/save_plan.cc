#include "planner/save_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/layout.h"

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
  const WriteItem* first = nullptr;  // defines kind, dtype and shape
  int first_rank = 0;
  std::vector<Occurrence> occurrences;
};

// A distinct piece of data to write once: a distinct tensor box or a bytes
// entry, with the ranks that hold it (ascending).
struct Unit {
  int entry;
  uint64_t bytes;
  int holders_begin;  // range in the flat holders array
  int holders_count;
  int writer = -1;  // index into holders, chosen by the balancer
};

class SavePlanBuilder {
 public:
  SavePlanBuilder(absl::string_view job, int64_t step,
                  const std::vector<LocalSavePlan>& plans,
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
    AssignWriters();
    GlobalSavePlan plan;
    if (absl::Status s = Layout(&plan); !s.ok()) return s;
    return plan;
  }

 private:
  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, message));
  }

  const WriteItem& ItemOf(const Occurrence& o) const {
    return plans_[o.rank].items[o.item];
  }

  absl::Status ValidateItem(int rank, const WriteItem& item) const {
    if (item.fqn.empty()) {
      return Error(
          absl::StrCat("rank ", rank, " has an item with an empty fqn"));
    }
    if (item.fqn.size() > kMaxFqnBytes ||
        item.fqn.find('\0') != std::string::npos) {
      return Error(absl::StrCat("rank ", rank, " fqn '", item.fqn.substr(0, 64),
                                "...' is longer than ", kMaxFqnBytes,
                                " bytes or contains NUL"));
    }
    if (item.length > kMaxObjectBytes) {
      return Error(absl::StrCat("rank ", rank, " '", item.fqn, "' has length ",
                                item.length, " bytes; at most 2^62 (",
                                kMaxObjectBytes, ") are supported"));
    }
    if (item.kind == WriteItem::Kind::kBytes) return absl::OkStatus();
    if (item.kind != WriteItem::Kind::kTensorChunk) {
      return Error(absl::StrCat("rank ", rank, " '", item.fqn,
                                "': unknown write item kind"));
    }
    const size_t elem = DTypeSize(item.dtype);
    if (elem == 0) {
      return Error(absl::StrCat("rank ", rank, " '", item.fqn,
                                "': unknown dtype ", DTypeName(item.dtype)));
    }
    if (absl::Status s = ValidateBoxInShape(item.box, item.global_shape);
        !s.ok()) {
      return Error(
          absl::StrCat("rank ", rank, " '", item.fqn, "': ", s.message()));
    }
    const uint64_t want = static_cast<uint64_t>(Volume(item.box)) * elem;
    if (item.length != want) {
      return Error(absl::StrCat("rank ", rank, " chunk ", BoxToString(item.box),
                                " of '", item.fqn, "' has length ", item.length,
                                " bytes; ", DTypeName(item.dtype), " needs ",
                                want));
    }
    return absl::OkStatus();
  }

  // Validates every item and groups the items by fqn, checking that kind,
  // dtype and shape agree across ranks.
  absl::Status CollectEntries() {
    size_t total_items = 0;
    for (const LocalSavePlan& p : plans_) total_items += p.items.size();
    by_fqn_.reserve(total_items / plans_.size() + 16);
    for (int r = 0; r < static_cast<int>(plans_.size()); ++r) {
      if (plans_[r].rank != r) {
        return Error(absl::StrCat(
            "the plan at position ", r, " is rank ", plans_[r].rank,
            "'s; plans must be ordered by rank 0..", plans_.size() - 1));
      }
      const auto& items = plans_[r].items;
      for (int i = 0; i < static_cast<int>(items.size()); ++i) {
        const WriteItem& item = items[i];
        if (absl::Status s = ValidateItem(r, item); !s.ok()) return s;
        auto [it, inserted] =
            by_fqn_.try_emplace(item.fqn, static_cast<int>(entries_.size()));
        if (inserted) {
          entries_.push_back(Entry{item.fqn, &item, r, {}});
        } else {
          const Entry& e = entries_[it->second];
          if (absl::Status s = CheckAgrees(e, r, item); !s.ok()) return s;
        }
        entries_[it->second].occurrences.push_back({r, i});
      }
    }
    // Canonical order: by fqn.
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) { return a.fqn < b.fqn; });
    return absl::OkStatus();
  }

  static std::string Describe(const WriteItem& item) {
    if (item.kind == WriteItem::Kind::kBytes) return "a bytes entry";
    return absl::StrCat(DTypeName(item.dtype), " ",
                        ShapeToString(item.global_shape));
  }

  absl::Status CheckAgrees(const Entry& e, int rank,
                           const WriteItem& item) const {
    const WriteItem& first = *e.first;
    const bool same =
        item.kind == first.kind && (item.kind == WriteItem::Kind::kBytes ||
                                    (item.dtype == first.dtype &&
                                     item.global_shape == first.global_shape));
    if (!same) {
      return Error(absl::StrCat("rank ", rank, " has '", item.fqn, "' as ",
                                Describe(item), " but rank ", e.first_rank,
                                " has it as ", Describe(first)));
    }
    return absl::OkStatus();
  }

  // Groups identical boxes into units, checks exact cover per tensor.
  absl::Status MakeUnits() {
    for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
      Entry& entry = entries_[e];
      auto& occ = entry.occurrences;
      if (entry.first->kind == WriteItem::Kind::kBytes) {
        // Replicas of one blob: same length, each rank lists it once.
        for (size_t k = 1; k < occ.size(); ++k) {
          const WriteItem& item = ItemOf(occ[k]);
          if (occ[k].rank == occ[k - 1].rank) {
            return Error(absl::StrCat("rank ", occ[k].rank,
                                      " lists bytes entry '", entry.fqn,
                                      "' twice"));
          }
          if (item.length != entry.first->length) {
            return Error(absl::StrCat(
                "rank ", occ[k].rank, " has bytes entry '", entry.fqn,
                "' with ", item.length, " bytes but rank ", entry.first_rank,
                " has ", entry.first->length, " (replicas must be identical)"));
          }
        }
        AddUnit(e, entry.first->length, occ.begin(), occ.end());
        continue;
      }
      // Tensor: sort by (box, rank); drop empty boxes.
      occ.erase(std::remove_if(occ.begin(), occ.end(),
                               [&](const Occurrence& o) {
                                 return IsEmpty(ItemOf(o).box);
                               }),
                occ.end());
      std::sort(occ.begin(), occ.end(),
                [&](const Occurrence& a, const Occurrence& b) {
                  const int c = CompareBoxes(ItemOf(a).box, ItemOf(b).box);
                  return c != 0 ? c < 0 : a.rank < b.rank;
                });
      distinct_.clear();
      holder_.clear();
      const size_t elem = DTypeSize(entry.first->dtype);
      for (size_t k = 0; k < occ.size();) {
        const ChunkBox& box = ItemOf(occ[k]).box;
        size_t end = k + 1;
        while (end < occ.size() && ItemOf(occ[end]).box == box) {
          if (occ[end].rank == occ[end - 1].rank) {
            return Error(absl::StrCat("rank ", occ[end].rank, " lists chunk ",
                                      BoxToString(box), " of '", entry.fqn,
                                      "' twice"));
          }
          ++end;
        }
        distinct_.push_back(box);
        holder_.push_back(occ[k].rank);
        AddUnit(e, static_cast<uint64_t>(Volume(box)) * elem,
                occ.begin() + static_cast<std::ptrdiff_t>(k),
                occ.begin() + static_cast<std::ptrdiff_t>(end));
        k = end;
      }
      if (absl::Status s = internal::CheckDisjointCover(
              entry.fqn, entry.first->global_shape, distinct_, holder_);
          !s.ok()) {
        return Error(s.message());
      }
    }
    return absl::OkStatus();
  }

  void AddUnit(int entry, uint64_t bytes,
               std::vector<Occurrence>::const_iterator begin,
               std::vector<Occurrence>::const_iterator end) {
    units_.push_back(Unit{entry, bytes, static_cast<int>(holders_.size()),
                          static_cast<int>(end - begin), -1});
    holders_.insert(holders_.end(), begin, end);
  }

  // LPT over the bytes each rank writes: forced units first, then replicated
  // ones by decreasing size to their least-loaded holder (ties: lowest rank,
  // holders are sorted by rank).
  void AssignWriters() {
    load_.assign(plans_.size(), 0);
    std::vector<int> replicated;
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      Unit& unit = units_[u];
      if (unit.holders_count == 1) {
        unit.writer = 0;
        load_[holders_[unit.holders_begin].rank] += unit.bytes;
      } else {
        replicated.push_back(u);
      }
    }
    // Units are in (fqn, box) order; a stable sort keeps it for equal sizes.
    std::stable_sort(replicated.begin(), replicated.end(), [&](int a, int b) {
      return units_[a].bytes > units_[b].bytes;
    });
    for (int u : replicated) {
      Unit& unit = units_[u];
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
    std::vector<int> count(world, 0);
    for (const Unit& unit : units_) {
      ++count[holders_[unit.holders_begin + unit.writer].rank];
    }
    std::vector<std::string> keys(world);
    for (int r = 0; r < world; ++r) {
      plan.ranks[r].rank = r;
      plan.ranks[r].writes.reserve(count[r]);
      if (count[r] > 0) keys[r] = ObjectKeyForRank(options_, r);
    }
    const uint64_t align = options_.alignment;
    for (const Unit& unit : units_) {
      const Occurrence& o = holders_[unit.holders_begin + unit.writer];
      RankSavePlan& rp = plan.ranks[o.rank];
      // object_bytes <= 2^62 and align <= 2^30 (checked in Build): rounding
      // up cannot wrap; then offset + bytes is checked.
      const uint64_t offset = (rp.object_bytes + align - 1) / align * align;
      if (offset > kMaxObjectBytes || unit.bytes > kMaxObjectBytes - offset) {
        return Error(absl::StrCat(
            "rank ", o.rank, " would write '", ItemOf(o).fqn, "' (", unit.bytes,
            " bytes) at offset ", offset, " of its object, past ",
            "the largest supported object size 2^62 (", kMaxObjectBytes,
            " bytes)"));
      }
      rp.writes.push_back(PlannedWrite{
          ItemOf(o), StorageLocation{keys[o.rank], offset, unit.bytes}});
      rp.object_bytes = offset + unit.bytes;
      if (unit.bytes > kMaxObjectBytes * 2 - plan.total_bytes) {
        return Error(
            absl::StrCat("the checkpoint would exceed 2^63 bytes at rank ",
                         o.rank, " '", ItemOf(o).fqn, "'"));
      }
      plan.total_bytes += unit.bytes;
    }
    plan.entries.reserve(entries_.size());
    for (const Entry& e : entries_) {
      const WriteItem& f = *e.first;
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
  const std::vector<LocalSavePlan>& plans_;
  const SavePlanOptions& options_;

  absl::flat_hash_map<absl::string_view, int> by_fqn_;
  std::vector<Entry> entries_;
  std::vector<Unit> units_;
  std::vector<Occurrence> holders_;
  std::vector<uint64_t> load_;
  // Scratch for MakeUnits.
  std::vector<ChunkBox> distinct_;
  std::vector<int> holder_;
};

}  // namespace

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
    const std::vector<LocalSavePlan>& plans, const SavePlanOptions& options) {
  return SavePlanBuilder(job, step, plans, options).Build();
}

}  // namespace cairn::planner
