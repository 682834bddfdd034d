#include "planner/packed_plan.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cairn::planner {
namespace {

constexpr uint32_t kNone = UINT32_MAX;

// Bytes entries are equal whatever dtype or shape an item carries.
bool Names(const PlanEntry& e, const WriteItem& item) {
  if (e.kind != item.kind) return false;
  return item.kind == WriteItem::Kind::kBytes ||
         (e.dtype == item.dtype && e.global_shape == item.global_shape);
}

}  // namespace

int64_t EntryTable::Find(const WriteItem& item) const {
  auto it = first_.find(item.fqn);
  if (it == first_.end()) return -1;
  for (uint32_t id = it->second; id != kNone; id = next_[id]) {
    if (Names(entries_[id], item)) return id;
  }
  return -1;
}

uint32_t EntryTable::Add(const WriteItem& item) {
  auto [it, inserted] =
      first_.try_emplace(item.fqn, static_cast<uint32_t>(entries_.size()));
  uint32_t last = kNone;
  if (!inserted) {
    for (uint32_t id = it->second; id != kNone; id = next_[id]) {
      if (Names(entries_[id], item)) return id;
      last = id;
    }
  }
  const uint32_t id = static_cast<uint32_t>(entries_.size());
  PlanEntry& e = entries_.emplace_back();
  e.kind = item.kind;
  e.fqn = item.fqn;
  if (item.kind == WriteItem::Kind::kTensorChunk) {
    e.dtype = item.dtype;
    e.global_shape = item.global_shape;
  }
  next_.push_back(kNone);
  if (last != kNone) next_[last] = id;
  return id;
}

BoxInterner::BoxInterner(std::vector<int64_t>* coords)
    : coords_(coords), boxes_(0, Hash{this}, Eq{this}) {}

BoxInterner::Probe BoxInterner::View(const Stored& s) const {
  const int64_t* at = coords_->data() + s.begin;
  return Probe{absl::MakeConstSpan(at, s.dims),
               absl::MakeConstSpan(at + s.dims, s.dims)};
}

size_t BoxInterner::Hash::operator()(const Probe& p) const {
  return absl::HashOf(p.offsets, p.sizes);
}

bool BoxInterner::Eq::operator()(const Probe& a, const Probe& b) const {
  return a.offsets == b.offsets && a.sizes == b.sizes;
}

size_t BoxInterner::Add(absl::Span<const int64_t> offsets,
                        absl::Span<const int64_t> sizes) {
  auto it = boxes_.find(Probe{offsets, sizes});
  if (it != boxes_.end()) return it->begin;
  const Stored stored{coords_->size(), offsets.size()};
  coords_->insert(coords_->end(), offsets.begin(), offsets.end());
  coords_->insert(coords_->end(), sizes.begin(), sizes.end());
  boxes_.insert(stored);
  return stored.begin;
}

WriteItem PackedLocalPlan::Unpack(const PackedItem& item) const {
  const PlanEntry& e = EntryOf(item);
  WriteItem out;
  out.kind = e.kind;
  out.fqn = e.fqn;
  out.dtype = e.dtype;
  out.global_shape = e.global_shape;
  out.length = item.length;
  if (e.kind == WriteItem::Kind::kTensorChunk) {
    const absl::Span<const int64_t> offsets = Offsets(item);
    const absl::Span<const int64_t> sizes = Sizes(item);
    out.box.offsets.assign(offsets.begin(), offsets.end());
    out.box.sizes.assign(sizes.begin(), sizes.end());
  }
  return out;
}

LocalSavePlan PackedLocalPlan::Unpack() const {
  LocalSavePlan out;
  out.rank = rank;
  out.items.reserve(items.size());
  for (const PackedItem& item : items) out.items.push_back(Unpack(item));
  return out;
}

size_t PackedLocalPlan::ApproximateBytes() const {
  return sizeof(*this) + items.capacity() * sizeof(PackedItem) +
         coords.capacity() * sizeof(int64_t);
}

absl::StatusOr<PackedLocalPlan> EntryInterner::Pack(const LocalSavePlan& plan) {
  PackedLocalPlan out;
  out.rank = plan.rank;
  size_t coords = 0;
  for (const WriteItem& item : plan.items) {
    if (item.kind != WriteItem::Kind::kTensorChunk) continue;
    if (item.box.offsets.size() != item.global_shape.size() ||
        item.box.sizes.size() != item.global_shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", plan.rank, " '", item.fqn, "': chunk ",
                       BoxToString(item.box), " has ", item.box.offsets.size(),
                       " offsets and ", item.box.sizes.size(),
                       " sizes but shape ", ShapeToString(item.global_shape),
                       " has ", item.global_shape.size(), " dims"));
    }
    coords += 2 * item.global_shape.size();
  }
  if (coords > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", plan.rank, " has ", plan.items.size(),
                     " items whose boxes exceed 2^32 numbers"));
  }
  out.items.resize(plan.items.size());

  // A recent table naming every entry of the plan, most recent first.
  std::vector<std::shared_ptr<const EntryTable>> candidates;
  {
    absl::MutexLock lock(&mu_);
    candidates.reserve(recent_.size());
    for (const std::weak_ptr<const EntryTable>& w : recent_) {
      if (std::shared_ptr<const EntryTable> t = w.lock()) {
        candidates.push_back(std::move(t));
      }
    }
  }
  for (std::shared_ptr<const EntryTable>& t : candidates) {
    size_t i = 0;
    for (; i < plan.items.size(); ++i) {
      const int64_t id = t->Find(plan.items[i]);
      if (id < 0) break;
      out.items[i].entry = static_cast<uint32_t>(id);
    }
    if (i == plan.items.size()) {
      out.table = std::move(t);
      break;
    }
  }
  if (out.table == nullptr) {
    auto table = std::make_shared<EntryTable>();
    for (size_t i = 0; i < plan.items.size(); ++i) {
      out.items[i].entry = table->Add(plan.items[i]);
    }
    out.table = std::move(table);
  }
  {
    absl::MutexLock lock(&mu_);
    recent_.erase(std::remove_if(recent_.begin(), recent_.end(),
                                 [&](const std::weak_ptr<const EntryTable>& w) {
                                   return w.expired() || w.lock() == out.table;
                                 }),
                  recent_.end());
    recent_.insert(recent_.begin(), out.table);
    if (recent_.size() > kRecentTables) recent_.resize(kRecentTables);
  }

  BoxInterner boxes(&out.coords);
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const WriteItem& item = plan.items[i];
    PackedItem& p = out.items[i];
    p.length = item.length;
    if (item.kind != WriteItem::Kind::kTensorChunk) continue;
    // At most `coords` numbers in all (checked above): fits 32 bits.
    p.box_begin =
        static_cast<uint32_t>(boxes.Add(absl::MakeConstSpan(item.box.offsets),
                                        absl::MakeConstSpan(item.box.sizes)));
  }
  out.coords.shrink_to_fit();
  return out;
}

size_t EntryInterner::LiveTables() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const std::weak_ptr<const EntryTable>& w : recent_) n += !w.expired();
  return n;
}

}  // namespace cairn::planner
