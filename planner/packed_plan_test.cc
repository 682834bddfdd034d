#include "planner/packed_plan.h"

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/planner_testing.h"
#include "planner/save_plan.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::Bytes;
using testing::Chunk;

bool SameItem(const WriteItem& a, const WriteItem& b) {
  if (a.kind != b.kind || a.fqn != b.fqn || a.length != b.length) return false;
  if (a.kind == WriteItem::Kind::kBytes) return true;
  return a.dtype == b.dtype && a.global_shape == b.global_shape &&
         a.box == b.box;
}

// A random save under FSDP x TP-like layouts: `tensors` fqns, every rank
// holding a chunk of each (some replicated), plus a bytes entry on rank 0.
std::vector<LocalSavePlan> RandomSave(std::mt19937_64& rng, int world,
                                      int tensors) {
  std::vector<LocalSavePlan> plans(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) plans[r].rank = r;
  for (int t = 0; t < tensors; ++t) {
    // Every fifth tensor is a scalar, replicated (a step counter, say).
    const Shape shape =
        t % 5 == 4 ? Shape{} : testing::RandomShape(rng, 3, 0, 9);
    const DType dtype = t % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
    DTensorLayout layout;
    if (!shape.empty()) layout = testing::RandomLayout(rng, shape, 0, 3, 4);
    if (layout.mesh.ranks.size() != static_cast<size_t>(world)) {
      layout = DTensorLayout{
          DeviceMesh{{world}, {}},
          {shape.empty() ? Placement::Replicate() : Placement::Shard(0)}};
      for (int r = 0; r < world; ++r) layout.mesh.ranks.push_back(r);
    }
    auto all = AllChunks(layout, shape);
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok()) return {};
    for (const RankChunk& rc : *all) {
      plans[rc.rank].items.push_back(
          Chunk("layers." + std::to_string(t) + ".w", shape, rc.box, dtype));
    }
  }
  plans[0].items.push_back(Bytes("extra_state", 17));
  return plans;
}

void ExpectSamePlans(const GlobalSavePlan& a, const GlobalSavePlan& b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  ASSERT_EQ(a.entries.size(), b.entries.size());
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    ASSERT_EQ(a.ranks[r].writes.size(), b.ranks[r].writes.size()) << r;
    EXPECT_EQ(a.ranks[r].object_key, b.ranks[r].object_key);
    EXPECT_EQ(a.ranks[r].object_bytes, b.ranks[r].object_bytes);
    for (size_t w = 0; w < a.ranks[r].writes.size(); ++w) {
      const int rank = static_cast<int>(r);
      EXPECT_TRUE(SameItem(a.ItemOf(rank, a.ranks[r].writes[w]),
                           b.ItemOf(rank, b.ranks[r].writes[w])));
      EXPECT_EQ(a.ranks[r].writes[w].offset, b.ranks[r].writes[w].offset);
    }
  }
}

TEST(PackedPlanTest, UnpacksToThePlanItPacked) {
  std::mt19937_64 rng(5);
  EntryInterner interner;
  for (int iter = 0; iter < 50; ++iter) {
    const int world = static_cast<int>(testing::Uniform(rng, 1, 24));
    const std::vector<LocalSavePlan> plans =
        RandomSave(rng, world, static_cast<int>(testing::Uniform(rng, 1, 6)));
    for (const LocalSavePlan& plan : plans) {
      absl::StatusOr<PackedLocalPlan> packed = interner.Pack(plan);
      ASSERT_TRUE(packed.ok()) << packed.status();
      const LocalSavePlan back = packed->Unpack();
      EXPECT_EQ(back.rank, plan.rank);
      ASSERT_EQ(back.items.size(), plan.items.size());
      for (size_t i = 0; i < plan.items.size(); ++i) {
        EXPECT_TRUE(SameItem(back.items[i], plan.items[i]))
            << "iteration " << iter << " rank " << plan.rank << " item " << i;
      }
    }
  }
}

TEST(PackedPlanTest, BoxInternerKeepsEachDistinctBoxOnce) {
  std::vector<int64_t> coords;
  BoxInterner boxes(&coords);
  auto add = [&](const Dims& offsets, const Dims& sizes) {
    return boxes.Add(absl::MakeConstSpan(offsets), absl::MakeConstSpan(sizes));
  };
  EXPECT_EQ(add({0, 4}, {2, 4}), 0u);
  EXPECT_EQ(add({2, 4}, {2, 4}), 4u);
  EXPECT_EQ(add({0, 4}, {2, 4}), 0u);
  // The same numbers as another box's, or a prefix of them, in other dims
  // are another box.
  EXPECT_EQ(add({0}, {4}), 8u);
  EXPECT_EQ(add({0, 4, 2}, {4, 1, 1}), 10u);
  EXPECT_EQ(add({0}, {4}), 8u);
  // A scalar's box is empty: it takes no numbers and is found again.
  const size_t scalar = add({}, {});
  EXPECT_EQ(scalar, 16u);
  EXPECT_EQ(add({}, {}), scalar);
  EXPECT_EQ(coords, (std::vector<int64_t>{0, 4, 2, 4, 2, 4, 2, 4, 0, 4, 0, 4, 2,
                                          4, 1, 1}));
  // Many boxes, each added twice: the array grows by the distinct ones.
  for (int64_t i = 0; i < 1000; ++i) {
    const size_t at = add({i, 0}, {1, 7});
    EXPECT_EQ(add({i, 0}, {1, 7}), at);
    EXPECT_EQ(coords[at], i);
    EXPECT_EQ(coords[at + 3], 7);
  }
  EXPECT_EQ(coords.size(), 16u + 4000u);
}

TEST(PackedPlanTest, ItemsWithTheSameBoxShareIt) {
  // An FSDP x TP rank: layer after layer, the same shapes and so the same box.
  LocalSavePlan plan{3, {}};
  for (int layer = 0; layer < 40; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    plan.items.push_back(
        Chunk(prefix + "attn.w", {64, 32}, ChunkBox{{16, 0}, {16, 32}}));
    plan.items.push_back(
        Chunk(prefix + "mlp.w", {128, 32}, ChunkBox{{32, 0}, {32, 32}}));
    plan.items.push_back(Chunk(prefix + "norm", {32}, ChunkBox{{0}, {32}}));
  }
  plan.items.push_back(Bytes("extra_state", 5));
  EntryInterner interner;
  absl::StatusOr<PackedLocalPlan> packed = interner.Pack(plan);
  ASSERT_TRUE(packed.ok()) << packed.status();
  // Three distinct boxes: 4 + 4 + 2 numbers, not 10 for each of 40 layers.
  EXPECT_EQ(packed->coords.size(), 10u);
  const LocalSavePlan back = packed->Unpack();
  ASSERT_EQ(back.items.size(), plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    EXPECT_TRUE(SameItem(back.items[i], plan.items[i])) << i;
  }
}

TEST(PackedPlanTest, RanksNamingTheSameTensorsShareOneTable) {
  std::mt19937_64 rng(9);
  const std::vector<LocalSavePlan> plans = RandomSave(rng, 16, 4);
  // Pipeline-style: a second stage names other tensors.
  std::vector<LocalSavePlan> stage2 = plans;
  for (LocalSavePlan& p : stage2) {
    for (WriteItem& item : p.items) item.fqn = "stage2." + item.fqn;
  }
  EntryInterner interner;
  std::vector<PackedLocalPlan> packed;
  for (size_t r = 0; r < plans.size(); ++r) {
    packed.push_back(*interner.Pack(plans[r]));
    packed.push_back(*interner.Pack(stage2[r]));
  }
  for (size_t i = 2; i < packed.size(); ++i) {
    EXPECT_EQ(packed[i].table, packed[i % 2].table) << i;
  }
  EXPECT_NE(packed[0].table, packed[1].table);
  EXPECT_EQ(interner.LiveTables(), 2u);
  // Each item is 16 bytes plus its box: far below the spelled-out form.
  EXPECT_EQ(packed[0].ApproximateBytes(),
            sizeof(PackedLocalPlan) +
                packed[0].items.capacity() * sizeof(PackedItem) +
                packed[0].coords.capacity() * sizeof(int64_t));
  // A table lives as long as a plan refers to it.
  packed.erase(packed.begin() + 1);
  for (size_t i = 1; i < packed.size();) packed.erase(packed.begin() + i);
  EXPECT_EQ(interner.LiveTables(), 1u);
  packed.clear();
  EXPECT_EQ(interner.LiveTables(), 0u);
}

TEST(PackedPlanTest, PlansPackedApartPlanAsPlansPackedTogether) {
  // The planner maps each table's entries to the checkpoint's: plans packed
  // by separate interners (a table each), by one, or spelled out give one
  // global plan.
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 100; ++iter) {
    const int world = static_cast<int>(testing::Uniform(rng, 1, 32));
    const std::vector<LocalSavePlan> plans =
        RandomSave(rng, world, static_cast<int>(testing::Uniform(rng, 1, 5)));
    ASSERT_FALSE(plans.empty());
    auto spelled = BuildGlobalSavePlan("j", iter, plans, SavePlanOptions{});
    ASSERT_TRUE(spelled.ok()) << spelled.status();

    std::vector<PackedLocalPlan> apart;
    for (const LocalSavePlan& p : plans) {
      EntryInterner own;
      apart.push_back(*own.Pack(p));
    }
    std::vector<const PackedLocalPlan*> pointers;
    for (const PackedLocalPlan& p : apart) pointers.push_back(&p);
    auto from_apart =
        BuildGlobalSavePlan("j", iter, pointers, SavePlanOptions{});
    ASSERT_TRUE(from_apart.ok()) << from_apart.status();
    ExpectSamePlans(*spelled, *from_apart);
    if (HasFatalFailure()) FAIL() << "iteration " << iter;
  }
}

TEST(PackedPlanTest, DisagreementsAcrossTablesAreNamedByRankAndFqn) {
  EntryInterner interner;
  std::vector<LocalSavePlan> plans(2);
  plans[0] = {0, {Chunk("w", {4, 4}, ChunkBox{{0, 0}, {2, 4}})}};
  plans[1] = {1, {Chunk("w", {4, 8}, ChunkBox{{2, 0}, {2, 4}})}};
  std::vector<PackedLocalPlan> packed{*interner.Pack(plans[0]),
                                      *interner.Pack(plans[1])};
  EXPECT_NE(packed[0].table, packed[1].table);
  std::vector<const PackedLocalPlan*> pointers{&packed[0], &packed[1]};
  absl::Status s =
      BuildGlobalSavePlan("llama", 7, pointers, SavePlanOptions{}).status();
  EXPECT_THAT(
      s,
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          AllOf(HasSubstr("job 'llama' step 7"),
                HasSubstr("rank 1 has 'w' as float32 [4, 8] but rank 0 has it "
                          "as float32 [4, 4]"))));

  // Within one plan: two entries of one fqn in one table.
  LocalSavePlan both{
      0,
      {Chunk("w", {4, 4}, ChunkBox{{0, 0}, {2, 4}}),
       Chunk("w", {4, 4}, ChunkBox{{2, 0}, {2, 4}}, DType::kBFloat16)}};
  absl::StatusOr<PackedLocalPlan> one = interner.Pack(both);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->table->size(), 2u);
  std::vector<const PackedLocalPlan*> single{&*one};
  s = BuildGlobalSavePlan("llama", 7, single, SavePlanOptions{}).status();
  EXPECT_THAT(s.message(), HasSubstr("rank 0 has 'w' as bfloat16 [4, 4] but "
                                     "rank 0 has it as float32 [4, 4]"));
}

TEST(PackedPlanTest, BoxesOfOtherDimsThanTheirShapeAreRefused) {
  EntryInterner interner;
  LocalSavePlan plan{3, {Chunk("layers.0.w", {4, 4}, ChunkBox{{0}, {4}})}};
  absl::StatusOr<PackedLocalPlan> packed = interner.Pack(plan);
  EXPECT_THAT(packed, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("rank 3 'layers.0.w': chunk"),
                                     HasSubstr("has 1 offsets and 1 sizes "
                                               "but shape [4, 4] has 2"))));
  // Bytes entries carry no box, whatever dtype an item says.
  WriteItem blob = Bytes("extra", 5);
  blob.dtype = DType::kUInt8;
  LocalSavePlan a{0, {Bytes("extra", 5)}}, b{1, {blob}};
  EXPECT_EQ(interner.Pack(a)->table, interner.Pack(b)->table);
}

TEST(PackedPlanTest, ConcurrentPackingSharesTables) {
  std::mt19937_64 rng(13);
  const std::vector<LocalSavePlan> plans = RandomSave(rng, 64, 6);
  EntryInterner interner;
  std::vector<PackedLocalPlan> packed(plans.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t r = t; r < plans.size(); r += 4) {
        packed[r] = *interner.Pack(plans[r]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // Racing first packs may each build a table; later ones reuse them.
  EXPECT_LE(interner.LiveTables(), 4u);
  std::vector<const PackedLocalPlan*> pointers;
  for (const PackedLocalPlan& p : packed) pointers.push_back(&p);
  auto got = BuildGlobalSavePlan("j", 1, pointers, SavePlanOptions{});
  auto want = BuildGlobalSavePlan("j", 1, plans, SavePlanOptions{});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectSamePlans(*want, *got);
}

}  // namespace
}  // namespace cairn::planner
