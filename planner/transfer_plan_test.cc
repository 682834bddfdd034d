#include "planner/transfer_plan.h"

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

TEST(TransferPlanTest, RowsToColumnsSendsOnlyOverlaps) {
  TransferTensor t{"w",
                   DType::kFloat32,
                   {4, 8},
                   {{0, Box({0, 0}, {2, 8})}, {1, Box({2, 0}, {2, 8})}},
                   {{0, Box({0, 0}, {4, 4})}, {1, Box({0, 4}, {4, 4})}}};
  auto plan = BuildTransferPlan({t}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->sends.size(), 4u);
  // Sorted by (src, dst): 0->0 local, 0->1, 1->0, 1->1 local.
  EXPECT_TRUE(plan->sends[0].local);
  EXPECT_EQ(plan->sends[1].src_rank, 0);
  EXPECT_EQ(plan->sends[1].dst_rank, 1);
  EXPECT_EQ(plan->sends[1].box, Box({0, 4}, {2, 4}));
  EXPECT_EQ(plan->sends[1].bytes, 32u);
  EXPECT_TRUE(plan->sends[3].local);
  EXPECT_EQ(plan->network_bytes, 64u);
  EXPECT_EQ(plan->local_bytes, 64u);
  EXPECT_EQ(plan->messages.size(), 2u);
  EXPECT_EQ(plan->max_rank_send_bytes, 32u);
  EXPECT_EQ(plan->max_rank_recv_bytes, 32u);
}

TEST(TransferPlanTest, ReplicasShareTheLoadAndLocalCopiesArePreferred) {
  // One box replicated on ranks 0..3; ranks 4..11 want it; rank 2 too.
  TransferTensor t{"w", DType::kFloat32, {16}, {}, {}};
  for (int r = 0; r < 4; ++r) t.sources.push_back({r, Box({0}, {16})});
  for (int r = 4; r < 12; ++r) t.destinations.push_back({r, Box({0}, {16})});
  t.destinations.push_back({2, Box({0}, {16})});
  auto plan = BuildTransferPlan({t}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<int, int> sends_by_src;
  for (const TransferSend& s : plan->sends) {
    if (s.dst_rank == 2) {
      EXPECT_TRUE(s.local);
      EXPECT_EQ(s.src_rank, 2);
    } else {
      ++sends_by_src[s.src_rank];
    }
  }
  EXPECT_EQ(sends_by_src, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}, {3, 2}}));
  EXPECT_EQ(plan->max_rank_send_bytes, 128u);
}

TEST(TransferPlanTest, BucketsSmallSendsPerPeerPairAndDtype) {
  std::vector<TransferTensor> tensors;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(TransferTensor{"t" + std::to_string(i),
                                     i < 5 ? DType::kFloat32 : DType::kInt64,
                                     {100},
                                     {{0, Box({0}, {100})}},
                                     {{1, Box({0}, {100})}}});
  }
  tensors.push_back(TransferTensor{"big",
                                   DType::kFloat32,
                                   {1000},
                                   {{0, Box({0}, {1000})}},
                                   {{1, Box({0}, {1000})}}});
  TransferPlanOptions options;
  options.bucket_cap_bytes = 1000;
  auto plan = BuildTransferPlan(tensors, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // float32: big (4000 B, alone), then t0..t4 (400 B each: 2 + 2 + 1);
  // int64: t5..t9 (800 B each, one per message).
  ASSERT_EQ(plan->messages.size(), 1u + 3u + 5u);
  EXPECT_EQ(plan->messages[0].bytes, 4000u);
  EXPECT_EQ(plan->messages[0].parts.size(), 1u);
  EXPECT_EQ(plan->messages[1].parts.size(), 2u);
  EXPECT_EQ(plan->messages[1].parts[1].payload_offset, 400u);
  EXPECT_EQ(plan->messages[3].parts.size(), 1u);
  EXPECT_EQ(plan->messages[4].dtype, DType::kInt64);
}

TEST(TransferPlanTest, Errors) {
  TransferTensor overlap{"w",
                         DType::kFloat32,
                         {8},
                         {{0, Box({0}, {5})}, {1, Box({4}, {4})}},
                         {{2, Box({0}, {8})}}};
  auto s = BuildTransferPlan({overlap}, {}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("'w': source rank 1 box [4:8] partially "
                                    "overlaps source rank 0 box [0:5]")));

  TransferTensor gap{
      "w", DType::kFloat32, {8}, {{0, Box({0}, {4})}}, {{5, Box({2}, {4})}}};
  s = BuildTransferPlan({gap}, {}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("'w': the sources hold 2 of the 4 elements "
                                    "destination rank 5 wants in [2:6]; e.g. "
                                    "[4:6] is missing")));

  TransferTensor outside{
      "w", DType::kFloat32, {8}, {{0, Box({0}, {8})}}, {{3, Box({6}, {4})}}};
  s = BuildTransferPlan({outside}, {}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("'w': destination rank 3")));

  TransferTensor ok{"w", DType::kFloat32, {8}, {{0, Box({0}, {8})}}, {}};
  s = BuildTransferPlan({ok, ok}, {}).status();
  EXPECT_THAT(s.message(), HasSubstr("'w' is listed twice"));
  TransferTensor bad_dtype = ok;
  bad_dtype.dtype = DType::kUnspecified;
  EXPECT_THAT(BuildTransferPlan({bad_dtype}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  TransferPlanOptions zero;
  zero.bucket_cap_bytes = 0;
  EXPECT_THAT(BuildTransferPlan({ok}, zero),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Property: random source layouts (with replicas) and destination layouts
// over overlapping rank sets. Oracle: execute every send on real buffers
// whose elements hold their global index; every destination byte is written
// exactly once with the right value; each send comes from a rank that holds
// the box; messages respect the cap and carry every network send once.
TEST(TransferPlanTest, SendsDeliverEveryDestinationByteExactlyOnce) {
  std::mt19937_64 rng(77);
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<TransferTensor> tensors;
    const int n = static_cast<int>(testing::Uniform(rng, 1, 3));
    for (int k = 0; k < n; ++k) {
      TransferTensor t;
      t.fqn = "t" + std::to_string(k);
      t.dtype = k % 2 ? DType::kFloat32 : DType::kInt32;  // both 4 bytes
      t.global_shape = testing::RandomShape(rng, 4, 1, 6);
      auto src = AllChunks(testing::RandomLayout(rng, t.global_shape, 0),
                           t.global_shape);
      auto dst = AllChunks(
          testing::RandomLayout(rng, t.global_shape,
                                static_cast<int>(testing::Uniform(rng, 0, 6))),
          t.global_shape);
      ASSERT_TRUE(src.ok() && dst.ok());
      t.sources = *src;
      t.destinations = *dst;
      tensors.push_back(std::move(t));
    }
    TransferPlanOptions options;
    options.bucket_cap_bytes =
        static_cast<uint64_t>(testing::Uniform(rng, 1, 400));
    auto plan = BuildTransferPlan(tensors, options);
    ASSERT_TRUE(plan.ok()) << plan.status();

    std::vector<std::vector<std::vector<int32_t>>> dst(tensors.size());
    std::vector<std::vector<std::vector<int>>> writes(tensors.size());
    for (size_t k = 0; k < tensors.size(); ++k) {
      for (const RankChunk& d : tensors[k].destinations) {
        dst[k].emplace_back(static_cast<size_t>(Volume(d.box)), -1);
        writes[k].emplace_back(static_cast<size_t>(Volume(d.box)), 0);
      }
    }
    uint64_t network = 0;
    for (const TransferSend& s : plan->sends) {
      const TransferTensor& t = tensors[s.tensor];
      const RankChunk& from = t.sources[s.source_index];
      const RankChunk& to = t.destinations[s.dest_index];
      ASSERT_EQ(s.src_rank, from.rank);
      ASSERT_EQ(s.dst_rank, to.rank);
      ASSERT_EQ(s.local, s.src_rank == s.dst_rank);
      ASSERT_EQ(s.fqn, t.fqn);
      ASSERT_TRUE(Contains(from.box, s.box) && Contains(to.box, s.box));
      ASSERT_EQ(s.bytes, static_cast<uint64_t>(Volume(s.box)) * 4);
      if (!s.local) network += s.bytes;
      std::vector<int32_t> src_buf;
      testing::ForEachElement(from.box, t.global_shape, [&](int64_t f) {
        src_buf.push_back(static_cast<int32_t>(f));
      });
      auto& out = dst[s.tensor][s.dest_index];
      auto& cnt = writes[s.tensor][s.dest_index];
      for (const CopySegment& seg : CopySegments(from.box, to.box, s.box, 4)) {
        std::memcpy(
            reinterpret_cast<char*>(out.data()) + seg.dst_offset,
            reinterpret_cast<const char*>(src_buf.data()) + seg.src_offset,
            seg.length);
        for (uint64_t b = 0; b < seg.length; b += 4)
          ++cnt[(seg.dst_offset + b) / 4];
      }
    }
    ASSERT_EQ(plan->network_bytes, network);
    for (size_t k = 0; k < tensors.size(); ++k) {
      for (size_t d = 0; d < tensors[k].destinations.size(); ++d) {
        for (int c : writes[k][d]) ASSERT_EQ(c, 1);
        std::vector<int32_t> expect;
        testing::ForEachElement(
            tensors[k].destinations[d].box, tensors[k].global_shape,
            [&](int64_t f) { expect.push_back(static_cast<int32_t>(f)); });
        ASSERT_EQ(dst[k][d], expect);
      }
    }
    std::vector<int> in_message(plan->sends.size(), 0);
    for (const TransferMessage& m : plan->messages) {
      ASSERT_FALSE(m.parts.empty());
      ASSERT_TRUE(m.bytes <= options.bucket_cap_bytes || m.parts.size() == 1);
      uint64_t offset = 0;
      for (const auto& part : m.parts) {
        const TransferSend& s = plan->sends[part.send];
        ASSERT_EQ(s.src_rank, m.src_rank);
        ASSERT_EQ(s.dst_rank, m.dst_rank);
        ASSERT_EQ(s.dtype, m.dtype);
        ASSERT_FALSE(s.local);
        ASSERT_EQ(part.payload_offset, offset);
        offset += s.bytes;
        ++in_message[part.send];
      }
      ASSERT_EQ(m.bytes, offset);
    }
    for (size_t i = 0; i < plan->sends.size(); ++i) {
      ASSERT_EQ(in_message[i], plan->sends[i].local ? 0 : 1);
    }
  }
}

}  // namespace
}  // namespace cairn::planner
