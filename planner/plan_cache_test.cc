#include "planner/plan_cache.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::planner {
namespace {

WriteItem Chunk(std::string fqn, int64_t offset, int64_t size) {
  WriteItem item;
  item.fqn = std::move(fqn);
  item.dtype = DType::kFloat32;
  item.global_shape = {64};
  item.box = ChunkBox{{offset}, {size}};
  item.length = static_cast<uint64_t>(size) * 4;
  return item;
}

LocalSavePlan SamplePlan() {
  LocalSavePlan plan;
  plan.rank = 3;
  plan.items = {Chunk("a", 0, 8), Chunk("b", 8, 8), Chunk("c", 16, 4)};
  WriteItem bytes;
  bytes.kind = WriteItem::Kind::kBytes;
  bytes.fqn = "rng";
  bytes.length = 5;
  plan.items.push_back(bytes);
  return plan;
}

TEST(FingerprintTest, IsStableHexAndIndependentOfItemOrderAndRank) {
  const LocalSavePlan plan = SamplePlan();
  const std::string fp = FingerprintLocalPlan(plan);
  EXPECT_EQ(fp.size(), 32u);
  EXPECT_TRUE(std::all_of(fp.begin(), fp.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  }));
  LocalSavePlan shuffled = plan;
  std::reverse(shuffled.items.begin(), shuffled.items.end());
  shuffled.rank = 9;
  EXPECT_EQ(FingerprintLocalPlan(shuffled), fp);
}

// Golden values: the fingerprint must not change across builds, runs or
// machines (ranks send it instead of their plan). Update only with a format
// change that invalidates every cached plan on purpose.
TEST(FingerprintTest, GoldenValuesAreStable) {
  EXPECT_EQ(StableHash128Hex(""), "00000000000000000000000000000000");
  EXPECT_EQ(StableHash128Hex("hello"), StableHash128Hex("hello"));
  EXPECT_NE(StableHash128Hex("hello"), StableHash128Hex("hellp"));
  EXPECT_EQ(StableHash128Hex("The quick brown fox jumps over the lazy dog"),
            "e34bbc7bbc071b6c7a433ca9c49a9347");  // MurmurHash3_x64_128 vector
  EXPECT_EQ(FingerprintLocalPlan(SamplePlan()),
            "54f29bdcee728ce1b13c84291eac8a28");
  EXPECT_EQ(FingerprintLocalPlan(LocalSavePlan{}),
            "28df63b7cc57c3cbf2557dfcc4e8fe52");
}

TEST(FingerprintTest, AnyFieldChangeChangesTheFingerprint) {
  const std::string fp = FingerprintLocalPlan(SamplePlan());
  std::vector<LocalSavePlan> variants(10, SamplePlan());
  variants[0].items[0].fqn = "a2";
  variants[1].items[0].dtype = DType::kBFloat16;
  variants[2].items[0].global_shape = {65};
  variants[3].items[0].box.offsets = {1};
  variants[4].items[0].box.sizes = {7};
  variants[5].items[0].length = 31;
  variants[6].items[3].kind = WriteItem::Kind::kTensorChunk;
  variants[7].items.pop_back();
  variants[8].items.push_back(variants[8].items[0]);  // a duplicate item
  // Moving bytes between adjacent string fields must not collide.
  variants[9].items[0].fqn = "ab";
  variants[9].items[1].fqn = "";
  std::vector<std::string> seen = {fp};
  for (const LocalSavePlan& v : variants) {
    const std::string f = FingerprintLocalPlan(v);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), f), 0) << f;
    seen.push_back(f);
  }
}

PlanCache::Key MakeKey(std::string job, int world, std::vector<std::string> fps,
                       std::string settings = "s") {
  return PlanCache::Key{std::move(job), world, std::move(fps),
                        std::move(settings)};
}

std::shared_ptr<const GlobalSavePlan> MakePlan(int world, int writes_per_rank) {
  auto plan = std::make_shared<GlobalSavePlan>();
  plan->world_size = world;
  plan->ranks.resize(world);
  plan->entries.push_back(PlannedEntry{WriteItem::Kind::kTensorChunk, "t",
                                       DType::kFloat32, Shape{1 << 20}});
  for (int r = 0; r < world; ++r) {
    RankSavePlan& rp = plan->ranks[r];
    rp.rank = r;
    rp.object_key = "k";
    for (int i = 0; i < writes_per_rank; ++i) {
      rp.writes.push_back(PlannedWrite{
          0, static_cast<uint32_t>(rp.coords.size()), uint64_t{4} * i, 4});
      rp.coords.push_back(i);  // offset
      rp.coords.push_back(1);  // size
    }
  }
  return plan;
}

// A StreamedKeyHash hashes exactly the bytes a StableKey given the same
// calls holds (the oracle: XXH3-128 of those bytes in one call), for random
// sequences of calls of every kind and size, including lists larger than
// XXH3's internal buffer.
TEST(StreamedKeyHashTest, HashesWhatAStableKeyWouldHold) {
  EXPECT_EQ(StreamedKeyHash().Hex(), StreamedKeyHashOf(""));
  // XXH3-128 of no bytes (xxHash's published value): the algorithm is XXH3.
  EXPECT_EQ(StreamedKeyHashOf(""), "99aa06d3014798d86001c324468d497f");
  std::mt19937_64 rng(17);
  std::set<std::string> seen;  // hashes of non-empty sequences
  for (int trial = 0; trial < 300; ++trial) {
    StableKey held;
    StreamedKeyHash streamed;
    const int calls = static_cast<int>(rng() % 12);
    for (int c = 0; c < calls; ++c) {
      switch (rng() % 4) {
        case 0: {
          const uint64_t v = rng();
          held.PutU64(v);
          streamed.PutU64(v);
          break;
        }
        case 1: {
          const int64_t v = static_cast<int64_t>(rng() % 2000) - 1000;
          held.PutInt(v);
          streamed.PutInt(v);
          break;
        }
        case 2: {
          std::string s(rng() % 300, '\0');
          for (char& ch : s) ch = static_cast<char>(rng());
          held.PutString(s);
          streamed.PutString(s);
          break;
        }
        default: {
          std::vector<int64_t> v(rng() % 3000);
          for (int64_t& x : v) x = static_cast<int64_t>(rng());
          held.PutInts(v);
          streamed.PutInts(v);
          break;
        }
      }
    }
    const std::string hex = streamed.Hex();
    EXPECT_EQ(hex, StreamedKeyHashOf(held.bytes())) << "trial " << trial;
    EXPECT_EQ(hex.size(), 32u);
    // Random sequences of calls (none repeats) hash apart.
    if (!held.bytes().empty()) {
      EXPECT_TRUE(seen.insert(hex).second) << "trial " << trial;
    }
  }
}

TEST(StreamedKeyHashTest, AnyChangeAndEveryBoundaryMatter) {
  std::vector<int64_t> boxes(8700);
  for (size_t i = 0; i < boxes.size(); ++i) boxes[i] = static_cast<int64_t>(i);
  const auto hash = [](absl::string_view digest,
                       const std::vector<int64_t>& ints) {
    StreamedKeyHash k;
    k.PutString(digest);
    k.PutInts(ints);
    return k.Hex();
  };
  const std::string base = hash("digest", boxes);
  EXPECT_EQ(hash("digest", boxes), base);
  EXPECT_NE(hash("digesT", boxes), base);
  for (size_t i : {size_t{0}, size_t{4350}, boxes.size() - 1}) {
    std::vector<int64_t> changed = boxes;
    ++changed[i];
    EXPECT_NE(hash("digest", changed), base) << "value " << i;
  }
  std::vector<int64_t> shorter(boxes.begin(), boxes.end() - 1);
  EXPECT_NE(hash("digest", shorter), base);
  // Lengths are part of what is hashed: "ab" + "c" is not "a" + "bc".
  StreamedKeyHash ab_c, a_bc;
  ab_c.PutString("ab");
  ab_c.PutString("c");
  a_bc.PutString("a");
  a_bc.PutString("bc");
  EXPECT_NE(ab_c.Hex(), a_bc.Hex());
}

TEST(PlanCacheTest, ReusesPlanWhenNoRankChanged) {
  PlanCache cache(1 << 20);
  auto plan = MakePlan(2, 3);
  cache.Insert(MakeKey("j", 2, {"f0", "f1"}), plan);
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f0", "f1"})), plan);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_GT(cache.bytes(), ApproximatePlanBytes(*plan));
}

TEST(PlanCacheTest, AnyKeyDifferenceMisses) {
  PlanCache cache(1 << 20);
  cache.Insert(MakeKey("j", 2, {"f0", "f1"}), MakePlan(2, 1));
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f0", "fX"})), nullptr);  // a rank
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f1", "f0"})), nullptr);  // swapped
  EXPECT_EQ(cache.Lookup(MakeKey("k", 2, {"f0", "f1"})), nullptr);  // job
  EXPECT_EQ(cache.Lookup(MakeKey("j", 3, {"f0", "f1"})), nullptr);  // world
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f0", "f1"}, "t")), nullptr);
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f0"})), nullptr);
  EXPECT_EQ(cache.Lookup(MakeKey("j", 2, {"f0", "f1", ""})), nullptr);
}

// Many keys that differ in one rank's fingerprint: each lookup returns the
// plan inserted under exactly that key, never a neighbour's. The second cache
// hashes every key to the same value, so only full-key comparison can tell
// them apart (a cache that compared hashes would fail here).
TEST(PlanCacheTest, NeverReturnsAPlanForADifferentKey) {
  PlanCache normal(size_t{1} << 30);
  auto colliding = PlanCache::NewWithCollidingHashesForTest(size_t{1} << 30);
  for (PlanCache* cache : {&normal, colliding.get()}) {
    std::vector<std::string> fps(64, "same");
    std::vector<std::shared_ptr<const GlobalSavePlan>> plans;
    for (int i = 0; i < 300; ++i) {
      fps[i % 64] = "v" + std::to_string(i);
      plans.push_back(MakePlan(1, 0));
      cache->Insert(MakeKey("j", 64, fps), plans.back());
    }
    ASSERT_EQ(cache->size(), 300u);
    fps.assign(64, "same");
    for (int i = 0; i < 300; ++i) {
      fps[i % 64] = "v" + std::to_string(i);
      ASSERT_EQ(cache->Lookup(MakeKey("j", 64, fps)), plans[i]) << i;
    }
    fps[0] = "never-inserted";
    EXPECT_EQ(cache->Lookup(MakeKey("j", 64, fps)), nullptr);
    // Same fingerprints under another job, world size or storage settings.
    EXPECT_EQ(cache->Lookup(MakeKey("k", 64, {"v0"})), nullptr);
  }
}

TEST(PlanCacheTest, EvictsLeastRecentlyUsedWithinByteBound) {
  auto plan = MakePlan(4, 10);
  const size_t one = ApproximatePlanBytes(*plan) + 200;
  PlanCache cache(3 * one);
  cache.Insert(MakeKey("j", 4, {"a"}), plan);
  cache.Insert(MakeKey("j", 4, {"b"}), plan);
  cache.Insert(MakeKey("j", 4, {"c"}), plan);
  ASSERT_EQ(cache.size(), 3u);
  ASSERT_NE(cache.Lookup(MakeKey("j", 4, {"a"})), nullptr);  // a is now MRU
  cache.Insert(MakeKey("j", 4, {"d"}), plan);                // evicts b
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
  EXPECT_EQ(cache.Lookup(MakeKey("j", 4, {"b"})), nullptr);
  EXPECT_NE(cache.Lookup(MakeKey("j", 4, {"a"})), nullptr);
  EXPECT_NE(cache.Lookup(MakeKey("j", 4, {"c"})), nullptr);
  EXPECT_NE(cache.Lookup(MakeKey("j", 4, {"d"})), nullptr);
}

TEST(PlanCacheTest, ReplacesSameKeyAndSkipsOversizedPlans) {
  PlanCache small(1000);
  const auto big = MakePlan(100, 100);
  const size_t charge = small.Insert(MakeKey("j", 1, {"a"}), big);
  EXPECT_GT(charge, ApproximatePlanBytes(*big));  // the key's bytes too
  EXPECT_LT(charge, ApproximatePlanBytes(*big) + 1000);
  EXPECT_EQ(small.size(), 0u);
  EXPECT_EQ(small.bytes(), 0u);
  PlanCache cache(1 << 20);
  auto p1 = MakePlan(1, 1), p2 = MakePlan(1, 2);
  EXPECT_EQ(cache.Insert(MakeKey("j", 1, {"a"}), p1), 0u);
  const size_t b1 = cache.bytes();
  cache.Insert(MakeKey("j", 1, {"a"}), p2);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Lookup(MakeKey("j", 1, {"a"})), p2);
  EXPECT_GT(cache.bytes(), b1);
  cache.Insert(MakeKey("j", 1, {"b"}), nullptr);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(PlanCacheTest, EraseJobDropsOnlyThatJob) {
  PlanCache cache(1 << 20);
  cache.Insert(MakeKey("j", 1, {"a"}), MakePlan(1, 1));
  cache.Insert(MakeKey("k", 1, {"a"}), MakePlan(1, 1));
  cache.EraseJob("j");
  EXPECT_EQ(cache.Lookup(MakeKey("j", 1, {"a"})), nullptr);
  EXPECT_NE(cache.Lookup(MakeKey("k", 1, {"a"})), nullptr);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(PlanCacheTest, ConcurrentInsertAndLookupKeepInvariants) {
  auto plan = MakePlan(2, 2);
  PlanCache cache(20 * (ApproximatePlanBytes(*plan) + 200));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto key = MakeKey("j", 2, {std::to_string((i * 7 + t) % 50)});
        if (i % 3 == 0) {
          cache.Insert(key, plan);
        } else {
          auto got = cache.Lookup(key);
          if (got != nullptr) {
            ASSERT_EQ(got, plan);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.bytes(), cache.max_bytes());
  EXPECT_GT(cache.size(), 0u);
}

}  // namespace
}  // namespace cairn::planner
