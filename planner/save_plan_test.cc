#include "planner/save_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

using testing::Bytes;
using testing::Chunk;

std::vector<LocalSavePlan> Plans(std::vector<std::vector<WriteItem>> items) {
  std::vector<LocalSavePlan> plans;
  for (size_t r = 0; r < items.size(); ++r) {
    plans.push_back(LocalSavePlan{static_cast<int>(r), std::move(items[r])});
  }
  return plans;
}

absl::Status BuildError(const std::vector<LocalSavePlan>& plans) {
  return BuildGlobalSavePlan("llama", 100, plans, SavePlanOptions{}).status();
}

TEST(SavePlanTest, ShardedTensorIsWrittenByEachOwnerAtAlignedOffsets) {
  auto plan = BuildGlobalSavePlan(
      "llama", 100,
      Plans({{Chunk("w", {4, 8}, Box({0, 0}, {2, 8})), Bytes("rng", 10)},
             {Chunk("w", {4, 8}, Box({2, 0}, {2, 8}))}}),
      SavePlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->world_size, 2);
  ASSERT_EQ(plan->ranks.size(), 2u);
  const RankSavePlan& r0 = plan->ranks[0];
  ASSERT_EQ(r0.writes.size(), 2u);
  // Sorted by fqn: "rng" before "w".
  EXPECT_EQ(plan->EntryOf(r0.writes[0]).fqn, "rng");
  EXPECT_EQ(r0.LocationOf(r0.writes[0]),
            (StorageLocation{"data/rank-00000.bin", 0, 10}));
  EXPECT_EQ(r0.LocationOf(r0.writes[1]),
            (StorageLocation{"data/rank-00000.bin", 4096, 64}));
  EXPECT_EQ(r0.object_bytes, 4096u + 64u);
  ASSERT_EQ(plan->ranks[1].writes.size(), 1u);
  EXPECT_EQ(plan->ranks[1].LocationOf(plan->ranks[1].writes[0]),
            (StorageLocation{"data/rank-00001.bin", 0, 64}));
  EXPECT_EQ(plan->ranks[1].object_key, "data/rank-00001.bin");
  EXPECT_EQ(plan->BoxOf(1, plan->ranks[1].writes[0]), Box({2, 0}, {2, 8}));
  EXPECT_EQ(plan->BoxOf(0, r0.writes[1]), Box({0, 0}, {2, 8}));
  // Spelled out, a write is the item its writer listed.
  EXPECT_EQ(plan->ItemOf(1, plan->ranks[1].writes[0]).global_shape,
            (Shape{4, 8}));
  EXPECT_EQ(plan->ItemOf(1, plan->ranks[1].writes[0]).length, 64u);
  EXPECT_EQ(plan->ItemOf(0, r0.writes[0]).kind, WriteItem::Kind::kBytes);
  EXPECT_EQ(plan->total_bytes, 138u);
  ASSERT_EQ(plan->entries.size(), 2u);
  EXPECT_EQ(plan->entries[1].fqn, "w");
  EXPECT_EQ(plan->entries[1].global_shape, (Shape{4, 8}));
}

TEST(SavePlanTest, WritesWithTheSameBoxShareItInTheirRanksPlan) {
  // Two ranks, rows of 30 same-shaped tensors and a replicated norm each.
  std::vector<std::vector<WriteItem>> items(2);
  for (int layer = 0; layer < 30; ++layer) {
    const std::string fqn = "layers." + std::to_string(layer) + ".w";
    const std::string norm = "layers." + std::to_string(layer) + ".norm";
    for (int64_t r = 0; r < 2; ++r) {
      items[r].push_back(Chunk(fqn, {8, 6}, Box({4 * r, 0}, {4, 6})));
      items[r].push_back(Chunk(norm, {6}, Box({0}, {6})));
    }
  }
  auto plan = BuildGlobalSavePlan("llama", 100, Plans(std::move(items)),
                                  SavePlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  size_t writes = 0;
  for (int r = 0; r < 2; ++r) {
    const RankSavePlan& rp = plan->ranks[r];
    writes += rp.writes.size();
    // Rank r's row box, plus the norm's box on a rank that writes some norm.
    EXPECT_EQ(rp.coords.size(), 4u + 2u) << r;
    for (const PlannedWrite& w : rp.writes) {
      const std::string& fqn = plan->EntryOf(w).fqn;
      if (fqn.size() > 2 && fqn.substr(fqn.size() - 2) == ".w") {
        EXPECT_EQ(plan->BoxOf(r, w), Box({4 * r, 0}, {4, 6})) << fqn;
      } else {
        EXPECT_EQ(plan->BoxOf(r, w), Box({0}, {6})) << fqn;
      }
    }
  }
  // 60 row chunks, 30 norms written once each, balanced over the ranks.
  EXPECT_EQ(writes, 90u);
  EXPECT_EQ(plan->ranks[0].writes.size(), 45u);
}

TEST(SavePlanTest, OptionsControlAlignmentAndObjectKeys) {
  SavePlanOptions options;
  options.alignment = 1;
  options.object_prefix = "x/";
  auto plan = BuildGlobalSavePlan(
      "j", 1, Plans({{Bytes("a", 3), Bytes("b", 5)}}), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].LocationOf(plan->ranks[0].writes[1]),
            (StorageLocation{"x/00000.bin", 3, 5}));
  EXPECT_EQ(ObjectKeyForRank(SavePlanOptions{}, 4095), "data/rank-04095.bin");
  options.alignment = 0;
  EXPECT_THAT(BuildGlobalSavePlan("j", 1, Plans({{Bytes("a", 3)}}), options),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(StorageSettingsKey(SavePlanOptions{}), StorageSettingsKey(options));
}

TEST(SavePlanTest, ReplicasAreWrittenOnceAndBalanced) {
  // Four replicated tensors of equal size on two ranks: two each.
  std::vector<WriteItem> items;
  for (const char* fqn : {"a", "b", "c", "d"}) {
    items.push_back(Chunk(fqn, {16}, Box({0}, {16})));
  }
  auto plan = BuildGlobalSavePlan("j", 1, Plans({items, items}), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].writes.size(), 2u);
  EXPECT_EQ(plan->ranks[1].writes.size(), 2u);
  EXPECT_EQ(plan->total_bytes, 4u * 64u);
}

TEST(SavePlanTest, BalancingAccountsForForcedWrites) {
  // Rank 0 alone holds a big shard; the replicated items go to rank 1
  // (greedy-by-arrival would give them all to rank 0).
  std::vector<WriteItem> r0 = {Chunk("big", {100}, Box({0}, {100})),
                               Chunk("r1", {10}, Box({0}, {10})),
                               Chunk("r2", {10}, Box({0}, {10}))};
  std::vector<WriteItem> r1 = {Chunk("r1", {10}, Box({0}, {10})),
                               Chunk("r2", {10}, Box({0}, {10}))};
  auto plan = BuildGlobalSavePlan("j", 1, Plans({r0, r1}), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->ranks[0].writes.size(), 1u);
  EXPECT_EQ(plan->EntryOf(plan->ranks[0].writes[0]).fqn, "big");
  EXPECT_EQ(plan->ranks[1].writes.size(), 2u);
}

TEST(SavePlanTest, EmptyBoxesAreDroppedAndEmptyTensorsListed) {
  auto plan =
      BuildGlobalSavePlan("j", 1,
                          Plans({{Chunk("w", {3}, Box({0}, {3})),
                                  Chunk("e", {0, 4}, Box({0, 0}, {0, 4}))},
                                 {Chunk("w", {3}, Box({3}, {0}))}}),
                          {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].writes.size(), 1u);
  EXPECT_TRUE(plan->ranks[1].writes.empty());
  EXPECT_EQ(plan->ranks[1].object_bytes, 0u);
  ASSERT_EQ(plan->entries.size(), 2u);
  EXPECT_EQ(plan->entries[0].fqn, "e");
}

TEST(SavePlanTest, ResultIsIndependentOfItemOrder) {
  std::mt19937_64 rng(1);
  std::vector<std::vector<WriteItem>> items(3);
  for (int t = 0; t < 20; ++t) {
    const std::string fqn = "t" + std::to_string(t);
    for (int r = 0; r < 3; ++r)
      items[r].push_back(Chunk(fqn, {8}, Box({0}, {8})));
  }
  auto a = BuildGlobalSavePlan("j", 1, Plans(items), {});
  for (auto& v : items) std::shuffle(v.begin(), v.end(), rng);
  auto b = BuildGlobalSavePlan("j", 1, Plans(items), {});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(a->ranks[r].writes.size(), b->ranks[r].writes.size());
    for (size_t i = 0; i < a->ranks[r].writes.size(); ++i) {
      EXPECT_EQ(a->EntryOf(a->ranks[r].writes[i]).fqn,
                b->EntryOf(b->ranks[r].writes[i]).fqn);
      EXPECT_EQ(a->ranks[r].LocationOf(a->ranks[r].writes[i]),
                b->ranks[r].LocationOf(b->ranks[r].writes[i]));
    }
  }
}

TEST(SavePlanTest, ErrorsNameJobStepRankAndFqn) {
  struct Case {
    std::vector<LocalSavePlan> plans;
    const char* substr;
  };
  WriteItem bad_length = Chunk("w", {4}, Box({0}, {4}));
  bad_length.length = 15;
  WriteItem bad_dtype = Chunk("w", {4}, Box({0}, {4}));
  bad_dtype.dtype = DType::kUnspecified;
  std::vector<LocalSavePlan> misordered =
      Plans({{Bytes("a", 1)}, {Bytes("a", 1)}});
  misordered[1].rank = 5;
  std::vector<Case> cases = {
      {{}, "no local plans"},
      {misordered, "the plan at position 1 is rank 5's"},
      {Plans({{Chunk("model.wq", {4096, 1000}, Box({0, 512}, {4096, 512}))}}),
       "rank 0 'model.wq': chunk [0:4096, 512:1024] exceeds shape [4096, "
       "1000]"},
      {Plans({{bad_length}}),
       "rank 0 chunk [0:4] of 'w' has length 15 bytes; float32 needs 16"},
      {Plans({{bad_dtype}}), "rank 0 'w': unknown dtype unspecified"},
      {Plans({{Bytes("", 1)}}), "rank 0 has an item with an empty fqn"},
      {Plans({{Chunk("w", {4}, Box({0}, {2}))},
              {Chunk("w", {4}, Box({2}, {2}), DType::kBFloat16)}}),
       "rank 1 has 'w' as bfloat16 [4] but rank 0 has it as float32 [4]"},
      {Plans({{Chunk("w", {4}, Box({0}, {2}))},
              {Chunk("w", {5}, Box({2}, {2}))}}),
       "rank 1 has 'w' as float32 [5] but rank 0 has it as float32 [4]"},
      {Plans({{Chunk("w", {4}, Box({0}, {4}))}, {Bytes("w", 16)}}),
       "rank 1 has 'w' as a bytes entry but rank 0 has it as float32 [4]"},
      {Plans({{Chunk("w", {4}, Box({0}, {3}))},
              {Chunk("w", {4}, Box({2}, {2}))}}),
       "'w': rank 1 chunk [2:4] partially overlaps rank 0 chunk [0:3]"},
      {Plans({{Chunk("w", {4}, Box({0}, {2}))},
              {Chunk("w", {4}, Box({0}, {2}))}}),
       "'w': chunks cover 2 of 4 elements of shape [4]; e.g. [2:4] is not "
       "covered"},
      {Plans(
           {{Chunk("w", {4}, Box({0}, {4})), Chunk("w", {4}, Box({0}, {4}))}}),
       "rank 0 lists chunk [0:4] of 'w' twice"},
      {Plans({{Bytes("rng", 8)}, {Bytes("rng", 9)}}),
       "rank 1 has bytes entry 'rng' with 9 bytes but rank 0 has 8"},
  };
  for (const Case& c : cases) {
    absl::Status s = BuildError(c.plans);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("job 'llama' step 100: "),
                                  HasSubstr(c.substr))))
        << c.substr;
  }
}

// Issue 11: sizes near 2^63 used to wrap object offsets (four 2^62-byte
// tensors on one rank ended at offset 2^64 = 0).
TEST(SavePlanTest, SizesNearTwoToThe63AreRejectedNotWrapped) {
  const int64_t n = int64_t{1} << 59;  // int64 elements: 2^62 bytes
  auto big = [&](const std::string& fqn) {
    return Chunk(fqn, {n}, Box({0}, {n}), DType::kInt64);
  };
  struct Case {
    std::vector<LocalSavePlan> plans;
    const char* substr;
  };
  const std::vector<Case> cases = {
      {Plans({{big("a"), big("b"), big("c"), big("d")}}),
       "rank 0 would write 'b' (4611686018427387904 bytes) at offset "
       "4611686018427387904 of its object, past the largest supported "
       "object size 2^62"},
      {Plans({{Bytes("blob", UINT64_MAX)}}),
       "rank 0 'blob' has length 18446744073709551615 bytes; at most 2^62"},
      {Plans({{Bytes("x", 1), Bytes("blob", (uint64_t{1} << 62))}}),
       "rank 0 would write 'x' (1 bytes) at offset 4611686018427387904"},
      {Plans({{Chunk("w", {int64_t{1} << 60}, Box({0}, {int64_t{1} << 60}),
                     DType::kInt64)}}),
       "rank 0 'w' has length 9223372036854775808 bytes; at most 2^62"},
      {Plans({{Chunk("w", {int64_t{1} << 40, int64_t{1} << 40},
                     Box({0, 0}, {1, 1}))}}),
       "rank 0 'w': shape [1099511627776, 1099511627776] has more than 2^60 "
       "elements"},
  };
  for (const Case& c : cases) {
    absl::Status s = BuildError(c.plans);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("job 'llama' step 100: "),
                                  HasSubstr(c.substr))))
        << c.substr;
  }
  // 2^62 bytes in one rank's object is still fine; over 2^63 in total is not.
  std::vector<std::vector<WriteItem>> per_rank;
  for (int r = 0; r < 3; ++r) per_rank.push_back({big(absl::StrCat("t", r))});
  absl::Status s = BuildError(Plans(per_rank));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("the checkpoint would exceed 2^63 bytes")));
  per_rank.pop_back();
  EXPECT_TRUE(BuildError(Plans(per_rank)).ok());
}

// Property: random DTensor layouts and explicit tilings for several tensors
// over random world sizes -> global plan. Oracle (brute force, per element):
// every element of every tensor is written exactly once, by a rank that holds
// it; writes within each object are aligned, in bounds and disjoint; every
// replicated unit is written by one of its holders; the plan is identical
// when items are shuffled.
TEST(SavePlanTest, MatchesCoverageOracleOnRandomLayouts) {
  std::mt19937_64 rng(2024);
  for (int iter = 0; iter < 1500; ++iter) {
    const int world = static_cast<int>(testing::Uniform(rng, 1, 12));
    std::vector<std::vector<WriteItem>> items(world);
    struct Tensor {
      Shape shape;
      DType dtype;
    };
    std::map<std::string, Tensor> tensors;
    const int num_tensors = static_cast<int>(testing::Uniform(rng, 1, 4));
    for (int t = 0; t < num_tensors; ++t) {
      const std::string fqn = "layer" + std::to_string(t) + ".w";
      const Shape shape = testing::RandomShape(rng, 5, 0, 6);
      const DType dtype = t % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
      tensors[fqn] = {shape, dtype};
      if (testing::Uniform(rng, 0, 1) == 0) {
        // DTensor layout over a subset of the world.
        DTensorLayout layout = testing::RandomLayout(rng, shape, 0, 2, 3);
        std::vector<int> perm(world);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        if (layout.mesh.ranks.size() > static_cast<size_t>(world)) {
          layout.mesh = DeviceMesh{{world}, perm};
          layout.placements = {Placement::Shard(0)};
        } else {
          for (int& r : layout.mesh.ranks) r = perm[static_cast<size_t>(r)];
        }
        auto all = AllChunks(layout, shape);
        ASSERT_TRUE(all.ok()) << all.status();
        for (const RankChunk& rc : *all) {
          items[rc.rank].push_back(Chunk(fqn, shape, rc.box, dtype));
        }
      } else {
        // Explicit irregular tiling, each tile on 1..3 random ranks.
        for (const ChunkBox& tile : testing::RandomTiling(rng, shape, 10)) {
          std::set<int> holders;
          const int copies = static_cast<int>(testing::Uniform(rng, 1, 3));
          for (int c = 0; c < copies; ++c) {
            holders.insert(
                static_cast<int>(testing::Uniform(rng, 0, world - 1)));
          }
          for (int r : holders)
            items[r].push_back(Chunk(fqn, shape, tile, dtype));
        }
      }
    }
    if (testing::Uniform(rng, 0, 1) == 0) {
      const uint64_t len =
          static_cast<uint64_t>(testing::Uniform(rng, 0, 9000));
      for (int r = 0; r < world; ++r) {
        if (r == 0 || testing::Uniform(rng, 0, 1) == 0) {
          items[r].push_back(Bytes("extra_state", len));
        }
      }
    }
    SavePlanOptions options;
    options.alignment =
        static_cast<uint64_t>(testing::Uniform(rng, 1, 3)) * 512;
    auto plan = BuildGlobalSavePlan("j", iter, Plans(items), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->world_size, world);

    std::map<std::string, std::vector<int>> coverage;
    for (const auto& [fqn, t] : tensors) {
      coverage[fqn].assign(static_cast<size_t>(NumElements(t.shape)), 0);
    }
    int bytes_writes = 0;
    for (int r = 0; r < world; ++r) {
      const RankSavePlan& rp = plan->ranks[r];
      ASSERT_EQ(rp.rank, r);
      uint64_t end = 0;
      for (const PlannedWrite& pw : rp.writes) {
        const WriteItem item = plan->ItemOf(r, pw);
        const StorageLocation location = rp.LocationOf(pw);
        ASSERT_EQ(location.object_key, ObjectKeyForRank(options, r));
        ASSERT_EQ(location.offset % options.alignment, 0u);
        ASSERT_GE(location.offset, end);  // disjoint, in order
        ASSERT_EQ(location.length, item.length);
        end = location.offset + location.length;
        // The writer holds the item.
        bool held = false;
        for (const WriteItem& it : items[r]) {
          held |= it.fqn == item.fqn && it.box == item.box &&
                  it.kind == item.kind && it.length == item.length;
        }
        ASSERT_TRUE(held) << "rank " << r << " writes " << item.fqn;
        if (item.kind == WriteItem::Kind::kBytes) {
          ++bytes_writes;
          continue;
        }
        ASSERT_GT(Volume(item.box), 0);
        testing::ForEachElement(item.box, tensors[item.fqn].shape,
                                [&](int64_t f) { ++coverage[item.fqn][f]; });
      }
      ASSERT_EQ(rp.object_bytes, end);
    }
    for (const auto& [fqn, cov] : coverage) {
      for (int c : cov) ASSERT_EQ(c, 1) << fqn;
    }
    bool has_bytes = false;
    for (const auto& v : items) {
      for (const auto& it : v) has_bytes |= it.kind == WriteItem::Kind::kBytes;
    }
    ASSERT_EQ(bytes_writes, has_bytes ? 1 : 0);
    // Determinism under item shuffles.
    for (auto& v : items) std::shuffle(v.begin(), v.end(), rng);
    auto again = BuildGlobalSavePlan("j", iter, Plans(items), options);
    ASSERT_TRUE(again.ok());
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(again->ranks[r].writes.size(), plan->ranks[r].writes.size());
      for (size_t i = 0; i < plan->ranks[r].writes.size(); ++i) {
        ASSERT_EQ(again->ranks[r].LocationOf(again->ranks[r].writes[i]),
                  plan->ranks[r].LocationOf(plan->ranks[r].writes[i]));
        ASSERT_EQ(again->BoxOf(r, again->ranks[r].writes[i]),
                  plan->BoxOf(r, plan->ranks[r].writes[i]));
      }
    }
  }
}

// The reference planner: steps 2-4 of save_plan.h's algorithm written the
// plain way (std::map by fqn, boxes sorted with operator<, a stable sort for
// LPT, units laid out one by one). BuildGlobalSavePlan's faster internals
// (flat keys, run merging, grid cover check, writer-by-writer copies) must
// produce exactly this plan. Inputs must be valid.
// A plan with every write spelled out (what the compact GlobalSavePlan
// encodes), as the reference planner builds it.
struct ExpandedRank {
  int rank = 0;
  uint64_t object_bytes = 0;
  std::vector<WriteItem> items;
  std::vector<StorageLocation> locations;
};
struct ExpandedPlan {
  int world_size = 0;
  uint64_t total_bytes = 0;
  std::vector<PlannedEntry> entries;
  std::vector<ExpandedRank> ranks;
};

ExpandedPlan ReferencePlan(const std::vector<LocalSavePlan>& plans,
                           const SavePlanOptions& options) {
  struct Held {
    int rank;
    const WriteItem* item;
  };
  std::map<std::string, std::vector<Held>> by_fqn;
  for (const LocalSavePlan& p : plans) {
    for (const WriteItem& item : p.items) {
      by_fqn[item.fqn].push_back(Held{p.rank, &item});
    }
  }
  struct Unit {
    uint64_t bytes;
    std::vector<Held> holders;  // by rank
  };
  std::vector<Unit> units;
  ExpandedPlan plan;
  plan.world_size = static_cast<int>(plans.size());
  for (auto& [fqn, held] : by_fqn) {
    const WriteItem& first = *held[0].item;
    if (first.kind == WriteItem::Kind::kBytes) {
      plan.entries.push_back(
          PlannedEntry{first.kind, fqn, DType::kUnspecified, Shape{}});
      units.push_back(Unit{first.length, held});
      continue;
    }
    plan.entries.push_back(
        PlannedEntry{first.kind, fqn, first.dtype, first.global_shape});
    std::stable_sort(held.begin(), held.end(),
                     [](const Held& a, const Held& b) {
                       if (a.item->box != b.item->box)
                         return a.item->box < b.item->box;
                       return a.rank < b.rank;
                     });
    for (const Held& h : held) {
      if (Volume(h.item->box) == 0) continue;
      if (!units.empty() && units.back().holders[0].item->fqn == fqn &&
          units.back().holders[0].item->box == h.item->box) {
        units.back().holders.push_back(h);
      } else {
        units.push_back(Unit{h.item->length, {h}});
      }
    }
  }
  std::vector<uint64_t> load(plans.size(), 0);
  std::vector<int> writer(units.size(), 0);
  std::vector<size_t> replicated;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].holders.size() == 1) {
      load[units[u].holders[0].rank] += units[u].bytes;
    } else {
      replicated.push_back(u);
    }
  }
  std::stable_sort(
      replicated.begin(), replicated.end(),
      [&](size_t a, size_t b) { return units[a].bytes > units[b].bytes; });
  for (size_t u : replicated) {
    for (size_t h = 1; h < units[u].holders.size(); ++h) {
      if (load[units[u].holders[h].rank] <
          load[units[u].holders[writer[u]].rank]) {
        writer[u] = static_cast<int>(h);
      }
    }
    load[units[u].holders[writer[u]].rank] += units[u].bytes;
  }
  plan.ranks.resize(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    plan.ranks[r].rank = static_cast<int>(r);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const Held& h = units[u].holders[writer[u]];
    ExpandedRank& rp = plan.ranks[h.rank];
    const uint64_t offset = (rp.object_bytes + options.alignment - 1) /
                            options.alignment * options.alignment;
    rp.items.push_back(*h.item);
    rp.locations.push_back(StorageLocation{ObjectKeyForRank(options, h.rank),
                                           offset, units[u].bytes});
    rp.object_bytes = offset + units[u].bytes;
    plan.total_bytes += units[u].bytes;
  }
  return plan;
}

void ExpectSamePlan(const GlobalSavePlan& got, const ExpandedPlan& want) {
  ASSERT_EQ(got.world_size, want.world_size);
  ASSERT_EQ(got.total_bytes, want.total_bytes);
  ASSERT_EQ(got.entries.size(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) {
    ASSERT_EQ(got.entries[i].kind, want.entries[i].kind);
    ASSERT_EQ(got.entries[i].fqn, want.entries[i].fqn);
    ASSERT_EQ(got.entries[i].dtype, want.entries[i].dtype);
    ASSERT_EQ(got.entries[i].global_shape, want.entries[i].global_shape);
  }
  ASSERT_EQ(got.ranks.size(), want.ranks.size());
  for (size_t r = 0; r < want.ranks.size(); ++r) {
    const RankSavePlan& g = got.ranks[r];
    const ExpandedRank& w = want.ranks[r];
    ASSERT_EQ(g.rank, w.rank);
    ASSERT_EQ(g.object_bytes, w.object_bytes) << "rank " << r;
    ASSERT_EQ(g.writes.size(), w.items.size()) << "rank " << r;
    ASSERT_EQ(g.object_key, w.items.empty() ? "" : w.locations[0].object_key);
    for (size_t i = 0; i < w.items.size(); ++i) {
      const WriteItem gi = got.ItemOf(static_cast<int>(r), g.writes[i]);
      const WriteItem& wi = w.items[i];
      ASSERT_EQ(gi.kind, wi.kind);
      ASSERT_EQ(gi.fqn, wi.fqn) << "rank " << r << " write " << i;
      ASSERT_EQ(gi.dtype, wi.dtype);
      ASSERT_EQ(gi.global_shape, wi.global_shape);
      ASSERT_EQ(gi.box, wi.box) << "rank " << r << " write " << i;
      ASSERT_EQ(gi.length, wi.length);
      ASSERT_EQ(g.LocationOf(g.writes[i]), w.locations[i]);
    }
  }
}

// Property: on random valid saves (DTensor layouts with ranks in mesh order,
// whose boxes arrive as a few sorted runs, or shuffled; irregular tilings on
// random holders; bytes entries; items in plan order or shuffled) the plan is
// exactly the reference planner's.
TEST(SavePlanTest, EqualsReferencePlannerOnRandomSaves) {
  std::mt19937_64 rng(77);
  for (int iter = 0; iter < 600; ++iter) {
    const int world = static_cast<int>(testing::Uniform(rng, 1, 64));
    std::vector<std::vector<WriteItem>> items(world);
    const int num_tensors = static_cast<int>(testing::Uniform(rng, 1, 6));
    for (int t = 0; t < num_tensors; ++t) {
      const std::string fqn = "model.layers." + std::to_string(t) + ".w";
      const Shape shape = testing::RandomShape(rng, 3, 0, 9);
      const DType dtype = t % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
      if (testing::Uniform(rng, 0, 2) != 0) {
        DTensorLayout layout = testing::RandomLayout(rng, shape, 0, 3, 4);
        if (layout.mesh.ranks.size() > static_cast<size_t>(world)) {
          layout =
              DTensorLayout{DeviceMesh{{world}, {}}, {Placement::Shard(0)}};
          layout.mesh.ranks.resize(static_cast<size_t>(world));
          std::iota(layout.mesh.ranks.begin(), layout.mesh.ranks.end(), 0);
        } else if (testing::Uniform(rng, 0, 1) == 0) {
          std::sort(layout.mesh.ranks.begin(), layout.mesh.ranks.end());
        }
        auto all = AllChunks(layout, shape);
        ASSERT_TRUE(all.ok()) << all.status();
        for (const RankChunk& rc : *all) {
          items[rc.rank].push_back(Chunk(fqn, shape, rc.box, dtype));
        }
      } else {
        for (const ChunkBox& tile : testing::RandomTiling(rng, shape, 12)) {
          std::set<int> holders;
          const int copies = static_cast<int>(testing::Uniform(rng, 1, 4));
          for (int c = 0; c < copies; ++c) {
            holders.insert(
                static_cast<int>(testing::Uniform(rng, 0, world - 1)));
          }
          for (int r : holders) {
            items[r].push_back(Chunk(fqn, shape, tile, dtype));
          }
        }
      }
    }
    for (int b = 0; b < 2; ++b) {
      if (testing::Uniform(rng, 0, 1) == 0) continue;
      const uint64_t len =
          static_cast<uint64_t>(testing::Uniform(rng, 0, 20000));
      for (int r = 0; r < world; ++r) {
        if (r == 0 || testing::Uniform(rng, 0, 2) == 0) {
          items[r].push_back(Bytes("extra_state." + std::to_string(b), len));
        }
      }
    }
    if (testing::Uniform(rng, 0, 1) == 0) {
      for (auto& v : items) std::shuffle(v.begin(), v.end(), rng);
    }
    SavePlanOptions options;
    options.alignment = static_cast<uint64_t>(testing::Uniform(rng, 1, 3)) * 64;
    const std::vector<LocalSavePlan> plans = Plans(items);
    auto plan = BuildGlobalSavePlan("j", iter, plans, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectSamePlan(*plan, ReferencePlan(plans, options));
    if (HasFatalFailure()) {
      FAIL() << "iteration " << iter;
    }
  }
}

// Balance: with every unit replicated on every rank (pure data parallel), the
// LPT assignment keeps max - min bytes per rank within the largest unit.
TEST(SavePlanTest, FullyReplicatedUnitsAreBalancedWithinOneUnit) {
  std::mt19937_64 rng(9);
  for (int iter = 0; iter < 200; ++iter) {
    const int world = static_cast<int>(testing::Uniform(rng, 2, 16));
    std::vector<WriteItem> items;
    int64_t largest = 0;
    const int n = static_cast<int>(testing::Uniform(rng, 1, 60));
    for (int t = 0; t < n; ++t) {
      const int64_t len = testing::Uniform(rng, 1, 1000);
      largest = std::max(largest, len * 4);
      items.push_back(Chunk("t" + std::to_string(t), {len}, Box({0}, {len})));
    }
    auto plan = BuildGlobalSavePlan(
        "j", 1, Plans(std::vector<std::vector<WriteItem>>(world, items)), {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const RankSavePlan& rp : plan->ranks) {
      uint64_t b = 0;
      for (const PlannedWrite& w : rp.writes) b += w.length;
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    ASSERT_LE(hi - lo, static_cast<uint64_t>(largest));
  }
}

}  // namespace
}  // namespace cairn::planner
