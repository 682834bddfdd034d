#include "common/lru_cache.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cairn {
namespace {

TEST(LruCacheTest, EvictsLeastRecentlyUsedFirst) {
  LruCache<std::string, int> cache(2);
  cache.Insert("a", std::make_shared<const int>(1), 1);
  cache.Insert("b", std::make_shared<const int>(2), 1);
  ASSERT_NE(cache.Lookup("a"), nullptr);  // a is now most recent
  cache.Insert("c", std::make_shared<const int>(3), 1);
  EXPECT_EQ(cache.Lookup("b"), nullptr);
  ASSERT_NE(cache.Lookup("a"), nullptr);
  EXPECT_EQ(*cache.Lookup("a"), 1);
  EXPECT_EQ(*cache.Lookup("c"), 3);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(LruCacheTest, ChargeBoundsTotalAndOversizedEntriesAreNotCached) {
  LruCache<int, std::string> cache(100);
  cache.Insert(1, std::make_shared<const std::string>("x"), 60);
  cache.Insert(2, std::make_shared<const std::string>("y"), 60);
  EXPECT_EQ(cache.Lookup(1), nullptr);
  EXPECT_EQ(cache.charge(), 60u);
  cache.Insert(3, std::make_shared<const std::string>("z"), 101);
  EXPECT_EQ(cache.Lookup(3), nullptr);
  EXPECT_NE(cache.Lookup(2), nullptr);
}

TEST(LruCacheTest, ReplaceAndEraseIfKeepChargeConsistent) {
  LruCache<int, int> cache(10);
  cache.Insert(1, std::make_shared<const int>(1), 4);
  cache.Insert(1, std::make_shared<const int>(2), 3);
  EXPECT_EQ(cache.charge(), 3u);
  EXPECT_EQ(*cache.Lookup(1), 2);
  cache.Insert(2, std::make_shared<const int>(5), 3);
  cache.Insert(3, std::make_shared<const int>(6), 3);
  cache.EraseIf([](const int& k) { return k % 2 == 1; });
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.charge(), 3u);
  EXPECT_NE(cache.Lookup(2), nullptr);
}

// Against a brute-force model: a vector ordered by recency.
TEST(LruCacheTest, MatchesReferenceModelOnRandomOperations) {
  std::mt19937 rng(7);
  LruCache<int, int> cache(5);
  std::vector<std::pair<int, int>> model;  // front = most recent
  for (int op = 0; op < 20000; ++op) {
    int key = static_cast<int>(rng() % 9);
    auto pos = std::find_if(model.begin(), model.end(),
                            [&](const auto& kv) { return kv.first == key; });
    if (rng() % 2) {
      int value = static_cast<int>(rng() % 1000);
      cache.Insert(key, std::make_shared<const int>(value), 1);
      if (pos != model.end()) model.erase(pos);
      model.insert(model.begin(), {key, value});
      if (model.size() > 5) model.pop_back();
    } else {
      auto got = cache.Lookup(key);
      if (pos == model.end()) {
        ASSERT_EQ(got, nullptr) << "op " << op;
      } else {
        ASSERT_NE(got, nullptr) << "op " << op;
        ASSERT_EQ(*got, pos->second);
        auto kv = *pos;
        model.erase(pos);
        model.insert(model.begin(), kv);
      }
    }
  }
}

}  // namespace
}  // namespace cairn
