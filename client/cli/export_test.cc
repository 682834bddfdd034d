// Tests of `cairn export --format safetensors` (client/cli/
// safetensors_export.h): checkpoints saved by several ranks with uneven
// shards and 2-d tilings in every dtype are exported, and the files are
// parsed back here (8-byte header length, JSON header, data offsets,
// alignment) and compared byte for byte with the whole tensors; the size
// cap's files and index; filters; and every failure (unknown step, a filter
// matching nothing, an existing DIR, a damaged or missing chunk, Ctrl-C, a
// disk that fills) leaving neither DIR nor its temporary sibling nor the
// parent directories it made.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli_test_fixture.h"
#include "client/cli/safetensors_export.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_layout.h"
#include "storage/shard_store.h"
#include "storage/testing/fault_injection_store.h"

namespace cairn::cli {
namespace {

namespace fs = std::filesystem;
using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A safetensors file parsed as a reader must: the header's length, the
// JSON, and the data after it.
struct Safetensors {
  uint64_t header_length = 0;
  nlohmann::json header;
  std::string data;
};

Safetensors ParseSafetensors(const std::string& path) {
  const std::string bytes = ReadFile(path);
  Safetensors s;
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return s;
  for (int b = 7; b >= 0; --b) {
    s.header_length = s.header_length << 8 | static_cast<uint8_t>(bytes[b]);
  }
  EXPECT_EQ((8 + s.header_length) % 8, 0u) << path;
  EXPECT_LE(8 + s.header_length, bytes.size()) << path;
  const std::string text = bytes.substr(8, s.header_length);
  EXPECT_EQ(text.front(), '{') << path;
  s.header = nlohmann::json::parse(text);
  s.data = bytes.substr(8 + s.header_length);
  // The data is exactly the tensors', back to back, each aligned to its
  // element size.
  std::map<uint64_t, uint64_t> ranges;
  for (const auto& [name, t] : s.header.items()) {
    if (name == "__metadata__") continue;
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    ranges[begin] = end;
    const std::string dtype = t["dtype"];
    const uint64_t elem = dtype == "F64" || dtype == "I64"   ? 8
                          : dtype == "F32" || dtype == "I32" ? 4
                          : dtype == "F16" || dtype == "BF16" || dtype == "I16"
                              ? 2
                              : 1;
    EXPECT_EQ((8 + s.header_length + begin) % elem, 0u) << name;
  }
  uint64_t at = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, at) << path;
    at = end;
  }
  EXPECT_EQ(at, s.data.size()) << path;
  return s;
}

std::string DataOf(const Safetensors& s, const std::string& fqn) {
  const nlohmann::json& t = s.header.at(fqn);
  const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
  return s.data.substr(begin, end - begin);
}

// Entries of `dir` other than itself (so a test sees stray temp dirs).
std::vector<std::string> Siblings(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path())) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A store that raises SIGINT in the reading thread on its first read of a
// data object, as a Ctrl-C in the middle of an export.
class InterruptingStore : public storage::FaultInjectionStore {
 public:
  using FaultInjectionStore::FaultInjectionStore;
  absl::StatusOr<size_t> Read(absl::string_view key, storage::ByteRange range,
                              absl::Span<char> out) override {
    if (absl::StrContains(key, ".data") && !raised_) {
      raised_ = true;
      raise(SIGINT);
    }
    return FaultInjectionStore::Read(key, range, out);
  }

 private:
  bool raised_ = false;
};

class ExportTest : public CliTestBase {
 protected:
  void SetUp() override {
    CliTestBase::SetUp();
    out_ = dir_ + "/export/llama";
  }

  // Saved by 3 ranks: uneven row shards, a 2-d tiling, column shards, a
  // rank holding an empty shard, a scalar, a tensor of no elements, and
  // every dtype safetensors has, plus two bytes entries.
  std::vector<TestTensor> Tensors(uint64_t seed) const {
    std::vector<TestTensor> t;
    t.push_back(MakeTestTensor("model.embed.weight", v1::DTYPE_BFLOAT16, {7, 5},
                               seed + 1, SplitChunks({7, 5}, 0, {3, 1, 3})));
    std::vector<TestChunk> grid;  // rows {2, 4} x cols {1, 3}
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        grid.push_back(TestChunk{{r == 0 ? 0 : 2, c == 0 ? 0 : 1},
                                 {r == 0 ? 2 : 4, c == 0 ? 1 : 3},
                                 (2 * r + c) % 3});
      }
    }
    t.push_back(MakeTestTensor("model.layers.0.attn.wq", v1::DTYPE_FLOAT32,
                               {6, 4}, seed + 2, grid));
    t.push_back(MakeTestTensor("model.layers.0.mlp.w1", v1::DTYPE_FLOAT32,
                               {3, 8}, seed + 3,
                               SplitChunks({3, 8}, 1, {2, 5, 1})));
    t.push_back(MakeTestTensor("model.layers.0.mask", v1::DTYPE_BOOL, {9},
                               seed + 4, SplitChunks({9}, 0, {5, 0, 4})));
    t.push_back(
        MakeTestTensor("model.tokens_seen", v1::DTYPE_INT64, {}, seed + 5, {}));
    t.push_back(MakeTestTensor("model.positions", v1::DTYPE_INT64, {5, 3},
                               seed + 6, SplitChunks({5, 3}, 0, {2, 2, 1})));
    t.push_back(
        MakeTestTensor("model.f16", v1::DTYPE_FLOAT16, {3}, seed + 7, {}));
    t.push_back(MakeTestTensor("model.f64", v1::DTYPE_FLOAT64, {2, 2}, seed + 8,
                               SplitChunks({2, 2}, 1, {1, 0, 1})));
    t.push_back(
        MakeTestTensor("model.i32", v1::DTYPE_INT32, {3}, seed + 9, {}));
    t.push_back(MakeTestTensor("model.i16", v1::DTYPE_INT16, {5}, seed + 10,
                               SplitChunks({5}, 0, {1, 1, 3})));
    t.push_back(MakeTestTensor("model.i8", v1::DTYPE_INT8, {3}, seed + 11, {}));
    t.push_back(
        MakeTestTensor("model.u8", v1::DTYPE_UINT8, {4}, seed + 12, {}));
    t.push_back(
        MakeTestTensor("model.fp8", v1::DTYPE_FLOAT8_E4M3, {2}, seed + 13, {}));
    t.push_back(MakeTestTensor("model.empty", v1::DTYPE_FLOAT32, {0, 4},
                               seed + 15, SplitChunks({0, 4}, 1, {2, 2, 0})));
    t.push_back(MakeTestTensor("optim.state.0.exp_avg", v1::DTYPE_FLOAT32, {6},
                               seed + 14, SplitChunks({6}, 0, {2, 2, 2})));
    return t;
  }
  std::vector<TestBytesEntry> Blobs() const {
    return {{"optim.param_groups", "pickled groups", 0},
            {"rng_state", "pickled rng", 1}};
  }
  void Save(int64_t step) {
    auto m = WriteTestTensors(*store_, "job", step, 3, Tensors(step), Blobs());
    ASSERT_TRUE(m.ok()) << m.status();
  }
  // Checks that `s` holds exactly `fqns` of Tensors(seed), each whole.
  void ExpectTensors(const Safetensors& s, uint64_t seed,
                     const std::vector<std::string>& fqns) const {
    std::vector<std::string> names;
    for (const auto& [name, t] : s.header.items()) {
      if (name != "__metadata__") names.push_back(name);
    }
    EXPECT_THAT(names, ::testing::UnorderedElementsAreArray(fqns));
    for (const TestTensor& t : Tensors(seed)) {
      if (!s.header.contains(t.fqn)) continue;
      const nlohmann::json& h = s.header[t.fqn];
      EXPECT_EQ(h["dtype"], SafetensorsDType(t.dtype)) << t.fqn;
      EXPECT_EQ(h["shape"].get<std::vector<int64_t>>(), t.shape) << t.fqn;
      EXPECT_TRUE(DataOf(s, t.fqn) == t.bytes) << t.fqn;
    }
  }
  std::vector<std::string> AllFqns() const {
    std::vector<std::string> out;
    for (const TestTensor& t : Tensors(0)) out.push_back(t.fqn);
    return out;
  }
  // Neither DIR, nor its temporary sibling, nor the parent directory the
  // export made for it (no test makes it beforehand).
  void ExpectNothingLeft() const {
    EXPECT_FALSE(fs::exists(out_));
    if (fs::exists(fs::path(out_).parent_path())) {
      ADD_FAILURE() << fs::path(out_).parent_path() << " was left behind";
      EXPECT_THAT(Siblings(out_), IsEmpty());
    }
  }

  std::string out_;
};

TEST(SafetensorsExportTest, ByteSizesAreParsedAsTransformersReadsThem) {
  EXPECT_EQ(ParseByteSize("5GB").value(), 5000000000u);
  EXPECT_EQ(ParseByteSize("500MB").value(), 500000000u);
  EXPECT_EQ(ParseByteSize("2GiB").value(), uint64_t{2} << 30);
  EXPECT_EQ(ParseByteSize("3mib").value(), uint64_t{3} << 20);
  EXPECT_EQ(ParseByteSize("10KB").value(), 10000u);
  EXPECT_EQ(ParseByteSize("1kib").value(), 1024u);
  EXPECT_EQ(ParseByteSize("1TB").value(), 1000000000000u);
  EXPECT_EQ(ParseByteSize("1024").value(), 1024u);
  EXPECT_EQ(ParseByteSize("7B").value(), 7u);
  for (const char* bad : {"", "0", "0GB", "-1", "1.5GB", "GB", "5 XB", "5GBs",
                          "0x10", "99999999999TB", "18446744073709551616"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseByteSize("lots").status().message()),
              HasSubstr("bad size 'lots'"));
}

TEST(SafetensorsExportTest, ShardsAreFilledInOrderAndBigTensorsGoAlone) {
  // Cap 6: 3+3 fit, the next 3 starts a file, 10 > cap goes alone (closing
  // the file being filled), then 1.
  EXPECT_THAT(PlanShards({3, 3, 3, 10, 1}, 6),
              ElementsAre(ElementsAre(0, 1), ElementsAre(2), ElementsAre(3),
                          ElementsAre(4)));
  EXPECT_THAT(PlanShards({10}, 6), ElementsAre(ElementsAre(0)));
  EXPECT_THAT(PlanShards({1, 2, 3}, 100), ElementsAre(ElementsAre(0, 1, 2)));
  EXPECT_THAT(PlanShards({0, 0, 6, 0}, 6),
              ElementsAre(ElementsAre(0, 1, 2, 3)));
  EXPECT_THAT(PlanShards({}, 6), IsEmpty());
  EXPECT_EQ(ShardFileName(0, 1), "model.safetensors");
  EXPECT_EQ(ShardFileName(1, 12), "model-00002-of-00012.safetensors");
}

TEST_F(ExportTest, ExportsEveryTensorWholeIntoOneFile) {
  Save(3);
  Result r = Cairn({"-s", uri_, "export", "job", "3", "--format", "safetensors",
                    "--out", out_, "--dtype-as-saved"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_THAT(r.out,
              HasSubstr("exported job job step 3 to " + out_ + ": 15 tensors"));
  EXPECT_THAT(r.out, HasSubstr("in 1 file"));
  EXPECT_THAT(r.out, HasSubstr("model.safetensors"));
  EXPECT_THAT(r.out, HasSubstr("skipped 2 non-tensor (bytes) entries"));
  EXPECT_THAT(r.out, HasSubstr("optim.param_groups, rng_state"));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(out_)) {
    files.push_back(e.path().filename().string());
  }
  EXPECT_THAT(files, ElementsAre("model.safetensors"));
  EXPECT_THAT(Siblings(out_), ElementsAre("llama"));  // no temp dir left
  // mkdtemp's 0700 is not what the user gets.
  EXPECT_NE(fs::status(out_).permissions() & fs::perms::others_read,
            fs::perms::none);
  const Safetensors s = ParseSafetensors(out_ + "/model.safetensors");
  ExpectTensors(s, 3, AllFqns());
  EXPECT_EQ(s.header["__metadata__"]["format"], "pt");
  EXPECT_EQ(s.header["__metadata__"]["cairn_job"], "job");
  EXPECT_EQ(s.header["__metadata__"]["cairn_step"], "3");
  EXPECT_EQ(s.header["model.embed.weight"]["dtype"], "BF16");
  EXPECT_EQ(s.header["model.layers.0.mask"]["dtype"], "BOOL");
  EXPECT_EQ(s.header["model.positions"]["dtype"], "I64");
  EXPECT_EQ(s.header["model.fp8"]["dtype"], "F8_E4M3");
  EXPECT_EQ(s.header["model.tokens_seen"]["shape"], nlohmann::json::array());
  // The data is laid out by element size, then name: the 8-byte dtypes
  // first.
  EXPECT_EQ(s.header["model.f64"]["data_offsets"][0], 0);

  // Through cairnd, with 'latest': the same file.
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result online =
      Cairn({"-c", addr, "export", "job", "latest", "-o", dir_ + "/online"});
  ASSERT_EQ(online.code, 0) << online;
  EXPECT_EQ(ReadFile(dir_ + "/online/model.safetensors"),
            ReadFile(out_ + "/model.safetensors"));
}

TEST_F(ExportTest, LargeTensorsAreWrittenChunkByChunkWithTheSameBytes) {
  Save(3);
  const v1::Manifest m = storage::ReadManifest(*store_, "job", 3).value();
  ExportOptions in_memory;
  in_memory.out_dir = dir_ + "/a";
  ASSERT_TRUE(ExportSafetensors(*store_, m, in_memory).ok());
  // Every tensor straight into the file, read 7 bytes at a time (pieces
  // that cut the segments of column shards).
  ExportOptions direct;
  direct.out_dir = dir_ + "/b";
  direct.assemble_in_memory_bytes = 0;
  direct.read_buffer_bytes = 7;
  std::vector<ExportProgress> calls;
  direct.progress = [&](const ExportProgress& p) { calls.push_back(p); };
  absl::StatusOr<ExportResult> r = ExportSafetensors(*store_, m, direct);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFile(dir_ + "/b/model.safetensors"),
            ReadFile(dir_ + "/a/model.safetensors"));
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().done, r->tensor_bytes);
  EXPECT_EQ(calls.back().total, r->tensor_bytes);
  EXPECT_EQ(calls.back().file, "model.safetensors");
  EXPECT_EQ(calls.back().file_done, calls.back().file_total);
}

TEST_F(ExportTest, MaxShardSizeSplitsIntoFilesWithAnIndex) {
  Save(4);
  // model.layers.0.attn.wq (96 bytes) is over the cap: alone in its file.
  Result r = Cairn({"-s", uri_, "export", "job", "4", "--out", out_,
                    "--max-shard-size", "64"});
  ASSERT_EQ(r.code, 0) << r;
  const nlohmann::json index =
      nlohmann::json::parse(ReadFile(out_ + "/" + kSafetensorsIndexName));
  ASSERT_TRUE(index.contains("weight_map")) << index.dump(2);
  const nlohmann::json& map = index["weight_map"];
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [fqn, file] : map.items()) by_file[file].push_back(fqn);
  const int n = static_cast<int>(by_file.size());
  ASSERT_GT(n, 2) << index.dump(2);
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("in ", n, " files")));
  EXPECT_THAT(r.out, HasSubstr(kSafetensorsIndexName));
  uint64_t total = 0;
  std::vector<std::string> all;
  int i = 0;
  for (const auto& [file, fqns] : by_file) {
    EXPECT_EQ(file, ShardFileName(i++, n));
    const Safetensors s = ParseSafetensors(out_ + "/" + file);
    ExpectTensors(s, 4, fqns);
    // Within the cap, but for a tensor larger than it, alone.
    EXPECT_TRUE(s.data.size() <= 64 || fqns.size() == 1) << file;
    total += s.data.size();
    all.insert(all.end(), fqns.begin(), fqns.end());
  }
  EXPECT_EQ(by_file[map["model.layers.0.attn.wq"]].size(), 1u);
  EXPECT_THAT(all, ::testing::UnorderedElementsAreArray(AllFqns()));
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index.size(), 2u);  // metadata and weight_map, as transformers
  // Nothing else in the directory.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(out_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, n + 1);
}

TEST_F(ExportTest, FiltersKeepOnlyTheirPrefixes) {
  Save(5);
  Result r = Cairn({"-s", uri_, "export", "job", "5", "--out", out_, "--filter",
                    "model.layers.", "--filter", "optim."});
  ASSERT_EQ(r.code, 0) << r;
  // Only the bytes entries the filters keep are reported skipped.
  EXPECT_THAT(r.out, HasSubstr("skipped 1 non-tensor (bytes) entry"));
  EXPECT_THAT(r.out, HasSubstr("(optim.param_groups)"));
  const Safetensors s = ParseSafetensors(out_ + "/model.safetensors");
  ExpectTensors(s, 5,
                {"model.layers.0.attn.wq", "model.layers.0.mlp.w1",
                 "model.layers.0.mask", "optim.state.0.exp_avg"});
}

TEST_F(ExportTest, AFilterMatchingNothingNamesItAndSomeTensors) {
  Save(5);
  Result r = Cairn({"-s", uri_, "export", "job", "5", "--out", out_, "--filter",
                    "model.", "--filter", "modle.", "--filter", "rng_state"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: job 'job' step 5: --filter "
                               "'modle.', 'rng_state' match no tensor"));
  EXPECT_THAT(r.err, HasSubstr("its 15 tensors include 'model.embed.weight'"));
  EXPECT_THAT(r.err, HasSubstr("'optim.state.0.exp_avg'"));
  ExpectNothingLeft();
}

TEST_F(ExportTest, UnknownJobOrStepIsNotFoundNamingThem) {
  Save(5);
  Result step = Cairn({"-s", uri_, "export", "job", "9", "--out", out_});
  EXPECT_EQ(step.code, 1) << step;
  EXPECT_THAT(step.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(step.err, HasSubstr("job 'job' step 9"));
  Result job = Cairn({"-s", uri_, "export", "nojob", "latest", "--out", out_});
  EXPECT_EQ(job.code, 1) << job;
  EXPECT_THAT(job.err, HasSubstr("job 'nojob' has no committed checkpoint"));
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result online = Cairn({"-c", addr, "export", "job", "9", "--out", out_});
  EXPECT_EQ(online.code, 1) << online;
  EXPECT_THAT(online.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(online.err, HasSubstr("job 'job' step 9"));
  ExpectNothingLeft();
}

TEST_F(ExportTest, AnExistingDirectoryIsRefusedAndLeftAlone) {
  Save(5);
  fs::create_directories(out_);
  std::ofstream(out_ + "/mine") << "keep";
  Result r = Cairn({"-s", uri_, "export", "job", "5", "--out", out_ + "/"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("ALREADY_EXISTS"));
  EXPECT_THAT(r.err, HasSubstr("exists; pass a new directory"));
  EXPECT_EQ(ReadFile(out_ + "/mine"), "keep");
  EXPECT_THAT(Siblings(out_), ElementsAre("llama"));
  // A file is as much in the way.
  Result file =
      Cairn({"-s", uri_, "export", "job", "5", "--out", out_ + "/mine"});
  EXPECT_EQ(file.code, 1) << file;
  EXPECT_THAT(file.err, HasSubstr("exists; pass a new directory"));
  // The library refuses it too (the CLI checks before asking anyone).
  ExportOptions options;
  options.out_dir = out_;
  EXPECT_THAT(
      ExportSafetensors(
          *store_, storage::ReadManifest(*store_, "job", 5).value(), options),
      StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(ExportTest, ATrailingSlashNamesTheSameDirectory) {
  Save(5);
  Result r = Cairn({"-s", uri_, "export", "job", "5", "--out", out_ + "/"});
  ASSERT_EQ(r.code, 0) << r;
  EXPECT_TRUE(fs::exists(out_ + "/model.safetensors"));
  EXPECT_THAT(Siblings(out_), ElementsAre("llama"));
}

TEST_F(ExportTest, ADamagedChunkIsDataLossAndLeavesNothing) {
  Save(6);
  const v1::Manifest m = storage::ReadManifest(*store_, "job", 6).value();
  // The last tensor exported (in the last file): earlier files are done
  // when it fails. optim.state.0.exp_avg's chunk [2:4] is rank 1's.
  const v1::ManifestTensor& t = m.tensors(m.tensors_size() - 1);
  ASSERT_EQ(t.entry().fqn(), "optim.state.0.exp_avg");
  const v1::StoredChunk& c = t.chunks(1);
  const std::string object =
      root_ + "/" + storage::ObjectKey("job", 6, c.location().object_key());
  {
    std::fstream f(object, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(c.location().offset() + 3));
    f.put('\x5a');
  }
  Result r = Cairn({"-s", uri_, "export", "job", "6", "--out", out_,
                    "--max-shard-size", "64"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(r.err, HasSubstr("tensor 'optim.state.0.exp_avg' chunk [2:4]"));
  EXPECT_THAT(r.err, HasSubstr("rank-1.data"));
  EXPECT_THAT(r.err, HasSubstr("checksum mismatch"));
  ExpectNothingLeft();
  // A missing data object is data loss as well.
  fs::remove(object);
  Result gone = Cairn({"-s", uri_, "export", "job", "6", "--out", out_});
  EXPECT_EQ(gone.code, 1) << gone;
  EXPECT_THAT(gone.err, HasSubstr("DATA_LOSS"));
  ExpectNothingLeft();
}

TEST_F(ExportTest, CtrlCStopsTheExportAndLeavesNothing) {
  Save(7);
  storage::RegisterShardStoreScheme(
      "interrupting",
      [](absl::string_view rest, const storage::StoreOptions& options)
          -> absl::StatusOr<std::unique_ptr<storage::ShardStore>> {
        CAIRN_ASSIGN_OR_RETURN(
            std::unique_ptr<storage::ShardStore> base,
            storage::OpenShardStore(absl::StrCat("file://", rest), options));
        return std::make_unique<InterruptingStore>(std::move(base));
      });
  Result r = Cairn(
      {"-s", "interrupting://" + root_, "export", "job", "7", "--out", out_});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("CANCELLED: export of job 'job' step 7 "
                               "interrupted"));
  ExpectNothingLeft();
  // The handler is the caller's again.
  struct sigaction now = {};
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  // The library stops the same way when told to.
  ExportOptions options;
  options.out_dir = out_;
  int polls = 0;
  options.cancelled = [&] { return ++polls > 3; };
  EXPECT_THAT(
      ExportSafetensors(
          *store_, storage::ReadManifest(*store_, "job", 7).value(), options),
      StatusIs(absl::StatusCode::kCancelled));
  ExpectNothingLeft();
}

TEST_F(ExportTest, BadFlagsAreUsageErrors) {
  Save(1);
  Result format = Cairn(
      {"-s", uri_, "export", "job", "1", "--format", "gguf", "--out", out_});
  EXPECT_EQ(format.code, 2) << format;
  Result size = Cairn({"-s", uri_, "export", "job", "1", "--out", out_,
                       "--max-shard-size", "1.5GB"});
  EXPECT_EQ(size.code, 2) << size;
  EXPECT_THAT(size.err, HasSubstr("--max-shard-size: bad size '1.5GB'"));
  EXPECT_EQ(Cairn({"-s", uri_, "export", "job", "1"}).code, 2);  // no --out
  EXPECT_EQ(Cairn({"-s", uri_, "export", "job", "--out", out_}).code, 2);
  Result step = Cairn({"-s", uri_, "export", "job", "x1", "--out", out_});
  EXPECT_EQ(step.code, 2) << step;
  ExpectNothingLeft();
}

TEST_F(ExportTest, ACheckpointWithoutTensorsHasNothingToExport) {
  auto m = WriteTestTensors(*store_, "job", 8, 2, {}, Blobs());
  ASSERT_TRUE(m.ok()) << m.status();
  Result r = Cairn({"-s", uri_, "export", "job", "8", "--out", out_});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION: job 'job' step 8 has no "
                               "tensors to export (2 non-tensor entries)"));
  ExpectNothingLeft();
}

// --- A disk that fills: DIR on a real small filesystem (a 1 MiB tmpfs we
// mount; as storage/posix's and the e2e full-disk tests, only as root). ---

class ExportToFullDiskTest : public ExportTest {
 protected:
  void SetUp() override {
    ExportTest::SetUp();
    mnt_ = dir_ + "/small";
    ASSERT_TRUE(fs::create_directories(mnt_));
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=1m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << strerror(errno);
    }
    mounted_ = true;
    // Its parent too is the export's to make (and to remove on failure).
    out_ = mnt_ + "/hf/llama";
  }
  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
    ExportTest::TearDown();
  }
  uint64_t FreePages() const {
    struct statvfs v;
    EXPECT_EQ(::statvfs(mnt_.c_str(), &v), 0);
    EXPECT_EQ(v.f_frsize, 4096u);
    return v.f_bavail;
  }
  // Fills the filesystem (a file of its own) until `pages` pages are free:
  // tmpfs counts whole pages, and directories and empty files take none.
  void LeaveFree(uint64_t pages) {
    const uint64_t free = FreePages();
    ASSERT_GE(free, pages);
    const int fd = ::open((mnt_ + "/filler").c_str(),
                          O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    const int rc =
        ::fallocate(fd, 0, 0, static_cast<off_t>((free - pages) * 4096));
    const int error = errno;
    ::close(fd);
    ASSERT_EQ(rc, 0) << strerror(error);
    ASSERT_EQ(FreePages(), pages);
  }
  // Everything on the small filesystem but the filler.
  std::vector<std::string> Debris() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(mnt_)) {
      const std::string name = fs::relative(e.path(), mnt_).string();
      if (name != "filler") out.push_back(name);
    }
    return out;
  }
  // How many files an export of `step` with --max-shard-size 64 writes
  // (exported once elsewhere).
  size_t NumShardFiles(int64_t step) {
    ExportOptions options;
    options.out_dir = dir_ + "/probe";
    options.max_shard_bytes = 64;
    absl::StatusOr<ExportResult> r = ExportSafetensors(
        *store_, storage::ReadManifest(*store_, "job", step).value(), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->files.size() : 0;
  }

  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(ExportToFullDiskTest, AFileThatDoesNotFitIsRefusedBeforeItsData) {
  Save(6);
  LeaveFree(0);
  Result r = Cairn({"-s", uri_, "export", "job", "6", "--out", out_});
  EXPECT_EQ(r.code, 1) << r;
  // Named: the export, its DIR and the file; and what is free.
  EXPECT_THAT(r.err, HasSubstr("RESOURCE_EXHAUSTED: export of job 'job' step "
                               "6 to '" +
                               out_ + "': no space left on device reserving "));
  EXPECT_THAT(r.err, HasSubstr(" bytes for 'model.safetensors' (0 bytes "
                               "free)"));
  EXPECT_THAT(r.err, Not(HasSubstr(".tmp-")));
  // No DIR, no DIR.tmp-*, not even the parent it made.
  EXPECT_THAT(Debris(), IsEmpty());
  EXPECT_EQ(FreePages(), 0u);
}

TEST_F(ExportToFullDiskTest, ALaterFileThatDoesNotFitTakesTheEarlierOnes) {
  Save(6);
  const size_t n = NumShardFiles(6);
  ASSERT_GT(n, 3u);
  // Each file takes one page: the first two fit, the third does not.
  LeaveFree(2);
  Result r = Cairn({"-s", uri_, "export", "job", "6", "--out", out_,
                    "--max-shard-size", "64"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("RESOURCE_EXHAUSTED: export of job 'job' step "
                               "6 to '" +
                               out_ + "': no space left on device reserving"));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(" bytes for '", ShardFileName(2, n),
                                            "' (0 bytes free)")));
  EXPECT_THAT(Debris(), IsEmpty());
  EXPECT_EQ(FreePages(), 2u);  // the two files written are gone
}

TEST_F(ExportToFullDiskTest, AWriteThatRunsOutOfSpaceLeavesNothingEither) {
  Save(6);
  const size_t n = NumShardFiles(6);
  ASSERT_GT(n, 1u);
  // Room for every safetensors file, none for the index written last: its
  // write (nothing reserved it) is what fails.
  LeaveFree(n);
  Result r = Cairn({"-s", uri_, "export", "job", "6", "--out", out_,
                    "--max-shard-size", "64"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("RESOURCE_EXHAUSTED: export of job 'job' step "
                               "6 to '" +
                               out_ + "': no space left on device writing "));
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat(" bytes of '", kSafetensorsIndexName,
                                     "' (0 bytes free)")));
  EXPECT_THAT(Debris(), IsEmpty());
  EXPECT_EQ(FreePages(), n);
  // With the space back, the same export succeeds (nothing was in its way).
  ASSERT_EQ(::unlink((mnt_ + "/filler").c_str()), 0);
  Result again = Cairn({"-s", uri_, "export", "job", "6", "--out", out_,
                        "--max-shard-size", "64"});
  ASSERT_EQ(again.code, 0) << again;
  EXPECT_TRUE(fs::exists(out_ + "/" + kSafetensorsIndexName));
}

}  // namespace
}  // namespace cairn::cli
