// Tests of `cairn diff JOB STEP_A STEP_B` (client/cli/checkpoint_diff.h):
// identical steps, a changed value found from the stored crc32c values with
// every data object deleted (so reading any byte would fail), entries added,
// removed and changed in kind, dtype or shape, a resharded tensor compared by
// reading its bytes, the JSON form, exit codes 0 / 1 / 2 and cairnd.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/checkpoint_diff.h"
#include "client/cli/cli_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_layout.h"

namespace cairn::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

class DiffTest : public CliTestBase {
 protected:
  // Saved by 3 ranks: rows split unevenly, a column split, a replicated
  // scalar, bfloat16 and bool, and two bytes entries.
  static std::vector<TestTensor> Tensors() {
    return {MakeTestTensor("model.embed.weight", v1::DTYPE_BFLOAT16, {7, 5}, 1,
                           SplitChunks({7, 5}, 0, {3, 1, 3})),
            MakeTestTensor("model.layers.0.wq", v1::DTYPE_FLOAT32, {4, 6}, 2,
                           SplitChunks({4, 6}, 1, {1, 2, 3})),
            MakeTestTensor("model.mask", v1::DTYPE_BOOL, {9}, 3,
                           SplitChunks({9}, 0, {5, 0, 4})),
            MakeTestTensor("model.tokens", v1::DTYPE_INT64, {}, 4, {})};
  }
  static std::vector<TestBytesEntry> Blobs() {
    return {{"rng_state", "rng", 1}, {"step", "1200", 0}};
  }
  void Save(int64_t step, std::vector<TestTensor> tensors,
            const std::vector<TestBytesEntry>& blobs = Blobs(), int world = 3) {
    auto m = WriteTestTensors(*store_, "job", step, world, std::move(tensors),
                              blobs);
    ASSERT_TRUE(m.ok()) << m.status();
  }
  // Deletes every data object of the step (its MANIFEST stays): anything
  // that reads a byte of it fails with DATA_LOSS.
  void DeleteData(int64_t step) {
    for (const auto& e : fs::directory_iterator(
             root_ + "/" + storage::StepPrefix("job", step))) {
      if (e.path().filename() != storage::kManifestName) fs::remove(e.path());
    }
  }
  static TestTensor& Named(std::vector<TestTensor>& ts,
                           const std::string& fqn) {
    for (TestTensor& t : ts) {
      if (t.fqn == fqn) return t;
    }
    ADD_FAILURE() << "no tensor " << fqn;
    return ts.front();
  }
};

TEST_F(DiffTest, IdenticalStepsExitZeroWithoutReadingData) {
  Save(1, Tensors());
  Save(2, Tensors());
  DeleteData(1);
  DeleteData(2);
  Result r = Cairn({"-s", uri_, "diff", "job", "1", "2"});
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("job job: step 1 and step 2 are identical (6 "
                               "entries in both: 6 compared by stored crc32c "
                               "without reading, 0 by reading bytes (0 B "
                               "read))"));
  Result json = Cairn({"-s", uri_, "diff", "job", "1", "latest", "--json"});
  EXPECT_EQ(json.code, 0) << json;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["job"], "job");
  EXPECT_EQ(j["step_a"], 1);
  EXPECT_EQ(j["step_b"], 2);
  EXPECT_EQ(j["identical"], true);
  EXPECT_EQ(j["entries"], nlohmann::json::array());
  EXPECT_EQ(j["unchanged"], 6);
  EXPECT_EQ(j["compared_by_crc32c"], 6);
  EXPECT_EQ(j["compared_by_bytes"], 0);
  EXPECT_EQ(j["bytes_read"], 0);
}

TEST_F(DiffTest, AChangedValueIsFoundFromTheStoredCrc32cAlone) {
  Save(1, Tensors());
  std::vector<TestTensor> changed = Tensors();
  Named(changed, "model.layers.0.wq").bytes[4 * 5] ^= 0x10;  // [0, 5]
  Save(2, changed, {{"rng_state", "RNG", 1}, {"step", "1200", 0}});
  DeleteData(1);
  DeleteData(2);
  Result r = Cairn({"-s", uri_, "diff", "job", "1", "2"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.out, HasSubstr("job job: step 1 -> step 2: 2 of 6 entries "
                               "differ"));
  EXPECT_THAT(r.out, ContainsRegex("differs +model.layers.0.wq +float32 \\[4, "
                                   "6\\] +float32 \\[4, 6\\] +1 of 3 chunks "
                                   "differ \\(by stored crc32c\\)"));
  EXPECT_THAT(r.out, ContainsRegex("differs +rng_state +bytes 3 B +bytes 3 B "
                                   "+crc32c or size differs"));
  EXPECT_THAT(r.out, Not(HasSubstr("model.embed.weight")));
  EXPECT_THAT(r.out, HasSubstr("4 identical; 6 entries in both: 6 compared by "
                               "stored crc32c without reading, 0 by reading "
                               "bytes"));
  Result json = Cairn({"-s", uri_, "diff", "job", "1", "2", "--json"});
  EXPECT_EQ(json.code, 1) << json;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["identical"], false);
  ASSERT_EQ(j["entries"].size(), 2u) << j.dump(2);
  const nlohmann::json& e = j["entries"][0];
  EXPECT_EQ(e["fqn"], "model.layers.0.wq");
  EXPECT_EQ(e["change"], "differs");
  EXPECT_EQ(e["compared"], "crc32c");
  EXPECT_EQ(e["chunks"], 3);
  EXPECT_EQ(e["chunks_differ"], 1);
  EXPECT_EQ(e["a"], nlohmann::json::parse(R"({"kind": "tensor", "dtype":
      "float32", "shape": [4, 6], "bytes": 96})"));
  EXPECT_EQ(e["a"], e["b"]);
  EXPECT_EQ(j["entries"][1]["fqn"], "rng_state");
  EXPECT_EQ(j["entries"][1]["compared"], "crc32c");
  EXPECT_EQ(j["bytes_read"], 0);

  // Through cairnd: the same answer from its manifests (no storage opened).
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result online = Cairn({"-c", addr, "diff", "job", "1", "2", "--json"});
  EXPECT_EQ(online.code, 1) << online;
  EXPECT_EQ(nlohmann::json::parse(online.out), j);
}

TEST_F(DiffTest, AddedRemovedAndChangedKindDtypeOrShape) {
  std::vector<TestTensor> a = Tensors();
  a.push_back(MakeTestTensor("model.old", v1::DTYPE_INT32, {2}, 5, {}));
  a.push_back(
      MakeTestTensor("model.becomes_bytes", v1::DTYPE_UINT8, {3}, 6, {}));
  Save(1, a);
  std::vector<TestTensor> b = Tensors();
  b.push_back(MakeTestTensor("model.new", v1::DTYPE_FLOAT32, {4}, 7, {}));
  TestTensor& embed = Named(b, "model.embed.weight");
  embed = MakeTestTensor("model.embed.weight", v1::DTYPE_BFLOAT16, {8, 5}, 1,
                         SplitChunks({8, 5}, 0, {3, 2, 3}));
  TestTensor& mask = Named(b, "model.mask");
  mask = MakeTestTensor("model.mask", v1::DTYPE_UINT8, {9}, 3,
                        SplitChunks({9}, 0, {5, 0, 4}));
  std::vector<TestBytesEntry> blobs = Blobs();
  blobs.push_back({"model.becomes_bytes", "xyz", 0});
  blobs.push_back({"extra", "e", 2});
  Save(2, b, blobs);
  DeleteData(1);
  DeleteData(2);
  Result r = Cairn({"-s", uri_, "diff", "job", "1", "2"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.out, ContainsRegex("added +extra +- +bytes 1 B"));
  EXPECT_THAT(r.out,
              ContainsRegex("changed +model.becomes_bytes +uint8 \\[3\\] "
                            "+bytes 3 B +kind changed"));
  EXPECT_THAT(r.out, ContainsRegex("changed +model.embed.weight +bfloat16 "
                                   "\\[7, 5\\] +bfloat16 \\[8, 5\\] +shape "
                                   "changed"));
  EXPECT_THAT(r.out, ContainsRegex("changed +model.mask +bool \\[9\\] +uint8 "
                                   "\\[9\\] +dtype changed"));
  EXPECT_THAT(r.out, ContainsRegex("added +model.new +- +float32 \\[4\\]"));
  EXPECT_THAT(r.out, ContainsRegex("removed +model.old +int32 \\[2\\] +-"));
  Result json = Cairn({"-s", uri_, "diff", "job", "1", "2", "--json"});
  EXPECT_EQ(json.code, 1) << json;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  std::vector<std::string> got;
  for (const nlohmann::json& e : j["entries"]) {
    got.push_back(absl::StrCat(
        e["change"].get<std::string>(), " ", e["fqn"].get<std::string>(),
        e.contains("what") ? " " + e["what"].dump() : ""));
  }
  EXPECT_THAT(got, ::testing::ElementsAre(
                       "added extra", "changed model.becomes_bytes [\"kind\"]",
                       "changed model.embed.weight [\"shape\"]",
                       "changed model.mask [\"dtype\"]", "added model.new",
                       "removed model.old"));
  EXPECT_TRUE(j["entries"][0]["a"].is_null());
  EXPECT_EQ(j["entries"][0]["b"]["kind"], "bytes");
  EXPECT_EQ(j["unchanged"], 4);
}

TEST_F(DiffTest, AnotherLayoutIsComparedByReadingBytes) {
  Save(1, Tensors());
  // The same values saved by 2 ranks in other boxes: embed by columns, wq
  // by rows; the rest as before.
  std::vector<TestTensor> resharded = Tensors();
  Named(resharded, "model.embed.weight").chunks =
      SplitChunks({7, 5}, 1, {2, 3});
  Named(resharded, "model.layers.0.wq").chunks = SplitChunks({4, 6}, 0, {3, 1});
  Named(resharded, "model.mask").chunks = SplitChunks({9}, 0, {4, 5});
  std::vector<TestBytesEntry> blobs = {{"rng_state", "rng", 1},
                                       {"step", "1200", 0}};
  Save(2, resharded, blobs, 2);
  Result same = Cairn({"-s", uri_, "diff", "job", "1", "2"});
  EXPECT_EQ(same.code, 0) << same;
  EXPECT_THAT(same.out, HasSubstr("are identical (6 entries in both: 3 "
                                  "compared by stored crc32c without "
                                  "reading, 3 by reading bytes"));

  // One element of embed changed, in the resharded step.
  Named(resharded, "model.embed.weight").bytes[2 * (3 * 5 + 4)] ^= 0x01;
  Save(3, resharded, blobs, 2);
  Result r = Cairn({"-s", uri_, "diff", "job", "1", "3"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.out, ContainsRegex("differs +model.embed.weight +bfloat16 "
                                   "\\[7, 5\\] +bfloat16 \\[7, 5\\] +1 of 35 "
                                   "elements differ \\(compared bytes: other "
                                   "layout\\)"));
  Result json = Cairn({"-s", uri_, "diff", "job", "1", "3", "--json"});
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["entries"].size(), 1u) << j.dump(2);
  EXPECT_EQ(j["entries"][0]["compared"], "bytes");
  EXPECT_EQ(j["entries"][0]["elements"], 35);
  EXPECT_EQ(j["entries"][0]["elements_differ"], 1);
  EXPECT_EQ(j["compared_by_bytes"], 3);
  // Every chunk of both sides of the 3 tensors read once (the cache holds
  // B's chunks): 70 + 96 + 9 bytes each.
  EXPECT_EQ(j["bytes_read"], 2 * (70 + 96 + 9));

  // Without a cache B's chunks are read again for each chunk of A that
  // overlaps them, to the same answer.
  const v1::Manifest m1 = storage::ReadManifest(*store_, "job", 1).value();
  const v1::Manifest m3 = storage::ReadManifest(*store_, "job", 3).value();
  DiffOptions options;
  options.cache_bytes = 1;
  absl::StatusOr<CheckpointDiff> uncached = DiffCheckpoints(
      m1, m3, [&](int) { return store_.get(); }, options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  ASSERT_EQ(uncached->entries.size(), 1u);
  EXPECT_EQ(uncached->entries[0].elements_differ, 1u);
  EXPECT_GT(uncached->bytes_read, 2u * (70 + 96 + 9));

  // A damaged chunk on the byte path is an error (2), naming it.
  DeleteData(3);
  Result lost = Cairn({"-s", uri_, "diff", "job", "1", "3"});
  EXPECT_EQ(lost.code, 2) << lost;
  EXPECT_THAT(lost.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(lost.err, HasSubstr("job 'job' step 3 tensor 'model.embed."
                                  "weight' chunk"));
}

TEST_F(DiffTest, ErrorsExitTwo) {
  Save(1, Tensors());
  Result step = Cairn({"-s", uri_, "diff", "job", "1", "9"});
  EXPECT_EQ(step.code, 2) << step;
  EXPECT_THAT(step.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(step.err, HasSubstr("job 'job' step 9"));
  Result job = Cairn({"-s", uri_, "diff", "nojob", "1", "2"});
  EXPECT_EQ(job.code, 2) << job;
  EXPECT_THAT(job.err, HasSubstr("job 'nojob' step 1"));
  EXPECT_EQ(Cairn({"-s", uri_, "diff", "job", "1"}).code, 2);
  Result bad = Cairn({"-s", uri_, "diff", "job", "1", "x"});
  EXPECT_EQ(bad.code, 2) << bad;
  EXPECT_THAT(bad.err, HasSubstr("got 'x'"));
  Result root =
      Cairn({"-s", "file://" + dir_ + "/nope", "diff", "job", "1", "1"});
  EXPECT_EQ(root.code, 2) << root;
  EXPECT_EQ(Cairn({"-c", "127.0.0.1:1", "diff", "job", "1", "1"}).code, 2);
  // A step against itself is identical.
  EXPECT_EQ(Cairn({"-s", uri_, "diff", "job", "1", "latest"}).code, 0);
}

}  // namespace
}  // namespace cairn::cli
