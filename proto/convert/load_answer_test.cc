#include "proto/convert/load_answer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/convert/plan_convert.h"

namespace cairn::convert {
namespace {

using ::cairn::testing::StatusIs;

// The answer as cairnd built it before: messages from ReadViewToProto,
// serialized by protobuf.
std::string AsMessage(const planner::LoadPlanner& planner,
                      const std::vector<planner::WantedChunk>& wanted,
                      int64_t step, const std::string& uri,
                      const std::vector<v1::ManifestBytes>& entries,
                      const std::string& prefix, uint64_t round) {
  v1::PlanLoadResponse resp;
  resp.set_step(step);
  resp.set_storage_uri(uri);
  resp.set_step_prefix(prefix);
  EXPECT_TRUE(planner
                  .PlanEach(wanted,
                            [&](const planner::LoadPlanner::ReadView& r) {
                              ReadViewToProto(r, resp.add_reads());
                            })
                  .ok());
  for (const v1::ManifestBytes& e : entries) *resp.add_bytes_entries() = e;
  resp.set_load_round(round);
  return resp.SerializeAsString();
}

// What a PlanLoadAnswerWriter writes (step 3 of "file:///x", step prefix
// "j/3/") for `wanted` in `form`, planned as cairnd plans it: with copy
// segments in the full form only.
struct WrittenAnswer {
  std::string bytes;
  int reads = 0;  // PlanLoadAnswerWriter::reads()
};
WrittenAnswer WriteAnswer(const planner::LoadPlanner& planner,
                          const std::vector<planner::WantedChunk>& wanted,
                          AnswerForm form, size_t expected_bytes = 0) {
  PlanLoadAnswerWriter w(3, "file:///x", form, expected_bytes);
  EXPECT_TRUE(
      planner
          .PlanEach(
              wanted,
              [&](const planner::LoadPlanner::ReadView& r) { w.AddRead(r); },
              /*segments=*/form == AnswerForm::kFull)
          .ok());
  WrittenAnswer a;
  a.reads = w.reads();
  a.bytes = std::move(w).Finish("j/3/");
  return a;
}

TEST(LoadAnswerTest, RandomPlansEncodeAsTheirMessages) {
  // Row-sharded tensors (some scalars, some with a zero dim) loaded in
  // columns, with values of every varint length (offsets near 2^62, zeros
  // that proto3 leaves out).
  std::mt19937_64 rng(17);
  const auto rand = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const auto big = [&]() -> uint64_t {
    switch (rand(0, 3)) {
      case 0:
        return 0;
      case 1:
        return static_cast<uint64_t>(rand(1, 127));
      case 2:
        return static_cast<uint64_t>(rand(128, int64_t{1} << 20));
      default:
        return static_cast<uint64_t>(rand(0, int64_t{1} << 62));
    }
  };
  size_t reads = 0;
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    std::vector<planner::StoredTensor> tensors;
    std::vector<planner::WantedChunk> wanted;
    const int n = static_cast<int>(rand(1, 5));
    for (int t = 0; t < n; ++t) {
      // Some stored in the previous tensor's tiling (as a model's layers
      // are), wanted in another box: they share box ids.
      if (t > 0 && !tensors.back().chunks.empty() &&
          !tensors.back().global_shape.empty() && rand(0, 2) == 0) {
        planner::StoredTensor st = tensors.back();
        st.fqn = absl::StrCat(st.fqn, ".", t);
        for (planner::StoredChunk& c : st.chunks) {
          c.location.offset = big();
          c.crc32c = static_cast<uint32_t>(big());
        }
        const int64_t rows = st.global_shape[0], cols = st.global_shape[1];
        const int64_t r0 = rand(0, rows - 1);
        wanted.push_back({st.fqn,
                          st.dtype,
                          st.global_shape,
                          {{r0, 0}, {rand(1, rows - r0), cols}}});
        tensors.push_back(std::move(st));
        continue;
      }
      planner::StoredTensor& st = tensors.emplace_back();
      st.fqn =
          absl::StrCat("layers.", t, rand(0, 1) ? ".ü.wq" : "",
                       std::string(static_cast<size_t>(rand(0, 200)), 'x'));
      st.dtype = planner::DType::kFloat32;
      const std::string key =
          absl::StrCat("r", rand(0, 9999), "/", std::string(rand(0, 150), 'k'));
      const auto location = [&](uint64_t length) {
        return planner::StorageLocation{rand(0, 3) ? key : "", big(), length};
      };
      if (rand(0, 5) == 0) {  // a scalar: zero dims
        planner::StoredChunk& c = st.chunks.emplace_back();
        c.location = location(4);
        c.crc32c = static_cast<uint32_t>(big());
        wanted.push_back({st.fqn, st.dtype, {}, {}});
        continue;
      }
      const int64_t rows = rand(1, 300), cols = rand(0, 300);
      st.global_shape = {rows, cols};
      const int64_t parts = rand(1, 6);
      for (int64_t p = 0, r = 0; p < parts && r < rows; ++p) {
        const int64_t take = p == parts - 1 ? rows - r : rand(1, rows - r);
        planner::StoredChunk& c = st.chunks.emplace_back();
        c.box = {{r, 0}, {take, cols}};
        c.location = location(static_cast<uint64_t>(take * cols * 4));
        c.crc32c = static_cast<uint32_t>(big());
        r += take;
      }
      const int64_t c0 = cols == 0 ? 0 : rand(0, cols - 1);
      const int64_t r0 = rand(0, rows - 1);
      wanted.push_back({st.fqn,
                        st.dtype,
                        st.global_shape,
                        {{r0, c0}, {rand(1, rows - r0), rand(0, cols - c0)}}});
    }
    if (rand(0, 1)) std::swap(wanted.front(), wanted.back());
    auto planner = planner::LoadPlanner::Create(tensors);
    ASSERT_TRUE(planner.ok()) << planner.status();

    std::vector<v1::ManifestBytes> entries(static_cast<size_t>(rand(0, 2)));
    for (v1::ManifestBytes& e : entries) {
      e.set_fqn(absl::StrCat("extra.", rand(0, 99)));
      e.mutable_location()->set_object_key(absl::StrCat("bytes/", rand(0, 99)));
      e.mutable_location()->set_offset(big());
      e.mutable_location()->set_length(big());
      e.set_crc32c(static_cast<uint32_t>(big()));
      e.set_writer_rank(static_cast<int32_t>(rand(0, 3)));
    }
    const int64_t step = rand(0, 2) ? rand(0, 1 << 20) : 0;
    const std::string uri = rand(0, 3) ? "file:///dev/shm/x" : "";
    const std::string prefix = rand(0, 3) ? absl::StrCat("job/", step) : "";
    const uint64_t round = big();

    // Room made up front: none, too little, or far too much.
    const auto expected = [&]() -> size_t {
      switch (rand(0, 3)) {
        case 0:
          return 0;
        case 1:
          return static_cast<size_t>(rand(1, 200));
        case 2:
          return static_cast<size_t>(rand(0, 1 << 16));
        default:
          return size_t{1} << 22;
      }
    };
    PlanLoadAnswerWriter writer(step, uri, AnswerForm::kFull, expected());
    uint64_t bytes = 0;
    ASSERT_TRUE((*planner)
                    ->PlanEach(wanted,
                               [&](const planner::LoadPlanner::ReadView& r) {
                                 writer.AddRead(r);
                                 uint64_t item_bytes = 0;
                                 for (const auto& s : *r.segments) {
                                   item_bytes += s.length;
                                 }
                                 EXPECT_EQ(r.bytes, item_bytes);
                                 bytes += item_bytes;
                               })
                    .ok());
    for (const v1::ManifestBytes& e : entries) {
      writer.AddBytesEntry(e);
      bytes += e.location().length();
    }
    const int items = writer.reads();
    EXPECT_EQ(writer.bytes_to_read(), bytes);
    std::string wire = std::move(writer).Finish(prefix);
    AppendLoadRound(round, &wire);
    EXPECT_EQ(wire,
              AsMessage(**planner, wanted, step, uri, entries, prefix, round));
    v1::PlanLoadResponse decoded;
    ASSERT_TRUE(decoded.ParseFromString(wire));
    EXPECT_EQ(decoded.reads_size(), items);
    reads += static_cast<size_t>(items);

    // The same as read columns, planned without copy segments as cairnd
    // plans them, with the load round appended. Each box is listed at least
    // once, and again at most when another took its slot in the writer's
    // table.
    absl::flat_hash_set<uint32_t> box_ids;
    PlanLoadAnswerWriter columns(step, uri, AnswerForm::kReadColumns,
                                 expected());
    ASSERT_TRUE((*planner)
                    ->PlanEach(
                        wanted,
                        [&](const planner::LoadPlanner::ReadView& r) {
                          EXPECT_EQ(r.segments, nullptr);
                          EXPECT_LT(r.box_id, (*planner)->num_box_ids());
                          box_ids.insert(r.box_id);
                          columns.AddRead(r);
                        },
                        /*segments=*/false)
                    .ok());
    for (const v1::ManifestBytes& e : entries) columns.AddBytesEntry(e);
    EXPECT_EQ(columns.reads(), items);
    EXPECT_EQ(columns.bytes_to_read(), bytes);
    std::string columns_wire = std::move(columns).Finish(prefix);
    AppendLoadRound(round, &columns_wire);
    // Smaller once the columns' tags and lengths are paid for, even with
    // these random values.
    if (items >= 8) {
      EXPECT_LT(columns_wire.size(), wire.size());
    }
    v1::PlanLoadResponse expanded;
    ASSERT_TRUE(expanded.ParseFromString(columns_wire));
    EXPECT_EQ(expanded.reads_size(), 0);
    ASSERT_TRUE(expanded.has_read_columns());
    EXPECT_EQ(expanded.read_columns().dest_index_size(), items);
    EXPECT_EQ(expanded.read_columns().crc32c_size(), items);
    EXPECT_GE(expanded.boxes_size(), static_cast<int>(box_ids.size()));
    EXPECT_LE(expanded.boxes_size(), items);

    // Expanded by the rank, it is the full answer plus each item's chunk id.
    v1::PlanLoadRequest request;
    for (const planner::WantedChunk& w : wanted) {
      WantedToProto(w, request.add_wanted());
    }
    ASSERT_TRUE(ExpandReadColumns(request, &expanded).ok());
    EXPECT_FALSE(expanded.has_read_columns());
    ASSERT_EQ(expanded.reads_size(), items);
    for (int i = 0; i < expanded.reads_size(); ++i) {
      v1::ReadItem& item = *expanded.mutable_reads(i);
      ASSERT_TRUE(item.has_chunk());
      const auto at = (*planner)->ChunkOfId(item.chunk());
      ASSERT_TRUE(at.has_value());
      const planner::StoredChunkView stored =
          (*planner)->chunk(at->first, at->second);
      EXPECT_EQ((*planner)->fqn(at->first), item.fqn());
      EXPECT_EQ(stored.offset, item.source().offset());
      EXPECT_EQ(stored.object_key, item.source().object_key());
      item.clear_chunk();
    }
    expanded.clear_objects();
    expanded.clear_boxes();
    EXPECT_EQ(expanded.SerializeAsString(), wire);
  }
  EXPECT_GT(reads, 1000u);
}

// One stored [8, 4] float32 tensor in two row blocks, in two objects; a rank
// wants rows 2..6, answered in read columns.
struct ColumnsCase {
  ColumnsCase() {
    planner::StoredTensor t;
    t.fqn = "w";
    t.dtype = planner::DType::kFloat32;
    t.global_shape = {8, 4};
    t.chunks.push_back({{{0, 0}, {4, 4}}, {"r0", 0, 64}, 1});
    t.chunks.push_back({{{4, 0}, {4, 4}}, {"r1", 4096, 64}, 2});
    planner = std::move(planner::LoadPlanner::Create({t}).value());
    const planner::WantedChunk want{
        "w", t.dtype, t.global_shape, {{2, 0}, {4, 4}}};
    WantedToProto(want, request.add_wanted());
    request.set_read_columns(true);
    PlanLoadAnswerWriter w(7, "file:///x", AnswerFormOf(request));
    EXPECT_TRUE(
        planner
            ->PlanEach(
                {want},
                [&](const planner::LoadPlanner::ReadView& r) { w.AddRead(r); },
                /*segments=*/false)
            .ok());
    EXPECT_TRUE(answer.ParseFromString(std::move(w).Finish("j/7/")));
  }
  std::unique_ptr<planner::LoadPlanner> planner;
  v1::PlanLoadRequest request;
  v1::PlanLoadResponse answer;
};

TEST(LoadAnswerTest, ARequestAsksForReadColumnsOrTheFullForm) {
  v1::PlanLoadRequest request;
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kFull);
  request.set_read_columns(true);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kReadColumns);
}

TEST(LoadAnswerTest, ExpandsReadColumns) {
  ColumnsCase c;
  EXPECT_EQ(c.answer.reads_size(), 0);
  ASSERT_EQ(c.answer.read_columns().dest_index_size(), 2);
  ASSERT_EQ(c.answer.objects_size(), 2);
  ASSERT_EQ(c.answer.boxes_size(), 2);
  ASSERT_TRUE(ExpandReadColumns(c.request, &c.answer).ok());
  EXPECT_FALSE(c.answer.has_read_columns());
  ASSERT_EQ(c.answer.reads_size(), 2);
  const v1::ReadItem& a = c.answer.reads(0);
  EXPECT_EQ(a.fqn(), "w");
  EXPECT_EQ(a.source().object_key(), "r0");
  EXPECT_EQ(a.source().length(), 64u);
  EXPECT_EQ(a.source_crc32c(), 1u);
  EXPECT_EQ(a.chunk(), 0u);
  ASSERT_EQ(a.segments_size(), 1);  // rows 2..3 of block 0: bytes 32..63
  EXPECT_EQ(a.segments(0).src_offset(), 32u);
  EXPECT_EQ(a.segments(0).dst_offset(), 0u);
  EXPECT_EQ(a.segments(0).length(), 32u);
  const v1::ReadItem& b = c.answer.reads(1);
  EXPECT_EQ(b.source().object_key(), "r1");
  EXPECT_EQ(b.source().offset(), 4096u);
  EXPECT_EQ(b.source_crc32c(), 2u);
  EXPECT_EQ(b.chunk(), 1u);
  ASSERT_EQ(b.segments_size(), 1);  // rows 4..5 of block 1: bytes 0..31
  EXPECT_EQ(b.segments(0).src_offset(), 0u);
  EXPECT_EQ(b.segments(0).dst_offset(), 32u);
  EXPECT_EQ(b.overlap().offsets(0), 4);
  EXPECT_EQ(b.overlap().sizes(0), 2);
  // Expanding again changes nothing (the answer is in the full form by
  // then, and the full form passes through).
  v1::PlanLoadResponse again = c.answer;
  ASSERT_TRUE(ExpandReadColumns(c.request, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), c.answer.SerializeAsString());
}

TEST(LoadAnswerTest, RefusesReadColumnsThatCannotBeRight) {
  using Damage = std::function<void(v1::PlanLoadResponse*)>;
  const auto column = [](std::function<void(v1::ReadColumns*)> f) -> Damage {
    return [f](v1::PlanLoadResponse* a) { f(a->mutable_read_columns()); };
  };
  // (what the error says, whether it names 'w', the damage)
  const std::vector<std::tuple<std::string, bool, Damage>> damages = {
      {"2 destinations, 2 objects, 2 offsets, 1 checksums", false,
       column([](v1::ReadColumns* c) { c->mutable_crc32c()->RemoveLast(); })},
      {"3 boxes", false, column([](v1::ReadColumns* c) { c->add_box(0); })},
      {"destination 1 of 1", false,  // the second item's difference is 1 more
       column([](v1::ReadColumns* c) { c->set_dest_index(1, 1); })},
      {"destination -1", false,
       column([](v1::ReadColumns* c) { c->set_dest_index(0, -1); })},
      {"object 2 of 2", true,
       column([](v1::ReadColumns* c) { c->set_object_index(1, 2); })},
      {"object 0 of 0", true,
       [](v1::PlanLoadResponse* a) { a->clear_objects(); }},
      {"box 2 of 2", true,
       column([](v1::ReadColumns* c) { c->set_box(1, 2); })},
      {"box 0 of 0", true, [](v1::PlanLoadResponse* a) { a->clear_boxes(); }},
      {"out of range: destination 2147483648", false,
       column(
           [](v1::ReadColumns* c) { c->set_dest_index(0, int64_t{1} << 31); })},
      {"out of range", false,
       column([](v1::ReadColumns* c) { c->set_object_index(0, -3); })},
      {"out of range", false,
       column([](v1::ReadColumns* c) { c->set_chunk(1, int64_t{1} << 32); })},
      {"out of range", false,
       column([](v1::ReadColumns* c) { c->set_offset(0, -1); })},
      {"out of range", false,
       column([](v1::ReadColumns* c) { c->set_box(0, -(int64_t{1} << 40)); })},
      {"exceeds shape", true,
       [](v1::PlanLoadResponse* a) { a->mutable_boxes(1)->set_offsets(0, 5); }},
      {"outside the wanted chunk", true,
       [](v1::PlanLoadResponse* a) { a->mutable_boxes(0)->set_sizes(0, 2); }},
      {"2 offsets but 3 sizes", true,
       [](v1::PlanLoadResponse* a) { a->mutable_boxes(0)->add_sizes(1); }},
      {"1 read items besides read columns", false,
       [](v1::PlanLoadResponse* a) { a->add_reads(); }},
  };
  for (const auto& [want, names_fqn, damage] : damages) {
    SCOPED_TRACE(want);
    ColumnsCase c;
    damage(&c.answer);
    const absl::Status s = ExpandReadColumns(c.request, &c.answer);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal));
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
    EXPECT_EQ(s.message().find("of 'w'") != std::string::npos, names_fqn) << s;
  }
}

// A model's layers stored in one tiling: the read columns list each stored
// box once, in a fraction of the full form's bytes, and expand to the full
// form.
TEST(LoadAnswerTest, SharedBoxesAreListedOnce) {
  // 40 [64, 16] float32 tensors, each in 8 row blocks written by 8 ranks; a
  // rank wants rows 4..35 of each: 5 blocks.
  std::vector<planner::StoredTensor> tensors;
  std::vector<planner::WantedChunk> wanted;
  for (int i = 0; i < 40; ++i) {
    planner::StoredTensor& t = tensors.emplace_back();
    t.fqn = absl::StrCat("layers.", i, ".w");
    t.dtype = planner::DType::kFloat32;
    t.global_shape = {64, 16};
    for (int64_t b = 0; b < 8; ++b) {
      t.chunks.push_back({{{b * 8, 0}, {8, 16}},
                          {absl::StrCat("rank", b, "/data"),
                           static_cast<uint64_t>(i) * 512, 512},
                          static_cast<uint32_t>(i * 8 + b + 1)});
    }
    wanted.push_back({t.fqn, t.dtype, t.global_shape, {{4, 0}, {32, 16}}});
  }
  auto planner = planner::LoadPlanner::Create(tensors);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_EQ((*planner)->num_box_ids(), 8u);
  v1::PlanLoadRequest request;
  for (const planner::WantedChunk& w : wanted) {
    WantedToProto(w, request.add_wanted());
  }
  const WrittenAnswer written =
      WriteAnswer(**planner, wanted, AnswerForm::kReadColumns);
  EXPECT_EQ(written.reads, 200);
  const std::string& columns = written.bytes;
  const std::string full =
      AsMessage(**planner, wanted, 3, "file:///x", {}, "j/3/", 0);
  v1::PlanLoadResponse c;
  ASSERT_TRUE(c.ParseFromString(columns));
  EXPECT_EQ(c.reads_size(), 0);
  ASSERT_EQ(c.boxes_size(), 5);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(BoxFromProto(c.boxes(k), "").value(),
              (planner::ChunkBox{{k * 8, 0}, {8, 16}}));
  }
  ASSERT_EQ(c.read_columns().box_size(), 200);
  for (int i = 0; i < 200; ++i) {  // boxes 0, 1, .., 4, 0, 1, ..
    EXPECT_EQ(c.read_columns().box(i), i % 5 == 0 ? (i == 0 ? 0 : -4) : 1);
  }
  // ~11 bytes an item instead of ~60.
  EXPECT_LT(columns.size() * 4, full.size())
      << columns.size() << " vs " << full.size();
  ASSERT_TRUE(ExpandReadColumns(request, &c).ok());
  for (v1::ReadItem& item : *c.mutable_reads()) item.clear_chunk();
  c.clear_objects();
  c.clear_boxes();
  EXPECT_EQ(c.SerializeAsString(), full);
}

// An answer naming more boxes than the writer's table starts with: the table
// grows, so that boxes named again are rarely listed again.
TEST(LoadAnswerTest, SharedBoxesOfALargeTiling) {
  // Two [6000, 8] tensors saved in rows, wanted whole, one after the other.
  std::vector<planner::StoredTensor> tensors(2);
  std::vector<planner::WantedChunk> wanted;
  for (int i = 0; i < 2; ++i) {
    planner::StoredTensor& t = tensors[i];
    t.fqn = absl::StrCat("layers.", i, ".w");
    t.dtype = planner::DType::kFloat32;
    t.global_shape = {6000, 8};
    for (int64_t r = 0; r < 6000; ++r) {
      t.chunks.push_back({{{r, 0}, {1, 8}},
                          {absl::StrCat("rank", r % 40, "/data"),
                           static_cast<uint64_t>(r * 64 + i * 32), 32},
                          static_cast<uint32_t>(r + 1)});
    }
    wanted.push_back({t.fqn, t.dtype, t.global_shape, {{0, 0}, {6000, 8}}});
  }
  auto planner = planner::LoadPlanner::Create(tensors);
  ASSERT_TRUE(planner.ok()) << planner.status();
  v1::PlanLoadResponse a;
  ASSERT_TRUE(a.ParseFromString(
      WriteAnswer(**planner, wanted, AnswerForm::kReadColumns).bytes));
  ASSERT_EQ(a.read_columns().box_size(), 12000);
  EXPECT_GE(a.boxes_size(), 6000);
  EXPECT_LT(a.boxes_size(), 6000 + 60) << "the table did not grow";
  v1::PlanLoadRequest request;
  for (const planner::WantedChunk& x : wanted) {
    WantedToProto(x, request.add_wanted());
  }
  ASSERT_TRUE(ExpandReadColumns(request, &a).ok());
  ASSERT_EQ(a.reads_size(), 12000);
  for (int i = 0; i < 12000; ++i) {
    const v1::ReadItem& item = a.reads(i);
    // Wanted whole: the overlap is the stored box.
    EXPECT_EQ(BoxFromProto(item.overlap(), "").value(),
              (planner::ChunkBox{{i % 6000, 0}, {1, 8}}));
    EXPECT_EQ(item.source().length(), 32u);
    ASSERT_EQ(item.segments_size(), 1);
    EXPECT_EQ(item.segments(0).dst_offset(),
              static_cast<uint64_t>(i % 6000) * 32);
  }
}

// Answers of many 64 KiB steps, in either form, the same bytes whatever room
// they were given up front, and not holding much more memory than they use.
TEST(LoadAnswerTest, LargeAnswersWhateverTheRoomGiven) {
  // A [6000, 8] tensor saved in rows by 40 writers (objects), wanted whole.
  planner::StoredTensor t;
  t.fqn = "layers.0.w";
  t.dtype = planner::DType::kFloat32;
  t.global_shape = {6000, 8};
  for (int64_t r = 0; r < 6000; ++r) {
    t.chunks.push_back({{{r, 0}, {1, 8}},
                        {absl::StrCat("rank", r % 40, "/data"),
                         static_cast<uint64_t>(r) * 32, 32},
                        static_cast<uint32_t>(r + 1)});
  }
  auto planner = planner::LoadPlanner::Create({t});
  ASSERT_TRUE(planner.ok()) << planner.status();
  const std::vector<planner::WantedChunk> wanted = {
      {t.fqn, t.dtype, t.global_shape, {{0, 0}, {6000, 8}}}};
  const auto answer = [&](AnswerForm form, size_t expected) {
    WrittenAnswer a = WriteAnswer(**planner, wanted, form, expected);
    EXPECT_EQ(a.reads, 6000);
    EXPECT_LE(a.bytes.capacity(), a.bytes.size() + a.bytes.size() / 8 + 64)
        << "given " << expected;
    return std::move(a.bytes);
  };
  const std::string full = answer(AnswerForm::kFull, 0);
  EXPECT_EQ(full, AsMessage(**planner, wanted, 3, "file:///x", {}, "j/3/", 0));
  ASSERT_GT(full.size(), size_t{4} << 16);
  const std::string columns = answer(AnswerForm::kReadColumns, 0);
  ASSERT_GT(columns.size(), size_t{1} << 16);
  for (const size_t given : {size_t{1}, size_t{100} << 10, full.size() - 1,
                             full.size(), size_t{64} << 20}) {
    EXPECT_EQ(answer(AnswerForm::kFull, given), full) << given;
    EXPECT_EQ(answer(AnswerForm::kReadColumns, given), columns) << given;
  }
  // Each of the 40 objects listed once, in the order of first use.
  v1::PlanLoadResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(columns));
  ASSERT_EQ(parsed.objects_size(), 40);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(parsed.objects(i), absl::StrCat("rank", i, "/data"));
  }
  v1::PlanLoadRequest request;
  WantedToProto(wanted[0], request.add_wanted());
  ASSERT_TRUE(ExpandReadColumns(request, &parsed).ok());
  ASSERT_EQ(parsed.reads_size(), 6000);
  for (int i = 0; i < 6000; ++i) {
    EXPECT_EQ(parsed.reads(i).source().object_key(),
              absl::StrCat("rank", i % 40, "/data"));
  }
}

// An answer's bytes, written out by hand from cairn.v1's PlanLoadResponse
// (the protobuf wire format): one read of a whole stored [4] float32 chunk,
// its crc32c a fixed32 (little-endian); in the read-columns form, the
// crc32c column is packed fixed32s.
TEST(LoadAnswerTest, BytesAreFixed) {
  planner::StoredTensor t;
  t.fqn = "w";
  t.dtype = planner::DType::kFloat32;
  t.global_shape = {4};
  t.chunks.push_back({{{0}, {4}}, {"r", 0, 16}, 0x04030201});
  std::unique_ptr<planner::LoadPlanner> planner =
      std::move(planner::LoadPlanner::Create({t}).value());
  const std::vector<planner::WantedChunk> wanted = {
      {"w", t.dtype, t.global_shape, {{0}, {4}}}};
  const std::string full(
      "\x08\x03"              // step 3
      "\x12\x09"              // storage_uri, 9 bytes:
      "file:///x"             //   the uri
      "\x1a\x1b"              // reads, 27 bytes:
      "\x0a\x01w"             //   fqn
      "\x1a\x06"              //   overlap:
      "\x0a\x01\x00"          //     offsets [0]
      "\x12\x01\x04"          //     sizes [4]
      "\x22\x05"              //   source:
      "\x0a\x01r"             //     object_key
      "\x18\x10"              //     length 16
      "\x2d\x01\x02\x03\x04"  //   source_crc32c
      "\x32\x02\x18\x10"      //   segments: length 16
      "\x2a\x04"              // step_prefix, 4 bytes:
      "j/3/",                 //   the prefix
      48);
  EXPECT_EQ(absl::BytesToHexString(
                WriteAnswer(*planner, wanted, AnswerForm::kFull).bytes),
            absl::BytesToHexString(full));
  v1::PlanLoadResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(full));
  ASSERT_EQ(parsed.reads_size(), 1);
  EXPECT_EQ(parsed.reads(0).source_crc32c(), 0x04030201u);
  // ReadColumns.crc32c (field 4): one packed fixed32.
  const std::string columns =
      WriteAnswer(*planner, wanted, AnswerForm::kReadColumns).bytes;
  EXPECT_NE(columns.find(std::string("\x22\x04\x01\x02\x03\x04", 6)),
            std::string::npos)
      << absl::BytesToHexString(columns);
  ASSERT_TRUE(parsed.ParseFromString(columns));
  ASSERT_EQ(parsed.read_columns().crc32c_size(), 1);
  EXPECT_EQ(parsed.read_columns().crc32c(0), 0x04030201u);
}

TEST(LoadAnswerTest, AnswerWithoutReads) {
  std::string none = PlanLoadAnswerWriter(0, "").Finish("");
  AppendLoadRound(0, &none);
  EXPECT_EQ(none, "");  // every field a default
  std::string some = PlanLoadAnswerWriter(-1, "u").Finish("p");
  AppendLoadRound(300, &some);
  v1::PlanLoadResponse want;
  want.set_step(-1);
  want.set_storage_uri("u");
  want.set_step_prefix("p");
  want.set_load_round(300);
  EXPECT_EQ(some, want.SerializeAsString());
}

}  // namespace
}  // namespace cairn::convert
