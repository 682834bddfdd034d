#include "proto/convert/load_answer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert/plan_convert.h"

namespace cairn::convert {
namespace {

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

TEST(LoadAnswerTest, ARequestAsksForTheFormItWasGiven) {
  for (AnswerForm form :
       {AnswerForm::kFull, AnswerForm::kCompact,
        AnswerForm::kCompactSharedBoxes, AnswerForm::kReadColumns}) {
    v1::PlanLoadRequest request;
    request.set_compact(true);  // overwritten either way
    request.set_shared_boxes(true);
    request.set_read_columns(true);
    AskForAnswerForm(form, &request);
    EXPECT_EQ(AnswerFormOf(request), form);
  }
  // shared_boxes alone (not a form libcairn asks for) is the full form.
  v1::PlanLoadRequest request;
  request.set_shared_boxes(true);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kFull);
  request.set_compact(true);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kCompactSharedBoxes);
  request.set_read_columns(true);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kReadColumns);
  // read_columns without shared_boxes is the compact form.
  request.set_shared_boxes(false);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kCompact);
  request.set_read_columns(false);
  EXPECT_EQ(AnswerFormOf(request), AnswerForm::kCompact);
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

    // The answer in a compact `form`, planned without copy segments as cairnd
    // plans it, with the load round appended; `seen` is shown each item.
    const auto compact_answer =
        [&](AnswerForm form,
            const std::function<void(const planner::LoadPlanner::ReadView&)>&
                seen) {
          PlanLoadAnswerWriter w(step, uri, form, expected());
          EXPECT_TRUE((*planner)
                          ->PlanEach(
                              wanted,
                              [&](const planner::LoadPlanner::ReadView& r) {
                                seen(r);
                                w.AddRead(r);
                              },
                              /*segments=*/false)
                          .ok());
          for (const v1::ManifestBytes& e : entries) w.AddBytesEntry(e);
          EXPECT_EQ(w.reads(), items);
          EXPECT_EQ(w.bytes_to_read(), bytes);
          std::string out = std::move(w).Finish(prefix);
          AppendLoadRound(round, &out);
          return out;
        };

    // The compact form (planned without copy segments, as cairnd does),
    // expanded by the rank, is the full form plus each item's source_box and
    // chunk id.
    const std::string compact_wire = compact_answer(
        AnswerForm::kCompact, [](const planner::LoadPlanner::ReadView& r) {
          EXPECT_EQ(r.segments, nullptr);
        });
    if (items > 0) {
      EXPECT_LT(compact_wire.size(), wire.size());
    }
    v1::PlanLoadRequest request;
    for (const planner::WantedChunk& w : wanted) {
      WantedToProto(w, request.add_wanted());
    }
    v1::PlanLoadResponse expanded;
    ASSERT_TRUE(expanded.ParseFromString(compact_wire));
    ASSERT_TRUE(ExpandCompactAnswer(request, &expanded).ok());
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
      EXPECT_EQ(BoxFromProto(item.source_box(), "").value(), stored.box);
      item.clear_source_box();
      item.clear_chunk();
      item.clear_object_index();
    }
    expanded.clear_objects();
    EXPECT_EQ(expanded.SerializeAsString(), wire);

    // The compact form with shared boxes, expanded, is the same: each item's
    // box is the stored chunk's. Each box is listed at least once, and again
    // at most when another took its slot in the writer's table.
    absl::flat_hash_set<uint32_t> box_ids;
    const std::string shared_wire =
        compact_answer(AnswerForm::kCompactSharedBoxes,
                       [&](const planner::LoadPlanner::ReadView& r) {
                         EXPECT_LT(r.box_id, (*planner)->num_box_ids());
                         box_ids.insert(r.box_id);
                       });
    ASSERT_TRUE(expanded.ParseFromString(shared_wire));
    EXPECT_GE(expanded.boxes_size(), static_cast<int>(box_ids.size()));
    EXPECT_LE(expanded.boxes_size(), items);
    ASSERT_TRUE(ExpandCompactAnswer(request, &expanded).ok());
    const std::string shared_expanded = expanded.SerializeAsString();
    for (int i = 0; i < expanded.reads_size(); ++i) {
      v1::ReadItem& item = *expanded.mutable_reads(i);
      ASSERT_TRUE(item.has_chunk());
      ASSERT_TRUE(item.has_box());
      EXPECT_FALSE(item.has_source_box());
      const auto at = (*planner)->ChunkOfId(item.chunk());
      ASSERT_TRUE(at.has_value());
      EXPECT_EQ(BoxFromProto(expanded.boxes(static_cast<int>(item.box())), "")
                    .value(),
                (*planner)->chunk(at->first, at->second).box);
      item.clear_box();
      item.clear_chunk();
      item.clear_object_index();
    }
    expanded.clear_objects();
    expanded.clear_boxes();
    EXPECT_EQ(expanded.SerializeAsString(), wire);

    // The same as columns: no ReadItem on the wire, the same objects and
    // boxes listed, and, expanded, exactly the shared-boxes answer expanded.
    const std::string columns_wire = compact_answer(
        AnswerForm::kReadColumns, [](const planner::LoadPlanner::ReadView&) {});
    // Smaller once the columns' tags and lengths are paid for, even with
    // these random values (the differences of two random offsets near 2^62
    // take more bytes than the offsets; a model's answer is half the size,
    // SharedBoxesAreListedOnce).
    if (items >= 8) {
      EXPECT_LT(columns_wire.size(), shared_wire.size());
    }
    ASSERT_TRUE(expanded.ParseFromString(columns_wire));
    EXPECT_EQ(expanded.reads_size(), 0);
    ASSERT_TRUE(expanded.has_read_columns());
    EXPECT_EQ(expanded.read_columns().dest_index_size(), items);
    EXPECT_EQ(expanded.read_columns().crc32c_size(), items);
    ASSERT_TRUE(ExpandCompactAnswer(request, &expanded).ok());
    EXPECT_FALSE(expanded.has_read_columns());
    EXPECT_EQ(expanded.SerializeAsString(), shared_expanded);
  }
  EXPECT_GT(reads, 1000u);
}

// One stored [8, 4] float32 tensor in two row blocks, in two objects; a rank
// wants rows 2..6.
struct CompactCase {
  explicit CompactCase(AnswerForm form = AnswerForm::kCompact) {
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
    PlanLoadAnswerWriter w(7, "file:///x", form);
    EXPECT_TRUE(planner
                    ->PlanEach({want},
                               [&](const planner::LoadPlanner::ReadView& r) {
                                 w.AddRead(r);
                               })
                    .ok());
    EXPECT_TRUE(answer.ParseFromString(std::move(w).Finish("j/7/")));
  }
  std::unique_ptr<planner::LoadPlanner> planner;
  v1::PlanLoadRequest request;
  v1::PlanLoadResponse answer;
};

TEST(LoadAnswerTest, ExpandsACompactAnswer) {
  CompactCase c;
  ASSERT_EQ(c.answer.reads_size(), 2);
  ASSERT_EQ(c.answer.objects_size(), 2);
  ASSERT_TRUE(ExpandCompactAnswer(c.request, &c.answer).ok());
  const v1::ReadItem& a = c.answer.reads(0);
  EXPECT_EQ(a.fqn(), "w");
  EXPECT_EQ(a.source().object_key(), "r0");
  EXPECT_EQ(a.chunk(), 0u);
  ASSERT_EQ(a.segments_size(), 1);  // rows 2..3 of block 0: bytes 32..63
  EXPECT_EQ(a.segments(0).src_offset(), 32u);
  EXPECT_EQ(a.segments(0).dst_offset(), 0u);
  EXPECT_EQ(a.segments(0).length(), 32u);
  const v1::ReadItem& b = c.answer.reads(1);
  EXPECT_EQ(b.source().object_key(), "r1");
  EXPECT_EQ(b.source().offset(), 4096u);
  EXPECT_EQ(b.chunk(), 1u);
  ASSERT_EQ(b.segments_size(), 1);  // rows 4..5 of block 1: bytes 0..31
  EXPECT_EQ(b.segments(0).src_offset(), 0u);
  EXPECT_EQ(b.segments(0).dst_offset(), 32u);
  EXPECT_EQ(b.overlap().offsets(0), 4);
  EXPECT_EQ(b.overlap().sizes(0), 2);
  // Expanding again changes nothing (items are in the full form by then,
  // and the full form passes through).
  v1::PlanLoadResponse again = c.answer;
  ASSERT_TRUE(ExpandCompactAnswer(c.request, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), c.answer.SerializeAsString());
}

TEST(LoadAnswerTest, RefusesACompactAnswerThatCannotBeRight) {
  const std::vector<
      std::pair<std::string, std::function<void(v1::PlanLoadResponse*)>>>
      damages = {
          {"destination 1 of 1",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(1)->set_dest_index(1);
           }},
          {"destination -1",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(0)->set_dest_index(-1);
           }},
          {"object 2 of 2",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(1)->set_object_index(2);
           }},
          {"object 0 of 0",
           [](v1::PlanLoadResponse* a) { a->clear_objects(); }},
          {"but length 65",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(0)->mutable_source()->set_length(65);
           }},
          {"exceeds shape",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(1)->mutable_source_box()->set_offsets(0, 5);
           }},
          {"outside the wanted chunk",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(0)->mutable_source_box()->set_sizes(0, 2);
             a->mutable_reads(0)->mutable_source()->set_length(32);
           }},
          {"2 offsets but 3 sizes",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(0)->mutable_source_box()->add_sizes(1);
           }},
      };
  for (const auto& [want, damage] : damages) {
    SCOPED_TRACE(want);
    CompactCase c;
    damage(&c.answer);
    const absl::Status s = ExpandCompactAnswer(c.request, &c.answer);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
    if (want.find("destination") == std::string::npos) {
      EXPECT_NE(s.message().find("of 'w'"), std::string::npos) << s;
    }
  }
}

TEST(LoadAnswerTest, RefusesASharedBoxesAnswerThatCannotBeRight) {
  const std::vector<
      std::pair<std::string, std::function<void(v1::PlanLoadResponse*)>>>
      damages = {
          {"box 2 of 2",
           [](v1::PlanLoadResponse* a) { a->mutable_reads(1)->set_box(2); }},
          {"box 0 of 0", [](v1::PlanLoadResponse* a) { a->clear_boxes(); }},
          {"names its stored box both ways",
           [](v1::PlanLoadResponse* a) {
             *a->mutable_reads(0)->mutable_source_box() = a->boxes(0);
           }},
          {"but length 65",
           [](v1::PlanLoadResponse* a) {
             a->mutable_reads(0)->mutable_source()->set_length(65);
           }},
          {"exceeds shape",
           [](v1::PlanLoadResponse* a) {
             a->mutable_boxes(1)->set_offsets(0, 5);
           }},
          {"outside the wanted chunk",
           [](v1::PlanLoadResponse* a) {
             a->mutable_boxes(0)->set_sizes(0, 2);
           }},
          {"2 offsets but 3 sizes",
           [](v1::PlanLoadResponse* a) { a->mutable_boxes(0)->add_sizes(1); }},
      };
  for (const auto& [want, damage] : damages) {
    SCOPED_TRACE(want);
    CompactCase c(AnswerForm::kCompactSharedBoxes);
    ASSERT_EQ(c.answer.boxes_size(), 2);
    damage(&c.answer);
    const absl::Status s = ExpandCompactAnswer(c.request, &c.answer);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
    EXPECT_NE(s.message().find("of 'w'"), std::string::npos) << s;
  }
}

TEST(LoadAnswerTest, RefusesReadColumnsThatCannotBeRight) {
  const std::vector<
      std::pair<std::string, std::function<void(v1::ReadColumns*)>>>
      damages = {
          {"2 destinations, 2 objects, 2 offsets, 1 checksums",
           [](v1::ReadColumns* c) { c->mutable_crc32c()->RemoveLast(); }},
          {"3 boxes", [](v1::ReadColumns* c) { c->add_box(0); }},
          {"destination 1 of 1",  // the second item's difference is 1 more
           [](v1::ReadColumns* c) { c->set_dest_index(1, 1); }},
          {"destination -1",
           [](v1::ReadColumns* c) { c->set_dest_index(0, -1); }},
          {"object 2 of 2",
           [](v1::ReadColumns* c) { c->set_object_index(1, 2); }},
          {"box 2 of 2", [](v1::ReadColumns* c) { c->set_box(1, 2); }},
          {"out of range: destination 2147483648",
           [](v1::ReadColumns* c) { c->set_dest_index(0, int64_t{1} << 31); }},
          {"out of range",
           [](v1::ReadColumns* c) { c->set_object_index(0, -3); }},
          {"out of range",
           [](v1::ReadColumns* c) { c->set_chunk(1, int64_t{1} << 32); }},
          {"out of range", [](v1::ReadColumns* c) { c->set_offset(0, -1); }},
          {"out of range",
           [](v1::ReadColumns* c) { c->set_box(0, -(int64_t{1} << 40)); }},
      };
  for (const auto& [want, damage] : damages) {
    SCOPED_TRACE(want);
    CompactCase c(AnswerForm::kReadColumns);
    ASSERT_EQ(c.answer.read_columns().dest_index_size(), 2);
    damage(c.answer.mutable_read_columns());
    const absl::Status s = ExpandCompactAnswer(c.request, &c.answer);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  }
  // Undamaged, it is the answer of ExpandsACompactAnswer.
  CompactCase columns(AnswerForm::kReadColumns);
  CompactCase items(AnswerForm::kCompactSharedBoxes);
  ASSERT_TRUE(ExpandCompactAnswer(columns.request, &columns.answer).ok());
  ASSERT_TRUE(ExpandCompactAnswer(items.request, &items.answer).ok());
  EXPECT_EQ(columns.answer.SerializeAsString(),
            items.answer.SerializeAsString());
  EXPECT_EQ(columns.answer.reads(1).source().offset(), 4096u);
  EXPECT_EQ(columns.answer.reads(1).chunk(), 1u);
}

// A model's layers stored in one tiling: the shared-boxes answer lists each
// stored box once, in far fewer bytes than the compact form, and expands to
// the same read items.
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
  const auto answer = [&](AnswerForm form) {
    PlanLoadAnswerWriter w(3, "file:///x", form);
    EXPECT_TRUE(
        (*planner)
            ->PlanEach(
                wanted,
                [&](const planner::LoadPlanner::ReadView& r) { w.AddRead(r); },
                /*segments=*/false)
            .ok());
    EXPECT_EQ(w.reads(), 200);
    return std::move(w).Finish("j/3/");
  };
  const std::string compact = answer(AnswerForm::kCompact);
  const std::string shared = answer(AnswerForm::kCompactSharedBoxes);
  v1::PlanLoadResponse a, b;
  ASSERT_TRUE(a.ParseFromString(compact));
  ASSERT_TRUE(b.ParseFromString(shared));
  ASSERT_EQ(b.boxes_size(), 5);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(BoxFromProto(b.boxes(k), "").value(),
              (planner::ChunkBox{{k * 8, 0}, {8, 16}}));
  }
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(b.reads(i).box(), static_cast<uint32_t>(i % 5));
    EXPECT_EQ(b.reads(i).source().length(), 0u);  // left out
  }
  // ~20 bytes an item instead of ~31 (its own box and length left out):
  // 4184 bytes instead of 6334.
  EXPECT_LT(shared.size() * 10, compact.size() * 7)
      << shared.size() << " vs " << compact.size();
  ASSERT_TRUE(ExpandCompactAnswer(request, &a).ok());
  ASSERT_TRUE(ExpandCompactAnswer(request, &b).ok());
  for (int i = 0; i < 200; ++i) {
    a.mutable_reads(i)->clear_source_box();
    b.mutable_reads(i)->clear_box();
  }
  b.clear_boxes();
  EXPECT_EQ(b.SerializeAsString(), a.SerializeAsString());

  // As columns: the same boxes, each item's values as small differences in
  // ~11 bytes instead of ~20, and the same items once expanded.
  const std::string columns = answer(AnswerForm::kReadColumns);
  EXPECT_LT(columns.size() * 10, shared.size() * 6)
      << columns.size() << " vs " << shared.size();
  v1::PlanLoadResponse c, d;
  ASSERT_TRUE(c.ParseFromString(columns));
  ASSERT_TRUE(d.ParseFromString(shared));
  EXPECT_EQ(c.reads_size(), 0);
  ASSERT_EQ(c.boxes_size(), 5);
  ASSERT_TRUE(ExpandCompactAnswer(request, &c).ok());
  ASSERT_TRUE(ExpandCompactAnswer(request, &d).ok());
  EXPECT_EQ(c.SerializeAsString(), d.SerializeAsString());
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
  PlanLoadAnswerWriter w(3, "file:///x", AnswerForm::kCompactSharedBoxes);
  ASSERT_TRUE(
      (*planner)
          ->PlanEach(
              wanted,
              [&](const planner::LoadPlanner::ReadView& r) { w.AddRead(r); },
              /*segments=*/false)
          .ok());
  v1::PlanLoadResponse a;
  ASSERT_TRUE(a.ParseFromString(std::move(w).Finish("j/3/")));
  ASSERT_EQ(a.reads_size(), 12000);
  EXPECT_GE(a.boxes_size(), 6000);
  EXPECT_LT(a.boxes_size(), 6000 + 60) << "the table did not grow";
  v1::PlanLoadRequest request;
  for (const planner::WantedChunk& x : wanted) {
    WantedToProto(x, request.add_wanted());
  }
  ASSERT_TRUE(ExpandCompactAnswer(request, &a).ok());
  for (int i = 0; i < 12000; ++i) {
    const v1::ReadItem& item = a.reads(i);
    EXPECT_EQ(BoxFromProto(a.boxes(static_cast<int>(item.box())), "").value(),
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
    PlanLoadAnswerWriter w(3, "file:///x", form, expected);
    EXPECT_TRUE(
        (*planner)
            ->PlanEach(
                wanted,
                [&](const planner::LoadPlanner::ReadView& r) { w.AddRead(r); },
                form == AnswerForm::kFull)
            .ok());
    EXPECT_EQ(w.reads(), 6000);
    std::string bytes = std::move(w).Finish("j/3/");
    EXPECT_LE(bytes.capacity(), bytes.size() + bytes.size() / 8 + 64)
        << "given " << expected;
    return bytes;
  };
  const std::string full = answer(AnswerForm::kFull, 0);
  EXPECT_EQ(full, AsMessage(**planner, wanted, 3, "file:///x", {}, "j/3/", 0));
  ASSERT_GT(full.size(), size_t{4} << 16);
  const std::string compact = answer(AnswerForm::kCompact, 0);
  ASSERT_GT(compact.size(), size_t{2} << 16);
  for (const size_t given : {size_t{1}, size_t{100} << 10, full.size() - 1,
                             full.size(), size_t{64} << 20}) {
    EXPECT_EQ(answer(AnswerForm::kFull, given), full) << given;
    EXPECT_EQ(answer(AnswerForm::kCompact, given), compact) << given;
  }
  // Each of the 40 objects listed once, in the order of first use.
  v1::PlanLoadResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(compact));
  ASSERT_EQ(parsed.objects_size(), 40);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(parsed.objects(i), absl::StrCat("rank", i, "/data"));
    EXPECT_EQ(parsed.reads(i).object_index(), i);
    EXPECT_EQ(parsed.reads(i + 40).object_index(), i);
  }
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
