// Test-only helpers shared by the planner tests: random layouts, random
// tilings and brute-force oracles that work element by element, independently
// of the planner's box arithmetic.
#ifndef CAIRN_PLANNER_PLANNER_TESTING_H_
#define CAIRN_PLANNER_PLANNER_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/layout.h"
#include "planner/save_plan.h"

namespace cairn::planner::testing {

// A tensor chunk item of `box`, its length the box's bytes.
inline WriteItem Chunk(std::string fqn, Shape shape, ChunkBox box,
                       DType dtype = DType::kFloat32) {
  WriteItem item;
  item.kind = WriteItem::Kind::kTensorChunk;
  item.fqn = std::move(fqn);
  item.dtype = dtype;
  item.global_shape = std::move(shape);
  item.length = static_cast<uint64_t>(Volume(box)) * DTypeSize(dtype);
  item.box = std::move(box);
  return item;
}

inline WriteItem Bytes(std::string fqn, uint64_t length) {
  WriteItem item;
  item.kind = WriteItem::Kind::kBytes;
  item.fqn = std::move(fqn);
  item.length = length;
  return item;
}

inline int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A random shape of 1..max_dims dims, each in [min_dim, max_dim].
inline Shape RandomShape(std::mt19937_64& rng, int max_dims, int64_t min_dim,
                         int64_t max_dim) {
  Shape s(static_cast<size_t>(Uniform(rng, 1, max_dims)));
  for (auto& d : s) d = Uniform(rng, min_dim, max_dim);
  return s;
}

// A random DTensor layout over a random mesh (1..3 dims of 1..4) with
// Shard/Replicate placements (several mesh dims may shard one tensor dim);
// ranks are a shuffled permutation of [first_rank, first_rank + size).
inline DTensorLayout RandomLayout(std::mt19937_64& rng, const Shape& shape,
                                  int first_rank = 0, int max_mesh_dims = 3,
                                  int64_t max_mesh_dim = 4) {
  DTensorLayout layout;
  const int mesh_dims = static_cast<int>(Uniform(rng, 1, max_mesh_dims));
  int64_t size = 1;
  for (int i = 0; i < mesh_dims; ++i) {
    layout.mesh.shape.push_back(Uniform(rng, 1, max_mesh_dim));
    size *= layout.mesh.shape.back();
    if (Uniform(rng, 0, 2) == 0) {
      layout.placements.push_back(Placement::Replicate());
    } else {
      layout.placements.push_back(Placement::Shard(static_cast<int>(
          Uniform(rng, 0, static_cast<int64_t>(shape.size()) - 1))));
    }
  }
  layout.mesh.ranks.resize(static_cast<size_t>(size));
  std::iota(layout.mesh.ranks.begin(), layout.mesh.ranks.end(), first_rank);
  std::shuffle(layout.mesh.ranks.begin(), layout.mesh.ranks.end(), rng);
  return layout;
}

// Oracle: the global indices along each tensor dim that the rank at mesh
// position `pos` holds, by literally splitting index lists like torch.chunk
// (chunk size ceil(n / k); fewer chunks when they run out).
inline std::vector<std::vector<int64_t>> OracleIndices(
    const DTensorLayout& layout, const Shape& shape, int64_t pos) {
  std::vector<int64_t> coord(layout.mesh.shape.size());
  for (size_t i = coord.size(); i-- > 0;) {
    coord[i] = pos % layout.mesh.shape[i];
    pos /= layout.mesh.shape[i];
  }
  std::vector<std::vector<int64_t>> idx(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    idx[d].resize(static_cast<size_t>(shape[d]));
    std::iota(idx[d].begin(), idx[d].end(), 0);
  }
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    if (layout.placements[i].kind != Placement::Kind::kShard) continue;
    auto& v = idx[static_cast<size_t>(layout.placements[i].dim)];
    const int64_t n = static_cast<int64_t>(v.size());
    const int64_t k = layout.mesh.shape[i];
    std::vector<std::vector<int64_t>> chunks;
    if (n > 0) {
      const int64_t cs = (n + k - 1) / k;
      for (int64_t s = 0; s < n; s += cs) {
        chunks.emplace_back(v.begin() + s, v.begin() + std::min(n, s + cs));
      }
    }
    v = coord[i] < static_cast<int64_t>(chunks.size())
            ? chunks[static_cast<size_t>(coord[i])]
            : std::vector<int64_t>{};
  }
  return idx;
}

// Calls f(flat index) for every element of `box` (row-major in `shape`).
template <typename F>
void ForEachElement(const ChunkBox& box, const Shape& shape, F&& f) {
  if (IsEmpty(box)) return;
  const size_t n = shape.size();
  Dims i(box.offsets);
  while (true) {
    int64_t flat = 0;
    for (size_t d = 0; d < n; ++d) flat = flat * shape[d] + i[d];
    f(flat);
    size_t d = n;
    while (d > 0) {
      --d;
      if (++i[d] < box.offsets[d] + box.sizes[d]) break;
      i[d] = box.offsets[d];
      if (d == 0) return;
    }
    if (n == 0) return;
  }
}

// A random tiling of `shape`: recursive random guillotine cuts, at most
// `max_boxes` boxes.
inline std::vector<ChunkBox> RandomTiling(std::mt19937_64& rng,
                                          const Shape& shape, int max_boxes) {
  std::vector<ChunkBox> done;
  std::vector<ChunkBox> todo{FullBox(shape)};
  while (!todo.empty()) {
    ChunkBox b = todo.back();
    todo.pop_back();
    const int total = static_cast<int>(done.size() + todo.size()) + 1;
    std::vector<size_t> cuttable;
    for (size_t d = 0; d < b.sizes.size(); ++d) {
      if (b.sizes[d] >= 2) cuttable.push_back(d);
    }
    if (total >= max_boxes || cuttable.empty() || Uniform(rng, 0, 4) == 0) {
      done.push_back(b);
      continue;
    }
    const size_t d = cuttable[static_cast<size_t>(
        Uniform(rng, 0, static_cast<int64_t>(cuttable.size()) - 1))];
    const int64_t cut = Uniform(rng, 1, b.sizes[d] - 1);
    ChunkBox lo = b, hi = b;
    lo.sizes[d] = cut;
    hi.offsets[d] += cut;
    hi.sizes[d] -= cut;
    todo.push_back(lo);
    todo.push_back(hi);
  }
  return done;
}

// A random box inside `shape`; empty only when allow_empty or a dim is 0.
inline ChunkBox RandomBox(std::mt19937_64& rng, const Shape& shape,
                          bool allow_empty) {
  ChunkBox b;
  for (int64_t n : shape) {
    int64_t lo = Uniform(rng, 0, n);
    int64_t hi = Uniform(rng, 0, n);
    if (lo > hi) std::swap(lo, hi);
    if (!allow_empty && lo == hi && n > 0) {
      if (hi < n) {
        ++hi;
      } else {
        --lo;
      }
    }
    b.offsets.push_back(lo);
    b.sizes.push_back(hi - lo);
  }
  return b;
}

}  // namespace cairn::planner::testing

#endif  // CAIRN_PLANNER_PLANNER_TESTING_H_
