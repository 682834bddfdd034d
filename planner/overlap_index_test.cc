#include "planner/overlap_index.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

TEST(OverlapIndexTest, FindsOverlappingBoxesInIndexOrder) {
  OverlapIndex index({Box({0, 0}, {2, 2}), Box({0, 2}, {2, 2}),
                      Box({2, 0}, {2, 4}), Box({1, 1}, {0, 3})});
  EXPECT_THAT(index.Query(Box({1, 1}, {2, 2})), ElementsAre(0, 1, 2));
  EXPECT_THAT(index.Query(Box({0, 0}, {1, 1})), ElementsAre(0));
  EXPECT_THAT(index.Query(Box({4, 0}, {1, 1})), IsEmpty());
  // Empty query and wrong number of dims: nothing.
  EXPECT_THAT(index.Query(Box({0, 0}, {0, 4})), IsEmpty());
  EXPECT_THAT(index.Query(Box({0}, {4})), IsEmpty());
  // Box 0 overlaps only itself; [1:3, 1:3] overlaps 0, 1 and 2.
  int hit = -1;
  EXPECT_FALSE(index.AnyOverlap(Box({0, 0}, {2, 2}), 0, &hit));
  EXPECT_EQ(hit, -1);
  EXPECT_TRUE(index.AnyOverlap(Box({2, 0}, {1, 1}), 0, &hit));
  EXPECT_EQ(hit, 2);
  // Every box comes back as given, the empty one (never reported) too.
  EXPECT_EQ(index.box(0), Box({0, 0}, {2, 2}));
  EXPECT_EQ(index.box(2), Box({2, 0}, {2, 4}));
  EXPECT_EQ(index.box(3), Box({1, 1}, {0, 3}));
  // Only empty boxes: nothing is reported, every box is kept.
  OverlapIndex empties({Box({0, 0}, {0, 4}), Box({3, 1}, {2, 0})});
  EXPECT_THAT(empties.Query(Box({0, 0}, {9, 9})), IsEmpty());
  EXPECT_EQ(empties.box(1), Box({3, 1}, {2, 0}));
}

TEST(OverlapIndexTest, EmptyIndexAndScalars) {
  OverlapIndex empty(std::vector<ChunkBox>{});
  EXPECT_THAT(empty.Query(Box({0}, {1})), IsEmpty());
  OverlapIndex scalars({Box({}, {}), Box({}, {})});
  EXPECT_THAT(scalars.Query(Box({}, {})), ElementsAre(0, 1));
  ChunkBox b = Box({1}, {2});
  scalars.BoxInto(1, &b);
  EXPECT_EQ(b, Box({}, {}));
  EXPECT_TRUE(scalars.HoldsBox(0, Box({}, {})));
  EXPECT_FALSE(scalars.HoldsBox(0, Box({0}, {1})));
}

// Oracle: a linear scan with Intersect.
TEST(OverlapIndexTest, MatchesLinearScanOnRandomBoxes) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 400; ++iter) {
    const Shape shape = testing::RandomShape(rng, 4, 1, 40);
    std::vector<ChunkBox> boxes;
    if (iter % 2 == 0) {
      boxes = testing::RandomTiling(rng, shape, 300);
    } else {  // arbitrary overlapping boxes, some empty
      const int n = static_cast<int>(testing::Uniform(rng, 1, 200));
      for (int i = 0; i < n; ++i) {
        boxes.push_back(testing::RandomBox(rng, shape, true));
      }
    }
    OverlapIndex index(boxes);
    // Every box comes back as given, into a box of any prior content, and
    // HoldsBox tells it from its neighbours and from a one-off change.
    ChunkBox reused = Box({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
    for (int i = 0; i < static_cast<int>(boxes.size()); ++i) {
      index.BoxInto(i, &reused);
      ASSERT_EQ(reused, boxes[i]) << i;
      ASSERT_EQ(index.box(i), boxes[i]) << i;
      ASSERT_TRUE(index.HoldsBox(i, boxes[i])) << i;
      const ChunkBox& other = boxes[(i + 1) % boxes.size()];
      ASSERT_EQ(index.HoldsBox(i, other), other == boxes[i]) << i;
      ChunkBox changed = boxes[i];
      if (!changed.sizes.empty()) {
        changed.sizes[rng() % changed.sizes.size()] += 1;
        ASSERT_FALSE(index.HoldsBox(i, changed)) << i;
      }
      changed.offsets.push_back(0);  // another number of dims
      changed.sizes.push_back(1);
      ASSERT_FALSE(index.HoldsBox(i, changed)) << i;
    }
    for (int q = 0; q < 30; ++q) {
      const ChunkBox query = testing::RandomBox(rng, shape, q % 5 == 0);
      std::vector<int> want;
      for (int i = 0; i < static_cast<int>(boxes.size()); ++i) {
        if (Intersect(boxes[i], query, nullptr)) want.push_back(i);
      }
      ASSERT_EQ(index.Query(query), want) << BoxToString(query);
      const int exclude = want.empty() ? -1 : want[0];
      int hit = -1;
      const bool any = index.AnyOverlap(query, exclude, &hit);
      ASSERT_EQ(any, want.size() > (exclude >= 0 ? 1u : 0u));
      if (any) {
        ASSERT_NE(hit, exclude);
        ASSERT_TRUE(Intersect(boxes[hit], query, nullptr));
      }
    }
  }
}

TEST(OverlapIndexTest, FindUncoveredReturnsAGapOrNothing) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const Shape shape = testing::RandomShape(rng, 3, 1, 8);
    std::vector<ChunkBox> tiles = testing::RandomTiling(rng, shape, 40);
    const bool drop = iter % 2 == 1 && tiles.size() > 1;
    ChunkBox dropped;
    if (drop) {
      const size_t k = static_cast<size_t>(
          testing::Uniform(rng, 0, static_cast<int64_t>(tiles.size()) - 1));
      dropped = tiles[k];
      tiles.erase(tiles.begin() + static_cast<std::ptrdiff_t>(k));
    }
    OverlapIndex index(tiles);
    ChunkBox gap;
    const bool found = FindUncovered(index, FullBox(shape), &gap);
    ASSERT_EQ(found, drop);
    if (found) {
      EXPECT_TRUE(Contains(dropped, gap))
          << BoxToString(gap) << " vs " << BoxToString(dropped);
      EXPECT_GT(Volume(gap), 0);
    }
  }
}

TEST(TilesAsGridTest, AcceptsExactlyTheGridsThatTileTheShape) {
  const Shape shape = {4, 6};
  // Uneven cuts per dim, boxes in any order: a grid.
  EXPECT_TRUE(TilesAsGrid(shape, {Box({1, 0}, {3, 2}), Box({0, 0}, {1, 2}),
                                  Box({0, 2}, {1, 4}), Box({1, 2}, {3, 4})}));
  EXPECT_TRUE(TilesAsGrid(shape, {FullBox(shape)}));
  EXPECT_TRUE(TilesAsGrid({}, {FullBox({})}));  // a scalar
  // A cell missing (a gap), a cell twice, a box over two cells, a box past
  // the shape, cuts not from 0: no grid.
  EXPECT_FALSE(TilesAsGrid(
      shape, {Box({0, 0}, {1, 2}), Box({0, 2}, {1, 4}), Box({1, 0}, {3, 2})}));
  EXPECT_FALSE(TilesAsGrid(shape, {Box({0, 0}, {4, 6}), Box({0, 0}, {4, 6})}));
  EXPECT_FALSE(TilesAsGrid(shape, {Box({0, 0}, {4, 3}), Box({0, 3}, {2, 3}),
                                   Box({2, 3}, {2, 3}), Box({2, 0}, {2, 3})}));
  EXPECT_FALSE(TilesAsGrid(shape, {Box({0, 0}, {4, 7})}));
  EXPECT_FALSE(TilesAsGrid(shape, {Box({1, 0}, {3, 6})}));
  EXPECT_FALSE(TilesAsGrid(shape, {}));
}

}  // namespace
}  // namespace cairn::planner
