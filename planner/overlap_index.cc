#include "planner/overlap_index.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace cairn::planner {

OverlapIndex::OverlapIndex(const std::vector<ChunkBox>& boxes)
    : size_(static_cast<int>(boxes.size())) {
  if (boxes.empty()) return;
  ndims_ = static_cast<int>(boxes[0].offsets.size());
  if (ndims_ > kMaxDims) return;  // never reports anything
  const size_t nd = static_cast<size_t>(ndims_);
  // Flat coordinates per original box index. Well-formed boxes with ndims_
  // dims are kept; the non-empty ones go into the tree, the empty ones after
  // it (kept for box(), never reported).
  std::vector<int64_t> lo(boxes.size() * nd), hi(boxes.size() * nd);
  std::vector<int> empty;
  order_.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const ChunkBox& b = boxes[i];
    if (b.offsets.size() != nd || b.sizes.size() != nd) continue;
    for (size_t d = 0; d < nd; ++d) {
      lo[i * nd + d] = b.offsets[d];
      hi[i * nd + d] = b.offsets[d] + b.sizes[d];
    }
    (IsEmpty(b) ? empty : order_).push_back(static_cast<int>(i));
  }
  const int indexed = static_cast<int>(order_.size());
  box_lo_.swap(lo);  // Build() reads original-index coordinates from these
  box_hi_.swap(hi);
  if (indexed > 0) {
    nodes_.reserve(2 * order_.size() / kLeafSize + 2);
    Build(0, indexed);
  }
  order_.insert(order_.end(), empty.begin(), empty.end());
  // Re-lay the coordinates out in order_ positions so leaf scans are linear.
  std::vector<int64_t> olo(order_.size() * nd), ohi(order_.size() * nd);
  for (size_t p = 0; p < order_.size(); ++p) {
    const size_t i = static_cast<size_t>(order_[p]);
    for (size_t d = 0; d < nd; ++d) {
      olo[p * nd + d] = box_lo_[i * nd + d];
      ohi[p * nd + d] = box_hi_[i * nd + d];
    }
  }
  box_lo_.swap(olo);
  box_hi_.swap(ohi);
  position_.assign(boxes.size(), -1);
  for (size_t p = 0; p < order_.size(); ++p) {
    position_[static_cast<size_t>(order_[p])] = static_cast<int>(p);
  }
}

size_t OverlapIndex::MemoryBytes() const {
  return sizeof(*this) + order_.capacity() * sizeof(int) +
         position_.capacity() * sizeof(int) +
         (box_lo_.capacity() + box_hi_.capacity() + node_lo_.capacity() +
          node_hi_.capacity()) *
             sizeof(int64_t) +
         nodes_.capacity() * sizeof(Node);
}

ChunkBox OverlapIndex::box(int i) const {
  ChunkBox out;
  BoxInto(i, &out);
  return out;
}

void OverlapIndex::BoxInto(int i, ChunkBox* out) const {
  const int p = position_.empty() ? -1 : position_[static_cast<size_t>(i)];
  if (p < 0) {  // not indexed
    out->offsets.clear();
    out->sizes.clear();
    return;
  }
  const size_t nd = static_cast<size_t>(ndims_);
  const int64_t* lo = box_lo_.data() + static_cast<size_t>(p) * nd;
  const int64_t* hi = box_hi_.data() + static_cast<size_t>(p) * nd;
  out->offsets.assign(lo, lo + nd);
  out->sizes.resize(nd);
  for (size_t d = 0; d < nd; ++d) out->sizes[d] = hi[d] - lo[d];
}

bool OverlapIndex::HoldsBox(int i, const ChunkBox& b) const {
  const int p = position_.empty() ? -1 : position_[static_cast<size_t>(i)];
  if (p < 0) return b.offsets.empty() && b.sizes.empty();
  const size_t nd = static_cast<size_t>(ndims_);
  if (b.offsets.size() != nd || b.sizes.size() != nd) return false;
  const int64_t* lo = box_lo_.data() + static_cast<size_t>(p) * nd;
  const int64_t* hi = box_hi_.data() + static_cast<size_t>(p) * nd;
  for (size_t d = 0; d < nd; ++d) {
    if (b.offsets[d] != lo[d] || b.sizes[d] != hi[d] - lo[d]) return false;
  }
  return true;
}

int OverlapIndex::Build(int begin, int end) {
  const size_t nd = static_cast<size_t>(ndims_);
  const int id = static_cast<int>(nodes_.size());
  nodes_.push_back(Node{begin, end, -1, -1});
  node_lo_.resize(node_lo_.size() + nd);
  node_hi_.resize(node_hi_.size() + nd);
  int64_t* nlo = node_lo_.data() + id * nd;
  int64_t* nhi = node_hi_.data() + id * nd;
  // Bounding box, and the spread of the box centres (2 * centre, exact).
  int64_t cmin[kMaxDims], cmax[kMaxDims];
  for (size_t d = 0; d < nd; ++d) {
    nlo[d] = cmin[d] = INT64_MAX;
    nhi[d] = cmax[d] = INT64_MIN;
  }
  for (int p = begin; p < end; ++p) {
    const size_t i = static_cast<size_t>(order_[p]);
    for (size_t d = 0; d < nd; ++d) {
      const int64_t l = box_lo_[i * nd + d], h = box_hi_[i * nd + d];
      nlo[d] = std::min(nlo[d], l);
      nhi[d] = std::max(nhi[d], h);
      cmin[d] = std::min(cmin[d], l + h);
      cmax[d] = std::max(cmax[d], l + h);
    }
  }
  if (end - begin <= kLeafSize) return id;
  size_t split_dim = 0;
  int64_t best_spread = -1;
  for (size_t d = 0; d < nd; ++d) {
    if (cmax[d] - cmin[d] > best_spread) {
      best_spread = cmax[d] - cmin[d];
      split_dim = d;
    }
  }
  if (best_spread <= 0) return id;  // all centres equal: cannot split
  const int mid = begin + (end - begin) / 2;
  const int64_t* blo = box_lo_.data();
  const int64_t* bhi = box_hi_.data();
  std::nth_element(order_.begin() + begin, order_.begin() + mid,
                   order_.begin() + end, [&](int a, int b) {
                     const size_t ia = static_cast<size_t>(a) * nd + split_dim;
                     const size_t ib = static_cast<size_t>(b) * nd + split_dim;
                     const int64_t ca = blo[ia] + bhi[ia];
                     const int64_t cb = blo[ib] + bhi[ib];
                     return ca != cb ? ca < cb : a < b;
                   });
  const int left = Build(begin, mid);
  const int right = Build(mid, end);
  nodes_[id].left = left;
  nodes_[id].right = right;
  return id;
}

template <typename Visit>
void OverlapIndex::Walk(const ChunkBox& query, Visit&& visit) const {
  if (nodes_.empty()) return;
  const size_t nd = static_cast<size_t>(ndims_);
  if (query.offsets.size() != nd || query.sizes.size() != nd ||
      IsEmpty(query)) {
    return;
  }
  int64_t qlo[kMaxDims], qhi[kMaxDims];
  for (size_t d = 0; d < nd; ++d) {
    qlo[d] = query.offsets[d];
    qhi[d] = query.offsets[d] + query.sizes[d];
  }
  auto overlaps = [&](const int64_t* lo, const int64_t* hi) {
    for (size_t d = 0; d < nd; ++d) {
      if (lo[d] >= qhi[d] || qlo[d] >= hi[d]) return false;
    }
    return true;
  };
  // Depth is at most ~log2(n) + 1 with median splits; 128 is ample.
  int stack[128];
  int top = 0;
  stack[top++] = 0;
  while (top > 0) {
    const Node& node = nodes_[stack[--top]];
    const size_t id = static_cast<size_t>(&node - nodes_.data());
    // data() + offset, not &v[offset]: with zero dims (scalars) the vectors
    // are empty and indexing them is undefined behaviour.
    if (!overlaps(node_lo_.data() + id * nd, node_hi_.data() + id * nd)) {
      continue;
    }
    if (node.left < 0) {
      for (int p = node.begin; p < node.end; ++p) {
        const size_t off = static_cast<size_t>(p) * nd;
        if (overlaps(box_lo_.data() + off, box_hi_.data() + off)) {
          if (visit(order_[p])) return;
        }
      }
      continue;
    }
    stack[top++] = node.right;
    stack[top++] = node.left;
  }
}

void OverlapIndex::Query(const ChunkBox& query, std::vector<int>* out) const {
  const size_t first = out->size();
  Walk(query, [out](int i) {
    out->push_back(i);
    return false;
  });
  std::sort(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
}

std::vector<int> OverlapIndex::Query(const ChunkBox& query) const {
  std::vector<int> out;
  Query(query, &out);
  return out;
}

bool OverlapIndex::AnyOverlap(const ChunkBox& query, int exclude,
                              int* hit) const {
  bool found = false;
  Walk(query, [&](int i) {
    if (i == exclude) return false;
    found = true;
    if (hit != nullptr) *hit = i;
    return true;
  });
  return found;
}

namespace {

bool FindUncoveredRec(const OverlapIndex& index, const ChunkBox& region,
                      ChunkBox* uncovered, int* steps) {
  if (IsEmpty(region) || --*steps < 0) return false;
  int hit = -1;
  if (!index.AnyOverlap(region, -1, &hit)) {
    *uncovered = region;
    return true;
  }
  ChunkBox inter;
  Intersect(region, index.box(hit), &inter);
  // region \ inter as disjoint pieces: for each dim d, the parts of `rest`
  // below and above inter along d; then clamp `rest` to inter along d.
  ChunkBox rest = region;
  for (size_t d = 0; d < region.sizes.size(); ++d) {
    const int64_t lo = inter.offsets[d], hi = lo + inter.sizes[d];
    const int64_t rlo = rest.offsets[d], rhi = rlo + rest.sizes[d];
    if (rlo < lo) {
      ChunkBox below = rest;
      below.sizes[d] = lo - rlo;
      if (FindUncoveredRec(index, below, uncovered, steps)) return true;
    }
    if (hi < rhi) {
      ChunkBox above = rest;
      above.offsets[d] = hi;
      above.sizes[d] = rhi - hi;
      if (FindUncoveredRec(index, above, uncovered, steps)) return true;
    }
    rest.offsets[d] = lo;
    rest.sizes[d] = hi - lo;
  }
  return false;
}

}  // namespace

bool FindUncovered(const OverlapIndex& index, const ChunkBox& region,
                   ChunkBox* uncovered, int max_steps) {
  int steps = max_steps;
  return FindUncoveredRec(index, region, uncovered, &steps);
}

bool TilesAsGrid(const Shape& shape, const std::vector<ChunkBox>& boxes) {
  const size_t nd = shape.size();
  const size_t n = boxes.size();
  if (n == 0 || nd > static_cast<size_t>(kMaxDims)) return false;
  std::vector<int64_t> cuts[kMaxDims];
  uint64_t cells = 1;
  for (size_t d = 0; d < nd; ++d) {
    std::vector<int64_t>& c = cuts[d];
    c.reserve(n);
    for (const ChunkBox& b : boxes) c.push_back(b.offsets[d]);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (c[0] != 0) return false;
    cells *= c.size();  // <= n after each step: no overflow
    if (cells > n) return false;
  }
  if (cells != n) return false;
  std::vector<bool> taken(n, false);
  for (const ChunkBox& b : boxes) {
    uint64_t cell = 0;
    for (size_t d = 0; d < nd; ++d) {
      const std::vector<int64_t>& c = cuts[d];
      const size_t k = static_cast<size_t>(
          std::lower_bound(c.begin(), c.end(), b.offsets[d]) - c.begin());
      const int64_t end = k + 1 < c.size() ? c[k + 1] : shape[d];
      if (b.sizes[d] != end - b.offsets[d]) return false;
      cell = cell * c.size() + k;
    }
    if (taken[cell]) return false;
    taken[cell] = true;
  }
  return true;
}

}  // namespace cairn::planner
