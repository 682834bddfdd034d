// The load protocol against a real cairnd (the Coordinator library behind its
// gRPC service, in-process, on loopback port 0, posix storage in a temp
// dir): checkpoints saved by N ranks in random shardings (SaveProtocol) and
// loaded by M ranks in other random shardings, compared element by element
// with the whole tensors; damaged stored bytes (DATA_LOSS naming the tensor
// and object); cancellation (CANCELLED naming the rank, job and step); a
// destination whose shape or dtype differs from the checkpoint's.
#include "protocol/load_protocol.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "protocol/save_protocol.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::protocol {
namespace {

using ::cairn::planner::ChunkBox;
using ::cairn::planner::DType;
using ::cairn::planner::Shape;
using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

// A whole tensor: its bytes, row-major.
struct Tensor {
  std::string fqn;
  DType dtype = DType::kUnspecified;
  Shape shape;
  std::string bytes;
};

// One rank's chunks: (tensor index, box).
using Chunks = std::vector<std::pair<int, ChunkBox>>;

int64_t Elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The bytes of `box` of `t`, row-major: the oracle, element by element over
// the whole tensor (every global index unravelled, kept if inside the box).
std::string Extract(const Tensor& t, const ChunkBox& box) {
  const size_t elem = planner::DTypeSize(t.dtype);
  const size_t dims = t.shape.size();
  std::string out(static_cast<size_t>(planner::Volume(box)) * elem, '\0');
  const int64_t n = Elements(t.shape);
  for (int64_t g = 0; g < n; ++g) {
    std::vector<int64_t> at(dims);
    int64_t rest = g;
    for (size_t d = dims; d-- > 0;) {
      at[d] = rest % t.shape[d];
      rest /= t.shape[d];
    }
    int64_t local = 0;
    bool inside = true;
    for (size_t d = 0; d < dims; ++d) {
      const int64_t x = at[d] - box.offsets[d];
      if (x < 0 || x >= box.sizes[d]) {
        inside = false;
        break;
      }
      local = local * box.sizes[d] + x;
    }
    if (!inside) continue;
    std::copy_n(t.bytes.data() + g * elem, elem, out.data() + local * elem);
  }
  return out;
}

// Cuts [0, n) at up to `max_cuts` random points: the pieces' [begin, end).
std::vector<std::pair<int64_t, int64_t>> Cut(int64_t n, int max_cuts,
                                             std::mt19937& rng) {
  std::vector<int64_t> cuts;
  const int k = std::uniform_int_distribution<int>(
      0, static_cast<int>(std::min<int64_t>(max_cuts, n - 1)))(rng);
  std::vector<int64_t> all;
  for (int64_t c = 1; c < n; ++c) all.push_back(c);
  std::shuffle(all.begin(), all.end(), rng);
  cuts.assign(all.begin(), all.begin() + k);
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t begin = 0;
  for (int64_t c : cuts) {
    pieces.push_back({begin, c});
    begin = c;
  }
  pieces.push_back({begin, n});
  return pieces;
}

// A random grid of boxes tiling `shape` (each dim cut at up to 2 points).
std::vector<ChunkBox> RandomGrid(const Shape& shape, std::mt19937& rng) {
  std::vector<ChunkBox> boxes(1);
  for (int64_t n : shape) {
    std::vector<ChunkBox> next;
    for (const auto& [begin, end] : Cut(n, 2, rng)) {
      for (ChunkBox b : boxes) {
        b.offsets.push_back(begin);
        b.sizes.push_back(end - begin);
        next.push_back(b);
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

// `shape` split along one random dim into at most `parts` pieces (a scalar:
// the one box).
std::vector<ChunkBox> RandomSplit(const Shape& shape, int parts,
                                  std::mt19937& rng) {
  ChunkBox whole;
  whole.offsets.assign(shape.size(), 0);
  whole.sizes = shape;
  if (shape.empty()) return {whole};
  const size_t d =
      std::uniform_int_distribution<size_t>(0, shape.size() - 1)(rng);
  std::vector<ChunkBox> boxes;
  for (const auto& [begin, end] : Cut(shape[d], parts - 1, rng)) {
    ChunkBox b = whole;
    b.offsets[d] = begin;
    b.sizes[d] = end - begin;
    boxes.push_back(b);
  }
  return boxes;
}

class LoadProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    std::filesystem::create_directories(dir_ + "/checkpoints");
    spec_.listen_address = "127.0.0.1:0";
    spec_.coordinator.storage_uri =
        absl::StrCat("file://", dir_, "/checkpoints");
    spec_.coordinator.catalog_path = dir_ + "/catalog";
  }
  void TearDown() override {
    server_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  void StartServer() {
    auto s = coordinator::CoordinatorServer::Start(spec_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    stub_ = v1::Coordinator::NewStub(
        NewCoordinatorChannel(absl::StrCat("127.0.0.1:", server_->port())));
  }

  // Saves `tensors` as `step` of `job` from `chunks.size()` ranks, rank r
  // holding chunks[r] (and rank 0 the bytes entry "rng" = `rng`). Returns
  // the step's storage prefix.
  std::string Save(const std::string& job, int64_t step,
                   const std::vector<Tensor>& tensors,
                   const std::vector<Chunks>& chunks, const std::string& rng) {
    const int world = static_cast<int>(chunks.size());
    std::vector<std::string> prefix(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        SaveProtocolOptions o;
        o.job = job;
        o.rank = r;
        o.world_size = world;
        o.max_retries = 0;
        SaveProtocol p(stub_.get(), o);
        planner::LocalSavePlan local;
        local.rank = r;
        std::vector<std::string> data;
        data.reserve(chunks[r].size());
        ItemSources sources;
        for (const auto& [ti, box] : chunks[r]) {
          const Tensor& t = tensors[ti];
          planner::WriteItem w;
          w.fqn = t.fqn;
          w.dtype = t.dtype;
          w.global_shape = t.shape;
          w.box = box;
          data.push_back(Extract(t, box));
          w.length = data.back().size();
          local.items.push_back(w);
          sources.AddChunk(t.fqn, box, data.back());
        }
        if (r == 0) {
          planner::WriteItem b;
          b.kind = planner::WriteItem::Kind::kBytes;
          b.fqn = "rng";
          b.dtype = DType::kUInt8;
          b.length = rng.size();
          local.items.push_back(b);
          sources.AddBytes("rng", rng);
        }
        auto save = p.Begin(step, local);
        ASSERT_TRUE(save.ok()) << "rank " << r << ": " << save.status();
        prefix[r] = (*save)->plan().step_prefix();
        ThreadPool pool(2);
        absl::Status written = (*save)->WriteAll(sources, pool);
        ASSERT_TRUE(written.ok()) << (*save)->Abort(written);
        auto record = (*save)->Commit();
        ASSERT_TRUE(record.ok()) << "rank " << r << ": " << record.status();
      });
    }
    for (auto& t : ranks) t.join();
    return prefix[0];
  }

  LoadProtocolOptions Options(const std::string& job, int rank, int world,
                              PartialChunkCheck check,
                              Cancellation* cancel = nullptr) {
    LoadProtocolOptions o;
    o.job = job;
    o.rank = rank;
    o.world_size = world;
    o.max_retries = 0;
    o.partial_chunk_check = check;
    o.cancellation = cancel;
    return o;
  }

  // cairnd's manifest of `step` of `job`.
  v1::Manifest Manifest(const std::string& job, int64_t step) {
    v1::GetCheckpointRequest get;
    get.set_job(job);
    get.set_step(step);
    v1::GetCheckpointResponse got;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetCheckpoint(&ctx, get, &got);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return got.manifest();
  }

  // Flips one byte of the stored object `key` (relative to the storage
  // root) at `offset`.
  void Damage(const std::string& key, uint64_t offset) {
    const std::string path = absl::StrCat(dir_, "/checkpoints/", key);
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x5a));
    ASSERT_TRUE(f.good()) << path;
  }

  std::string dir_;
  coordinator::CoordinatorServer::Spec spec_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// The resharding oracle: random tensors (1 to 3 dims, a scalar sometimes,
// several dtypes) saved by N random ranks in random grids, loaded by M ranks
// in other random layouts — a grid spread at random (a rank holding several
// chunks, or none: the full form of PlanLoad), one piece per rank (the
// short form), every rank the whole tensor (replicas) — by step or latest,
// with each PartialChunkCheck; every loaded element must equal the saved
// tensor's.
TEST_F(LoadProtocolTest, RandomReshardingMatchesTheWholeTensors) {
  StartServer();
  std::mt19937 rng(20240611);
  const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kUInt8,
                           DType::kFloat64};
  const PartialChunkCheck kChecks[] = {PartialChunkCheck::kCollective,
                                       PartialChunkCheck::kReadWhole,
                                       PartialChunkCheck::kNone};
  auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  constexpr int kCases = 48;
  int64_t verified_by_cairnd = 0;  // over every case
  for (int c = 0; c < kCases; ++c) {
    SCOPED_TRACE(absl::StrCat("case ", c));
    // One job per case: each load round is its own.
    const std::string job = absl::StrCat("reshard", c);
    std::vector<Tensor> tensors(uniform(1, 3));
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor& t = tensors[i];
      t.fqn = absl::StrCat("layer", i, ".w");
      t.dtype = kDTypes[uniform(0, 3)];
      const int dims = uniform(0, 5) == 0 ? 0 : uniform(1, 3);
      for (int d = 0; d < dims; ++d) t.shape.push_back(uniform(1, 7));
      t.bytes.resize(Elements(t.shape) * planner::DTypeSize(t.dtype));
      for (char& b : t.bytes) b = static_cast<char>(uniform(0, 255));
    }
    const std::string blob = absl::StrCat("rng-state-", c);

    const int n = uniform(1, 4);
    std::vector<Chunks> saved(n);
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      for (const ChunkBox& b : RandomGrid(tensors[ti].shape, rng)) {
        saved[uniform(0, n - 1)].push_back({static_cast<int>(ti), b});
      }
    }
    const int64_t step = uniform(1, 1000);
    Save(job, step, tensors, saved, blob);
    if (HasFailure()) return;

    const int m = uniform(1, 4);
    std::vector<Chunks> wanted(m);
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const int ti32 = static_cast<int>(ti);
      ChunkBox whole;
      whole.offsets.assign(tensors[ti].shape.size(), 0);
      whole.sizes = tensors[ti].shape;
      switch (uniform(0, 2)) {
        case 0:  // a grid spread at random
          for (const ChunkBox& b : RandomGrid(tensors[ti].shape, rng)) {
            wanted[uniform(0, m - 1)].push_back({ti32, b});
          }
          break;
        case 1: {  // at most one piece per rank, to random ranks
          std::vector<int> ranks(m);
          for (int r = 0; r < m; ++r) ranks[r] = r;
          std::shuffle(ranks.begin(), ranks.end(), rng);
          std::vector<ChunkBox> pieces = RandomSplit(tensors[ti].shape, m, rng);
          for (size_t k = 0; k < pieces.size(); ++k) {
            wanted[ranks[k]].push_back({ti32, pieces[k]});
          }
          break;
        }
        default:  // replicated: every rank the whole tensor
          for (int r = 0; r < m; ++r) wanted[r].push_back({ti32, whole});
          break;
      }
    }
    const PartialChunkCheck check = kChecks[uniform(0, 2)];
    const bool latest = uniform(0, 1) == 1;

    // Every destination starts as 0xee bytes; the load must overwrite all.
    std::vector<std::vector<std::string>> bufs(m);
    std::vector<std::string> blobs(m, "stale");
    std::vector<absl::StatusOr<int64_t>> loaded(m,
                                                absl::UnknownError("not run"));
    std::vector<LoadStats> stats(m);
    std::vector<std::thread> ranks;
    for (int r = 0; r < m; ++r) {
      for (const auto& [ti, box] : wanted[r]) {
        bufs[r].push_back(std::string(
            planner::Volume(box) * planner::DTypeSize(tensors[ti].dtype),
            '\xee'));
      }
    }
    for (int r = 0; r < m; ++r) {
      ranks.emplace_back([&, r] {
        LoadProtocol p(stub_.get(), Options(job, r, m, check));
        LoadDestinations dests;
        for (size_t ti = 0; ti < tensors.size(); ++ti) {
          std::vector<ChunkDestination> chunks;
          for (size_t k = 0; k < wanted[r].size(); ++k) {
            if (wanted[r][k].first != static_cast<int>(ti)) continue;
            chunks.push_back({wanted[r][k].second, absl::MakeSpan(bufs[r][k])});
          }
          const Tensor& t = tensors[ti];
          absl::Status added =
              dests.AddTensor(t.fqn, t.dtype, t.shape, std::move(chunks));
          ASSERT_TRUE(added.ok()) << added;
        }
        ASSERT_TRUE(dests.AddBytes("rng", &blobs[r]).ok());
        ThreadPool pool(2);
        loaded[r] =
            p.Load(latest ? std::nullopt : std::optional(step), dests, pool);
        stats[r] = p.last_stats();
      });
    }
    for (auto& t : ranks) t.join();

    int64_t verified_locally = 0;
    for (int r = 0; r < m; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", m, ", saved by ", n,
                                " ranks, check ", static_cast<int>(check),
                                latest ? ", latest" : ""));
      ASSERT_TRUE(loaded[r].ok()) << loaded[r].status();
      EXPECT_EQ(*loaded[r], step);
      EXPECT_EQ(blobs[r], blob);
      uint64_t bytes = blob.size();
      for (size_t k = 0; k < wanted[r].size(); ++k) {
        const auto& [ti, box] = wanted[r][k];
        const Tensor& t = tensors[ti];
        const std::string want = Extract(t, box);
        const size_t elem = planner::DTypeSize(t.dtype);
        ASSERT_EQ(bufs[r][k].size(), want.size());
        for (size_t e = 0; e < want.size() / elem; ++e) {
          ASSERT_EQ(bufs[r][k].substr(e * elem, elem),
                    want.substr(e * elem, elem))
              << "'" << t.fqn << "' chunk " << planner::BoxToString(box)
              << " element " << e;
        }
        bytes += want.size();
      }
      EXPECT_EQ(stats[r].bytes, bytes);
      verified_locally += stats[r].chunks_verified_locally;
      verified_by_cairnd += stats[r].chunks_verified_by_cairnd;
    }
    // The ranks together read every stored chunk they touch (the wanted
    // boxes tile each tensor): cairnd verifies every piece read in part.
    if (check == PartialChunkCheck::kCollective) {
      EXPECT_EQ(verified_locally, 0);
    }
  }
  // The cases took every path: pieces combined by cairnd, the short form of
  // PlanLoad, and the full form.
  EXPECT_GT(verified_by_cairnd, 0);
  EXPECT_GT(server_->coordinator().stats().load_requests_short, 0);
  EXPECT_GT(server_->coordinator().stats().load_chunks_verified, 0);
}

// One stored chunk with a flipped byte: a load that reads it whole, and one
// that reads part of it (checked by cairnd, which sends it back to be read
// whole, or read whole at once), fail DATA_LOSS naming the tensor and the
// object; a damaged bytes entry likewise.
TEST_F(LoadProtocolTest, DamagedStoredBytesAreDataLossNamingTensorAndObject) {
  StartServer();
  Tensor w{"w", DType::kFloat32, {8, 4}, std::string(128, '\0')};
  for (size_t i = 0; i < w.bytes.size(); ++i) {
    w.bytes[i] = static_cast<char>(i * 7 + 1);
  }
  const ChunkBox whole{{0, 0}, {8, 4}};
  const std::string prefix = Save("job", 1, {w}, {{{0, whole}}}, "seed!");
  ASSERT_FALSE(HasFailure());
  const v1::Manifest manifest = Manifest("job", 1);
  ASSERT_EQ(manifest.tensors_size(), 1);
  ASSERT_EQ(manifest.tensors(0).chunks_size(), 1);
  const v1::StorageLocation& loc = manifest.tensors(0).chunks(0).location();
  const std::string key = prefix + loc.object_key();
  Damage(key, loc.offset() + 100);  // in rows 6..7
  ASSERT_FALSE(HasFailure());

  const std::string mismatch = absl::StrCat(
      "rank 0 loading job 'job' step 1: checksum mismatch in "
      "'w' stored chunk at ",
      key, "@", loc.offset(), "+128: crc32c 0x");
  const struct {
    PartialChunkCheck check;
    ChunkBox box;
  } kLoads[] = {
      {PartialChunkCheck::kCollective, whole},
      {PartialChunkCheck::kCollective, {{0, 0}, {4, 4}}},  // rows 0..3
      {PartialChunkCheck::kReadWhole, {{0, 1}, {8, 2}}},
  };
  for (const auto& l : kLoads) {
    SCOPED_TRACE(planner::BoxToString(l.box));
    LoadProtocol p(stub_.get(), Options("job", 0, 1, l.check));
    std::string buf(planner::Volume(l.box) * 4, '\0');
    LoadDestinations dests;
    ASSERT_TRUE(dests
                    .AddTensor("w", DType::kFloat32, {8, 4},
                               {{l.box, absl::MakeSpan(buf)}})
                    .ok());
    ThreadPool pool(2);
    EXPECT_THAT(p.Load(1, dests, pool),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(mismatch)));
  }

  // The bytes entry.
  ASSERT_EQ(manifest.bytes_entries_size(), 1);
  const v1::StorageLocation& b = manifest.bytes_entries(0).location();
  Damage(prefix + b.object_key(), b.offset());
  ASSERT_FALSE(HasFailure());
  LoadProtocol p(stub_.get(),
                 Options("job", 0, 1, PartialChunkCheck::kCollective));
  std::string blob;
  LoadDestinations dests;
  ASSERT_TRUE(dests.AddBytes("rng", &blob).ok());
  ThreadPool pool(2);
  EXPECT_THAT(
      p.Load(std::nullopt, dests, pool),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr(absl::StrCat(
                   "rank 0 loading job 'job' step 1: checksum mismatch in "
                   "bytes entry 'rng' at ",
                   prefix, b.object_key(), ": crc32c 0x"))));
}

// A missing object is DATA_LOSS naming it; with the step's MANIFEST gone too
// (the storage cairnd uses is not what this host sees), FAILED_PRECONDITION.
TEST_F(LoadProtocolTest, MissingObjectIsDataLossUnlessTheManifestIsGoneToo) {
  StartServer();
  Tensor w{"w", DType::kUInt8, {16}, std::string(16, 'x')};
  const ChunkBox whole{{0}, {16}};
  const std::string prefix = Save("job", 2, {w}, {{{0, whole}}}, "seed!");
  ASSERT_FALSE(HasFailure());
  const v1::Manifest manifest = Manifest("job", 2);
  ASSERT_EQ(manifest.tensors_size(), 1);
  const v1::StorageLocation& loc = manifest.tensors(0).chunks(0).location();
  const std::string key = prefix + loc.object_key();
  ASSERT_TRUE(std::filesystem::remove(dir_ + "/checkpoints/" + key));
  auto load = [&] {
    LoadProtocol p(stub_.get(),
                   Options("job", 0, 1, PartialChunkCheck::kCollective));
    std::string buf(16, '\0');
    LoadDestinations dests;
    EXPECT_TRUE(
        dests
            .AddTensor("w", DType::kUInt8, {16}, {{whole, absl::MakeSpan(buf)}})
            .ok());
    ThreadPool pool(2);
    return p.Load(2, dests, pool).status();
  };
  EXPECT_THAT(
      load(),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr(absl::StrCat("rank 0 loading job 'job' step 2: 'w' "
                                      "stored chunk at ",
                                      loc.offset(), "+16: object ", key,
                                      " of the committed checkpoint is "
                                      "missing"))));
  ASSERT_TRUE(std::filesystem::remove(
      absl::StrCat(dir_, "/checkpoints/", prefix, "MANIFEST")));
  EXPECT_THAT(
      load(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr(absl::StrCat(
                   "object ", key, " and the step's MANIFEST are not in "))));
}

// Cancelled before the load: CANCELLED naming `latest`, and no call made.
// Cancelled after PlanLoad (from the test hook, on the loading thread): no
// item is read, the destination is untouched, and the error names the step.
TEST_F(LoadProtocolTest, CancelStopsALoadBeforeAndAfterPlanLoad) {
  StartServer();
  Tensor w{"w", DType::kUInt8, {16}, std::string(16, 'x')};
  const ChunkBox whole{{0}, {16}};
  Save("job", 3, {w}, {{{0, whole}}}, "seed!");
  ASSERT_FALSE(HasFailure());
  Cancellation cancel("cancelled (test)");
  std::string buf(16, '\0');
  LoadDestinations dests;
  ASSERT_TRUE(
      dests.AddTensor("w", DType::kUInt8, {16}, {{whole, absl::MakeSpan(buf)}})
          .ok());
  ThreadPool pool(2);

  LoadProtocolOptions o =
      Options("job", 0, 1, PartialChunkCheck::kCollective, &cancel);
  {
    LoadProtocol p(stub_.get(), o);
    cancel.Cancel();
    EXPECT_THAT(p.Load(std::nullopt, dests, pool),
                StatusIs(absl::StatusCode::kCancelled,
                         HasSubstr("rank 0 loading job 'job' latest: "
                                   "cancelled (test)")));
    EXPECT_EQ(server_->coordinator().stats().load_requests_short, 0);
    EXPECT_EQ(server_->coordinator().stats().load_reports, 0);
    // The protocol never resets the cancellation.
    EXPECT_TRUE(cancel.cancelled());
    cancel.Reset();
  }
  o.after_plan_load_for_test = [&](int64_t step) {
    EXPECT_EQ(step, 3);
    cancel.Cancel();
  };
  LoadProtocol p(stub_.get(), o);
  EXPECT_THAT(
      p.Load(std::nullopt, dests, pool),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 loading job 'job' step 3: cancelled (test)")));
  EXPECT_EQ(buf, std::string(16, '\0'));
  EXPECT_EQ(p.last_stats().bytes_storage, 0u);
}

// Rank 0 of 2 has read part of a chunk and waits in VerifyLoad for rank 1,
// which never loads: Cancel from another thread ends the call at once
// (cairnd's join grace is an hour) with CANCELLED naming the step.
TEST_F(LoadProtocolTest, CancelEndsVerifyLoadWaitingForTheOtherRank) {
  spec_.coordinator.load_join_grace = absl::Hours(1);
  spec_.coordinator.load_verify_deadline = absl::Hours(2);
  StartServer();
  Tensor w{"w", DType::kUInt8, {16}, std::string(16, 'x')};
  Save("job", 4, {w}, {{{0, ChunkBox{{0}, {16}}}}}, "seed!");
  ASSERT_FALSE(HasFailure());
  Cancellation cancel("cancelled (test)");
  const ChunkBox half{{0}, {8}};
  std::string buf(8, '\0');
  LoadDestinations dests;
  ASSERT_TRUE(
      dests.AddTensor("w", DType::kUInt8, {16}, {{half, absl::MakeSpan(buf)}})
          .ok());
  LoadProtocol p(stub_.get(),
                 Options("job", 0, 2, PartialChunkCheck::kCollective, &cancel));
  ThreadPool pool(2);
  absl::StatusOr<int64_t> loaded = absl::UnknownError("not run");
  std::thread rank0([&] { loaded = p.Load(4, dests, pool); });
  while (server_->coordinator().stats().load_reports == 0) {
    absl::SleepFor(absl::Milliseconds(1));  // until rank 0 reported
  }
  cancel.Cancel();
  rank0.join();
  EXPECT_THAT(
      loaded,
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 loading job 'job' step 4: cancelled (test)")));
  // Every planned byte is in place, though unverified.
  EXPECT_EQ(buf, std::string(8, 'x'));
}

// A destination of another shape or dtype than the checkpoint's tensor:
// cairnd's INVALID_ARGUMENT naming the tensor and both.
TEST_F(LoadProtocolTest, ShapeOrDTypeMismatchIsInvalidArgument) {
  StartServer();
  Tensor w{"w", DType::kFloat32, {8, 4}, std::string(128, 'w')};
  Save("job", 5, {w}, {{{0, ChunkBox{{0, 0}, {8, 4}}}}}, "seed!");
  ASSERT_FALSE(HasFailure());
  const struct {
    DType dtype;
    Shape shape;
    std::string error;
  } kCases[] = {
      {DType::kFloat32,
       {8, 5},
       "rank 0 loading job 'job' step 5: 'w': saved float32 [8, 4], requested "
       "float32 [8, 5]"},
      {DType::kBFloat16,
       {8, 4},
       "rank 0 loading job 'job' step 5: 'w': saved float32 [8, 4], requested "
       "bfloat16 [8, 4]"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.error);
    LoadProtocol p(stub_.get(),
                   Options("job", 0, 1, PartialChunkCheck::kCollective));
    const ChunkBox box{{0, 0}, c.shape};
    std::string buf(planner::Volume(box) * planner::DTypeSize(c.dtype), '\0');
    LoadDestinations dests;
    ASSERT_TRUE(
        dests.AddTensor("w", c.dtype, c.shape, {{box, absl::MakeSpan(buf)}})
            .ok());
    ThreadPool pool(2);
    EXPECT_THAT(
        p.Load(5, dests, pool),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
}

TEST(LoadDestinationsTest, RefusesABufferOfTheWrongSizeAndDuplicateNames) {
  LoadDestinations dests;
  std::string buf(15, '\0');
  EXPECT_THAT(
      dests.AddTensor("w", DType::kFloat32, {2, 2},
                      {{ChunkBox{{0, 0}, {2, 2}}, absl::MakeSpan(buf)}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("tensor 'w' chunk [0:2, 0:2] of float32 "
                         "needs a buffer of 16 bytes, got 15")));
  EXPECT_THAT(
      dests.AddTensor("w", DType::kFloat32, {2, 2},
                      {{ChunkBox{{0, 1}, {2, 2}}, absl::MakeSpan(buf)}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'w'")));
  EXPECT_TRUE(dests.tensors().empty());
  std::string blob;
  ASSERT_TRUE(dests.AddBytes("rng", &blob).ok());
  EXPECT_THAT(dests.AddBytes("rng", &blob),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'rng'")));
  EXPECT_THAT(dests.AddTensor("rng", DType::kUInt8, {1}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'rng'")));
  EXPECT_THAT(dests.AddBytes("none", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bytes entry 'none' has no blob")));
}

}  // namespace
}  // namespace cairn::protocol
