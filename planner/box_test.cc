#include "planner/box.h"

#include <limits>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/dtype.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

TEST(DTypeTest, SizesNamesAndParsingRoundTrip) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kFloat8E5M2), 1u);
  EXPECT_EQ(DTypeSize(DType::kUnspecified), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kUnspecified), "unspecified");
  EXPECT_EQ(DTypeName(static_cast<DType>(42)), "dtype(42)");
  for (int v = 1; v <= 12; ++v) {
    const DType d = static_cast<DType>(v);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
  auto bad = ParseDType("complex64");
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("complex64")));
  EXPECT_THAT(ParseDType("unspecified"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(BoxTest, VolumeAndElements) {
  EXPECT_EQ(NumElements({4, 5}), 20);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({3, 0}), 0);
  EXPECT_EQ(Volume(Box({1, 2}, {3, 4})), 12);
  EXPECT_EQ(Volume(Box({}, {})), 1);
  EXPECT_EQ(Volume(Box({5}, {0})), 0);
  EXPECT_TRUE(IsEmpty(Box({5}, {0})));
  EXPECT_FALSE(IsEmpty(Box({}, {})));
}

TEST(BoxTest, IntersectComputesOverlapOrReportsEmpty) {
  ChunkBox out;
  ASSERT_TRUE(Intersect(Box({0, 0}, {4, 4}), Box({2, 1}, {4, 2}), &out));
  EXPECT_EQ(out, Box({2, 1}, {2, 2}));
  // Touching boxes do not intersect.
  EXPECT_FALSE(Intersect(Box({0, 0}, {4, 4}), Box({4, 0}, {4, 4}), &out));
  // Different dims never intersect.
  EXPECT_FALSE(Intersect(Box({0}, {4}), Box({0, 0}, {4, 4}), &out));
  // Empty boxes never intersect anything.
  EXPECT_FALSE(Intersect(Box({0, 1}, {4, 0}), Box({0, 0}, {4, 4}), nullptr));
  // Scalars intersect.
  EXPECT_TRUE(Intersect(Box({}, {}), Box({}, {}), &out));
}

TEST(BoxTest, Contains) {
  EXPECT_TRUE(Contains(Box({0, 0}, {4, 4}), Box({1, 1}, {3, 3})));
  EXPECT_FALSE(Contains(Box({0, 0}, {4, 4}), Box({1, 1}, {4, 3})));
  EXPECT_FALSE(Contains(Box({1, 0}, {4, 4}), Box({0, 0}, {1, 1})));
  EXPECT_FALSE(Contains(Box({0}, {4}), Box({0, 0}, {1, 1})));
}

// A client's box (VerifyLoad's overlap) whose end overflows int64 used to
// wrap negative and pass as contained.
TEST(BoxTest, ContainsRejectsInnerBoxesWhoseEndOverflows) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(Contains(Box({0}, {10}), Box({5}, {kMax})));
  EXPECT_FALSE(Contains(Box({0, 0}, {4, 4}), Box({1, kMax - 1}, {1, 5})));
  EXPECT_FALSE(Contains(Box({0}, {10}), Box({kMax}, {0})));
  EXPECT_TRUE(Contains(Box({0}, {10}), Box({10}, {0})));
  EXPECT_TRUE(Contains(Box({2}, {8}), Box({2}, {8})));
}

TEST(BoxTest, CompareBoxesAgreesWithOperators) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    const Shape shape = testing::RandomShape(rng, 3, 1, 3);
    const Shape other =
        i % 10 == 0 ? testing::RandomShape(rng, 3, 1, 3) : shape;
    const ChunkBox a = testing::RandomBox(rng, shape, true);
    const ChunkBox b = testing::RandomBox(rng, other, true);
    const int c = CompareBoxes(a, b);
    ASSERT_EQ(c < 0, a < b);
    ASSERT_EQ(c == 0, a == b);
    ASSERT_EQ(c > 0, b < a);
  }
}

TEST(BoxTest, Strings) {
  EXPECT_EQ(BoxToString(Box({0, 512}, {4096, 512})), "[0:4096, 512:1024]");
  EXPECT_EQ(BoxToString(Box({}, {})), "[]");
  EXPECT_EQ(ShapeToString({4096, 1000}), "[4096, 1000]");
}

TEST(BoxTest, ValidateBoxInShapeNamesBoxAndShape) {
  EXPECT_TRUE(ValidateBoxInShape(Box({0, 0}, {4, 4}), {4, 4}).ok());
  EXPECT_TRUE(ValidateBoxInShape(Box({4, 0}, {0, 4}), {4, 4}).ok());
  absl::Status s = ValidateBoxInShape(Box({0, 512}, {4096, 512}), {4096, 1000});
  EXPECT_THAT(
      s, StatusIs(
             absl::StatusCode::kInvalidArgument,
             HasSubstr("chunk [0:4096, 512:1024] exceeds shape [4096, 1000]")));
  s = ValidateBoxInShape(Box({0}, {4}), {4, 4});
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 dims")));
  s = ValidateBoxInShape(Box({-1}, {2}), {4});
  EXPECT_THAT(s.message(), HasSubstr("negative"));
  s = ValidateBoxInShape(Box({INT64_MAX}, {INT64_MAX}), {4});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateShape(Shape(9, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateShape({int64_t{1} << 40, int64_t{1} << 30}).message(),
              HasSubstr("2^60"));
}

// On a valid shape the box-only check decides every box as the full one
// does (random boxes in, at and past the shape's edges, negative and with
// the wrong number of dims); it skips only the shape's own checks.
TEST(BoxTest, ValidateBoxInValidShapeAgreesOnValidShapes) {
  std::mt19937_64 rng(11);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const size_t dims = rng() % 4;
    Shape shape(dims);
    for (int64_t& d : shape) d = static_cast<int64_t>(rng() % 6);
    ASSERT_TRUE(ValidateShape(shape).ok());
    const size_t box_dims = rng() % 8 == 0 ? (dims + 1) % 4 : dims;
    ChunkBox box;
    for (size_t d = 0; d < box_dims; ++d) {
      box.offsets.push_back(static_cast<int64_t>(rng() % 8) - 1);
      box.sizes.push_back(static_cast<int64_t>(rng() % 8) - 1);
    }
    const absl::Status full = ValidateBoxInShape(box, shape);
    const absl::Status box_only = ValidateBoxInValidShape(box, shape);
    ASSERT_EQ(full, box_only)
        << BoxToString(box) << " in " << ShapeToString(shape);
    accepted += full.ok();
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_LT(accepted, 19000);
}

TEST(CopySegmentsTest, WholeTrailingDimsAreOneSegment) {
  const ChunkBox b = Box({0, 0}, {4, 8});
  EXPECT_THAT(CopySegments(b, b, Box({1, 0}, {2, 8}), 4),
              ElementsAre(CopySegment{32, 32, 64}));
}

TEST(CopySegmentsTest, PartialRowsAreOneSegmentPerRow) {
  // src rows 0..3 cols 0..7; dst rows 2..5 cols 4..11; region rows 2..3,
  // cols 4..7.
  auto segs = CopySegments(Box({0, 0}, {4, 8}), Box({2, 4}, {4, 8}),
                           Box({2, 4}, {2, 4}), 2);
  EXPECT_THAT(segs, ElementsAre(CopySegment{(2 * 8 + 4) * 2, 0, 8},
                                CopySegment{(3 * 8 + 4) * 2, 8 * 2, 8}));
}

TEST(CopySegmentsTest, ScalarAndEmpty) {
  EXPECT_THAT(CopySegments(Box({}, {}), Box({}, {}), Box({}, {}), 8),
              ElementsAre(CopySegment{0, 0, 8}));
  EXPECT_TRUE(
      CopySegments(Box({0}, {4}), Box({0}, {4}), Box({2}, {0}), 4).empty());
}

// Oracle: map every region element to its byte offsets in both buffers, then
// check the segments copy exactly those bytes, once, in order, and that their
// count equals the number of maximal runs contiguous in both buffers.
TEST(CopySegmentsTest, MatchesElementwiseOracleOnRandomBoxes) {
  std::mt19937_64 rng(20240611);
  int single = 0, multi = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const Shape shape = testing::RandomShape(rng, 5, 1, 6);
    // A region, and two boxes around it (sometimes exactly it).
    const ChunkBox region = testing::RandomBox(rng, shape, false);
    auto around = [&](const ChunkBox& r) {
      ChunkBox b = r;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (testing::Uniform(rng, 0, 2) == 0) continue;
        const int64_t lo = testing::Uniform(rng, 0, r.offsets[d]);
        const int64_t hi =
            testing::Uniform(rng, r.offsets[d] + r.sizes[d], shape[d]);
        b.offsets[d] = lo;
        b.sizes[d] = hi - lo;
      }
      return b;
    };
    const ChunkBox src = around(region);
    const ChunkBox dst = around(region);
    const size_t elem = static_cast<size_t>(testing::Uniform(rng, 1, 4));
    // Expected (src byte, dst byte) pairs, row-major over the region.
    std::vector<std::pair<uint64_t, uint64_t>> want;
    auto local = [&](const ChunkBox& b, const Dims& g) {
      uint64_t off = 0;
      for (size_t d = 0; d < g.size(); ++d) {
        off = off * static_cast<uint64_t>(b.sizes[d]) +
              static_cast<uint64_t>(g[d] - b.offsets[d]);
      }
      return off;
    };
    Dims g(region.offsets);
    const int64_t vol = Volume(region);
    for (int64_t k = 0; k < vol; ++k) {
      for (size_t e = 0; e < elem; ++e) {
        want.push_back({local(src, g) * elem + e, local(dst, g) * elem + e});
      }
      for (size_t d = g.size(); d-- > 0;) {
        if (++g[d] < region.offsets[d] + region.sizes[d]) break;
        g[d] = region.offsets[d];
      }
    }
    size_t runs = want.empty() ? 0 : 1;
    for (size_t k = 1; k < want.size(); ++k) {
      if (want[k].first != want[k - 1].first + 1 ||
          want[k].second != want[k - 1].second + 1) {
        ++runs;
      }
    }
    const auto segs = CopySegments(src, dst, region, elem);
    std::vector<std::pair<uint64_t, uint64_t>> got;
    for (const CopySegment& s : segs) {
      ASSERT_GT(s.length, 0u);
      for (uint64_t b = 0; b < s.length; ++b) {
        got.push_back({s.src_offset + b, s.dst_offset + b});
      }
    }
    ASSERT_EQ(got, want) << "src " << BoxToString(src) << " dst "
                         << BoxToString(dst) << " region "
                         << BoxToString(region);
    ASSERT_EQ(segs.size(), runs) << BoxToString(region);
    ASSERT_EQ(NumCopySegments(src, dst, region), runs);
    if (runs == 1) ++single;
    if (runs > 1) ++multi;
  }
  EXPECT_GT(single, 300);
  EXPECT_GT(multi, 300);
}

}  // namespace
}  // namespace cairn::planner
