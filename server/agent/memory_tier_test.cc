#include "server/agent/memory_tier.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/staging_pool.h"
#include "server/agent/testing/item_sets.h"
#include "storage/checksum.h"

namespace cairn::agent {
namespace {

using ::cairn::agent::testing::BytesItem;
using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kNode = 3;

// A float32 chunk [offset, offset + rows) x [0, 4) of tensor `fqn`.
v1::WriteItem TensorItem(const std::string& fqn, int64_t offset, int64_t rows) {
  v1::WriteItem w;
  w.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  w.mutable_tensor()->set_fqn(fqn);
  w.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  w.mutable_tensor()->add_global_shape(64);
  w.mutable_tensor()->add_global_shape(4);
  w.mutable_chunk()->add_offsets(offset);
  w.mutable_chunk()->add_offsets(0);
  w.mutable_chunk()->add_sizes(rows);
  w.mutable_chunk()->add_sizes(4);
  w.set_length(static_cast<uint64_t>(rows) * 4 * 4);
  return w;
}

class MemoryTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StagingPool::Options o;
    o.node_id = 8000 + static_cast<int>(getpid() % 1000);
    o.budget_bytes = uint64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<StagingPool>> p = StagingPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
  }

  // A committed set of (job, step, rank) holding `items`, filled with bytes
  // derived from (step, rank, item) and checksummed.
  std::shared_ptr<ItemSet> MakeSet(const std::string& job, int64_t step,
                                   int rank, bool replica,
                                   const std::vector<v1::WriteItem>& items) {
    return testing::MakeFilledSet(
        *pool_, job, step, rank, replica, items, [&](size_t i, uint64_t b) {
          return static_cast<char>(step * 31 + rank * 7 + i * 3 + b);
        });
  }

  std::unique_ptr<StagingPool> pool_;
  MemoryTier tier_{kNode};
};

TEST_F(MemoryTierTest, KeepsTheNewestStepPerJobAndRankInEachTier) {
  tier_.Keep(MakeSet("j", 1, 0, false, {TensorItem("w", 0, 8)}));
  tier_.Keep(MakeSet("j", 3, 0, false, {TensorItem("w", 0, 8)}));
  tier_.Keep(MakeSet("j", 2, 0, false, {TensorItem("w", 0, 8)}));  // older
  tier_.Keep(MakeSet("j", 2, 0, true, {TensorItem("w", 8, 8)}));
  tier_.Keep(MakeSet("j", 1, 1, false, {TensorItem("w", 8, 8)}));
  tier_.Keep(MakeSet("k", 5, 0, false, {TensorItem("w", 0, 8)}));
  EXPECT_EQ(tier_.counts().tier0_sets, 3);
  EXPECT_EQ(tier_.counts().replica_sets, 1);
  EXPECT_EQ(tier_.Inventory("j", 3).sets_size(), 1);
  EXPECT_EQ(tier_.Inventory("j", 2).sets_size(), 1);  // the replica only
  EXPECT_EQ(tier_.Inventory("j", 1).sets_size(), 1);  // rank 1
  EXPECT_EQ(tier_.Inventory("k", 5).sets_size(), 1);
  EXPECT_EQ(tier_.Inventory("k", 3).sets_size(), 0);
}

TEST_F(MemoryTierTest, ReplacedAndEvictedSetsReleaseTheirSegments) {
  auto first = MakeSet("j", 1, 0, false, {TensorItem("w", 0, 8)});
  std::weak_ptr<shm::ShmSegment> seg1 = first->segment;
  std::weak_ptr<const ItemSet> set1 = first;
  tier_.Keep(std::move(first));
  EXPECT_FALSE(set1.expired());
  tier_.Keep(MakeSet("j", 2, 0, false, {TensorItem("w", 0, 8)}));
  EXPECT_TRUE(set1.expired());
  EXPECT_TRUE(seg1.expired());

  std::weak_ptr<const ItemSet> held;
  {
    auto s = MakeSet("j", 2, 1, true, {TensorItem("w", 8, 8)});
    held = s;
    tier_.Keep(std::move(s));
  }
  ASSERT_TRUE(tier_.EvictOldest());  // the replica goes first
  EXPECT_TRUE(held.expired());
  EXPECT_EQ(tier_.counts().replica_sets, 0);
  EXPECT_EQ(tier_.counts().tier0_sets, 1);
  ASSERT_TRUE(tier_.EvictOldest());
  EXPECT_EQ(tier_.counts().tier0_sets, 0);
  EXPECT_FALSE(tier_.EvictOldest());
}

TEST_F(MemoryTierTest, EvictionMatchesABruteForceModel) {
  // Random keeps and evictions against a model that keeps every set with
  // its tier and picks victims by scanning all of them.
  std::mt19937 rng(12345);
  using ModelKey = std::tuple<bool, std::string, int>;  // replica, job, rank
  std::map<ModelKey, int64_t> model;                    // -> step
  for (int op = 0; op < 600; ++op) {
    if (rng() % 3 == 0) {
      // Victim: a replica with the smallest step, else a tier-0 set.
      const ModelKey* victim = nullptr;
      for (bool replica : {true, false}) {
        for (const auto& [k, step] : model) {
          if (std::get<0>(k) != replica) continue;
          if (victim == nullptr || step < model.at(*victim)) victim = &k;
        }
        if (victim != nullptr) break;
      }
      const bool expect = victim != nullptr;
      std::vector<int64_t> steps_before;
      if (expect) {
        const ModelKey k = *victim;
        const int64_t victim_step = model.at(k);
        model.erase(k);
        ASSERT_TRUE(tier_.EvictOldest());
        // The tier no longer holds a set of that (job, step) for that rank
        // in that tier unless the model still does.
        int still = 0;
        for (const auto& [mk, step] : model) {
          if (std::get<1>(mk) == std::get<1>(k) && step == victim_step) {
            ++still;
          }
        }
        EXPECT_EQ(tier_.Inventory(std::get<1>(k), victim_step).sets_size(),
                  still);
      } else {
        ASSERT_FALSE(tier_.EvictOldest());
      }
    } else {
      const bool replica = rng() % 2 == 0;
      const std::string job = rng() % 2 ? "a" : "b";
      const int rank = static_cast<int>(rng() % 3);
      const int64_t step = static_cast<int64_t>(rng() % 20);
      tier_.Keep(MakeSet(job, step, rank, replica,
                         {BytesItem("extra", 1 + rng() % 100)}));
      int64_t& s = model.try_emplace({replica, job, rank}, step).first->second;
      s = std::max(s, step);
    }
    int tier0 = 0, replicas = 0;
    for (const auto& [k, step] : model) ++(std::get<0>(k) ? replicas : tier0);
    ASSERT_EQ(tier_.counts().tier0_sets, tier0) << "op " << op;
    ASSERT_EQ(tier_.counts().replica_sets, replicas) << "op " << op;
    for (const std::string job : {"a", "b"}) {
      for (int64_t step = 0; step < 20; ++step) {
        int n = 0;
        for (const auto& [k, s] : model) {
          if (std::get<1>(k) == job && s == step) ++n;
        }
        ASSERT_EQ(tier_.Inventory(job, step).sets_size(), n)
            << "op " << op << " job " << job << " step " << step;
      }
    }
  }
}

TEST_F(MemoryTierTest, InventoryListsEveryItemWithItsChecksumTierZeroFirst) {
  auto own =
      MakeSet("j", 4, 0, false, {TensorItem("w", 0, 8), BytesItem("opt", 33)});
  auto rep = MakeSet("j", 4, 1, true, {TensorItem("w", 8, 8)});
  const uint32_t own_crc0 = own->items[0].crc32c;
  const uint32_t own_crc1 = own->items[1].crc32c;
  const uint32_t rep_crc = rep->items[0].crc32c;
  tier_.Keep(rep);
  tier_.Keep(own);
  v1::InventoryResponse inv = tier_.Inventory("j", 4);
  ASSERT_EQ(inv.sets_size(), 2);
  EXPECT_EQ(inv.sets(0).source_rank(), 0);
  ASSERT_EQ(inv.sets(0).items_size(), 2);
  EXPECT_EQ(inv.sets(0).items(0).item().tensor().fqn(), "w");
  EXPECT_EQ(inv.sets(0).items(0).crc32c(), own_crc0);
  EXPECT_EQ(inv.sets(0).items(1).item().bytes_fqn(), "opt");
  EXPECT_EQ(inv.sets(0).items(1).crc32c(), own_crc1);
  EXPECT_EQ(inv.sets(1).source_rank(), 1);
  ASSERT_EQ(inv.sets(1).items_size(), 1);
  EXPECT_EQ(inv.sets(1).items(0).crc32c(), rep_crc);
}

TEST_F(MemoryTierTest, FindChecksTheBytesHeldAgainstTheChecksum) {
  auto own =
      MakeSet("j", 4, 0, false, {TensorItem("w", 0, 8), BytesItem("opt", 33)});
  const uint32_t crc = own->items[0].crc32c;
  const uint32_t opt_crc = own->items[1].crc32c;
  ItemSet* raw = own.get();
  tier_.Keep(own);

  auto found = tier_.Find("j", 4, TensorItem("w", 0, 8), crc);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->first.get(), raw);
  EXPECT_EQ(found->second, &raw->items[0]);
  auto bytes = tier_.Find("j", 4, BytesItem("opt", 33), opt_crc);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->second, &raw->items[1]);

  EXPECT_THAT(tier_.Find("j", 4, TensorItem("w", 0, 4), crc).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("node 3 holds no 'w' [0:4, 0:4] of job 'j' "
                                 "step 4")));
  EXPECT_THAT(tier_.Find("j", 5, TensorItem("w", 0, 8), crc).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(tier_.Find("j", 4, TensorItem("w", 0, 8), crc ^ 1).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("node 3: in-memory 'w' [0:8, 0:4] of job "
                                 "'j' step 4 has crc32c")));

  // Memory damaged after the checksum: refused; a good replica of the same
  // box is used instead.
  raw->segment->data()[raw->items[0].offset + 5] ^= 0x40;
  EXPECT_THAT(
      tier_.Find("j", 4, TensorItem("w", 0, 8), crc).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("manifest says")));
  auto rep = MakeSet("j", 4, 0, true, {TensorItem("w", 0, 8)});
  ASSERT_EQ(rep->items[0].crc32c, crc);  // the same bytes
  ItemSet* rep_raw = rep.get();
  tier_.Keep(std::move(rep));
  auto good = tier_.Find("j", 4, TensorItem("w", 0, 8), crc);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->first.get(), rep_raw);
}

TEST_F(MemoryTierTest, FoundSetOutlivesItsEviction) {
  auto s = MakeSet("j", 1, 0, false, {TensorItem("w", 0, 8)});
  const uint32_t crc = s->items[0].crc32c;
  tier_.Keep(std::move(s));
  auto found = tier_.Find("j", 1, TensorItem("w", 0, 8), crc);
  ASSERT_TRUE(found.ok());
  tier_.Clear();
  EXPECT_EQ(tier_.counts().tier0_sets, 0);
  // The caller's reference keeps the bytes valid.
  EXPECT_EQ(
      storage::Crc32c(found->first->segment->data() + found->second->offset,
                      found->second->item.length()),
      crc);
}

TEST_F(MemoryTierTest, ConcurrentKeepsFindsAndEvictions) {
  std::vector<std::shared_ptr<ItemSet>> sets;
  for (int i = 0; i < 64; ++i) {
    sets.push_back(
        MakeSet("j", i % 8, i % 4, i % 2 == 0, {TensorItem("w", 0, 8)}));
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 2000; ++i) {
        const auto& s = sets[rng() % sets.size()];
        switch (rng() % 4) {
          case 0:
            tier_.Keep(s);
            break;
          case 1:
            tier_.EvictOldest();
            break;
          case 2: {
            auto f =
                tier_.Find("j", s->step, s->items[0].item, s->items[0].crc32c);
            if (f.ok() && f->first->step != s->step) ++bad;
            if (!f.ok() && f.status().code() != absl::StatusCode::kNotFound) {
              ++bad;
            }
            break;
          }
          default: {
            const v1::InventoryResponse inv = tier_.Inventory("j", s->step);
            for (const v1::HeldSet& h : inv.sets()) {
              if (h.items_size() != 1) ++bad;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  const MemoryTier::Counts c = tier_.counts();
  EXPECT_LE(c.tier0_sets, 4);
  EXPECT_LE(c.replica_sets, 4);
}

}  // namespace
}  // namespace cairn::agent
