#include "planner/load_plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/planner_testing.h"

namespace cairn::planner {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ChunkBox Box(const Dims& offsets, const Dims& sizes) {
  return ChunkBox{offsets, sizes};
}

StoredTensor Tensor(std::string fqn, Shape shape,
                    const std::vector<ChunkBox>& boxes,
                    DType dtype = DType::kFloat32) {
  StoredTensor t{std::move(fqn), dtype, std::move(shape), {}};
  uint64_t offset = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const uint64_t len =
        static_cast<uint64_t>(Volume(boxes[i])) * DTypeSize(dtype);
    t.chunks.push_back(StoredChunk{
        boxes[i], StorageLocation{"data/rank-00000.bin", offset, len},
        static_cast<uint32_t>(1000 + i)});
    offset += (len + 4095) / 4096 * 4096;
  }
  return t;
}

std::unique_ptr<LoadPlanner> MustCreate(std::vector<StoredTensor> tensors) {
  auto planner = LoadPlanner::Create(std::move(tensors));
  EXPECT_TRUE(planner.ok()) << planner.status();
  return planner.ok() ? std::move(*planner) : nullptr;
}

TEST(LoadPlanTest, ReshardsRowsIntoColumns) {
  // Saved by two ranks as row halves of [4, 8]; loaded as column halves.
  auto planner = MustCreate(
      {Tensor("w", {4, 8}, {Box({0, 0}, {2, 8}), Box({2, 0}, {2, 8})})});
  ASSERT_NE(planner, nullptr);
  auto reads = planner->Plan(
      {WantedChunk{"w", DType::kFloat32, {4, 8}, Box({0, 4}, {4, 4})}});
  ASSERT_TRUE(reads.ok()) << reads.status();
  ASSERT_EQ(reads->size(), 2u);
  const ReadItem& r0 = (*reads)[0];
  EXPECT_EQ(r0.fqn, "w");
  EXPECT_EQ(r0.dest_index, 0);
  EXPECT_EQ(r0.source_chunk, 0);
  EXPECT_EQ(r0.overlap, Box({0, 4}, {2, 4}));
  EXPECT_EQ(r0.source.offset, 0u);
  EXPECT_EQ(r0.source.length, 64u);
  EXPECT_EQ(r0.source_crc32c, 1000u);
  EXPECT_THAT(r0.segments, ::testing::ElementsAre(CopySegment{16, 0, 16},
                                                  CopySegment{48, 16, 16}));
  EXPECT_EQ((*reads)[1].source_chunk, 1);
  EXPECT_EQ((*reads)[1].source.offset, 4096u);
  EXPECT_EQ((*reads)[1].segments[0], (CopySegment{16, 32, 16}));
}

TEST(LoadPlanTest, TooManyCopySegmentsIsResourceExhaustedBeforeAllocating) {
  // Column halves of an int8 [2^22 + 1, 2] tensor (8 MiB stored): reading it
  // whole is one segment per row and chunk, 2^23 + 2 in all. cairnd used to
  // allocate them all (found by fuzz/plan_convert_fuzzer at 2^28 rows: 6 GiB
  // for one request); now the call fails before any segment is built.
  const int64_t rows = (int64_t{1} << 22) + 1;
  auto planner = MustCreate(
      {Tensor("emb", {rows, 2},
              {Box({0, 0}, {rows, 1}), Box({0, 1}, {rows, 1})}, DType::kInt8)});
  ASSERT_NE(planner, nullptr);
  auto reads = planner->Plan(
      {WantedChunk{"emb", DType::kInt8, {rows, 2}, Box({0, 0}, {rows, 2})}});
  EXPECT_THAT(
      reads,
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          HasSubstr(
              "'emb' wanted chunk 0 [0:4194305, 0:2]: reading it needs more "
              "than 8388608 copy segments in one plan (stored chunk "
              "[0:4194305, 1:2] alone needs 4194305)")));
  // Half the rows is within the bound, and exact.
  reads = planner->Plan({WantedChunk{
      "emb", DType::kInt8, {rows, 2}, Box({0, 0}, {rows / 2, 2})}});
  ASSERT_TRUE(reads.ok()) << reads.status();
  ASSERT_EQ(reads->size(), 2u);
  EXPECT_EQ((*reads)[0].segments.size(), static_cast<size_t>(rows / 2));
}

TEST(LoadPlanTest, WholeTrailingDimsAreOneRange) {
  auto planner = MustCreate({Tensor("w", {8, 4}, {Box({0, 0}, {8, 4})})});
  auto reads = planner->Plan(
      {WantedChunk{"w", DType::kFloat32, {8, 4}, Box({2, 0}, {3, 4})}});
  ASSERT_TRUE(reads.ok());
  ASSERT_EQ(reads->size(), 1u);
  EXPECT_THAT((*reads)[0].segments,
              ::testing::ElementsAre(CopySegment{32, 0, 48}));
}

TEST(LoadPlanTest, ErrorsNameTheFqnAndSayWhatDiffers) {
  auto planner = MustCreate(
      {Tensor("w", {4, 4}, {Box({0, 0}, {2, 4})}),  // rows 2..3 missing
       Tensor("b", {4}, {Box({0}, {4})}, DType::kBFloat16)});
  ASSERT_NE(planner, nullptr);
  auto missing =
      planner->Plan({WantedChunk{"nope", DType::kFloat32, {4}, Box({0}, {4})}});
  EXPECT_THAT(missing,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  // Nothing of it wanted (an empty box): nothing to read, nothing missing.
  auto none = planner->Plan(
      {WantedChunk{"nope", DType::kFloat32, {4}, Box({0}, {0})},
       WantedChunk{"nope2", DType::kFloat32, {0, 4}, Box({0, 0}, {0, 4})}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  // A scalar's box is never empty.
  EXPECT_THAT(
      planner->Plan({WantedChunk{"nope", DType::kFloat32, {}, Box({}, {})}}),
      StatusIs(absl::StatusCode::kNotFound));

  auto dtype =
      planner->Plan({WantedChunk{"b", DType::kFloat32, {4}, Box({0}, {4})}});
  EXPECT_THAT(
      dtype,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'b': saved bfloat16 [4], requested float32 [4]")));

  auto shape =
      planner->Plan({WantedChunk{"b", DType::kBFloat16, {5}, Box({0}, {4})}});
  EXPECT_THAT(
      shape, StatusIs(absl::StatusCode::kInvalidArgument,
                      HasSubstr("saved bfloat16 [4], requested bfloat16 [5]")));

  auto outside =
      planner->Plan({WantedChunk{"b", DType::kBFloat16, {4}, Box({2}, {3})}});
  EXPECT_THAT(outside, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("exceeds shape [4]")));

  auto uncovered = planner->Plan(
      {WantedChunk{"w", DType::kFloat32, {4, 4}, Box({1, 0}, {2, 4})}});
  EXPECT_THAT(
      uncovered,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("holds 4 of the 8 elements of 'w' wanted chunk [1:3, "
                         "0:4]; e.g. [2:3, 0:4] is missing")));

  // Covered parts and empty boxes plan fine.
  auto ok = planner->Plan(
      {WantedChunk{"w", DType::kFloat32, {4, 4}, Box({0, 0}, {2, 4})},
       WantedChunk{"w", DType::kFloat32, {4, 4}, Box({3, 0}, {0, 4})}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 1u);
  EXPECT_EQ(planner->Find("w"), 0);
  EXPECT_EQ(planner->Find("x"), -1);
}

// Two plans of the same wanted chunks: the same items, field by field.
void ExpectSameItems(const std::vector<ReadItem>& got,
                     const std::vector<ReadItem>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string where = absl::StrCat(what, " item ", i);
    EXPECT_EQ(got[i].fqn, want[i].fqn) << where;
    EXPECT_EQ(got[i].dest_index, want[i].dest_index) << where;
    EXPECT_EQ(got[i].source_chunk, want[i].source_chunk) << where;
    EXPECT_EQ(got[i].overlap, want[i].overlap) << where;
    EXPECT_EQ(got[i].source, want[i].source) << where;
    EXPECT_EQ(got[i].source_crc32c, want[i].source_crc32c) << where;
    EXPECT_EQ(got[i].segments, want[i].segments) << where;
  }
}

TEST(LoadPlanTest, WantedByTensorIndexPlansAsByNameAndNamesTheFqn) {
  auto planner = MustCreate(
      {Tensor("w", {4, 4}, {Box({0, 0}, {2, 4}), Box({2, 0}, {1, 4})}),
       Tensor("b", {4}, {Box({0}, {4})}, DType::kBFloat16)});
  ASSERT_NE(planner, nullptr);
  const int w = planner->Find("w");
  const int b = planner->Find("b");
  const std::vector<WantedBox> by_index = {WantedBox{b, Box({1}, {2})},
                                           WantedBox{w, Box({1, 1}, {2, 2})},
                                           WantedBox{w, Box({0, 0}, {0, 4})}};
  std::vector<WantedChunk> by_name;
  for (const WantedBox& x : by_index) by_name.push_back(planner->Named(x));
  EXPECT_EQ(by_name[0].fqn, "b");
  EXPECT_EQ(by_name[0].dtype, DType::kBFloat16);
  EXPECT_EQ(by_name[1].global_shape, (Shape{4, 4}));
  auto got = planner->Plan(by_index);
  auto want = planner->Plan(by_name);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), 3u);  // b once, w from both of its chunks
  ExpectSameItems(*got, *want, "by index");

  for (int bad : {-1, 2, 1 << 30}) {
    auto no_tensor = planner->Plan(std::vector<WantedBox>{
        WantedBox{w, Box({0, 0}, {1, 1})}, WantedBox{bad, Box({0}, {1})}});
    EXPECT_THAT(
        no_tensor,
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr(absl::StrCat("wanted chunk 1 names stored tensor ",
                                        bad, " of 2"))));
  }
  // A run of values: the same items; too few or too many values, or a bad
  // index, refused naming the wanted chunk.
  const std::vector<int> order = {b, w, w};
  const std::vector<int64_t> values = {1, 2, 1, 1, 2, 2, 0, 0, 0, 4};
  auto run = planner->Plan(WantedBoxRun{order, values});
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectSameItems(*run, *want, "run");
  const std::vector<int64_t> fewer(values.begin(), values.end() - 1);
  auto short_run = planner->Plan(WantedBoxRun{order, fewer});
  EXPECT_THAT(
      short_run,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("the wanted boxes end at wanted chunk 2 ('w'): 9 "
                         "values for 3 wanted chunks")));
  std::vector<int64_t> more = values;
  more.push_back(0);
  auto long_run = planner->Plan(WantedBoxRun{order, more});
  EXPECT_THAT(
      long_run,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("the wanted boxes hold 1 values after those of the "
                         "last of 3 wanted chunks")));
  const std::vector<int> bad_order = {b, 2, w};
  auto bad_run = planner->Plan(WantedBoxRun{bad_order, values});
  EXPECT_THAT(bad_run,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wanted chunk 1 names stored tensor 2 of 2")));
  const std::vector<int64_t> beyond = {2, 3, 1, 1, 2, 2, 0, 0, 0, 4};
  auto outside_run = planner->Plan(WantedBoxRun{order, beyond});
  EXPECT_THAT(outside_run.status().message(),
              HasSubstr("'b' wanted chunk 0: chunk [2:5] exceeds shape [4]"));

  auto outside =
      planner->Plan(std::vector<WantedBox>{WantedBox{b, Box({2}, {3})}});
  EXPECT_THAT(
      outside,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'b' wanted chunk 0: chunk [2:5] exceeds shape [4]")));
  auto dims =
      planner->Plan(std::vector<WantedBox>{WantedBox{w, Box({0}, {4})}});
  EXPECT_THAT(dims, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("'w' wanted chunk 0")));
  auto uncovered =
      planner->Plan(std::vector<WantedBox>{WantedBox{w, Box({2, 0}, {2, 4})}});
  EXPECT_THAT(
      uncovered,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("holds 4 of the 8 elements of 'w' wanted chunk [2:4, "
                         "0:4]; e.g. [3:4, 0:4] is missing")));
}

TEST(LoadPlanTest, CreateRejectsBadManifests) {
  struct Case {
    std::vector<StoredTensor> tensors;
    const char* substr;
  };
  StoredTensor bad_len = Tensor("w", {4}, {Box({0}, {4})});
  bad_len.chunks[0].location.length = 3;
  std::vector<Case> cases = {
      {{Tensor("w", {4}, {Box({0}, {3}), Box({2}, {2})})},
       "'w': stored chunks [0:3] and [2:4] overlap"},
      {{Tensor("w", {4}, {Box({0}, {4}), Box({0}, {4})})}, "overlap"},
      {{Tensor("w", {4}, {Box({0}, {5})})}, "exceeds shape [4]"},
      {{Tensor("w", {4}, {}), Tensor("w", {4}, {})}, "'w' twice"},
      {{Tensor("", {4}, {})}, "no fqn"},
      {{Tensor("w", {4}, {}, DType::kUnspecified)}, "unknown dtype"},
      {{bad_len}, "has length 3 bytes; float32 needs 16"},
      // A tiling met before is checked against each tensor's shape; one
      // that differs from it by a box is checked for overlaps.
      {{Tensor("a", {4}, {Box({0}, {2}), Box({2}, {2})}),
        Tensor("b", {3}, {Box({0}, {2}), Box({2}, {2})})},
       "'b' stored chunk 1: chunk [2:4] exceeds shape [3]"},
      {{Tensor("a", {4}, {Box({0}, {2}), Box({2}, {2})}),
        Tensor("b", {4}, {Box({0}, {2}), Box({1}, {2})})},
       "'b': stored chunks [0:2] and [1:3] overlap"},
  };
  for (Case& c : cases) {
    auto p = LoadPlanner::Create(std::move(c.tensors));
    EXPECT_THAT(
        p, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.substr)))
        << c.substr;
  }
  // A chunk naming an object by an index past the builder's objects.
  LoadPlanner::Builder builder({"data/rank-00000.bin"});
  StoredTensorByIndex past{"w", DType::kFloat32, {4}, {}};
  past.chunks.push_back(StoredChunkByIndex{Box({0}, {4}), 1, 0, 16, 0});
  const absl::Status s = builder.Add(std::move(past));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("'w' stored chunk [0:4] names object 1 "
                                    "of 1")));
}

// Tensors stored in the same tiling share one overlap index; each keeps its
// own locations and checksums.
TEST(LoadPlanTest, TensorsInTheSameTilingShareAnIndex) {
  const std::vector<ChunkBox> rows = {Box({0, 0}, {2, 8}), Box({2, 0}, {2, 8})};
  const std::vector<ChunkBox> cols = {Box({0, 0}, {4, 4}), Box({0, 4}, {4, 4})};
  std::vector<StoredTensor> tensors;
  for (int layer = 0; layer < 40; ++layer) {
    for (const auto& [name, tiling] :
         {std::pair{"attn", rows}, std::pair{"mlp", cols}}) {
      StoredTensor t = Tensor("layers." + std::to_string(layer) + "." + name,
                              {4, 8}, tiling);
      for (StoredChunk& c : t.chunks) {
        c.location.offset += 1 << 20 * (layer % 2);
        c.crc32c += 100 * layer;
      }
      tensors.push_back(std::move(t));
    }
  }
  const std::vector<StoredTensor> given = tensors;
  auto planner = MustCreate(std::move(tensors));
  ASSERT_NE(planner, nullptr);
  EXPECT_EQ(planner->num_indexes(), 2);
  for (int t = 0; t < planner->num_tensors(); ++t) {
    auto reads = planner->Plan(
        {{given[t].fqn, DType::kFloat32, {4, 8}, Box({1, 2}, {2, 4})}});
    ASSERT_TRUE(reads.ok()) << reads.status();
    uint64_t bytes = 0;
    for (const ReadItem& r : *reads) {
      const StoredChunk& source = given[t].chunks[r.source_chunk];
      EXPECT_EQ(r.source, source.location) << given[t].fqn;
      EXPECT_EQ(r.source_crc32c, source.crc32c) << given[t].fqn;
      ChunkBox overlap;
      ASSERT_TRUE(Intersect(source.box, Box({1, 2}, {2, 4}), &overlap));
      EXPECT_EQ(r.overlap, overlap);
      bytes += static_cast<uint64_t>(Volume(r.overlap)) * 4;
    }
    EXPECT_EQ(bytes, 2u * 4u * 4u) << given[t].fqn;
  }
}

// A rank's load names many tensors stored in the same few tilings, often
// with the same box: PlanEach works out each (tiling, box) overlap once and
// reuses it (evicting past a few dozen pairs). Whatever it reuses, every
// wanted chunk must get exactly the items it gets planned on its own: its
// own tensor's records, lengths of its own dtype, the same segments.
TEST(LoadPlanTest, ReusedOverlapsGiveEachWantedChunkItsOwnItems) {
  std::vector<std::vector<ChunkBox>> tilings(3);
  for (int i = 0; i < 4; ++i) tilings[0].push_back(Box({3 * i, 0}, {3, 12}));
  for (int i = 0; i < 3; ++i) tilings[1].push_back(Box({0, 4 * i}, {12, 4}));
  for (int i = 0; i < 4; ++i) {
    tilings[2].push_back(Box({6 * (i / 2), 6 * (i % 2)}, {6, 6}));
  }
  std::vector<StoredTensor> tensors;
  for (int t = 0; t < 60; ++t) {
    StoredTensor tensor =
        Tensor(absl::StrCat("t", 100 + t), {12, 12}, tilings[t % 3],
               t % 2 == 0 ? DType::kFloat32 : DType::kBFloat16);
    for (StoredChunk& c : tensor.chunks) {
      c.location.object_key = absl::StrCat("data/rank-", t % 5, ".bin");
      c.location.offset += uint64_t{1} << (20 + t % 7);
      c.crc32c += 17 * t;
    }
    tensors.push_back(std::move(tensor));
  }
  auto planner = MustCreate(std::move(tensors));
  ASSERT_NE(planner, nullptr);
  ASSERT_EQ(planner->num_indexes(), 3);
  std::mt19937 rng(20261127);
  auto coord = [&](int n) {
    return static_cast<int64_t>(std::uniform_int_distribution<int>(0, n)(rng));
  };
  std::vector<ChunkBox> pool;  // 50 boxes: more pairs than are kept
  while (pool.size() < 50) {
    const int64_t r = coord(11), c = coord(11);
    pool.push_back(Box({r, c}, {1 + coord(static_cast<int>(11 - r)),
                                1 + coord(static_cast<int>(11 - c))}));
  }
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<WantedBox> wanted;
    for (int t = 0; t < planner->num_tensors(); ++t) {
      for (int k = coord(2); k >= 0; --k) {
        wanted.push_back(WantedBox{
            t, pool[static_cast<size_t>(coord(trial < 10 ? 3 : 49))]});
      }
    }
    absl::StatusOr<std::vector<ReadItem>> all = planner->Plan(wanted);
    ASSERT_TRUE(all.ok()) << all.status();
    // The same boxes as one run of values (a short request's) plan to the
    // same items.
    std::vector<int> order;
    std::vector<int64_t> values;
    for (const WantedBox& x : wanted) {
      order.push_back(x.tensor);
      values.insert(values.end(), x.box.offsets.begin(), x.box.offsets.end());
      values.insert(values.end(), x.box.sizes.begin(), x.box.sizes.end());
    }
    absl::StatusOr<std::vector<ReadItem>> run =
        planner->Plan(WantedBoxRun{order, values});
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectSameItems(*run, *all, absl::StrCat("trial ", trial, " run"));
    size_t next = 0;
    for (size_t w = 0; w < wanted.size(); ++w) {
      absl::StatusOr<std::vector<ReadItem>> alone =
          planner->Plan(absl::MakeConstSpan(&wanted[w], 1));
      ASSERT_TRUE(alone.ok()) << alone.status();
      for (const ReadItem& want : *alone) {
        ASSERT_LT(next, all->size()) << "wanted chunk " << w;
        const ReadItem& got = (*all)[next++];
        const std::string where =
            absl::StrCat("trial ", trial, " wanted chunk ", w, " (", want.fqn,
                         ") stored chunk ", want.source_chunk);
        EXPECT_EQ(got.dest_index, static_cast<int>(w)) << where;
        EXPECT_EQ(got.fqn, want.fqn) << where;
        EXPECT_EQ(got.source_chunk, want.source_chunk) << where;
        EXPECT_EQ(got.overlap, want.overlap) << where;
        EXPECT_EQ(got.source.object_key, want.source.object_key) << where;
        EXPECT_EQ(got.source.offset, want.source.offset) << where;
        EXPECT_EQ(got.source.length, want.source.length) << where;
        EXPECT_EQ(got.source_crc32c, want.source_crc32c) << where;
        EXPECT_EQ(got.segments, want.segments) << where;
      }
    }
    EXPECT_EQ(next, all->size()) << "trial " << trial;
  }
}

// MemoryBytes charges each chunk its record and its place in the location
// lookup, each distinct overlap index once (a tiling shared by 40 layers is
// not charged 40 times), and grows with the chunks.
TEST(LoadPlanTest, MemoryBytesCountsChunksAndEachSharedIndexOnce) {
  auto layers = [](int n, int tiles) {
    std::vector<ChunkBox> tiling;
    for (int i = 0; i < tiles; ++i) tiling.push_back(Box({i, 0}, {1, 8}));
    std::vector<StoredTensor> tensors;
    for (int layer = 0; layer < n; ++layer) {
      tensors.push_back(
          Tensor("layers." + std::to_string(layer), {tiles, 8}, tiling));
    }
    return MustCreate(std::move(tensors));
  };
  auto one = layers(1, 1000);
  auto forty = layers(40, 1000);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(forty, nullptr);
  ASSERT_EQ(forty->num_indexes(), 1);
  // 16-byte records plus a 4-byte lookup entry per chunk, at least.
  EXPECT_GE(one->MemoryBytes(), 1000u * 20u);
  EXPECT_GE(forty->MemoryBytes(), 40000u * 20u);
  // The index (1000 2-D boxes: >= 32 bytes each) is in the one, and charged
  // once in the forty: they differ by about 39 x 1000 chunks' records.
  const size_t index_bytes = one->MemoryBytes() - 1000u * 20u;
  EXPECT_GE(index_bytes, 1000u * 32u);
  EXPECT_LT(forty->MemoryBytes(), 40000u * 40u + index_bytes);
}

// The planner keeps each stored chunk in a compact form (its box in the
// overlap index, its object as an index): every chunk must come back as it
// was given, and be found again by its location. Random tensors of 1-4 dims
// (sizes from 0, so with empty chunks), some with no chunks, over a few
// objects, their chunks laid out in the order listed or shuffled.
TEST(LoadPlanTest, KeepsEveryStoredChunkAndFindsItByLocation) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<StoredTensor> tensors;
    const int num_tensors = static_cast<int>(testing::Uniform(rng, 1, 8));
    const int num_objects = static_cast<int>(testing::Uniform(rng, 1, 4));
    std::vector<uint64_t> next_offset(num_objects, 0);
    for (int t = 0; t < num_tensors; ++t) {
      StoredTensor st;
      st.fqn = "t" + std::to_string(t);
      st.dtype = testing::Uniform(rng, 0, 1) ? DType::kFloat32 : DType::kInt8;
      st.global_shape = testing::RandomShape(rng, 4, 0, 6);
      std::vector<ChunkBox> boxes;
      if (t > 0 && testing::Uniform(rng, 0, 2) == 0) {
        // An earlier tensor's tiling again (layers of a model): shared, and
        // the tilings' tensors interleaved (their records are kept tiling by
        // tiling).
        const StoredTensor& earlier =
            tensors[testing::Uniform(rng, 0, static_cast<int>(t) - 1)];
        st.global_shape = earlier.global_shape;
        for (const StoredChunk& c : earlier.chunks) boxes.push_back(c.box);
      } else if (testing::Uniform(rng, 0, 4) > 0) {
        boxes = testing::RandomTiling(rng, st.global_shape, 12);
      }
      for (const ChunkBox& b : boxes) {
        const int o =
            static_cast<int>(testing::Uniform(rng, 0, num_objects - 1));
        const uint64_t len =
            static_cast<uint64_t>(Volume(b)) * DTypeSize(st.dtype);
        st.chunks.push_back(StoredChunk{
            b,
            StorageLocation{"obj-" + std::to_string(o) + "-of-a-long-key",
                            next_offset[o], len},
            static_cast<uint32_t>(rng())});
        next_offset[o] += len + 2;  // offset + 1 is never a chunk start
      }
      tensors.push_back(std::move(st));
    }
    if (iter % 2 == 1) {
      // Objects whose chunks are not laid out in the order they are listed
      // (ChunkAt's index then sorts them by offset).
      std::vector<std::vector<StoredChunk*>> in_object(num_objects);
      for (StoredTensor& st : tensors) {
        for (StoredChunk& c : st.chunks) {
          in_object[c.location.object_key[4] - '0'].push_back(&c);
        }
      }
      for (std::vector<StoredChunk*>& chunks : in_object) {
        std::shuffle(chunks.begin(), chunks.end(), rng);
        uint64_t offset = 0;
        for (StoredChunk* c : chunks) {
          c->location.offset = offset;
          offset += c->location.length + 2;
        }
      }
    }
    const std::vector<StoredTensor> given = tensors;
    std::unique_ptr<LoadPlanner> planner;
    if (iter % 3 == 2) {
      // The same chunks naming their objects by index into a list in
      // another order, holding one object no chunk is in.
      std::vector<std::string> objects;
      for (int o = 0; o <= num_objects; ++o) {
        objects.push_back("obj-" + std::to_string(o) + "-of-a-long-key");
      }
      std::shuffle(objects.begin(), objects.end(), rng);
      auto index_of = [&](const std::string& key) {
        return static_cast<uint32_t>(
            std::find(objects.begin(), objects.end(), key) - objects.begin());
      };
      LoadPlanner::Builder builder(objects);
      for (StoredTensor& st : tensors) {
        StoredTensorByIndex by_index{st.fqn, st.dtype, st.global_shape, {}};
        for (const StoredChunk& c : st.chunks) {
          by_index.chunks.push_back(StoredChunkByIndex{
              c.box, index_of(c.location.object_key), c.location.offset,
              c.location.length, c.crc32c});
        }
        ASSERT_TRUE(builder.Add(std::move(by_index)).ok());
      }
      planner = std::move(builder).Finish();
    } else {
      planner = MustCreate(std::move(tensors));
    }
    ASSERT_NE(planner, nullptr);
    ASSERT_EQ(planner->num_tensors(), num_tensors);
    if (iter % 4 == 0) {
      // First lookups from several threads at once: ChunkAt's index is
      // built once, by whichever comes first, and each finds every chunk.
      std::atomic<int> found{0};
      int stored = 0;
      for (const StoredTensor& g : given) stored += g.chunks.size();
      std::vector<std::thread> threads;
      for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&] {
          for (const StoredTensor& g : given) {
            for (const StoredChunk& c : g.chunks) {
              if (planner->ChunkAt(c.location.object_key, c.location.offset)) {
                ++found;
              }
            }
          }
        });
      }
      for (std::thread& th : threads) th.join();
      ASSERT_EQ(found.load(), 4 * stored);
    }
    uint32_t ids = 0;  // tensor by tensor
    for (int t = 0; t < num_tensors; ++t) {
      const StoredTensor& g = given[t];
      ASSERT_EQ(planner->fqn(t), g.fqn);
      ASSERT_EQ(planner->Find(g.fqn), t);
      ASSERT_EQ(planner->dtype(t), g.dtype);
      ASSERT_EQ(planner->global_shape(t), g.global_shape);
      ASSERT_EQ(planner->num_chunks(t), static_cast<int>(g.chunks.size()));
      for (int c = 0; c < planner->num_chunks(t); ++c) {
        ASSERT_EQ(planner->ChunkOfId(ids), std::make_pair(t, c));
        ++ids;
        const StoredChunkView v = planner->chunk(t, c);
        ASSERT_EQ(v.box, g.chunks[c].box) << g.fqn << " chunk " << c;
        ASSERT_EQ(v.location(), g.chunks[c].location);
        ASSERT_EQ(v.crc32c, g.chunks[c].crc32c);
        const auto at = planner->ChunkAt(g.chunks[c].location.object_key,
                                         g.chunks[c].location.offset);
        ASSERT_TRUE(at.has_value());
        ASSERT_EQ(*at, std::make_pair(t, c));
        // Not a chunk's start, or not an object of the checkpoint.
        ASSERT_FALSE(planner
                         ->ChunkAt(g.chunks[c].location.object_key,
                                   g.chunks[c].location.offset + 1)
                         .has_value());
        ASSERT_FALSE(
            planner->ChunkAt("no-such-object", g.chunks[c].location.offset)
                .has_value());
      }
    }
    ASSERT_EQ(planner->num_chunk_ids(), ids);
    ASSERT_FALSE(planner->ChunkOfId(ids).has_value());
  }
}

// Property: random stored tilings (layout chunks or irregular tilings, some
// with a tile missing) and random wanted chunks (another layout's chunks or
// random boxes). Oracle: execute every read on real buffers whose elements
// hold their global index; every wanted byte must be written exactly once
// with the right value, or the plan must fail with FAILED_PRECONDITION iff a
// wanted box touches the missing tile.
TEST(LoadPlanTest, ReadsReassembleEveryWantedByteExactlyOnce) {
  std::mt19937_64 rng(42);
  int planned = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    const Shape shape = testing::RandomShape(rng, 5, 1, 7);
    std::vector<ChunkBox> stored;
    if (iter % 2 == 0) {
      auto all = AllChunks(testing::RandomLayout(rng, shape), shape);
      ASSERT_TRUE(all.ok());
      for (const RankChunk& rc : *all) stored.push_back(rc.box);
      std::sort(stored.begin(), stored.end());
      stored.erase(std::unique(stored.begin(), stored.end()), stored.end());
    } else {
      stored = testing::RandomTiling(rng, shape, 40);
    }
    std::shuffle(stored.begin(), stored.end(), rng);
    ChunkBox dropped;
    const bool drop = iter % 5 == 4 && stored.size() > 1 && !IsEmpty(stored[0]);
    if (drop) {
      dropped = stored[0];
      stored.erase(stored.begin());
    }
    auto planner = MustCreate({Tensor("w", shape, stored, DType::kInt32)});
    ASSERT_NE(planner, nullptr);

    std::vector<WantedChunk> wanted;
    if (iter % 3 == 0) {
      const DTensorLayout layout = testing::RandomLayout(rng, shape);
      const int rank = layout.mesh.ranks[0];
      auto mine = LocalChunks(layout, shape, rank);
      ASSERT_TRUE(mine.ok());
      for (const ChunkBox& b : *mine) {
        wanted.push_back({"w", DType::kInt32, shape, b});
      }
    }
    const int extra = static_cast<int>(testing::Uniform(rng, 1, 4));
    for (int k = 0; k < extra; ++k) {
      wanted.push_back(
          {"w", DType::kInt32, shape, testing::RandomBox(rng, shape, k == 3)});
    }
    bool touches_gap = false;
    for (const WantedChunk& w : wanted) {
      touches_gap |= drop && Intersect(w.box, dropped, nullptr);
    }
    auto reads = planner->Plan(wanted);
    if (touches_gap) {
      ASSERT_THAT(reads, StatusIs(absl::StatusCode::kFailedPrecondition));
      ++rejected;
      continue;
    }
    ASSERT_TRUE(reads.ok()) << reads.status();
    ++planned;

    // Stored buffers: int32 global flat index per element.
    std::vector<std::vector<int32_t>> src(stored.size());
    for (size_t c = 0; c < stored.size(); ++c) {
      testing::ForEachElement(stored[c], shape, [&](int64_t f) {
        src[c].push_back(static_cast<int32_t>(f));
      });
    }
    std::vector<std::vector<int32_t>> dst(wanted.size());
    std::vector<std::vector<int>> writes(wanted.size());
    for (size_t w = 0; w < wanted.size(); ++w) {
      dst[w].assign(static_cast<size_t>(Volume(wanted[w].box)), -1);
      writes[w].assign(dst[w].size() * 4, 0);
    }
    int last_dest = -1;
    for (const ReadItem& r : *reads) {
      ASSERT_GE(r.dest_index, last_dest);  // grouped by wanted chunk
      last_dest = r.dest_index;
      ASSERT_EQ(r.source, planner->chunk(0, r.source_chunk).location());
      ChunkBox expect;
      ASSERT_TRUE(
          Intersect(stored[r.source_chunk], wanted[r.dest_index].box, &expect));
      ASSERT_EQ(r.overlap, expect);
      uint64_t last_src = 0;
      for (const CopySegment& s : r.segments) {
        ASSERT_GE(s.src_offset, last_src);
        last_src = s.src_offset + s.length;
        ASSERT_LE(s.src_offset + s.length, r.source.length);
        ASSERT_LE(s.dst_offset + s.length, dst[r.dest_index].size() * 4);
        std::memcpy(
            reinterpret_cast<char*>(dst[r.dest_index].data()) + s.dst_offset,
            reinterpret_cast<const char*>(src[r.source_chunk].data()) +
                s.src_offset,
            s.length);
        for (uint64_t b = 0; b < s.length; ++b)
          ++writes[r.dest_index][s.dst_offset + b];
      }
    }
    for (size_t w = 0; w < wanted.size(); ++w) {
      for (int c : writes[w]) ASSERT_EQ(c, 1);
      std::vector<int32_t> expect;
      testing::ForEachElement(wanted[w].box, shape, [&](int64_t f) {
        expect.push_back(static_cast<int32_t>(f));
      });
      ASSERT_EQ(dst[w], expect);
    }
  }
  EXPECT_GT(planned, 1000);
  EXPECT_GT(rejected, 50);
}

}  // namespace
}  // namespace cairn::planner
