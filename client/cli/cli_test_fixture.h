// What the `cairn` CLI's tests share: running RunCli in-process, a fixture
// with a real file:// storage (and a real cairnd over it on loopback, port 0,
// when a test wants one), and a writer of checkpoints laid out exactly as a
// test says (any dtype, shape and chunk boxes per rank), committed with the
// real protocol: data objects closed first, MANIFEST published last.
#ifndef CAIRN_CLIENT_CLI_CLI_TEST_FIXTURE_H_
#define CAIRN_CLIENT_CLI_CLI_TEST_FIXTURE_H_

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cairn/v1/cairn.pb.h"
#include "client/cli/cli.h"
#include "common/status_macros.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "planner/box.h"
#include "server/coordinator/coordinator_server.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"
#include "storage/shard_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::cli {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.code << "\nstdout:\n"
            << r.out << "stderr:\n"
            << r.err;
}

// Runs `cairn args...` with `input` on stdin.
inline Result Cairn(const std::vector<std::string>& args,
                    const std::string& input = "") {
  std::vector<const char*> argv = {"cairn"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::istringstream in(input);
  std::ostringstream out, err;
  Result r;
  r.code = RunCli(static_cast<int>(argv.size()), argv.data(), in, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// One stored chunk of a TestTensor: its box and the rank that wrote it.
struct TestChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int rank = 0;
};

// A tensor as a test saves it: the whole tensor's row-major bytes and how
// they are split into stored chunks.
struct TestTensor {
  std::string fqn;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<TestChunk> chunks;
};

struct TestBytesEntry {
  std::string fqn;
  std::string bytes;
  int rank = 0;
};

// Deterministic bytes for a tensor of `dtype` and `shape` (`seed` picks
// them; bools are 0 or 1).
inline std::string TestTensorBytes(v1::DType dtype,
                                   const std::vector<int64_t>& shape,
                                   uint64_t seed) {
  uint64_t n = storage::DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  std::string out(n, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(dtype == v1::DTYPE_BOOL ? (x >> 11) & 1
                                                       : (x >> 11) & 0xff);
  }
  return out;
}

// Row-major chunks of `shape` split along `dim` into `parts` pieces of the
// given sizes (one per rank, rank = index), e.g. uneven {3, 1, 2}.
inline std::vector<TestChunk> SplitChunks(const std::vector<int64_t>& shape,
                                          int dim,
                                          const std::vector<int64_t>& sizes) {
  std::vector<TestChunk> out;
  int64_t at = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    TestChunk c;
    c.offsets.assign(shape.size(), 0);
    c.sizes = shape;
    c.offsets[dim] = at;
    c.sizes[dim] = sizes[r];
    c.rank = static_cast<int>(r);
    at += sizes[r];
    out.push_back(std::move(c));
  }
  return out;
}

inline TestTensor MakeTestTensor(std::string fqn, v1::DType dtype,
                                 std::vector<int64_t> shape, uint64_t seed,
                                 std::vector<TestChunk> chunks) {
  TestTensor t;
  t.fqn = std::move(fqn);
  t.dtype = dtype;
  t.bytes = TestTensorBytes(dtype, shape, seed);
  t.shape = std::move(shape);
  if (chunks.empty()) {  // one chunk, the whole tensor, by rank 0
    TestChunk c;
    c.offsets.assign(t.shape.size(), 0);
    c.sizes = t.shape;
    chunks.push_back(std::move(c));
  }
  t.chunks = std::move(chunks);
  return t;
}

// Writes and commits the checkpoint: each rank's chunks and bytes entries in
// one object "rank-<r>.data" (64-byte aligned), then the MANIFEST.
inline absl::StatusOr<v1::Manifest> WriteTestTensors(
    storage::ShardStore& store, const std::string& job, int64_t step,
    int world_size, std::vector<TestTensor> tensors,
    const std::vector<TestBytesEntry>& blobs = {}) {
  std::sort(
      tensors.begin(), tensors.end(),
      [](const TestTensor& a, const TestTensor& b) { return a.fqn < b.fqn; });
  v1::Manifest m;
  m.set_format_version(storage::kManifestFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(world_size);
  m.set_created_unix_micros(1700000000000000 + step);
  std::vector<std::string> data(world_size);
  std::vector<const TestBytesEntry*> sorted_blobs;
  for (const TestBytesEntry& b : blobs) sorted_blobs.push_back(&b);
  std::sort(sorted_blobs.begin(), sorted_blobs.end(),
            [](const auto* a, const auto* b) { return a->fqn < b->fqn; });
  uint64_t total = 0;
  auto place = [&](int rank, const std::string& bytes,
                   v1::StorageLocation* loc) {
    std::string& object = data[rank];
    object.resize((object.size() + 63) / 64 * 64, '\0');
    loc->set_object_key(absl::StrCat("rank-", rank, ".data"));
    loc->set_offset(object.size());
    loc->set_length(bytes.size());
    object += bytes;
    total += bytes.size();
    return storage::Crc32c(bytes);
  };
  for (const TestTensor& t : tensors) {
    v1::ManifestTensor* mt = m.add_tensors();
    mt->mutable_entry()->set_fqn(t.fqn);
    mt->mutable_entry()->set_dtype(t.dtype);
    planner::Shape shape(t.shape.begin(), t.shape.end());
    for (int64_t d : t.shape) mt->mutable_entry()->add_global_shape(d);
    const size_t elem = storage::DTypeSize(t.dtype);
    for (const TestChunk& c : t.chunks) {
      planner::ChunkBox box;
      box.offsets.assign(c.offsets.begin(), c.offsets.end());
      box.sizes.assign(c.sizes.begin(), c.sizes.end());
      std::string bytes(static_cast<size_t>(planner::Volume(box)) * elem, '\0');
      for (const planner::CopySegment& s :
           planner::CopySegments(planner::FullBox(shape), box, box, elem)) {
        bytes.replace(s.dst_offset, s.length, t.bytes, s.src_offset, s.length);
      }
      v1::StoredChunk* sc = mt->add_chunks();
      for (int64_t o : c.offsets) sc->mutable_box()->add_offsets(o);
      for (int64_t z : c.sizes) sc->mutable_box()->add_sizes(z);
      sc->set_writer_rank(c.rank);
      sc->set_crc32c(place(c.rank, bytes, sc->mutable_location()));
    }
  }
  for (const TestBytesEntry* b : sorted_blobs) {
    v1::ManifestBytes* mb = m.add_bytes_entries();
    mb->set_fqn(b->fqn);
    mb->set_writer_rank(b->rank);
    mb->set_crc32c(place(b->rank, b->bytes, mb->mutable_location()));
  }
  for (int r = 0; r < world_size; ++r) {
    const std::string object = absl::StrCat("rank-", r, ".data");
    m.add_objects(object);
    CAIRN_ASSIGN_OR_RETURN(
        std::unique_ptr<storage::ObjectWriter> writer,
        store.NewWriter(storage::ObjectKey(job, step, object)));
    CAIRN_RETURN_IF_ERROR(writer->Append(data[r]));
    CAIRN_RETURN_IF_ERROR(writer->Close());
  }
  m.set_total_bytes(total);
  CAIRN_RETURN_IF_ERROR(storage::PublishManifest(store, m));
  return m;
}

// A fresh file:// storage in a temp dir per test, removed afterwards, and a
// cairnd over it on demand.
class CliTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("CAIRN_COORDINATOR");
    unsetenv("CAIRN_STORAGE");
    dir_ = testing::MakeTempDir("cli-test");
    ASSERT_FALSE(dir_.empty());
    root_ = dir_ + "/ckpt";
    std::filesystem::create_directories(root_);
    uri_ = "file://" + root_;
    store_ = storage::OpenShardStore(uri_).value();
  }
  void TearDown() override {
    cairnd_.reset();
    unsetenv("CAIRN_COORDINATOR");
    unsetenv("CAIRN_STORAGE");
    std::filesystem::remove_all(dir_);
  }

  // storage::WriteTestCheckpoint: float32 tensors split by rows over 2
  // ranks and one bytes entry.
  void Write(const std::string& job, int64_t step) {
    storage::TestCheckpointSpec spec;
    spec.job = job;
    spec.step = step;
    spec.seed = static_cast<uint64_t>(step);
    auto m = storage::WriteTestCheckpoint(*store_, spec);
    ASSERT_TRUE(m.ok()) << m.status();
  }
  std::string ManifestPath(const std::string& job, int64_t step) const {
    return root_ + "/" + storage::ManifestKey(job, step);
  }
  // Any data object of the step (the first regular file that is not the
  // MANIFEST).
  std::string DataObject(const std::string& job, int64_t step) const {
    const std::string prefix = root_ + "/" + storage::StepPrefix(job, step);
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(prefix)) {
      if (e.is_regular_file() && e.path() != ManifestPath(job, step)) {
        return e.path().string();
      }
    }
    return "";
  }

  // A cairnd on loopback over the same storage (its catalog is rebuilt from
  // the MANIFESTs written so far).
  std::string StartCairnd() {
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = uri_;
    spec.coordinator.catalog_path = dir_ + "/catalog";
    auto c = coordinator::CoordinatorServer::Start(spec);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return "";
    cairnd_ = std::move(*c);
    return absl::StrCat("127.0.0.1:", cairnd_->port());
  }

  std::string dir_, root_, uri_;
  std::unique_ptr<storage::ShardStore> store_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
};

}  // namespace cairn::cli

#endif  // CAIRN_CLIENT_CLI_CLI_TEST_FIXTURE_H_
