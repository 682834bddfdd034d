// OverlapIndex: which of n boxes intersect a query box, in O(log n + k)
// typical time instead of the O(n) scan PyTorch's DCP does per wanted chunk.
//
// Algorithm: a static bounding-volume hierarchy (a kd-tree over boxes). The
// build sorts box indices recursively: at each node it takes the bounding box
// of its boxes, picks the dim where the boxes' centres spread the most, and
// partitions the boxes at the median centre (std::nth_element), until a node
// holds at most kLeafSize boxes. Build is O(n log n). A query walks the tree
// with an explicit stack and descends only into nodes whose bounding box
// intersects the query; leaves test their boxes directly. For the disjoint
// boxes of a checkpoint (a tiling of the tensor) subtrees are spatially
// compact, so a query visits O(log n) nodes plus the ones around its k hits.
// Empty boxes are stored but never reported.
#ifndef CAIRN_PLANNER_OVERLAP_INDEX_H_
#define CAIRN_PLANNER_OVERLAP_INDEX_H_

#include <cstdint>
#include <vector>

#include "planner/box.h"

namespace cairn::planner {

// Thread-safe: immutable after construction; every const method may be called
// concurrently without external locking.
class OverlapIndex {
 public:
  // All boxes must have the same number of dims (the caller validates; boxes
  // with another number of dims are never reported).
  explicit OverlapIndex(const std::vector<ChunkBox>& boxes);

  OverlapIndex(const OverlapIndex&) = delete;
  OverlapIndex& operator=(const OverlapIndex&) = delete;
  OverlapIndex(OverlapIndex&&) = default;
  OverlapIndex& operator=(OverlapIndex&&) = default;

  // Appends to *out the indices of the boxes whose intersection with `query`
  // is non-empty, in ascending index order.
  void Query(const ChunkBox& query, std::vector<int>* out) const;
  std::vector<int> Query(const ChunkBox& query) const;

  // True if some box other than `exclude` intersects `query`; writes its index
  // into *hit (may be nullptr). Stops at the first hit.
  bool AnyOverlap(const ChunkBox& query, int exclude, int* hit) const;

  // Box `i` as given, for every box with the index's number of dims (empty
  // ones too: they are kept, never reported); an empty ChunkBox for boxes
  // with another number of dims. A LoadPlanner keeps its chunks' boxes only
  // here.
  ChunkBox box(int i) const;
  // box(i) written into *out, reusing its storage (no allocation for up to
  // 4 dims): a LoadPlanner fills one box per read item it plans.
  void BoxInto(int i, ChunkBox* out) const;
  // Whether box(i) == b, without making box(i).
  bool HoldsBox(int i, const ChunkBox& b) const;
  int size() const { return size_; }
  // Approximate bytes this index holds (its vectors' capacity).
  size_t MemoryBytes() const;

 private:
  static constexpr int kLeafSize = 8;
  struct Node {
    int begin = 0;  // range of order_ covered by this node
    int end = 0;
    int left = -1;  // children (both -1 for a leaf)
    int right = -1;
  };

  int Build(int begin, int end);
  template <typename Visit>
  void Walk(const ChunkBox& query, Visit&& visit) const;

  // Constant after construction.
  int ndims_ = 0;
  int size_ = 0;                  // boxes given
  std::vector<int> order_;        // box indices, grouped by node; then
                                  // the empty ones (in no node)
  std::vector<int> position_;     // box index -> its position in order_
  std::vector<int64_t> box_lo_;   // [order position * ndims + d]
  std::vector<int64_t> box_hi_;   // exclusive
  std::vector<Node> nodes_;       // nodes_[0] is the root
  std::vector<int64_t> node_lo_;  // [node * ndims + d]: bounding box
  std::vector<int64_t> node_hi_;
};

// Finds a non-empty sub-box of `region` that no indexed box covers and writes
// it into *uncovered; false when `region` is fully covered (or the search gave
// up after `max_steps` index queries, which only happens for pathological
// inputs). Meant for error messages: it splits `region` around one covering
// box at a time (into at most 2 * dims pieces) and recurses depth first.
bool FindUncovered(const OverlapIndex& index, const ChunkBox& region,
                   ChunkBox* uncovered, int max_steps = 100000);

// True when `boxes` (non-empty, each with shape's number of dims) form a grid
// that tiles `shape`: per dim, the sorted distinct offsets (starting at 0) cut
// the dim into intervals, every box spans exactly one interval per dim (one
// grid cell), and there are as many boxes as cells, each in its own cell.
// That is a bijection between boxes and the cells, which partition the
// tensor, so the boxes are disjoint and cover it. Every DTensor layout
// (torch.chunk pieces along each sharded dim) passes; false says no more
// than that the boxes are no grid (irregular shards, overlaps, gaps: an
// OverlapIndex tells which). O(n log n) with small constants, no index to
// build: the fast path of a check that chunks tile a tensor.
bool TilesAsGrid(const Shape& shape, const std::vector<ChunkBox>& boxes);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_OVERLAP_INDEX_H_
