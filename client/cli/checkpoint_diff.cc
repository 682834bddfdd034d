#include "client/cli/checkpoint_diff.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "planner/overlap_index.h"
#include "proto/convert/plan_convert.h"
#include "storage/checkpoint_layout.h"
#include "storage/manifest.h"

namespace cairn::cli {
namespace {

bool BoxLess(const v1::ChunkBox& x, const v1::ChunkBox& y) {
  if (!std::equal(x.offsets().begin(), x.offsets().end(), y.offsets().begin(),
                  y.offsets().end())) {
    return std::lexicographical_compare(x.offsets().begin(), x.offsets().end(),
                                        y.offsets().begin(), y.offsets().end());
  }
  return std::lexicographical_compare(x.sizes().begin(), x.sizes().end(),
                                      y.sizes().begin(), y.sizes().end());
}

bool BoxEqual(const v1::ChunkBox& x, const v1::ChunkBox& y) {
  return !BoxLess(x, y) && !BoxLess(y, x);
}

bool EmptyBox(const v1::ChunkBox& box) {
  for (int64_t s : box.sizes()) {
    if (s == 0) return true;
  }
  return false;
}

// The non-empty chunks of `t`, sorted by box.
std::vector<const v1::StoredChunk*> SortedChunks(const v1::ManifestTensor& t) {
  std::vector<const v1::StoredChunk*> out;
  for (const v1::StoredChunk& c : t.chunks()) {
    if (!EmptyBox(c.box())) out.push_back(&c);
  }
  std::sort(out.begin(), out.end(), [](const auto* x, const auto* y) {
    return BoxLess(x->box(), y->box());
  });
  return out;
}

DiffSide SideOf(const v1::ManifestTensor& t) {
  DiffSide s;
  s.present = true;
  s.is_tensor = true;
  s.dtype = t.entry().dtype();
  s.shape.assign(t.entry().global_shape().begin(),
                 t.entry().global_shape().end());
  s.bytes = storage::DTypeSize(s.dtype);
  for (int64_t d : s.shape) s.bytes *= static_cast<uint64_t>(d);
  return s;
}

DiffSide SideOf(const v1::ManifestBytes& b) {
  DiffSide s;
  s.present = true;
  s.bytes = b.location().length();
  return s;
}

// An entry of either kind, by fqn.
struct Entry {
  const v1::ManifestTensor* tensor = nullptr;
  const v1::ManifestBytes* bytes = nullptr;
};

std::map<std::string, Entry> EntriesOf(const v1::Manifest& m) {
  std::map<std::string, Entry> out;
  for (const v1::ManifestTensor& t : m.tensors()) {
    out[t.entry().fqn()].tensor = &t;
  }
  for (const v1::ManifestBytes& b : m.bytes_entries()) {
    out[b.fqn()].bytes = &b;
  }
  return out;
}

// The bytes comparison of one tensor stored in other boxes in A and B.
class TensorBytesComparison {
 public:
  TensorBytesComparison(const v1::Manifest& a, const v1::Manifest& b,
                        storage::ShardStore& store_a,
                        storage::ShardStore& store_b,
                        const DiffOptions& options, uint64_t* bytes_read)
      : a_(a),
        b_(b),
        store_a_(store_a),
        store_b_(store_b),
        options_(options),
        bytes_read_(bytes_read) {}

  // Counts the elements of `ta` and `tb` (same dtype and shape) that differ.
  absl::Status Compare(const v1::ManifestTensor& ta,
                       const v1::ManifestTensor& tb, EntryDiff* d) {
    const std::string& fqn = ta.entry().fqn();
    const size_t elem = storage::DTypeSize(ta.entry().dtype());
    std::vector<planner::ChunkBox> boxes_b;
    for (const v1::StoredChunk& c : tb.chunks()) {
      CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box,
                             convert::BoxFromProto(c.box(), fqn));
      boxes_b.push_back(std::move(box));
    }
    const planner::OverlapIndex index(boxes_b);
    cache_.clear();
    cached_bytes_ = 0;
    std::string buf_a, uncached;
    std::vector<int> hits;
    for (const v1::StoredChunk& ca : ta.chunks()) {
      CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box_a,
                             convert::BoxFromProto(ca.box(), fqn));
      if (planner::IsEmpty(box_a)) continue;
      CAIRN_RETURN_IF_ERROR(Read(store_a_, a_, fqn, ca, &buf_a));
      hits.clear();
      index.Query(box_a, &hits);
      for (int i : hits) {
        const std::string* buf_b = nullptr;
        CAIRN_RETURN_IF_ERROR(ChunkOfB(tb, i, &uncached, &buf_b));
        planner::ChunkBox overlap;
        planner::Intersect(box_a, boxes_b[i], &overlap);
        for (const planner::CopySegment& s :
             planner::CopySegments(box_a, boxes_b[i], overlap, elem)) {
          const char* x = buf_a.data() + s.src_offset;
          const char* y = buf_b->data() + s.dst_offset;
          if (std::memcmp(x, y, s.length) == 0) continue;
          for (uint64_t k = 0; k < s.length; k += elem) {
            if (std::memcmp(x + k, y + k, elem) != 0) ++d->elements_differ;
          }
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Read(storage::ShardStore& store, const v1::Manifest& m,
                    const std::string& fqn, const v1::StoredChunk& c,
                    std::string* out) {
    out->resize(c.location().length());
    CAIRN_RETURN_IF_ERROR(storage::ReadVerified(
        store, m.job(), m.step(), c.location(), c.crc32c(),
        absl::StrCat("tensor '", fqn, "' chunk ",
                     storage::BoxToString(c.box())),
        absl::Span<char>(out->data(), out->size())));
    *bytes_read_ += c.location().length();
    return absl::OkStatus();
  }

  // Chunk i of tb, from the cache or read (into the cache while it has
  // room, else into *uncached).
  absl::Status ChunkOfB(const v1::ManifestTensor& tb, int i,
                        std::string* uncached, const std::string** out) {
    auto it = cache_.find(i);
    if (it != cache_.end()) {
      *out = &it->second;
      return absl::OkStatus();
    }
    const v1::StoredChunk& c = tb.chunks(i);
    const uint64_t n = c.location().length();
    std::string* dst = uncached;
    if (n <= options_.cache_bytes) {
      if (cached_bytes_ + n > options_.cache_bytes) {
        cache_.clear();
        cached_bytes_ = 0;
      }
      dst = &cache_[i];
      cached_bytes_ += n;
    }
    CAIRN_RETURN_IF_ERROR(Read(store_b_, b_, tb.entry().fqn(), c, dst));
    *out = dst;
    return absl::OkStatus();
  }

  const v1::Manifest& a_;
  const v1::Manifest& b_;
  storage::ShardStore& store_a_;
  storage::ShardStore& store_b_;
  const DiffOptions& options_;
  uint64_t* bytes_read_;
  std::map<int, std::string> cache_;  // chunks of B by index
  uint64_t cached_bytes_ = 0;
};

}  // namespace

const char* ChangeName(EntryDiff::Change change) {
  switch (change) {
    case EntryDiff::Change::kAdded:
      return "added";
    case EntryDiff::Change::kRemoved:
      return "removed";
    case EntryDiff::Change::kChanged:
      return "changed";
    case EntryDiff::Change::kDiffers:
      return "differs";
  }
  return "?";
}

absl::StatusOr<CheckpointDiff> DiffCheckpoints(const v1::Manifest& a,
                                               const v1::Manifest& b,
                                               const DiffStoreOf& store_of,
                                               const DiffOptions& options) {
  CheckpointDiff diff;
  const std::map<std::string, Entry> ea = EntriesOf(a), eb = EntriesOf(b);
  std::map<std::string, std::pair<Entry, Entry>> both;
  for (const auto& [fqn, e] : ea) both[fqn].first = e;
  for (const auto& [fqn, e] : eb) both[fqn].second = e;
  for (const auto& [fqn, pair] : both) {
    const auto& [x, y] = pair;
    EntryDiff d;
    d.fqn = fqn;
    if (x.tensor) d.a = SideOf(*x.tensor);
    if (x.bytes) d.a = SideOf(*x.bytes);
    if (y.tensor) d.b = SideOf(*y.tensor);
    if (y.bytes) d.b = SideOf(*y.bytes);
    if (!d.a.present || !d.b.present) {
      d.change =
          d.a.present ? EntryDiff::Change::kRemoved : EntryDiff::Change::kAdded;
      diff.entries.push_back(std::move(d));
      continue;
    }
    if (d.a.is_tensor != d.b.is_tensor ||
        (d.a.is_tensor && (d.a.dtype != d.b.dtype || d.a.shape != d.b.shape))) {
      d.change = EntryDiff::Change::kChanged;
      diff.entries.push_back(std::move(d));
      continue;
    }
    bool same = true;
    if (x.bytes) {
      ++diff.compared_by_crc32c;
      same = x.bytes->crc32c() == y.bytes->crc32c() &&
             x.bytes->location().length() == y.bytes->location().length();
    } else {
      const std::vector<const v1::StoredChunk*> ca = SortedChunks(*x.tensor),
                                                cb = SortedChunks(*y.tensor);
      const bool same_layout = ca.size() == cb.size() &&
                               std::equal(ca.begin(), ca.end(), cb.begin(),
                                          [](const auto* p, const auto* q) {
                                            return BoxEqual(p->box(), q->box());
                                          });
      if (same_layout) {
        ++diff.compared_by_crc32c;
        d.chunks = static_cast<int64_t>(ca.size());
        for (size_t i = 0; i < ca.size(); ++i) {
          if (ca[i]->crc32c() != cb[i]->crc32c()) ++d.chunks_differ;
        }
        same = d.chunks_differ == 0;
      } else {
        ++diff.compared_by_bytes;
        d.compared_bytes = true;
        d.elements =
            d.a.bytes / std::max<size_t>(storage::DTypeSize(d.a.dtype), 1);
        CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * store_a, store_of(0));
        CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * store_b, store_of(1));
        TensorBytesComparison comparison(a, b, *store_a, *store_b, options,
                                         &diff.bytes_read);
        CAIRN_RETURN_IF_ERROR(comparison.Compare(*x.tensor, *y.tensor, &d));
        same = d.elements_differ == 0;
      }
    }
    if (same) {
      ++diff.identical;
      continue;
    }
    d.change = EntryDiff::Change::kDiffers;
    diff.entries.push_back(std::move(d));
  }
  return diff;
}

}  // namespace cairn::cli
