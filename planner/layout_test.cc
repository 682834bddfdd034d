#include "planner/layout.h"

#include <map>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

DTensorLayout Layout(const Shape& mesh_shape, std::vector<int> ranks,
                     std::vector<Placement> placements) {
  return DTensorLayout{DeviceMesh{mesh_shape, std::move(ranks)},
                       std::move(placements)};
}

ChunkBox ChunkOf(const DTensorLayout& layout, const Shape& shape, int rank) {
  auto chunks = LocalChunks(layout, shape, rank);
  EXPECT_TRUE(chunks.ok()) << chunks.status();
  if (!chunks.ok() || chunks->size() != 1) return ChunkBox{};
  return (*chunks)[0];
}

std::vector<int64_t> Sizes0(const DTensorLayout& layout, const Shape& shape) {
  std::vector<int64_t> out;
  for (int r : layout.mesh.ranks)
    out.push_back(ChunkOf(layout, shape, r).sizes[0]);
  return out;
}

// torch.chunk docs: torch.arange(11).chunk(6) -> 2,2,2,2,2,1;
// torch.arange(12).chunk(6) -> 2 x 6; torch.arange(13).chunk(6) -> 3,3,3,3,1
// (only 5 chunks: DTensor's 6th shard is empty).
TEST(LayoutTest, TorchChunkDocumentedExamples) {
  const auto mesh6 = Layout({6}, {0, 1, 2, 3, 4, 5}, {Placement::Shard(0)});
  EXPECT_THAT(Sizes0(mesh6, {11}), ElementsAre(2, 2, 2, 2, 2, 1));
  EXPECT_THAT(Sizes0(mesh6, {12}), ElementsAre(2, 2, 2, 2, 2, 2));
  EXPECT_THAT(Sizes0(mesh6, {13}), ElementsAre(3, 3, 3, 3, 1, 0));
  // The empty trailing shard sits at the end of the dim, as
  // compute_local_shape_and_global_offset reports it.
  EXPECT_EQ(ChunkOf(mesh6, {13}, 5), Box({13}, {0}));
}

// DTensor docs: a [4, 8] tensor over a 1-D mesh of 4 with Shard(0) gives each
// rank one row block; over a 2-D mesh [[0, 1], [2, 3]] with
// [Shard(0), Shard(1)] each rank gets a [2, 4] block; with
// [Shard(0), Replicate()] ranks 0 and 1 hold the same rows.
TEST(LayoutTest, DTensorDocumentedExamples) {
  const auto row = Layout({4}, {0, 1, 2, 3}, {Placement::Shard(0)});
  EXPECT_EQ(ChunkOf(row, {4, 8}, 2), Box({2, 0}, {1, 8}));
  // Uneven: 10 rows over 4 ranks -> 3, 3, 3, 1 (torch.chunk), not
  // tensor_split's 3, 3, 2, 2.
  EXPECT_THAT(Sizes0(row, {10, 4}), ElementsAre(3, 3, 3, 1));
  EXPECT_EQ(ChunkOf(row, {10, 4}, 3), Box({9, 0}, {1, 4}));
  const auto grid =
      Layout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Shard(1)});
  EXPECT_EQ(ChunkOf(grid, {4, 8}, 0), Box({0, 0}, {2, 4}));
  EXPECT_EQ(ChunkOf(grid, {4, 8}, 1), Box({0, 4}, {2, 4}));
  EXPECT_EQ(ChunkOf(grid, {4, 8}, 2), Box({2, 0}, {2, 4}));
  EXPECT_EQ(ChunkOf(grid, {4, 8}, 3), Box({2, 4}, {2, 4}));
  const auto hsdp = Layout({2, 2}, {0, 1, 2, 3},
                           {Placement::Shard(0), Placement::Replicate()});
  EXPECT_EQ(ChunkOf(hsdp, {4, 8}, 0), ChunkOf(hsdp, {4, 8}, 1));
  EXPECT_EQ(ChunkOf(hsdp, {4, 8}, 3), Box({2, 0}, {2, 8}));
  // Replicate everywhere: the whole tensor.
  const auto rep = Layout({2}, {0, 1}, {Placement::Replicate()});
  EXPECT_EQ(ChunkOf(rep, {3, 5}, 1), Box({0, 0}, {3, 5}));
}

// Nested sharding: two mesh dims shard tensor dim 0 (e.g. FSDP inside TP);
// the second split applies to the piece left by the first, offsets add up.
TEST(LayoutTest, NestedShardingSplitsThePieceLeftByEarlierMeshDims) {
  const auto nested =
      Layout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Shard(0)});
  EXPECT_EQ(ChunkOf(nested, {8}, 0), Box({0}, {2}));
  EXPECT_EQ(ChunkOf(nested, {8}, 1), Box({2}, {2}));
  EXPECT_EQ(ChunkOf(nested, {8}, 2), Box({4}, {2}));
  EXPECT_EQ(ChunkOf(nested, {8}, 3), Box({6}, {2}));
  // Uneven: 7 -> [0:4], [4:7] -> [0:2], [2:4], [4:6], [6:7].
  EXPECT_EQ(ChunkOf(nested, {7}, 1), Box({2}, {2}));
  EXPECT_EQ(ChunkOf(nested, {7}, 3), Box({6}, {1}));
  // 3 over [2, 2]: [0:2], [2:3] -> [0:1], [1:2], [2:3], [3:3] (empty).
  EXPECT_EQ(ChunkOf(nested, {3}, 2), Box({2}, {1}));
  EXPECT_EQ(ChunkOf(nested, {3}, 3), Box({3}, {0}));
}

TEST(LayoutTest, RankOutsideMeshHoldsNothingAndRanksMayBePermuted) {
  const auto layout = Layout({2}, {7, 3}, {Placement::Shard(0)});
  EXPECT_EQ(ChunkOf(layout, {4}, 7), Box({0}, {2}));
  EXPECT_EQ(ChunkOf(layout, {4}, 3), Box({2}, {2}));
  auto none = LocalChunks(layout, {4}, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
}

TEST(LayoutTest, ValidateLayoutRejectsMalformedLayouts) {
  struct Case {
    DTensorLayout layout;
    Shape shape;
    const char* substr;
  };
  const Case cases[] = {
      {Layout({}, {}, {}), {4}, "1 to 8 dims"},
      {Layout({2, 0}, {}, {Placement::Shard(0), Placement::Shard(0)}),
       {4},
       "dim < 1"},
      {Layout({2}, {0}, {Placement::Shard(0)}), {4}, "2 positions but lists 1"},
      {Layout({2}, {0, 0}, {Placement::Shard(0)}), {4}, "rank 0 twice"},
      {Layout({2}, {0, -1}, {Placement::Shard(0)}), {4}, "negative rank -1"},
      {Layout({2}, {0, 1}, {}), {4}, "1 dims but 0 placements"},
      {Layout({2}, {0, 1}, {Placement::Shard(1)}),
       {4},
       "Shard(1) on mesh dim 0 names a dim outside shape [4]"},
      {Layout({2}, {0, 1}, {Placement::Shard(0)}), {-1}, "negative dim"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateLayout(c.layout, c.shape);
    EXPECT_THAT(
        s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.substr)))
        << c.substr;
    EXPECT_THAT(LocalChunks(c.layout, c.shape, 0),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST(LayoutTest, PartialCannotBeSaved) {
  const auto layout =
      Layout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Partial()});
  absl::Status s = CheckSavable(layout, "model.wq");
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'model.wq'"),
                             HasSubstr("Partial() placement on mesh dim 1"))));
  EXPECT_TRUE(
      CheckSavable(Layout({2}, {0, 1}, {Placement::Shard(0)}), "w").ok());
}

// Property: for thousands of random layouts (1-5 dims, uneven and empty
// shards, nested sharding, replication), every rank's box equals the oracle's
// torch.chunk index lists, and element coverage counted by brute force equals
// the replication factor everywhere; CheckExactCover accepts the layout.
TEST(LayoutTest, MatchesTorchChunkOracleOnRandomLayouts) {
  std::mt19937_64 rng(3);
  int checked_empty = 0, checked_nested = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const Shape shape = testing::RandomShape(rng, 5, 0, 7);
    const DTensorLayout layout = testing::RandomLayout(rng, shape);
    auto all = AllChunks(layout, shape);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->size(), layout.mesh.ranks.size());
    int64_t replication = 1;
    std::map<int, int> shard_dims;
    for (size_t i = 0; i < layout.placements.size(); ++i) {
      if (layout.placements[i].kind == Placement::Kind::kReplicate) {
        replication *= layout.mesh.shape[i];
      } else {
        ++shard_dims[layout.placements[i].dim];
      }
    }
    for (const auto& [dim, count] : shard_dims) {
      if (count > 1) ++checked_nested;
    }
    std::vector<int64_t> coverage(static_cast<size_t>(NumElements(shape)), 0);
    for (size_t pos = 0; pos < all->size(); ++pos) {
      const RankChunk& rc = (*all)[pos];
      ASSERT_EQ(rc.rank, layout.mesh.ranks[pos]);
      ASSERT_EQ(ChunkOf(layout, shape, rc.rank), rc.box);
      ASSERT_TRUE(ValidateBoxInShape(rc.box, shape).ok())
          << BoxToString(rc.box);
      const auto idx =
          testing::OracleIndices(layout, shape, static_cast<int64_t>(pos));
      for (size_t d = 0; d < shape.size(); ++d) {
        ASSERT_EQ(rc.box.sizes[d], static_cast<int64_t>(idx[d].size()));
        if (!idx[d].empty()) {
          ASSERT_EQ(rc.box.offsets[d], idx[d].front());
          ASSERT_EQ(idx[d].back() - idx[d].front() + 1,
                    static_cast<int64_t>(idx[d].size()));
        } else {
          ++checked_empty;
        }
      }
      testing::ForEachElement(rc.box, shape, [&](int64_t f) { ++coverage[f]; });
    }
    for (int64_t c : coverage) ASSERT_EQ(c, replication);
    ASSERT_TRUE(CheckExactCover("w", shape, *all).ok());
  }
  EXPECT_GT(checked_empty, 100);
  EXPECT_GT(checked_nested, 100);
}

TEST(CheckExactCoverTest, ReportsPartialOverlapWithRanksAndBoxes) {
  absl::Status s = CheckExactCover(
      "w", {4, 8}, {{0, Box({0, 0}, {4, 4})}, {1, Box({0, 2}, {4, 6})}});
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'w': rank 1 chunk [0:4, 2:8] partially overlaps rank "
                         "0 chunk [0:4, 0:4]")));
}

TEST(CheckExactCoverTest, ReportsGapWithAnUncoveredBox) {
  absl::Status s = CheckExactCover(
      "w", {4, 8}, {{0, Box({0, 0}, {4, 4})}, {1, Box({0, 4}, {2, 4})}});
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'w': chunks cover 24 of 32 elements"),
                             HasSubstr("[2:4, 4:8] is not covered"))));
}

TEST(CheckExactCoverTest, ReportsChunkOutsideShape) {
  absl::Status s = CheckExactCover("w", {4}, {{3, Box({2}, {4})}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("rank 3 of 'w'"),
                                HasSubstr("exceeds shape [4]"))));
}

TEST(CheckExactCoverTest, ReplicasAndEmptyBoxesAreFine) {
  EXPECT_TRUE(CheckExactCover(
                  "w", {4},
                  {{0, Box({0}, {4})}, {1, Box({0}, {4})}, {2, Box({4}, {0})}})
                  .ok());
  EXPECT_TRUE(CheckExactCover("w", {0, 3}, {{0, Box({0, 0}, {0, 3})}}).ok());
  EXPECT_TRUE(CheckExactCover("s", {}, {{0, Box({}, {})}}).ok());
  EXPECT_THAT(CheckExactCover("s", {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Property: random explicit chunk lists (tilings, with replicas, dropped
// tiles, perturbed tiles) vs a brute-force element coverage oracle: OK iff
// every element is covered exactly once by the distinct boxes.
TEST(CheckExactCoverTest, MatchesCoverageOracleOnRandomChunkLists) {
  std::mt19937_64 rng(5);
  int ok_cases = 0, bad_cases = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const Shape shape = testing::RandomShape(rng, 4, 1, 6);
    std::vector<ChunkBox> tiles = testing::RandomTiling(rng, shape, 12);
    const int mutation = static_cast<int>(testing::Uniform(rng, 0, 3));
    if (mutation == 1 && tiles.size() > 1) {
      tiles.erase(tiles.begin());
    } else if (mutation == 2) {
      tiles[0] = testing::RandomBox(rng, shape, false);
    }
    std::vector<RankChunk> chunks;
    int rank = 0;
    for (const ChunkBox& t : tiles) {
      const int copies = static_cast<int>(testing::Uniform(rng, 1, 3));
      for (int c = 0; c < copies; ++c) chunks.push_back({rank++, t});
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    // Oracle over distinct boxes.
    std::vector<ChunkBox> distinct = tiles;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()),
                   distinct.end());
    std::vector<int> coverage(static_cast<size_t>(NumElements(shape)), 0);
    for (const ChunkBox& b : distinct) {
      testing::ForEachElement(b, shape, [&](int64_t f) { ++coverage[f]; });
    }
    const bool exact = std::all_of(coverage.begin(), coverage.end(),
                                   [](int c) { return c == 1; });
    absl::Status s = CheckExactCover("w", shape, chunks);
    ASSERT_EQ(s.ok(), exact) << s;
    if (!exact) {
      ASSERT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
      ++bad_cases;
    } else {
      ++ok_cases;
    }
  }
  EXPECT_GT(ok_cases, 500);
  EXPECT_GT(bad_cases, 500);
}

}  // namespace
}  // namespace cairn::planner
