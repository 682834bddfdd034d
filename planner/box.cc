#include "planner/box.h"

#include <algorithm>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cairn::planner {

namespace {

int CompareInts(const Dims& a, const Dims& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  }
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return 0;
}

}  // namespace

int CompareBoxes(const ChunkBox& a, const ChunkBox& b) {
  const int c = CompareInts(a.offsets, b.offsets);
  return c != 0 ? c : CompareInts(a.sizes, b.sizes);
}

ChunkBox FullBox(const Shape& shape) {
  return ChunkBox{Dims(shape.size(), 0), shape};
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Volume(const ChunkBox& box) {
  int64_t n = 1;
  for (int64_t s : box.sizes) {
    if (s <= 0) return 0;
    n *= s;
  }
  return n;
}

bool IsEmpty(const ChunkBox& box) {
  for (int64_t s : box.sizes) {
    if (s <= 0) return true;
  }
  return false;
}

bool Intersect(const ChunkBox& a, const ChunkBox& b, ChunkBox* out) {
  const size_t n = a.offsets.size();
  if (b.offsets.size() != n || a.sizes.size() != n || b.sizes.size() != n) {
    return false;
  }
  for (size_t d = 0; d < n; ++d) {
    if (std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]) <=
        std::max(a.offsets[d], b.offsets[d])) {
      return false;
    }
  }
  if (out != nullptr) {
    out->offsets.resize(n);
    out->sizes.resize(n);
    for (size_t d = 0; d < n; ++d) {
      const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
      out->offsets[d] = lo;
      out->sizes[d] =
          std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]) - lo;
    }
  }
  return true;
}

bool Contains(const ChunkBox& outer, const ChunkBox& inner) {
  const size_t n = outer.offsets.size();
  if (inner.offsets.size() != n || outer.sizes.size() != n ||
      inner.sizes.size() != n) {
    return false;
  }
  for (size_t d = 0; d < n; ++d) {
    // `inner` may come from a client unchecked (VerifyLoad): compare without
    // computing its end, which can overflow. outer's end cannot (outer lies
    // in a validated shape), and inner.offsets[d] >= outer.offsets[d] here.
    if (inner.offsets[d] < outer.offsets[d] || inner.sizes[d] < 0 ||
        inner.offsets[d] > outer.offsets[d] + outer.sizes[d] ||
        inner.sizes[d] > outer.offsets[d] + outer.sizes[d] - inner.offsets[d]) {
      return false;
    }
  }
  return true;
}

std::string BoxToString(const ChunkBox& box) {
  std::string out = "[";
  const size_t n = std::min(box.offsets.size(), box.sizes.size());
  for (size_t d = 0; d < n; ++d) {
    if (d > 0) out += ", ";
    absl::StrAppend(&out, box.offsets[d], ":", box.offsets[d] + box.sizes[d]);
  }
  if (box.offsets.size() != box.sizes.size()) {
    absl::StrAppend(&out, n > 0 ? ", " : "", "<", box.offsets.size(),
                    " offsets vs ", box.sizes.size(), " sizes>");
  }
  out += "]";
  return out;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ValidateShape(const Shape& shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(shape), " has ", shape.size(),
                     " dims; at most ", kMaxDims, " are supported"));
  }
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dim"));
    }
    if (d > 0 && elements > (int64_t{1} << 60) / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), " has more than 2^60 elements"));
    }
    elements *= d;
  }
  return absl::OkStatus();
}

absl::Status ValidateBoxInShape(const ChunkBox& box, const Shape& shape) {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  return ValidateBoxInValidShape(box, shape);
}

absl::Status ValidateBoxInValidShape(const ChunkBox& box, const Shape& shape) {
  if (box.offsets.size() != shape.size() || box.sizes.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", BoxToString(box), " has ", box.offsets.size(),
                     " offsets and ", box.sizes.size(), " sizes but shape ",
                     ShapeToString(shape), " has ", shape.size(), " dims"));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", BoxToString(box), " has a negative offset or size (shape ",
          ShapeToString(shape), ")"));
    }
    // offsets[d] <= shape[d] - sizes[d] avoids overflow of offset + size.
    if (box.offsets[d] > shape[d] - box.sizes[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", BoxToString(box), " exceeds shape ", ShapeToString(shape)));
    }
  }
  return absl::OkStatus();
}

namespace {

// The outermost dim j such that every dim > j is spanned completely by the
// region in both boxes (n - 1 if the innermost dim is not). 0 for n == 0.
size_t FirstContiguousDim(const ChunkBox& src, const ChunkBox& dst,
                          const ChunkBox& region) {
  const size_t n = region.sizes.size();
  if (n == 0) return 0;
  size_t j = n - 1;
  while (j > 0 && region.sizes[j] == src.sizes[j] &&
         region.sizes[j] == dst.sizes[j]) {
    --j;
  }
  return j;
}

}  // namespace

uint64_t NumCopySegments(const ChunkBox& src, const ChunkBox& dst,
                         const ChunkBox& region) {
  if (IsEmpty(region)) return 0;
  const size_t j = FirstContiguousDim(src, dst, region);
  uint64_t count = 1;
  for (size_t d = 0; d < j; ++d)
    count *= static_cast<uint64_t>(region.sizes[d]);
  return count;
}

void AppendCopySegments(const ChunkBox& src, const ChunkBox& dst,
                        const ChunkBox& region, size_t elem_size,
                        std::vector<CopySegment>* out) {
  if (IsEmpty(region)) return;
  const size_t n = region.sizes.size();
  if (n > static_cast<size_t>(kMaxDims)) return;  // precondition violated
  if (n == 0) {                                   // a scalar: one element
    out->push_back({0, 0, elem_size});
    return;
  }
  // Row-major element strides of both buffers.
  uint64_t src_stride[kMaxDims];
  uint64_t dst_stride[kMaxDims];
  uint64_t s = 1, t = 1;
  for (size_t d = n; d-- > 0;) {
    src_stride[d] = s;
    dst_stride[d] = t;
    s *= static_cast<uint64_t>(src.sizes[d]);
    t *= static_cast<uint64_t>(dst.sizes[d]);
  }
  const size_t j = FirstContiguousDim(src, dst, region);
  const uint64_t run_elems =
      static_cast<uint64_t>(region.sizes[j]) * src_stride[j];
  const uint64_t length = run_elems * elem_size;

  // Element offsets of the region's first element in both buffers.
  uint64_t src_base = 0, dst_base = 0;
  for (size_t d = 0; d < n; ++d) {
    src_base += static_cast<uint64_t>(region.offsets[d] - src.offsets[d]) *
                src_stride[d];
    dst_base += static_cast<uint64_t>(region.offsets[d] - dst.offsets[d]) *
                dst_stride[d];
  }
  if (j == 0) {
    out->push_back({src_base * elem_size, dst_base * elem_size, length});
    return;
  }
  // Odometer over the region's indices in dims [0, j).
  uint64_t count = 1;
  for (size_t d = 0; d < j; ++d)
    count *= static_cast<uint64_t>(region.sizes[d]);
  out->reserve(out->size() + count);
  int64_t idx[kMaxDims] = {0};
  uint64_t src_off = src_base, dst_off = dst_base;
  for (uint64_t i = 0; i < count; ++i) {
    out->push_back({src_off * elem_size, dst_off * elem_size, length});
    // Advance the odometer (dim j-1 fastest).
    for (size_t d = j; d-- > 0;) {
      if (++idx[d] < region.sizes[d]) {
        src_off += src_stride[d];
        dst_off += dst_stride[d];
        break;
      }
      src_off -= static_cast<uint64_t>(region.sizes[d] - 1) * src_stride[d];
      dst_off -= static_cast<uint64_t>(region.sizes[d] - 1) * dst_stride[d];
      idx[d] = 0;
    }
  }
}

std::vector<CopySegment> CopySegments(const ChunkBox& src, const ChunkBox& dst,
                                      const ChunkBox& region,
                                      size_t elem_size) {
  std::vector<CopySegment> out;
  AppendCopySegments(src, dst, region, elem_size, &out);
  return out;
}

}  // namespace cairn::planner
