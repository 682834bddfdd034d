// Unit tests for proto/convert: every *FromProto rejection path (what a
// hostile or buggy peer can put on the wire) is INVALID_ARGUMENT naming the
// fqn and the defect, and planner types survive planner -> proto -> planner
// unchanged on many random plans (fixed seed).
#include "proto/convert/plan_convert.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::convert {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// EXPECT that `s` is INVALID_ARGUMENT and its message holds every piece.
template <typename T>
void ExpectInvalid(const absl::StatusOr<T>& s,
                   const std::vector<std::string>& pieces) {
  ASSERT_FALSE(s.ok()) << "accepted; expected INVALID_ARGUMENT";
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  for (const std::string& p : pieces) {
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(p));
  }
}

v1::ChunkBox Box(std::vector<int64_t> offsets, std::vector<int64_t> sizes) {
  v1::ChunkBox b;
  for (int64_t o : offsets) b.add_offsets(o);
  for (int64_t s : sizes) b.add_sizes(s);
  return b;
}

v1::WriteItem TensorItem(const std::string& fqn, v1::DType dtype,
                         std::vector<int64_t> shape, v1::ChunkBox box,
                         uint64_t length) {
  v1::WriteItem w;
  w.set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
  w.mutable_tensor()->set_fqn(fqn);
  w.mutable_tensor()->set_dtype(dtype);
  for (int64_t d : shape) w.mutable_tensor()->add_global_shape(d);
  *w.mutable_chunk() = std::move(box);
  w.set_length(length);
  return w;
}

// --- DType ---

TEST(PlanConvertTest, EveryPlannerDTypeRoundTripsAndUnknownOnesAreRejected) {
  for (int v = 1; v <= 12; ++v) {
    const auto d = static_cast<planner::DType>(v);
    ASSERT_GT(planner::DTypeSize(d), 0u) << v;
    absl::StatusOr<planner::DType> back = DTypeFromProto(DTypeToProto(d), "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, d);
  }
  ExpectInvalid(DTypeFromProto(v1::DTYPE_UNSPECIFIED, "layers.0.wq"),
                {"'layers.0.wq'", "unknown dtype 0"});
  ExpectInvalid(DTypeFromProto(static_cast<v1::DType>(13), "emb"),
                {"'emb'", "unknown dtype 13"});
  ExpectInvalid(DTypeFromProto(static_cast<v1::DType>(-7), "emb"),
                {"'emb'", "unknown dtype -7"});
  ExpectInvalid(DTypeFromProto(static_cast<v1::DType>(1 << 30), "emb"),
                {"unknown dtype 1073741824"});
}

// --- Boxes and shapes ---

TEST(PlanConvertTest, BoxWithDifferentNumbersOfOffsetsAndSizesIsRejected) {
  ExpectInvalid(BoxFromProto(Box({0, 0}, {4}), "model.wq"),
                {"chunk of 'model.wq'", "2 offsets but 1 sizes"});
  ExpectInvalid(BoxFromProto(Box({}, {4}), "model.wq"),
                {"0 offsets but 1 sizes"});
}

TEST(PlanConvertTest, BoxWithMoreThanMaxDimsIsRejected) {
  std::vector<int64_t> nine(planner::kMaxDims + 1, 1);
  ExpectInvalid(BoxFromProto(Box(nine, nine), "deep"),
                {"chunk of 'deep'", "9 dims", "at most 8"});
  std::vector<int64_t> eight(planner::kMaxDims, 1);
  EXPECT_TRUE(BoxFromProto(Box(eight, eight), "deep").ok());
}

TEST(PlanConvertTest, BoxWithANegativeOffsetOrSizeIsRejectedNamingTheDim) {
  ExpectInvalid(BoxFromProto(Box({0, -1}, {4, 4}), "w"),
                {"chunk of 'w'", "negative offset or size in dim 1"});
  ExpectInvalid(BoxFromProto(Box({0, 0, 0}, {4, 4, -4}), "w"),
                {"negative offset or size in dim 2"});
  ExpectInvalid(
      BoxFromProto(Box({std::numeric_limits<int64_t>::min()}, {1}), "w"),
      {"negative offset or size in dim 0"});
}

TEST(PlanConvertTest, BoxEndingPastInt64IsRejectedNotWrapped) {
  // offset + size would wrap to a negative end: every later Contains or
  // Intersect would be undefined behaviour.
  ExpectInvalid(BoxFromProto(Box({0, kInt64Max}, {4, 1}), "w"),
                {"chunk of 'w'", "dim 1", "ends past 2^63 - 1"});
  ExpectInvalid(BoxFromProto(Box({1}, {kInt64Max}), "w"),
                {"dim 0", "ends past 2^63 - 1"});
  ExpectInvalid(
      BoxFromProto(Box({kInt64Max / 2 + 1}, {kInt64Max / 2 + 1}), "w"),
      {"ends past 2^63 - 1"});
  // Ending exactly at 2^63 - 1 is representable.
  absl::StatusOr<planner::ChunkBox> edge =
      BoxFromProto(Box({kInt64Max - 5}, {5}), "w");
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ(edge->offsets[0], kInt64Max - 5);
  absl::StatusOr<planner::ChunkBox> whole =
      BoxFromProto(Box({0}, {kInt64Max}), "w");
  EXPECT_TRUE(whole.ok()) << whole.status();
}

TEST(PlanConvertTest, ScalarBoxAndEmptyBoxesConvert) {
  absl::StatusOr<planner::ChunkBox> scalar = BoxFromProto(Box({}, {}), "s");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->offsets.empty());
  absl::StatusOr<planner::ChunkBox> empty = BoxFromProto(Box({3}, {0}), "e");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->sizes[0], 0);
}

// The direct check VerifyLoad makes of a piece's box against the stored
// chunk agrees with converting the box and asking IsEmpty and Contains, on
// random boxes near the outer one's edges, hostile ones (negative, huge,
// wrong dims) among them.
TEST(PlanConvertTest, NonEmptyBoxInsideAgreesWithConvertingTheBox) {
  std::mt19937_64 rng(20261128);
  const std::vector<int64_t> extremes = {
      kInt64Max, kInt64Max - 1, std::numeric_limits<int64_t>::min(), -1};
  // Near [base, base + span] (which does not wrap), or an extreme value.
  auto pick = [&](int64_t base, int64_t span) -> int64_t {
    int64_t v = base;
    switch (rng() % 8) {
      case 0:
        return extremes[rng() % extremes.size()];
      case 1:
        return base;
      case 2:
        return base + span;
      default:
        if (__builtin_add_overflow(
                base, static_cast<int64_t>(rng() % (span + 3)) - 1, &v)) {
          return base;
        }
        return v;
    }
  };
  int inside = 0, outside = 0;
  for (int round = 0; round < 20000; ++round) {
    const int dims = static_cast<int>(rng() % 4);
    planner::ChunkBox outer;
    for (int d = 0; d < dims; ++d) {
      outer.offsets.push_back(static_cast<int64_t>(rng() % 100));
      outer.sizes.push_back(1 + static_cast<int64_t>(rng() % 20));
    }
    if (dims > 0 && rng() % 16 == 0) {
      outer.offsets[0] = kInt64Max - outer.sizes[0];  // ends at 2^63 - 1
    }
    // The piece mostly has the outer box's dims, sometimes one more or less.
    int piece_dims = dims;
    if (rng() % 10 == 0) piece_dims += (rng() % 2 == 0 && dims > 0) ? -1 : 1;
    std::vector<int64_t> offsets, sizes;
    for (int d = 0; d < piece_dims; ++d) {
      const int64_t o = d < dims ? outer.offsets[d] : 0;
      const int64_t s = d < dims ? outer.sizes[d] : 4;
      const int64_t offset = pick(o, s);
      offsets.push_back(offset);
      int64_t to_end = 0;  // a size reaching the outer box's end
      if (rng() % 2 == 0 || __builtin_sub_overflow(o + s, offset, &to_end)) {
        to_end = pick(0, s);
      }
      sizes.push_back(to_end);
    }
    v1::ChunkBox box = Box(offsets, sizes);
    if (rng() % 20 == 0) box.add_sizes(1);  // offsets and sizes disagree
    absl::StatusOr<planner::ChunkBox> converted = BoxFromProto(box, "w");
    const bool expected = converted.ok() && !planner::IsEmpty(*converted) &&
                          planner::Contains(outer, *converted);
    EXPECT_EQ(NonEmptyBoxInside(box, outer), expected)
        << "box " << box.ShortDebugString() << " outer "
        << planner::BoxToString(outer);
    (expected ? inside : outside)++;
  }
  // Both answers are common, so each side of the check is exercised.
  EXPECT_GT(inside, 2000);
  EXPECT_GT(outside, 2000);
}

TEST(PlanConvertTest, ShapeWithANegativeDimOrTooManyDimsIsRejected) {
  v1::TensorEntry t;
  t.add_global_shape(4);
  t.add_global_shape(-1);
  ExpectInvalid(ShapeFromProto(t.global_shape(), "model.wk"),
                {"tensor 'model.wk'", "negative dim"});
  t.clear_global_shape();
  for (int i = 0; i <= planner::kMaxDims; ++i) t.add_global_shape(2);
  ExpectInvalid(ShapeFromProto(t.global_shape(), "model.wk"),
                {"tensor 'model.wk'", "9 dims", "at most 8"});
  t.clear_global_shape();
  t.add_global_shape(0);
  t.add_global_shape(kInt64Max);
  absl::StatusOr<planner::Shape> ok = ShapeFromProto(t.global_shape(), "z");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (planner::Shape{0, kInt64Max}));
}

// --- Write items and plans ---

TEST(PlanConvertTest, WriteItemWithoutAKnownKindIsRejectedNamingTheFqn) {
  v1::WriteItem w =
      TensorItem("opt.m", v1::DTYPE_FLOAT32, {4}, Box({0}, {4}), 16);
  w.set_kind(v1::WriteItem::KIND_UNSPECIFIED);
  ExpectInvalid(WriteItemFromProto(w), {"write item for 'opt.m'", "no kind"});
  w.set_kind(static_cast<v1::WriteItem::Kind>(99));
  ExpectInvalid(WriteItemFromProto(w), {"write item for 'opt.m'", "kind 99"});
}

TEST(PlanConvertTest, WriteItemRejectionsNameTheTensor) {
  ExpectInvalid(WriteItemFromProto(TensorItem("a.b", v1::DTYPE_UNSPECIFIED, {4},
                                              Box({0}, {4}), 16)),
                {"tensor 'a.b'", "unknown dtype"});
  ExpectInvalid(WriteItemFromProto(TensorItem("a.b", v1::DTYPE_FLOAT32, {-4},
                                              Box({0}, {4}), 16)),
                {"tensor 'a.b'", "negative dim"});
  ExpectInvalid(WriteItemFromProto(TensorItem("a.b", v1::DTYPE_FLOAT32, {4},
                                              Box({0, 0}, {4}), 16)),
                {"chunk of 'a.b'", "2 offsets but 1 sizes"});
  ExpectInvalid(WriteItemFromProto(TensorItem("a.b", v1::DTYPE_FLOAT32, {4},
                                              Box({-2}, {4}), 16)),
                {"chunk of 'a.b'", "negative"});
}

TEST(PlanConvertTest, LocalAndRankPlansReportTheFirstBadItem) {
  v1::LocalSavePlan local;
  local.set_rank(3);
  *local.add_items() =
      TensorItem("good", v1::DTYPE_INT8, {4}, Box({0}, {4}), 4);
  *local.add_items() =
      TensorItem("bad", v1::DTYPE_INT8, {4}, Box({0}, {4, 4}), 4);
  ExpectInvalid(LocalPlanFromProto(local), {"chunk of 'bad'"});

  v1::RankSavePlan rank;
  rank.set_rank(2);
  v1::PlannedWrite* pw = rank.add_writes();
  *pw->mutable_item() =
      TensorItem("w2", static_cast<v1::DType>(42), {4}, Box({0}, {4}), 4);
  ExpectInvalid(RankPlanFromProto(rank), {"tensor 'w2'", "unknown dtype 42"});
}

// What the converters leave to the planner (documented in the header): a
// chunk outside its shape, a length that is not the chunk's size, an empty
// fqn. They convert; the planner rejects them with the job and rank.
TEST(PlanConvertTest, SemanticChecksAreLeftToThePlanner) {
  absl::StatusOr<planner::WriteItem> outside = WriteItemFromProto(
      TensorItem("w", v1::DTYPE_FLOAT32, {4}, Box({2}, {4}), 7));
  ASSERT_TRUE(outside.ok()) << outside.status();
  EXPECT_FALSE(
      planner::ValidateBoxInShape(outside->box, outside->global_shape).ok());
  absl::StatusOr<planner::WriteItem> unnamed = WriteItemFromProto(
      TensorItem("", v1::DTYPE_FLOAT32, {4}, Box({0}, {4}), 16));
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(unnamed->fqn, "");
}

// --- Layouts ---

TEST(PlanConvertTest, PlacementWithNoKindIsRejectedNamingTheTensor) {
  v1::DTensorLayout l;
  l.mutable_mesh()->add_shape(2);
  l.mutable_mesh()->add_ranks(0);
  l.mutable_mesh()->add_ranks(1);
  l.add_placements()->set_shard_dim(0);
  l.add_placements();  // no kind set
  ExpectInvalid(LayoutFromProto(l, "model.wo"),
                {"layout of 'model.wo'", "placement with no kind"});
}

// --- Manifests, wanted chunks, read items ---

TEST(PlanConvertTest, ManifestTensorRejectionsNameTheTensor) {
  v1::Manifest m;
  v1::ManifestTensor* t = m.add_tensors();
  t->mutable_entry()->set_fqn("ok");
  t->mutable_entry()->set_dtype(v1::DTYPE_FLOAT16);
  t->mutable_entry()->add_global_shape(8);
  v1::StoredChunk* c = t->add_chunks();
  *c->mutable_box() = Box({0}, {8});
  v1::ManifestTensor* bad = m.add_tensors();
  bad->mutable_entry()->set_fqn("layers.3.ffn");
  bad->mutable_entry()->set_dtype(v1::DTYPE_FLOAT16);
  bad->mutable_entry()->add_global_shape(8);
  *bad->add_chunks()->mutable_box() = Box({kInt64Max}, {8});
  ExpectInvalid(StoredTensorsFromManifest(m),
                {"chunk of 'layers.3.ffn'", "ends past 2^63 - 1"});
  *bad->mutable_chunks(0)->mutable_box() = Box({0}, {8});
  bad->mutable_entry()->set_dtype(static_cast<v1::DType>(77));
  ExpectInvalid(StoredTensorsFromManifest(m),
                {"tensor 'layers.3.ffn'", "unknown dtype 77"});
  bad->mutable_entry()->set_dtype(v1::DTYPE_FLOAT16);
  for (int i = 0; i < 9; ++i) bad->mutable_entry()->add_global_shape(1);
  ExpectInvalid(StoredTensorsFromManifest(m),
                {"tensor 'layers.3.ffn'", "10 dims"});
}

TEST(PlanConvertTest, WantedChunkRejectionsNameTheTensor) {
  v1::WantedChunk w;
  w.mutable_tensor()->set_fqn("emb.weight");
  w.mutable_tensor()->set_dtype(v1::DTYPE_BFLOAT16);
  w.mutable_tensor()->add_global_shape(16);
  *w.mutable_box() = Box({0}, {-16});
  ExpectInvalid(WantedFromProto(w), {"chunk of 'emb.weight'", "negative"});
  *w.mutable_box() = Box({1}, {kInt64Max});
  ExpectInvalid(WantedFromProto(w), {"chunk of 'emb.weight'", "ends past"});
  *w.mutable_box() = Box({0}, {16});
  w.mutable_tensor()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(WantedFromProto(w), {"tensor 'emb.weight'", "unknown dtype"});
}

TEST(PlanConvertTest, ReadItemWithABadOverlapIsRejectedNamingTheTensor) {
  v1::ReadItem r;
  r.set_fqn("head");
  *r.mutable_overlap() = Box({0, 0}, {1});
  ExpectInvalid(ReadItemFromProto(r),
                {"chunk of 'head'", "2 offsets but 1 sizes"});
  *r.mutable_overlap() = Box({kInt64Max - 1}, {2});
  ExpectInvalid(ReadItemFromProto(r), {"chunk of 'head'", "ends past"});
}

// --- Round trips on random plans (planner -> proto -> planner) ---

class RandomPlans {
 public:
  explicit RandomPlans(uint32_t seed) : rng_(seed) {}

  int64_t Int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  std::string Fqn() {
    static const char* kParts[] = {"model", "layers", "0", "17",  "wq",
                                   "ffn",   "norm",   "ü", "a b", "x.y"};
    std::string out;
    const int n = static_cast<int>(Int(1, 4));
    for (int i = 0; i < n; ++i) {
      absl::StrAppend(&out, i ? "." : "", kParts[Int(0, 9)]);
    }
    return out;
  }
  planner::DType DType() { return static_cast<planner::DType>(Int(1, 12)); }
  // A shape and a box inside it; dims may be 0; sometimes near 2^62.
  void ShapeAndBox(planner::Shape* shape, planner::ChunkBox* box) {
    const int dims = static_cast<int>(Int(0, planner::kMaxDims));
    shape->clear();
    box->offsets.clear();
    box->sizes.clear();
    for (int d = 0; d < dims; ++d) {
      const int64_t n = Int(0, 3) == 0 ? Int(0, int64_t{1} << 62) : Int(0, 64);
      const int64_t off = Int(0, n);
      const int64_t size = Int(0, n - off);
      shape->push_back(n);
      box->offsets.push_back(off);
      box->sizes.push_back(size);
    }
  }
  planner::WriteItem Item() {
    planner::WriteItem w;
    w.fqn = Fqn();
    w.length = static_cast<uint64_t>(Int(0, int64_t{1} << 62));
    if (Int(0, 4) == 0) {
      w.kind = planner::WriteItem::Kind::kBytes;
      w.dtype = planner::DType::kUInt8;  // what a bytes item decodes to
      return w;
    }
    w.kind = planner::WriteItem::Kind::kTensorChunk;
    w.dtype = DType();
    ShapeAndBox(&w.global_shape, &w.box);
    return w;
  }
  planner::StorageLocation Location() {
    return {absl::StrCat("data/rank-", Int(0, 99999), ".bin"),
            static_cast<uint64_t>(Int(0, kInt64Max)),
            static_cast<uint64_t>(Int(0, kInt64Max))};
  }
  planner::DTensorLayout Layout() {
    planner::DTensorLayout l;
    const int dims = static_cast<int>(Int(1, 3));
    int64_t ranks = 1;
    for (int d = 0; d < dims; ++d) {
      l.mesh.shape.push_back(Int(1, 4));
      ranks *= l.mesh.shape.back();
      switch (Int(0, 2)) {
        case 0:
          l.placements.push_back(planner::Placement::Shard(
              static_cast<int>(Int(0, planner::kMaxDims - 1))));
          break;
        case 1:
          l.placements.push_back(planner::Placement::Replicate());
          break;
        default:
          l.placements.push_back(planner::Placement::Partial());
      }
    }
    for (int64_t r = 0; r < ranks; ++r) {
      l.mesh.ranks.push_back(static_cast<int>(Int(0, 1 << 20)));
    }
    return l;
  }

 private:
  std::mt19937 rng_;
};

void ExpectSameItem(const planner::WriteItem& a, const planner::WriteItem& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.fqn, b.fqn);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.length, b.length);
  if (a.kind == planner::WriteItem::Kind::kTensorChunk) {
    EXPECT_EQ(a.global_shape, b.global_shape);
    EXPECT_EQ(a.box, b.box);
  }
}

TEST(PlanConvertTest, RandomLocalAndRankPlansRoundTrip) {
  RandomPlans gen(20261123);
  for (int trial = 0; trial < 2000; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    planner::LocalSavePlan local;
    local.rank = static_cast<int>(gen.Int(0, 1 << 20));
    // A one-rank global plan whose writes are random items (each its own
    // entry) at random offsets of the rank's object.
    planner::GlobalSavePlan global;
    global.ranks.resize(1);
    planner::RankSavePlan& rank = global.ranks[0];
    rank.rank = local.rank;
    rank.object_key = gen.Location().object_key;
    std::vector<planner::WriteItem> written;
    const int n = static_cast<int>(gen.Int(0, 12));
    for (int i = 0; i < n; ++i) {
      local.items.push_back(gen.Item());
      const planner::WriteItem item = gen.Item();
      written.push_back(item);
      const bool bytes = item.kind == planner::WriteItem::Kind::kBytes;
      global.entries.push_back(planner::PlannedEntry{
          item.kind, item.fqn,
          bytes ? planner::DType::kUnspecified : item.dtype,
          bytes ? planner::Shape{} : item.global_shape});
      rank.writes.push_back(planner::PlannedWrite{
          static_cast<uint32_t>(i), static_cast<uint32_t>(rank.coords.size()),
          gen.Location().offset, item.length});
      if (!bytes) {
        rank.coords.insert(rank.coords.end(), item.box.offsets.begin(),
                           item.box.offsets.end());
        rank.coords.insert(rank.coords.end(), item.box.sizes.begin(),
                           item.box.sizes.end());
      }
    }

    v1::LocalSavePlan wire;
    LocalPlanToProto(local, &wire);
    // Through bytes, as the plan travels.
    v1::LocalSavePlan parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    absl::StatusOr<planner::LocalSavePlan> back = LocalPlanFromProto(parsed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->rank, local.rank);
    ASSERT_EQ(back->items.size(), local.items.size());
    for (size_t i = 0; i < local.items.size(); ++i) {
      ExpectSameItem(back->items[i], local.items[i]);
    }

    v1::RankSavePlan rwire;
    RankPlanToProto(global, 0, &rwire);
    absl::StatusOr<DecodedRankPlan> rback = RankPlanFromProto(rwire);
    ASSERT_TRUE(rback.ok()) << rback.status();
    EXPECT_EQ(rback->rank, rank.rank);
    ASSERT_EQ(rback->items.size(), written.size());
    ASSERT_EQ(rback->locations.size(), written.size());
    for (size_t i = 0; i < written.size(); ++i) {
      ExpectSameItem(rback->items[i], written[i]);
      EXPECT_EQ(rback->locations[i], rank.LocationOf(rank.writes[i]));
    }
    // And proto -> planner -> proto is the identity on what To* wrote.
    v1::LocalSavePlan again;
    LocalPlanToProto(*back, &again);
    EXPECT_EQ(again.SerializeAsString(), wire.SerializeAsString());
  }
}

TEST(PlanConvertTest, RandomLayoutsWantedChunksAndReadItemsRoundTrip) {
  RandomPlans gen(7);
  for (int trial = 0; trial < 2000; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    planner::DTensorLayout layout = gen.Layout();
    v1::DTensorLayout lwire;
    LayoutToProto(layout, &lwire);
    absl::StatusOr<planner::DTensorLayout> lback = LayoutFromProto(lwire, "t");
    ASSERT_TRUE(lback.ok()) << lback.status();
    EXPECT_EQ(lback->mesh.shape, layout.mesh.shape);
    EXPECT_EQ(lback->mesh.ranks, layout.mesh.ranks);
    EXPECT_EQ(lback->placements, layout.placements);

    planner::WantedChunk wanted;
    wanted.fqn = gen.Fqn();
    wanted.dtype = gen.DType();
    gen.ShapeAndBox(&wanted.global_shape, &wanted.box);
    v1::WantedChunk wwire;
    WantedToProto(wanted, &wwire);
    absl::StatusOr<planner::WantedChunk> wback = WantedFromProto(wwire);
    ASSERT_TRUE(wback.ok()) << wback.status();
    EXPECT_EQ(wback->fqn, wanted.fqn);
    EXPECT_EQ(wback->dtype, wanted.dtype);
    EXPECT_EQ(wback->global_shape, wanted.global_shape);
    EXPECT_EQ(wback->box, wanted.box);

    planner::ReadItem read;
    read.fqn = wanted.fqn;
    read.dest_index = static_cast<int>(gen.Int(0, 1 << 20));
    read.overlap = wanted.box;
    read.source_chunk = -1;  // not on the wire: decoded as -1
    read.source = gen.Location();
    read.source_crc32c = static_cast<uint32_t>(gen.Int(0, UINT32_MAX));
    const int segs = static_cast<int>(gen.Int(0, 5));
    for (int s = 0; s < segs; ++s) {
      read.segments.push_back({static_cast<uint64_t>(gen.Int(0, kInt64Max)),
                               static_cast<uint64_t>(gen.Int(0, kInt64Max)),
                               static_cast<uint64_t>(gen.Int(0, kInt64Max))});
    }
    v1::ReadItem rwire;
    ReadItemToProto(read, &rwire);
    absl::StatusOr<planner::ReadItem> rback = ReadItemFromProto(rwire);
    ASSERT_TRUE(rback.ok()) << rback.status();
    EXPECT_EQ(rback->fqn, read.fqn);
    EXPECT_EQ(rback->dest_index, read.dest_index);
    EXPECT_EQ(rback->overlap, read.overlap);
    EXPECT_EQ(rback->source_chunk, -1);
    EXPECT_EQ(rback->source, read.source);
    EXPECT_EQ(rback->source_crc32c, read.source_crc32c);
    EXPECT_EQ(rback->segments, read.segments);
  }
}

TEST(PlanConvertTest, ReadViewsEncodeAsTheirReadItems) {
  // A column-parallel load of row-sharded tensors, with replicated and
  // uneven chunks: cairnd writes PlanEach's views straight into its answer;
  // the bytes must be those of Plan()'s read items.
  RandomPlans gen(5);
  size_t reads = 0;
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    std::vector<planner::StoredTensor> tensors;
    std::vector<planner::WantedChunk> wanted;
    const int n = static_cast<int>(gen.Int(1, 4));
    for (int t = 0; t < n; ++t) {
      planner::StoredTensor& st = tensors.emplace_back();
      st.fqn = absl::StrCat("layers.", t, ".", gen.Fqn());
      st.dtype = planner::DType::kFloat32;
      const int64_t rows = gen.Int(1, 40), cols = gen.Int(1, 40);
      st.global_shape = {rows, cols};
      const int64_t parts = gen.Int(1, 5);
      for (int64_t p = 0, r = 0; p < parts && r < rows; ++p) {
        const int64_t take = p == parts - 1 ? rows - r : gen.Int(1, rows - r);
        planner::StoredChunk& c = st.chunks.emplace_back();
        c.box = {{r, 0}, {take, cols}};
        c.location = gen.Location();
        c.location.length = static_cast<uint64_t>(take * cols * 4);
        c.crc32c = static_cast<uint32_t>(gen.Int(0, UINT32_MAX));
        r += take;
      }
      const int64_t c0 = gen.Int(0, cols - 1);
      wanted.push_back({st.fqn,
                        st.dtype,
                        st.global_shape,
                        {{0, c0}, {rows, gen.Int(1, cols - c0)}}});
    }
    auto planner = planner::LoadPlanner::Create(tensors);
    ASSERT_TRUE(planner.ok()) << planner.status();
    absl::StatusOr<std::vector<planner::ReadItem>> items =
        (*planner)->Plan(wanted);
    ASSERT_TRUE(items.ok()) << items.status();
    std::vector<std::string> from_views;
    ASSERT_TRUE((*planner)
                    ->PlanEach(wanted,
                               [&](const planner::LoadPlanner::ReadView& r) {
                                 v1::ReadItem wire;
                                 ReadViewToProto(r, &wire);
                                 from_views.push_back(wire.SerializeAsString());
                               })
                    .ok());
    ASSERT_EQ(from_views.size(), items->size());
    for (size_t i = 0; i < items->size(); ++i) {
      v1::ReadItem wire;
      ReadItemToProto((*items)[i], &wire);
      EXPECT_EQ(from_views[i], wire.SerializeAsString()) << "read item " << i;
    }
    reads += items->size();
  }
  EXPECT_GT(reads, 400u);
}

TEST(PlanConvertTest, RandomManifestsConvertToTheirStoredTensors) {
  RandomPlans gen(99);
  for (int trial = 0; trial < 500; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    v1::Manifest m;
    std::vector<planner::StoredTensor> want;
    const int tensors = static_cast<int>(gen.Int(0, 6));
    for (int t = 0; t < tensors; ++t) {
      planner::StoredTensor st;
      st.fqn = gen.Fqn();
      st.dtype = gen.DType();
      planner::ChunkBox ignored;
      gen.ShapeAndBox(&st.global_shape, &ignored);
      v1::ManifestTensor* mt = m.add_tensors();
      mt->mutable_entry()->set_fqn(st.fqn);
      mt->mutable_entry()->set_dtype(DTypeToProto(st.dtype));
      mt->mutable_entry()->mutable_global_shape()->Assign(
          st.global_shape.begin(), st.global_shape.end());
      const int chunks = static_cast<int>(gen.Int(0, 4));
      for (int c = 0; c < chunks; ++c) {
        planner::StoredChunk sc;
        planner::Shape shape;
        gen.ShapeAndBox(&shape, &sc.box);
        sc.location = gen.Location();
        sc.crc32c = static_cast<uint32_t>(gen.Int(0, UINT32_MAX));
        v1::StoredChunk* pc = mt->add_chunks();
        BoxToProto(sc.box, pc->mutable_box());
        LocationToProto(sc.location, pc->mutable_location());
        pc->set_crc32c(sc.crc32c);
        st.chunks.push_back(std::move(sc));
      }
      want.push_back(std::move(st));
    }
    absl::StatusOr<std::vector<planner::StoredTensor>> got =
        StoredTensorsFromManifest(m);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_EQ((*got)[t].fqn, want[t].fqn);
      EXPECT_EQ((*got)[t].dtype, want[t].dtype);
      EXPECT_EQ((*got)[t].global_shape, want[t].global_shape);
      ASSERT_EQ((*got)[t].chunks.size(), want[t].chunks.size());
      for (size_t c = 0; c < want[t].chunks.size(); ++c) {
        EXPECT_EQ((*got)[t].chunks[c].box, want[t].chunks[c].box);
        EXPECT_EQ((*got)[t].chunks[c].location, want[t].chunks[c].location);
        EXPECT_EQ((*got)[t].chunks[c].crc32c, want[t].chunks[c].crc32c);
      }
    }
  }
}

// Random boxes straight off the wire (any int64 values): accepted exactly
// when every dim is non-negative and ends by 2^63 - 1, and then unchanged.
TEST(PlanConvertTest, RandomWireBoxesAreAcceptedExactlyWhenRepresentable) {
  RandomPlans gen(12345);
  auto any = [&]() -> int64_t {
    switch (gen.Int(0, 4)) {
      case 0:
        return gen.Int(std::numeric_limits<int64_t>::min(), -1);
      case 1:
        return gen.Int(kInt64Max - 1000, kInt64Max);
      case 2:
        return gen.Int(0, kInt64Max);
      default:
        return gen.Int(0, 100);
    }
  };
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int dims = static_cast<int>(gen.Int(0, planner::kMaxDims + 1));
    std::vector<int64_t> off, size;
    bool oracle = dims <= planner::kMaxDims;
    for (int d = 0; d < dims; ++d) {
      off.push_back(any());
      size.push_back(any());
      if (off.back() < 0 || size.back() < 0 ||
          off.back() > kInt64Max - size.back()) {
        oracle = false;
      }
    }
    absl::StatusOr<planner::ChunkBox> b = BoxFromProto(Box(off, size), "r");
    ASSERT_EQ(b.ok(), oracle) << "trial " << trial << ": " << b.status();
    if (b.ok()) {
      ++accepted;
      EXPECT_EQ(b->offsets, planner::Dims(off.begin(), off.end()));
      EXPECT_EQ(b->sizes, planner::Dims(size.begin(), size.end()));
    } else {
      ++rejected;
      EXPECT_THAT(
          b, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'r'")));
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace cairn::convert
