// The planned-object writer against the memory store: object grouping,
// zero padding to the planned offsets, crc32c per item, and errors that name
// the item and the object. Oracle: random plans written in random pieces
// compared with the bytes laid out by hand.
#include "protocol/planned_writer.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checksum.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/fault_injection_store.h"

namespace cairn::protocol {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Adds a planned write of a 1-D fp32 chunk [start, start + n) of `fqn` (or a
// bytes entry of n bytes when fqn starts with '$') at `offset` of `object`.
void AddWrite(v1::BeginSaveResponse& plan, const std::string& fqn,
              int64_t start, int64_t n, const std::string& object,
              uint64_t offset) {
  v1::PlannedWrite* w = plan.mutable_rank_plan()->add_writes();
  uint64_t length = 0;
  if (fqn[0] == '$') {
    w->mutable_item()->set_kind(v1::WriteItem::KIND_BYTES);
    w->mutable_item()->set_bytes_fqn(fqn.substr(1));
    length = static_cast<uint64_t>(n);
  } else {
    w->mutable_item()->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
    w->mutable_item()->mutable_tensor()->set_fqn(fqn);
    w->mutable_item()->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    w->mutable_item()->mutable_tensor()->add_global_shape(1 << 20);
    w->mutable_item()->mutable_chunk()->add_offsets(start);
    w->mutable_item()->mutable_chunk()->add_sizes(n);
    length = static_cast<uint64_t>(n) * 4;
  }
  w->mutable_item()->set_length(length);
  w->mutable_location()->set_object_key(object);
  w->mutable_location()->set_offset(offset);
  w->mutable_location()->set_length(length);
}

v1::CommitSaveRequest CommitFor(const v1::BeginSaveResponse& plan) {
  v1::CommitSaveRequest commit;
  for (const v1::PlannedWrite& w : plan.rank_plan().writes()) {
    *commit.add_results()->mutable_location() = w.location();
  }
  return commit;
}

std::string Bytes(uint64_t n, char seed) {
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 31);
  return s;
}

std::string ReadAll(storage::ShardStore& store, const std::string& key) {
  absl::StatusOr<uint64_t> size = store.Size(key);
  EXPECT_TRUE(size.ok()) << size.status();
  if (!size.ok()) return "";
  std::string out(*size, '\0');
  EXPECT_TRUE(store.Read(key, {0, *size}, absl::MakeSpan(out)).ok());
  return out;
}

TEST(GroupByObjectTest, GroupsByObjectSortsByOffsetAndPrefixesTheStep) {
  v1::BeginSaveResponse plan;
  plan.set_step_prefix("job/0000000007/");
  AddWrite(plan, "b", 0, 4, "data-1", 4096);
  AddWrite(plan, "a", 0, 4, "data-0", 8192);
  AddWrite(plan, "c", 0, 4, "data-1", 0);
  AddWrite(plan, "d", 0, 1024, "data-0", 0);
  absl::StatusOr<std::vector<PlannedObject>> objects = GroupByObject(plan);
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 2u);
  EXPECT_EQ((*objects)[0].key, "job/0000000007/data-0");
  EXPECT_THAT((*objects)[0].writes, ElementsAre(3, 1));
  EXPECT_EQ((*objects)[0].size, 8192u + 16);
  EXPECT_EQ((*objects)[1].key, "job/0000000007/data-1");
  EXPECT_THAT((*objects)[1].writes, ElementsAre(2, 0));
  EXPECT_EQ((*objects)[1].size, 4096u + 16);
}

TEST(GroupByObjectTest, OverlappingWritesAreInvalidNamingObjectAndItems) {
  v1::BeginSaveResponse plan;
  plan.set_step_prefix("job/0000000007/");
  AddWrite(plan, "model.wq", 0, 2048, "data-3", 0);  // 8192 bytes
  AddWrite(plan, "$rng", 0, 10, "data-3", 4096);
  EXPECT_THAT(
      GroupByObject(plan).status(),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr(
              "overlapping writes in object job/0000000007/data-3: "
              "'model.wq' [0:2048] at 0+8192 and bytes entry 'rng' at 4096")));
}

TEST(PlannedObjectWriterTest, PadsToPlannedOffsetsAndRecordsCrcPerItem) {
  auto store = storage::OpenMemoryShardStore().value();
  v1::BeginSaveResponse plan;
  plan.set_step_prefix("j/0000000001/");
  AddWrite(plan, "w", 0, 3, "data-0", 0);  // 12 bytes
  AddWrite(plan, "$blob", 0, 5, "data-0", 4096);
  AddWrite(plan, "v", 8, 0, "data-0", 8192);  // empty chunk
  v1::CommitSaveRequest commit = CommitFor(plan);
  auto objects = GroupByObject(plan).value();
  ASSERT_EQ(objects.size(), 1u);
  auto writer = PlannedObjectWriter::Open(*store, plan, objects[0], &commit);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string w = Bytes(12, 'a'), blob = Bytes(5, 'x');
  EXPECT_EQ((*writer)->current_write(), 0);
  // "w" in two pieces.
  ASSERT_TRUE((*writer)->Append(absl::MakeConstSpan(w.data(), 5)).ok());
  ASSERT_TRUE((*writer)->Append(absl::MakeConstSpan(w.data() + 5, 7)).ok());
  ASSERT_TRUE((*writer)->FinishItem().ok());
  ASSERT_TRUE((*writer)->WriteItem(blob).ok());
  ASSERT_TRUE((*writer)->FinishItem().ok());  // the empty one
  EXPECT_EQ((*writer)->current_write(), -1);
  ASSERT_TRUE((*writer)->Close().ok());

  std::string want(8192, '\0');
  want.replace(0, 12, w);
  want.replace(4096, 5, blob);
  EXPECT_EQ(ReadAll(*store, "j/0000000001/data-0"), want);
  EXPECT_EQ(commit.results(0).crc32c(), storage::Crc32c(w));
  EXPECT_EQ(commit.results(1).crc32c(), storage::Crc32c(blob));
  EXPECT_EQ(commit.results(2).crc32c(), 0u);
  EXPECT_EQ(commit.results(1).location().offset(), 4096u);
}

TEST(PlannedObjectWriterTest, WrongLengthsNameTheItemAndTheObject) {
  auto store = storage::OpenMemoryShardStore().value();
  v1::BeginSaveResponse plan;
  plan.set_step_prefix("j/0000000002/");
  AddWrite(plan, "model.wq", 4, 3, "data-5", 0);  // 12 bytes
  v1::CommitSaveRequest commit = CommitFor(plan);
  auto objects = GroupByObject(plan).value();
  {
    auto writer =
        PlannedObjectWriter::Open(*store, plan, objects[0], &commit).value();
    EXPECT_THAT(
        writer->Append(Bytes(13, 'q')),
        StatusIs(
            absl::StatusCode::kInvalidArgument,
            HasSubstr("'model.wq' [4:7] has 13 bytes here, more than the 12 "
                      "cairnd planned at 0 of object j/0000000002/data-5")));
    ASSERT_TRUE(writer->Append(Bytes(8, 'q')).ok());
    EXPECT_THAT(
        writer->FinishItem(),
        StatusIs(
            absl::StatusCode::kFailedPrecondition,
            HasSubstr("'model.wq' [4:7] has 8 bytes here, not the 12 cairnd "
                      "planned at 0 of object j/0000000002/data-5")));
    EXPECT_THAT(
        writer->Close(),
        StatusIs(
            absl::StatusCode::kFailedPrecondition,
            HasSubstr(
                "object j/0000000002/data-5 closed with 1 of its 1 planned "
                "items not written")));
  }
  // Nothing became visible.
  EXPECT_THAT(store->Size("j/0000000002/data-5"),
              StatusIs(absl::StatusCode::kNotFound));
  {
    auto writer =
        PlannedObjectWriter::Open(*store, plan, objects[0], &commit).value();
    ASSERT_TRUE(writer->WriteItem(Bytes(12, 'q')).ok());
    EXPECT_THAT(
        writer->Append(Bytes(1, 'q')),
        StatusIs(
            absl::StatusCode::kFailedPrecondition,
            HasSubstr("object j/0000000002/data-5: 1 bytes appended after its "
                      "last planned item")));
  }
}

TEST(PlannedObjectWriterTest, StorageErrorsNameTheItemAndTheObject) {
  storage::FaultInjectionStore store(storage::OpenMemoryShardStore().value());
  store.AddRule({.ops = storage::kFaultAppend,
                 .key_contains = "data-1",
                 .skip = 1,  // the padding before the second item passes
                 .status = absl::ResourceExhaustedError("disk full")});
  v1::BeginSaveResponse plan;
  plan.set_step_prefix("j/0000000003/");
  AddWrite(plan, "a", 0, 2, "data-1", 0);
  AddWrite(plan, "model.layers.3.w", 16, 4, "data-1", 4096);
  v1::CommitSaveRequest commit = CommitFor(plan);
  auto objects = GroupByObject(plan).value();
  auto writer =
      PlannedObjectWriter::Open(store, plan, objects[0], &commit).value();
  ASSERT_TRUE(writer->WriteItem(Bytes(8, 'a')).ok());
  EXPECT_THAT(
      writer->WriteItem(Bytes(16, 'b')),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("disk full (Append of 'j/0000000003/data-1') (writing "
                         "'model.layers.3.w' [16:20] to object "
                         "j/0000000003/data-1)")));
}

// Oracle: random plans (several objects, aligned offsets with gaps, empty
// items, bytes entries) written item by item in random pieces produce
// exactly the hand-laid-out objects and each item's crc32c.
TEST(PlannedObjectWriterTest, RandomPlansMatchTheOracle) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(trial);
    auto store = storage::OpenMemoryShardStore().value();
    v1::BeginSaveResponse plan;
    plan.set_step_prefix(absl::StrCat("j/", trial, "/"));
    std::map<std::string, std::string> want;  // object -> bytes
    std::vector<std::string> data;            // per write
    const int num_objects = 1 + static_cast<int>(rng() % 3);
    std::vector<uint64_t> end(num_objects, 0);
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const int o = static_cast<int>(rng() % num_objects);
      const std::string object = absl::StrCat("data-", o);
      const uint64_t align = (rng() % 2) ? 4096 : 64;
      const uint64_t offset =
          (end[o] + align - 1) / align * align + (rng() % 3 == 0 ? align : 0);
      const int64_t elems = static_cast<int64_t>(rng() % 3000);
      const bool bytes = rng() % 4 == 0;
      AddWrite(plan, bytes ? absl::StrCat("$b", i) : absl::StrCat("t", i),
               i * 4000, elems, object, offset);
      const uint64_t length = bytes ? elems : elems * 4;
      data.push_back(Bytes(length, static_cast<char>(rng())));
      std::string& w = want[plan.step_prefix() + object];
      w.resize(offset + length, '\0');
      w.replace(offset, length, data.back());
      end[o] = offset + length;
    }
    // Shuffle the plan's order: the writer must not depend on it.
    auto* writes = plan.mutable_rank_plan()->mutable_writes();
    std::vector<int> perm(n);
    for (int i = 0; i < n; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    v1::BeginSaveResponse shuffled = plan;
    std::vector<std::string> shuffled_data(n);
    for (int i = 0; i < n; ++i) {
      *shuffled.mutable_rank_plan()->mutable_writes(i) = writes->Get(perm[i]);
      shuffled_data[i] = data[perm[i]];
    }
    v1::CommitSaveRequest commit = CommitFor(shuffled);
    auto objects = GroupByObject(shuffled);
    ASSERT_TRUE(objects.ok()) << objects.status();
    for (const PlannedObject& object : *objects) {
      auto writer =
          PlannedObjectWriter::Open(*store, shuffled, object, &commit).value();
      for (int w : object.writes) {
        ASSERT_EQ(writer->current_write(), w);
        const std::string& d = shuffled_data[w];
        for (size_t done = 0; done < d.size();) {
          const size_t piece =
              std::min<size_t>(d.size() - done, 1 + rng() % (d.size() + 1));
          ASSERT_TRUE(
              writer->Append(absl::MakeConstSpan(d.data() + done, piece)).ok());
          done += piece;
        }
        ASSERT_TRUE(writer->FinishItem().ok());
      }
      ASSERT_TRUE(writer->Close().ok());
    }
    ASSERT_EQ(objects->size(), want.size());
    for (const auto& [key, bytes] : want) {
      EXPECT_EQ(ReadAll(*store, key), bytes) << key;
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(commit.results(i).crc32c(), storage::Crc32c(shuffled_data[i]))
          << i;
    }
  }
}

}  // namespace
}  // namespace cairn::protocol
