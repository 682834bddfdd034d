// Box geometry over row-major tensors.
//
// A ChunkBox is a hyper-rectangle [offsets[d], offsets[d] + sizes[d]) per dim
// of a global tensor of at most kMaxDims dims (a scalar has zero dims and one
// element). Everything in Cairn that moves tensor bytes reduces to three
// questions answered here: do two boxes intersect (and where), is one inside
// the other, and which contiguous byte ranges copy a region from a buffer
// holding one box into a buffer holding another.
//
// CopySegments algorithm: in row-major order the innermost dims that the
// region spans completely in BOTH the source and the destination box form one
// contiguous run, and so does the next-outer dim's span of the region. Let j be
// the outermost dim such that every dim > j is spanned completely; each
// segment then copies region.sizes[j] * prod(sizes[j+1..]) elements, and we
// emit one segment per index of the (region-restricted) dims < j in row-major
// order, which is also increasing src and dst offset order. No two emitted
// segments can be merged (they would have to be adjacent in both buffers,
// which means dim j is spanned completely, contradicting the choice of j), so
// the result has the fewest possible ranges and covers each region byte once.
#ifndef CAIRN_PLANNER_BOX_H_
#define CAIRN_PLANNER_BOX_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"

namespace cairn::planner {

inline constexpr int kMaxDims = 8;

// Per-dim values of a shape or box. Inline up to 4 dims (nearly every
// tensor), so a plan of millions of items does not allocate per shape and
// box: allocation would be the largest cost of global save planning.
using Dims = absl::InlinedVector<int64_t, 4>;

// Elements per dim, dim 0 outermost.
using Shape = Dims;

// A box of a global tensor, in elements. offsets.size() == sizes.size() ==
// number of dims. A box with some size 0 is empty (Volume 0).
struct ChunkBox {
  Dims offsets;
  Dims sizes;

  friend bool operator==(const ChunkBox& a, const ChunkBox& b) {
    return a.offsets == b.offsets && a.sizes == b.sizes;
  }
  friend bool operator!=(const ChunkBox& a, const ChunkBox& b) {
    return !(a == b);
  }
  // Lexicographic by offsets, then sizes: a deterministic total order.
  friend bool operator<(const ChunkBox& a, const ChunkBox& b) {
    if (a.offsets != b.offsets) return a.offsets < b.offsets;
    return a.sizes < b.sizes;
  }
};

// Three-way comparison in the order of operator< (-1, 0 or 1), in one pass;
// what sorts of many boxes should use.
int CompareBoxes(const ChunkBox& a, const ChunkBox& b);

// The box [0, shape) covering a whole tensor.
ChunkBox FullBox(const Shape& shape);

// Product of dims (1 for a scalar, 0 if any dim is 0).
int64_t NumElements(const Shape& shape);
// Product of sizes (1 for a zero-dim box, 0 if any size is 0).
int64_t Volume(const ChunkBox& box);
// True if some size is <= 0.
bool IsEmpty(const ChunkBox& box);

// Writes a ∩ b into *out (may be nullptr) and returns true when the
// intersection is non-empty. Boxes with different numbers of dims never
// intersect. Two zero-dim boxes intersect (both are the scalar).
bool Intersect(const ChunkBox& a, const ChunkBox& b, ChunkBox* out);

// True if every element of `inner` lies in `outer` (an empty `inner` with the
// same number of dims is contained when its offsets lie in outer's range).
bool Contains(const ChunkBox& outer, const ChunkBox& inner);

// "[0:4096, 512:1024]": start:end per dim; "[]" for a scalar.
std::string BoxToString(const ChunkBox& box);
// "[4096, 1000]".
std::string ShapeToString(const Shape& shape);

// OK when box and shape have the same number of dims (<= kMaxDims), every
// shape dim >= 0, every offset >= 0, every size >= 0 and offset + size <=
// shape dim. INVALID_ARGUMENT naming the box and the shape otherwise, e.g.
// "chunk [0:4096, 512:1024] exceeds shape [4096, 1000]".
absl::Status ValidateBoxInShape(const ChunkBox& box, const Shape& shape);
// ValidateBoxInShape for a shape ValidateShape already accepted (a tensor's,
// checked once, and the boxes of millions of its chunks against it).
absl::Status ValidateBoxInValidShape(const ChunkBox& box, const Shape& shape);

// OK when shape has <= kMaxDims dims, all >= 0, and at most 2^60 elements (so
// byte sizes fit in 63 bits). INVALID_ARGUMENT otherwise.
absl::Status ValidateShape(const Shape& shape);

// A contiguous byte copy between two buffers.
struct CopySegment {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;

  friend bool operator==(const CopySegment& a, const CopySegment& b) {
    return a.src_offset == b.src_offset && a.dst_offset == b.dst_offset &&
           a.length == b.length;
  }
};

// Row-major byte segments that copy `region` (which must lie inside both
// `src` and `dst`; the caller guarantees it) from a buffer holding box `src`
// into a buffer holding box `dst`, both row-major and contiguous with
// `elem_size` bytes per element. Coalesced (a region spanning whole trailing
// dims of both boxes is one segment), sorted by src_offset (and dst_offset).
// Empty region: no segments.
//
// Example: src = dst = [0:4, 0:8], region = [1:3, 0:8], elem_size 4
//   -> one segment {src_offset 32, dst_offset 32, length 64}.
std::vector<CopySegment> CopySegments(const ChunkBox& src, const ChunkBox& dst,
                                      const ChunkBox& region, size_t elem_size);

// Same, appending to *out (avoids an allocation per call in hot loops).
void AppendCopySegments(const ChunkBox& src, const ChunkBox& dst,
                        const ChunkBox& region, size_t elem_size,
                        std::vector<CopySegment>* out);

// Number of segments CopySegments would return, without building them.
uint64_t NumCopySegments(const ChunkBox& src, const ChunkBox& dst,
                         const ChunkBox& region);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_BOX_H_
