#include "common/large_array.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;

struct Item {
  uint64_t a;
  uint32_t b;
};

// Whether address `p` lies in one of this process's mappings (by
// /proc/self/maps): an array's memory goes back to the system when the
// array that owns it is reset or destroyed.
bool Mapped(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    const uintptr_t from = std::stoull(line.substr(0, dash), nullptr, 16);
    const uintptr_t to =
        std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
    if (at >= from && at < to) return true;
  }
  return false;
}

TEST(LargeArrayTest, HoldsWhatIsWrittenAcrossHugePages) {
  constexpr size_t kN = (size_t{5} << 20) / sizeof(Item) + 7;  // > 2 MiB
  LargeArray<Item> items = LargeArray<Item>::Allocate(kN, "items").value();
  ASSERT_NE(items.get(), nullptr);
  EXPECT_EQ(items.size(), kN);
  for (size_t i = 0; i < kN; ++i) items[i] = Item{i * 3, uint32_t(i ^ 0x5a)};
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(items[i].a, i * 3) << i;
    ASSERT_EQ(items[i].b, uint32_t(i ^ 0x5a)) << i;
  }
}

TEST(LargeArrayTest, MovesTheMappingAndUnmapsItWhenReset) {
  LargeArray<Item> a = LargeArray<Item>::Allocate(1000, "a").value();
  a[999] = Item{42, 7};
  Item* p = a.get();
  ASSERT_TRUE(Mapped(p));
  LargeArray<Item> b(std::move(a));
  EXPECT_EQ(a.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);      // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.get(), p);
  EXPECT_EQ(b[999].a, 42u);
  LargeArray<Item> c = LargeArray<Item>::Allocate(10, "c").value();
  c = std::move(b);  // c's own mapping is released, b's taken
  EXPECT_EQ(c.get(), p);
  EXPECT_EQ(c.size(), 1000u);
  c = LargeArray<Item>();
  EXPECT_EQ(c.get(), nullptr);
  EXPECT_FALSE(Mapped(p));
}

TEST(LargeArrayTest, EmptyHasNoMemory) {
  LargeArray<Item> none = LargeArray<Item>::Allocate(0, "none").value();
  EXPECT_EQ(none.get(), nullptr);
  EXPECT_EQ(none.size(), 0u);
}

TEST(LargeArrayTest, WhatCannotBeMappedIsResourceExhausted) {
  // More than any address space: the mapping fails (ENOMEM).
  absl::StatusOr<LargeArray<Item>> huge =
      LargeArray<Item>::Allocate(size_t{1} << 58, "the commit's chunks");
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(huge.status().message().find("the commit's chunks: cannot map"),
            std::string::npos)
      << huge.status();
  // Bytes that overflow a size_t.
  absl::StatusOr<LargeArray<Item>> overflow =
      LargeArray<Item>::Allocate(~size_t{0} / 2, "x");
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(overflow, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(overflow.status().message().find("overflow"), std::string::npos);
}

}  // namespace
}  // namespace cairn
