#include "proto/convert/load_request.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/convert/plan_convert.h"

namespace cairn::convert {
namespace {

using ::cairn::testing::StatusIs;

// A checkpoint of `n` tensors (fqns in random order, some scalars, some with
// a zero dim), each stored whole, and a rank's full request for one random
// box of each (some empty), in fqn order.
struct Case {
  std::unique_ptr<planner::LoadPlanner> planner;
  v1::PlanLoadRequest full;
};

Case RandomCase(std::mt19937_64& rng) {
  const auto rand = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const planner::DType dtypes[] = {planner::DType::kFloat32,
                                   planner::DType::kBFloat16};
  std::vector<planner::StoredTensor> tensors;
  const int n = static_cast<int>(rand(1, 40));
  for (int t = 0; t < n; ++t) {
    planner::StoredTensor& st = tensors.emplace_back();
    st.fqn = absl::StrCat(rand(0, 1) ? "model." : "optim.", "layers.", t,
                          rand(0, 1) ? ".ü" : ".w", rand(0, 9));
    st.dtype = dtypes[rand(0, 1)];
    const int dims = static_cast<int>(rand(0, 3));
    for (int d = 0; d < dims; ++d) {
      // Small past dim 0: a partial box needs a copy segment per row.
      st.global_shape.push_back(rand(0, 5) == 0 ? 0
                                : d == 0        ? rand(1, 3000)
                                                : rand(1, 40));
    }
    planner::StoredChunk& c = st.chunks.emplace_back();
    c.box = planner::FullBox(st.global_shape);
    c.location = {"r0", 0,
                  static_cast<uint64_t>(planner::NumElements(st.global_shape)) *
                      planner::DTypeSize(st.dtype)};
  }
  Case out;
  out.full.set_job("j");
  out.full.set_step(7);
  out.full.set_rank(3);
  out.full.set_world_size(8);
  out.full.set_read_columns(true);
  out.full.add_wanted_bytes("extra");
  std::vector<const planner::StoredTensor*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->fqn < b->fqn; });
  for (const planner::StoredTensor* t : sorted) {
    planner::WantedChunk w{t->fqn, t->dtype, t->global_shape, {}};
    for (int64_t dim : t->global_shape) {
      const int64_t off = rand(0, dim);
      w.box.offsets.push_back(off);
      w.box.sizes.push_back(rand(0, 3) == 0 ? 0 : rand(0, dim - off));
    }
    WantedToProto(w, out.full.add_wanted());
  }
  out.planner = *planner::LoadPlanner::Create(std::move(tensors));
  return out;
}

TEST(LoadRequestTest, ShortFormExpandsToTheFullFormOnRandomCases) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    Case c = RandomCase(rng);
    v1::PlanLoadRequest wire;
    ASSERT_TRUE(CompactWanted(c.full, &wire));
    EXPECT_EQ(wire.wanted_size(), 0);
    std::vector<int> order;
    EXPECT_EQ(wire.tensors_digest(), TensorsDigestOf(*c.planner, &order));
    // Everything else is the full request's.
    v1::PlanLoadRequest rest = wire;
    rest.clear_tensors_digest();
    rest.clear_wanted_boxes();
    v1::PlanLoadRequest full_rest = c.full;
    full_rest.clear_wanted();
    EXPECT_EQ(rest.SerializeAsString(), full_rest.SerializeAsString());

    absl::StatusOr<std::vector<planner::WantedBox>> wanted =
        WantedFromCompact(wire, *c.planner, order);
    ASSERT_TRUE(wanted.ok()) << wanted.status();
    ASSERT_EQ(static_cast<int>(wanted->size()), c.full.wanted_size());
    for (int i = 0; i < c.full.wanted_size(); ++i) {
      const planner::WantedChunk want = *WantedFromProto(c.full.wanted(i));
      const planner::WantedChunk got = c.planner->Named((*wanted)[i]);
      EXPECT_EQ(got.fqn, want.fqn);
      EXPECT_EQ(got.dtype, want.dtype);
      EXPECT_EQ(got.global_shape, want.global_shape);
      EXPECT_EQ(got.box, want.box) << i;
    }
    // And the plans agree.
    std::vector<planner::WantedChunk> from_full;
    for (const v1::WantedChunk& w : c.full.wanted()) {
      from_full.push_back(*WantedFromProto(w));
    }
    absl::StatusOr<std::vector<planner::ReadItem>> a = c.planner->Plan(*wanted);
    absl::StatusOr<std::vector<planner::ReadItem>> b =
        c.planner->Plan(from_full);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      EXPECT_EQ((*a)[i].fqn, (*b)[i].fqn);
      EXPECT_EQ((*a)[i].dest_index, (*b)[i].dest_index);
      EXPECT_EQ((*a)[i].overlap, (*b)[i].overlap);
      EXPECT_EQ((*a)[i].source, (*b)[i].source);
      EXPECT_EQ((*a)[i].source_crc32c, (*b)[i].source_crc32c);
      EXPECT_EQ((*a)[i].segments, (*b)[i].segments);
    }
    // Smaller on the wire, unless every fqn is tiny.
    EXPECT_LT(wire.ByteSizeLong(), c.full.ByteSizeLong() + 40);
  }
}

TEST(LoadRequestTest, AnyDifferenceInTheTensorsChangesTheDigest) {
  std::mt19937_64 rng(9);
  Case c = RandomCase(rng);
  while (c.full.wanted_size() < 3) c = RandomCase(rng);
  v1::PlanLoadRequest wire;
  ASSERT_TRUE(CompactWanted(c.full, &wire));
  const std::string digest = wire.tensors_digest();
  const auto digest_of = [](const v1::PlanLoadRequest& r) {
    v1::PlanLoadRequest w;
    EXPECT_TRUE(CompactWanted(r, &w));
    return w.tensors_digest();
  };
  // A tensor with dims.
  int with_dims = 0;
  while (with_dims < c.full.wanted_size() &&
         c.full.wanted(with_dims).tensor().global_shape_size() == 0) {
    ++with_dims;
  }
  ASSERT_LT(with_dims, c.full.wanted_size());
  v1::PlanLoadRequest boxes = c.full;
  boxes.mutable_wanted(with_dims)->mutable_box()->Clear();
  boxes.mutable_wanted(with_dims)->mutable_tensor()->clear_global_shape();
  v1::PlanLoadRequest other_fqn = c.full;
  other_fqn.mutable_wanted(1)->mutable_tensor()->mutable_fqn()->append("x");
  v1::PlanLoadRequest other_dtype = c.full;
  other_dtype.mutable_wanted(1)->mutable_tensor()->set_dtype(
      c.full.wanted(1).tensor().dtype() == v1::DTYPE_FLOAT32
          ? v1::DTYPE_BFLOAT16
          : v1::DTYPE_FLOAT32);
  v1::PlanLoadRequest other_shape = c.full;
  other_shape.mutable_wanted(2)->mutable_tensor()->add_global_shape(1);
  other_shape.mutable_wanted(2)->mutable_box()->add_offsets(0);
  other_shape.mutable_wanted(2)->mutable_box()->add_sizes(1);
  v1::PlanLoadRequest fewer = c.full;
  fewer.mutable_wanted()->RemoveLast();
  EXPECT_NE(digest_of(boxes), digest);  // the shape went with the box
  EXPECT_NE(digest_of(other_fqn), digest);
  EXPECT_NE(digest_of(other_dtype), digest);
  EXPECT_NE(digest_of(other_shape), digest);
  EXPECT_NE(digest_of(fewer), digest);
  v1::PlanLoadRequest same_tensors = c.full;
  for (auto& w : *same_tensors.mutable_wanted()) {
    for (auto& s : *w.mutable_box()->mutable_sizes()) s = 0;
  }
  EXPECT_EQ(digest_of(same_tensors), digest);
}

TEST(LoadRequestTest, OnlyOneChunkPerTensorInFqnOrderHasAShortForm) {
  std::mt19937_64 rng(11);
  Case c = RandomCase(rng);
  while (c.full.wanted_size() < 2) c = RandomCase(rng);
  v1::PlanLoadRequest wire;
  v1::PlanLoadRequest swapped = c.full;
  swapped.mutable_wanted()->SwapElements(0, 1);
  EXPECT_FALSE(CompactWanted(swapped, &wire));
  v1::PlanLoadRequest twice = c.full;
  *twice.add_wanted() = c.full.wanted(c.full.wanted_size() - 1);
  EXPECT_FALSE(CompactWanted(twice, &wire));
  v1::PlanLoadRequest bad_box = c.full;
  bad_box.mutable_wanted(0)->mutable_box()->add_offsets(0);
  EXPECT_FALSE(CompactWanted(bad_box, &wire));
}

TEST(LoadRequestTest, RefusesBoxesOfTheWrongLength) {
  std::mt19937_64 rng(13);
  Case c = RandomCase(rng);
  v1::PlanLoadRequest wire;
  ASSERT_TRUE(CompactWanted(c.full, &wire));
  std::vector<int> order;
  TensorsDigestOf(*c.planner, &order);
  v1::PlanLoadRequest longer = wire;
  longer.add_wanted_boxes(0);
  absl::StatusOr<std::vector<planner::WantedBox>> got =
      WantedFromCompact(longer, *c.planner, order);
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(got.status().message().find(absl::StrCat(
                "holds ", wire.wanted_boxes_size() + 1, " values")),
            std::string::npos)
      << got.status();
  v1::PlanLoadRequest none = wire;
  none.clear_wanted_boxes();
  bool any_dims = false;
  for (int t : order) any_dims |= !c.planner->global_shape(t).empty();
  EXPECT_EQ(WantedFromCompact(none, *c.planner, order).ok(), !any_dims);
}

}  // namespace
}  // namespace cairn::convert
