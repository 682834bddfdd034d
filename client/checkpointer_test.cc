// libcairn against a real cairnd server (the Coordinator library behind its
// gRPC service, in-process, on loopback port 0, posix storage in a temp dir),
// including a restarted job saving a step its killed process was waiting in.
#include "client/checkpointer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/checkpoint_info_proto.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/convert/plan_convert.h"
#include "protocol/coordinator_call.h"
#include "protocol/save_protocol.h"
#include "server/coordinator/coordinator_server.h"
#include "storage/testing/fault_injection_store.h"

namespace cairn::client {
namespace {

using ::cairn::testing::StatusIs;
using planner::DType;
using planner::Placement;
using ::testing::HasSubstr;

// Polls `done` until it holds or a bound far beyond any wait a test expects
// (the bound only keeps a broken test from hanging); returns done().
bool WaitUntil(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  while (!done() && absl::Now() < give_up)
    absl::SleepFor(absl::Milliseconds(1));
  return done();
}

// A gate that Appends to objects whose key contains `key_contains` wait at
// while it is closed: holds a rank's save in its write phase.
class WriteGate {
 public:
  // Closes the gate for `key_contains` ("": gates nothing) and counts the
  // Appends that pass it from now on.
  void Close(std::string key_contains) {
    absl::MutexLock lock(&mu_);
    key_contains_ = std::move(key_contains);
    open_ = false;
    passed_ = 0;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Pass(absl::string_view key) {
    absl::MutexLock lock(&mu_);
    if (key_contains_.empty() || !absl::StrContains(key, key_contains_)) return;
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
    ++passed_;
  }
  int waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }
  int passed() const {
    absl::MutexLock lock(&mu_);
    return passed_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string key_contains_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int passed_ ABSL_GUARDED_BY(mu_) = 0;
};

WriteGate& Gate() {
  static WriteGate* gate = new WriteGate;
  return *gate;
}

// "gated:///path": the posix store at /path, its Appends passing Gate().
// cairnd (in this process) hands the URI to the ranks, which open it too.
class GatedStore : public storage::FaultInjectionStore {
 public:
  GatedStore(std::unique_ptr<storage::ShardStore> base, std::string uri)
      : FaultInjectionStore(std::move(base)), uri_(std::move(uri)) {}
  std::string uri() const override { return uri_; }
  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<storage::ObjectWriter>> NewWriter(
      absl::string_view key, const storage::WriterOptions& options) override {
    absl::StatusOr<std::unique_ptr<storage::ObjectWriter>> base =
        FaultInjectionStore::NewWriter(key, options);
    if (!base.ok()) return base.status();
    return std::unique_ptr<storage::ObjectWriter>(
        new Writer(std::string(key), std::move(*base)));
  }

 private:
  class Writer : public storage::ObjectWriter {
   public:
    Writer(std::string key, std::unique_ptr<storage::ObjectWriter> base)
        : key_(std::move(key)), base_(std::move(base)) {}
    absl::Status Append(absl::Span<const char> data) override {
      Gate().Pass(key_);
      return base_->Append(data);
    }
    absl::Status Close() override { return base_->Close(); }
    uint64_t bytes_written() const override { return base_->bytes_written(); }

   private:
    const std::string key_;
    std::unique_ptr<storage::ObjectWriter> base_;
  };
  const std::string uri_;
};

void RegisterGatedScheme() {
  storage::RegisterShardStoreScheme(
      "gated",
      [](absl::string_view rest, const storage::StoreOptions& options)
          -> absl::StatusOr<std::unique_ptr<storage::ShardStore>> {
        absl::StatusOr<std::unique_ptr<storage::ShardStore>> base =
            storage::OpenShardStore(absl::StrCat("file://", rest), options);
        if (!base.ok()) return base.status();
        return std::unique_ptr<storage::ShardStore>(
            new GatedStore(std::move(*base), absl::StrCat("gated://", rest)));
      });
}

constexpr char kCancelled[] = "cancelled (Checkpointer::Cancel)";

class CheckpointerTest : public ::testing::Test {
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
  }

  CheckpointerOptions Options(int rank, int world) const {
    CheckpointerOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", server_->port());
    o.job = "job";
    o.rank = rank;
    o.world_size = world;
    o.max_retries = 0;
    o.store.use_odirect = false;
    return o;
  }

  std::unique_ptr<Checkpointer> Connect(int rank, int world) {
    auto c = Checkpointer::Connect(Options(rank, world));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // "w": fp32 [8, 4] split by rows over a mesh of `world` ranks.
  static absl::Status AddW(StateDict& state, int rank, int world,
                           std::vector<char>& buf, Placement p) {
    planner::DTensorLayout layout{{{world}, {}}, {p}};
    for (int r = 0; r < world; ++r) layout.mesh.ranks.push_back(r);
    auto boxes = planner::LocalChunks(layout, {8, 4}, rank);
    if (!boxes.ok()) return boxes.status();
    buf.assign(static_cast<size_t>(planner::Volume((*boxes)[0])) * 4, 0);
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<char>((i * 7 + rank) & 0xff);
    }
    return state.AddDTensor("w", DType::kFloat32, {8, 4}, layout, rank,
                            absl::MakeSpan(buf));
  }

  // Rank `rank`'s state: "w" split by rows over `world` ranks (in `buf`) and
  // bytes "rng".
  static absl::Status AddRankState(StateDict& state, int rank, int world,
                                   std::vector<char>& buf, std::string* rng) {
    absl::Status added = AddW(state, rank, world, buf, Placement::Shard(0));
    return added.ok() ? state.AddBytes("rng", rng) : added;
  }

  // Saves step `step` of "w" (rows split over `world` ranks, one thread
  // each) and returns what each rank's Save returned.
  std::vector<absl::StatusOr<CheckpointInfo>> SaveRanks(int64_t step,
                                                        int world) {
    std::vector<absl::StatusOr<CheckpointInfo>> out(
        world, absl::UnknownError("not run"));
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        std::unique_ptr<Checkpointer> c = Connect(r, world);
        if (c == nullptr) return;
        StateDict state;
        std::vector<char> buf;
        std::string rng = "rng-state";
        absl::Status added = AddRankState(state, r, world, buf, &rng);
        out[r] = added.ok() ? c->Save(step, state) : added;
      });
    }
    for (auto& t : ranks) t.join();
    return out;
  }

  // Saves step `step` of "w" with one rank (the whole tensor).
  void SaveOneRank(int64_t step) {
    std::unique_ptr<Checkpointer> c = Connect(0, 1);
    ASSERT_NE(c, nullptr);
    StateDict state;
    std::vector<char> buf;
    ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
    auto rec = c->Save(step, state);
    ASSERT_TRUE(rec.ok()) << rec.status();
  }

  std::string dir_;
  coordinator::CoordinatorServer::Spec spec_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
};

// A rank whose load fails after PlanLoad tells its load round so before
// Load returns: nothing is left running once the Checkpointer is destroyed
// (it was a fire-and-forget VerifyLoad whose callback could run after the
// channel and stub were gone, crashing about every other such process).
// Also: a data object missing from a committed checkpoint is DATA_LOSS naming
// the tensor and the object, not NOT_FOUND.
TEST_F(CheckpointerTest, FailedLoadsReportBeforeReturningAndLeaveNoCall) {
  spec_.coordinator.load_join_grace = absl::Milliseconds(1);
  StartServer();
  SaveOneRank(1);
  // Remove step 1's data object: every load of "w" fails reading it.
  std::string object;
  for (const auto& e : std::filesystem::recursive_directory_iterator(
           dir_ + "/checkpoints/job")) {
    if (e.is_regular_file() && e.path().filename() != "MANIFEST") {
      object = e.path().string();
    }
  }
  ASSERT_FALSE(object.empty());
  ASSERT_TRUE(std::filesystem::remove(object));
  for (int i = 0; i < 60; ++i) {
    SCOPED_TRACE(i);
    std::unique_ptr<Checkpointer> c = Connect(i % 2, 2);
    ASSERT_NE(c, nullptr);
    StateDict state;
    std::vector<char> buf;
    ASSERT_TRUE(AddW(state, i % 2, 2, buf, Placement::Shard(1)).ok());
    absl::StatusOr<int64_t> loaded =
        c->Load(i % 3 == 0 ? LoadRef::Latest() : LoadRef::Step(1), state);
    EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kDataLoss));
    const std::string msg(loaded.status().message());
    EXPECT_THAT(msg, HasSubstr(absl::StrCat("rank ", i % 2,
                                            " loading job 'job' step 1")));
    EXPECT_THAT(msg, HasSubstr("'w'"));
    EXPECT_THAT(msg, HasSubstr("missing"));
    EXPECT_THAT(msg,
                HasSubstr(std::filesystem::path(object).filename().string()));
    // The report reached cairnd before Load returned.
    EXPECT_EQ(server_->coordinator().stats().load_reports, i + 1);
    c.reset();
  }
}

// A rank loading the checkpoint's tensors sends the short form of PlanLoad
// (their digest and its boxes): resharded, and on ranks that hold none of a
// tensor. Other tensors than the checkpoint's go in full when cairnd asks.
TEST_F(CheckpointerTest, LoadsSendTheShortFormAndTheFullOneWhenAsked) {
  StartServer();
  for (const auto& saved : SaveRanks(1, 2)) ASSERT_TRUE(saved.ok());
  std::vector<char> whole;  // "w" as saved: rank r's rows hold (i * 7 + r)
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 64; ++i) whole.push_back(static_cast<char>(i * 7 + r));
  }
  // 8 rows over 16 ranks: ranks 8-15 hold none of "w". The ranks of a load
  // run at once (one load round).
  for (int world : {3, 16}) {
    SCOPED_TRACE(world);
    std::vector<std::thread> ranks;
    std::vector<std::string> got(world), want(world), rngs(world);
    std::vector<absl::Status> status(world);
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        std::unique_ptr<Checkpointer> c = Connect(r, world);
        if (c == nullptr) return;
        StateDict state;
        std::vector<char> buf;
        status[r] = AddRankState(state, r, world, buf, &rngs[r]);
        if (!status[r].ok()) return;
        std::fill(buf.begin(), buf.end(), 0);
        status[r] = c->Load(LoadRef::Step(1), state).status();
        const size_t begin =
            std::min<size_t>(
                8, static_cast<size_t>(r * ((8 + world - 1) / world))) *
            16;
        got[r].assign(buf.begin(), buf.end());
        want[r].assign(whole.begin() + begin,
                       whole.begin() + begin + buf.size());
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(status[r].ok()) << r << ": " << status[r];
      EXPECT_EQ(got[r], want[r]) << r;
      EXPECT_EQ(rngs[r], "rng-state");
    }
  }
  EXPECT_EQ(server_->coordinator().stats().load_requests_short, 3 + 16);
  EXPECT_EQ(server_->coordinator().stats().load_wanted_resends, 0);

  // A tensor the checkpoint lacks but of which nothing is wanted (shape
  // [0, 4]): asked in full, and loaded.
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  {
    StateDict state;
    std::vector<char> buf;
    ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
    ASSERT_TRUE(state.AddChunks("empty", DType::kFloat32, {0, 4}, {}).ok());
    std::fill(buf.begin(), buf.end(), 0);
    absl::StatusOr<int64_t> loaded = c->Load(LoadRef::Step(1), state);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(std::string(buf.begin(), buf.end()),
              std::string(whole.begin(), whole.end()));
    EXPECT_EQ(server_->coordinator().stats().load_wanted_resends, 1);
  }

  // One tensor more than the checkpoint holds: asked in full, then refused
  // naming it.
  StateDict state;
  std::vector<char> buf;
  std::vector<char> extra(16);
  ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
  ASSERT_TRUE(state
                  .AddChunks("x", DType::kFloat32, {4},
                             {TensorChunk{planner::ChunkBox{{0}, {4}},
                                          absl::MakeSpan(extra)}})
                  .ok());
  absl::StatusOr<int64_t> loaded = c->Load(LoadRef::Step(1), state);
  EXPECT_THAT(
      loaded,
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("'x' (wanted chunk 1) is not in the checkpoint")));
  EXPECT_EQ(server_->coordinator().stats().load_wanted_resends, 2);
}

// A rank whose PlanLoad is refused leaves the round at cairnd; destroying
// its Checkpointer right after leaves nothing running either.
TEST_F(CheckpointerTest, RefusedLoadsLeaveNoCall) {
  StartServer();
  SaveOneRank(1);
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    std::unique_ptr<Checkpointer> c = Connect(i % 2, 2);
    ASSERT_NE(c, nullptr);
    StateDict state;
    std::vector<char> buf(16);
    // A tensor the checkpoint does not hold: PlanLoad refuses it.
    ASSERT_TRUE(state
                    .AddChunks("missing", DType::kFloat32, {4},
                               {TensorChunk{planner::ChunkBox{{0}, {4}},
                                            absl::MakeSpan(buf)}})
                    .ok());
    absl::StatusOr<int64_t> loaded =
        c->Load(i % 3 == 0 ? LoadRef::Latest() : LoadRef::Step(1), state);
    EXPECT_THAT(loaded,
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
    c.reset();
  }
  EXPECT_EQ(server_->coordinator().stats().load_reports, 0);
}

TEST_F(CheckpointerTest, SaveReturnsTheCommittedCheckpoint) {
  StartServer();
  const absl::Time before = absl::Now();
  std::vector<absl::StatusOr<CheckpointInfo>> saved = SaveRanks(12, 2);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_TRUE(saved[r].ok()) << saved[r].status();
    const CheckpointInfo& info = *saved[r];
    EXPECT_EQ(info.job, "job");
    EXPECT_EQ(info.step, 12);
    EXPECT_EQ(info.state, CheckpointState::kCommitted);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.bytes, 8u * 4 * 4 + 9);  // "w" fp32 [8, 4] + "rng"
    EXPECT_EQ(info.num_tensors, 1);
    EXPECT_EQ(info.num_bytes_entries, 1);
    EXPECT_GE(info.created, before - absl::Seconds(1));
    EXPECT_GE(info.committed, info.created);
    EXPECT_THAT(info.storage_uri, HasSubstr(dir_));
    EXPECT_TRUE(info.abort_reason.empty());
  }
}

TEST_F(CheckpointerTest, ListReturnsThisJobsCheckpointsByStep) {
  StartServer();
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  absl::StatusOr<std::vector<CheckpointInfo>> none = c->List();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  for (int64_t step : {30, 10, 20}) SaveOneRank(step);
  // Another job's checkpoint is not listed.
  CheckpointerOptions other = Options(0, 1);
  other.job = "other";
  auto o = Checkpointer::Connect(other);
  ASSERT_TRUE(o.ok()) << o.status();
  {
    StateDict state;
    std::vector<char> buf;
    ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
    ASSERT_TRUE((*o)->Save(5, state).ok());
  }
  absl::StatusOr<std::vector<CheckpointInfo>> listed = c->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> steps;
  for (const CheckpointInfo& i : *listed) {
    EXPECT_EQ(i.job, "job");
    EXPECT_EQ(i.state, CheckpointState::kCommitted);
    EXPECT_EQ(i.bytes, 128u);
    steps.push_back(i.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 30}));
}

TEST_F(CheckpointerTest, LatestStepIsTheNewestCommittedOrNotFoundNamingJob) {
  spec_.coordinator.begin_deadline = absl::Milliseconds(300);
  StartServer();
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(
      c->LatestStep().status(),
      StatusIs(
          absl::StatusCode::kNotFound,
          HasSubstr(
              "rank 0 asking for the latest committed step of job 'job': ")));
  for (int64_t step : {7, 21, 14}) SaveOneRank(step);
  absl::StatusOr<int64_t> latest = c->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 21);
  // A newer save that never commits (rank 1 of 2 never joins; cairnd's
  // begin deadline aborts it) does not become latest.
  std::unique_ptr<Checkpointer> r0 = Connect(0, 2);
  ASSERT_NE(r0, nullptr);
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, 0, 2, buf, Placement::Shard(0)).ok());
  EXPECT_FALSE(r0->Save(30, state).ok());
  latest = c->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 21);
}

TEST_F(CheckpointerTest, DescribeSummarizesTheManifest) {
  StartServer();
  std::vector<absl::StatusOr<CheckpointInfo>> saved = SaveRanks(4, 2);
  ASSERT_TRUE(saved[0].ok()) << saved[0].status();
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  absl::StatusOr<CheckpointSummary> d = c->Describe(4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->info.step, 4);
  EXPECT_EQ(d->info.state, CheckpointState::kCommitted);
  ASSERT_EQ(d->tensors.size(), 1u);
  EXPECT_EQ(d->tensors[0].fqn, "w");
  EXPECT_EQ(d->tensors[0].dtype, DType::kFloat32);
  EXPECT_EQ(d->tensors[0].shape, (planner::Shape{8, 4}));
  EXPECT_EQ(d->tensors[0].chunks, 2);  // rows split over two ranks
  EXPECT_EQ(d->tensors[0].bytes, 128u);
  // Rank 0 saved rows [0, 4), rank 1 rows [4, 8), all 4 columns each.
  EXPECT_EQ(
      d->tensors[0].chunk_boxes,
      (std::vector<planner::ChunkBox>{{{0, 0}, {4, 4}}, {{4, 0}, {4, 4}}}));
  ASSERT_EQ(d->bytes_entries.size(), 1u);
  EXPECT_EQ(d->bytes_entries[0].fqn, "rng");
  EXPECT_EQ(d->bytes_entries[0].bytes, 9u);
}

TEST_F(CheckpointerTest, DescribeErrorsNameJobStepAndRank) {
  StartServer();
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->Describe(99).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("rank 0 describing job 'job' step 99")));
  EXPECT_THAT(c->Describe(-3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 describing job 'job' step -3")));
}

TEST_F(CheckpointerTest, FailedSaveNamesRankJobStepAndTensor) {
  StartServer();
  std::unique_ptr<Checkpointer> c = Connect(1, 2);
  ASSERT_NE(c, nullptr);
  StateDict state;
  std::vector<char> buf;
  // A pending reduction cannot be saved: refused before any call.
  ASSERT_TRUE(AddW(state, 1, 2, buf, Placement::Partial()).ok());
  EXPECT_THAT(c->Save(3, state).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 saving job 'job' step 3: ")));
  EXPECT_THAT(std::string(c->Save(3, state).status().message()),
              HasSubstr("'w'"));
  EXPECT_EQ(server_->coordinator().stats().plans_built, 0);
}

TEST_F(CheckpointerTest, ConnectRefusesBadOptionsNamingJobAndRank) {
  CheckpointerOptions o;
  o.coordinator = "127.0.0.1:1";
  o.job = "job";
  o.rank = 4;
  o.world_size = 4;
  EXPECT_THAT(
      Checkpointer::Connect(o).status(),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("job 'job': rank 4 is out of range for world_size 4")));
  o.rank = 0;
  o.job = "bad/name";
  EXPECT_THAT(Checkpointer::Connect(o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o.job = "job";
  o.coordinator.clear();
  EXPECT_THAT(Checkpointer::Connect(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cairnd address is required")));
}

// The bytes of "w" [8, 4] fp32 as SaveRanks(step, 2) saves them, row-major:
// rows 0-3 are rank 0's buffer, rows 4-7 rank 1's (AddW's pattern).
std::vector<char> SavedW() {
  std::vector<char> w;
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 64; ++i)
      w.push_back(static_cast<char>((i * 7 + r) & 0xff));
  }
  return w;
}

// Loads "w" [8, 4] whole (one rank) from `step`; empty on failure.
std::vector<char> LoadWholeW(Checkpointer& c, int64_t step) {
  std::vector<char> buf(128, 0x5a);
  StateDict state;
  if (!state
           .AddChunks("w", DType::kFloat32, {8, 4},
                      {TensorChunk{planner::ChunkBox{{0, 0}, {8, 4}},
                                   absl::MakeSpan(buf)}})
           .ok()) {
    return {};
  }
  absl::StatusOr<int64_t> loaded = c.Load(LoadRef::Step(step), state);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? buf : std::vector<char>();
}

// cairnd's record of `step` (including uncommitted ones).
std::optional<CheckpointInfo> RecordOf(Checkpointer& c, int64_t step) {
  absl::StatusOr<std::vector<CheckpointInfo>> listed = c.List(true);
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (!listed.ok()) return std::nullopt;
  for (const CheckpointInfo& i : *listed) {
    if (i.step == step) return i;
  }
  return std::nullopt;
}

// Rank 0 of 2 waits in BeginSave for rank 1, which never comes (cairnd's
// begin deadline is far away): Cancel from another thread ends the wait with
// CANCELLED (the call is not retried, though retries are allowed), cairnd
// lists the step ABORTED with the reason, the previous checkpoint stays the
// latest and loads bit-exact, and the next step commits with the same
// Checkpointer (the Cancel was consumed).
TEST_F(CheckpointerTest, CancelEndsASaveWaitingInBeginSaveAndAbortsIt) {
  spec_.coordinator.begin_deadline = absl::Minutes(10);
  StartServer();
  for (const auto& saved : SaveRanks(1, 2))
    ASSERT_TRUE(saved.ok()) << saved.status();

  CheckpointerOptions o = Options(0, 2);
  o.max_retries = 16;
  auto c0 = Checkpointer::Connect(o);
  ASSERT_TRUE(c0.ok()) << c0.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, 0, 2, buf, Placement::Shard(0)).ok());
  absl::StatusOr<CheckpointInfo> result = absl::UnknownError("not run");
  absl::Notification done;
  std::thread rank0([&] {
    result = (*c0)->Save(2, state);
    done.Notify();
  });
  // Rank 0 has joined the save at cairnd (and waits for rank 1).
  ASSERT_TRUE(WaitUntil(
      [&] { return server_->coordinator().stats().saves_in_progress == 1; }));
  EXPECT_FALSE(done.HasBeenNotified());
  (*c0)->Cancel();
  const bool returned = done.WaitForNotificationWithTimeout(absl::Minutes(2));
  EXPECT_TRUE(returned) << "Save did not return after Cancel";
  rank0.join();
  EXPECT_THAT(result.status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 saving job 'job' step 2: ", kCancelled))));

  std::optional<CheckpointInfo> rec = RecordOf(**c0, 2);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, CheckpointState::kAborted);
  EXPECT_THAT(rec->abort_reason,
              HasSubstr(absl::StrCat("aborted by rank 0: ", kCancelled)));
  EXPECT_EQ(server_->coordinator().stats().saves_in_progress, 0);
  absl::StatusOr<int64_t> latest = (*c0)->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);

  // Both ranks save step 3; rank 0 with the same Checkpointer.
  absl::StatusOr<CheckpointInfo> rank1_result = absl::UnknownError("not run");
  std::thread rank1([&] {
    std::unique_ptr<Checkpointer> c1 = Connect(1, 2);
    if (c1 == nullptr) return;
    StateDict s1;
    std::vector<char> b1;
    absl::Status added = AddW(s1, 1, 2, b1, Placement::Shard(0));
    rank1_result = added.ok() ? c1->Save(3, s1) : added;
  });
  absl::StatusOr<CheckpointInfo> next = (*c0)->Save(3, state);
  rank1.join();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(rank1_result.ok()) << rank1_result.status();
  EXPECT_EQ(next->state, CheckpointState::kCommitted);
  std::unique_ptr<Checkpointer> reader = Connect(0, 1);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(LoadWholeW(*reader, 1), SavedW());
  EXPECT_EQ(LoadWholeW(*reader, 3), SavedW());
}

// Rank 0 is held writing its first item (its object's Appends wait at a
// gate); rank 1 writes everything and waits in CommitSave. Cancel on rank 0,
// then the gate opens: the item in flight finishes, no further item is
// written, rank 0 returns CANCELLED, rank 1 ABORTED at once naming rank 0 and
// the reason, and nothing is committed.
TEST_F(CheckpointerTest, CancelDuringTheWritesStopsThemAndAbortsForEveryRank) {
  RegisterGatedScheme();
  spec_.coordinator.storage_uri =
      absl::StrCat("gated://", dir_, "/checkpoints");
  StartServer();
  for (const auto& saved : SaveRanks(1, 2))
    ASSERT_TRUE(saved.ok()) << saved.status();

  constexpr int kTensors = 6;
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Connect(r, 2));
    ASSERT_NE(ranks.back(), nullptr);
  }
  std::vector<std::vector<std::vector<char>>> bufs(
      2, std::vector<std::vector<char>>(kTensors));
  std::vector<StateDict> states(2);
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      std::vector<char>& b = bufs[r][t];
      b.assign(4 * 4 * 4, static_cast<char>(r * 16 + t));  // rows [4r, 4r+4)
      ASSERT_TRUE(
          states[r]
              .AddChunks(absl::StrCat("t", t), DType::kFloat32, {8, 4},
                         {TensorChunk{planner::ChunkBox{{4 * r, 0}, {4, 4}},
                                      absl::MakeSpan(b)}})
              .ok());
    }
  }
  Gate().Close("rank-00000");
  std::vector<absl::StatusOr<CheckpointInfo>> results(
      2, absl::UnknownError("not run"));
  std::vector<absl::Notification> done(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      results[r] = ranks[r]->Save(2, states[r]);
      done[r].Notify();
    });
  }
  ASSERT_TRUE(WaitUntil([] { return Gate().waiting() == 1; }));
  ranks[0]->Cancel();
  Gate().Open();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(done[r].WaitForNotificationWithTimeout(absl::Minutes(2)))
        << "rank " << r << " did not return";
  }
  for (auto& t : threads) t.join();
  const int passed = Gate().passed();
  Gate().Close("");  // gates nothing
  Gate().Open();

  EXPECT_THAT(results[0].status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 saving job 'job' step 2: ", kCancelled))));
  EXPECT_THAT(
      results[1].status(),
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr(absl::StrCat("aborted by rank 0: ", kCancelled))));
  EXPECT_THAT(std::string(results[1].status().message()), HasSubstr("step 2"));
  // Rank 0's object got the item in flight when Cancel came, nothing more.
  EXPECT_EQ(passed, 1);
  std::optional<CheckpointInfo> rec = RecordOf(*ranks[1], 2);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, CheckpointState::kAborted);
  absl::StatusOr<int64_t> latest = ranks[1]->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);
  EXPECT_FALSE(std::filesystem::exists(
      absl::StrCat(dir_, "/checkpoints/job/2/MANIFEST")));
  std::unique_ptr<Checkpointer> reader = Connect(0, 1);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(LoadWholeW(*reader, 1), SavedW());
}

// With nothing running, Cancel cancels the next Save or Load at once (no
// call reaches cairnd) and only that one: the queries do not consume it,
// two Cancels before a call are one, and the call after it runs normally.
// A Load cancelled before it read leaves the caller's buffers untouched.
TEST_F(CheckpointerTest, CancelWithNothingRunningCancelsOnlyTheNextCall) {
  StartServer();
  std::unique_ptr<Checkpointer> c = Connect(0, 1);
  ASSERT_NE(c, nullptr);
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
  const std::vector<char> saved = buf;

  c->Cancel();
  c->Cancel();
  ASSERT_TRUE(c->List().ok());  // queries are not cancelled
  EXPECT_THAT(c->Save(5, state).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 saving job 'job' step 5: ", kCancelled))));
  EXPECT_FALSE(RecordOf(*c, 5).has_value());  // cairnd never heard of it
  EXPECT_EQ(server_->coordinator().stats().plans_built, 0);
  absl::StatusOr<CheckpointInfo> rec = c->Save(5, state);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state, CheckpointState::kCommitted);

  std::fill(buf.begin(), buf.end(), 0x5a);
  c->Cancel();
  EXPECT_THAT(c->Load(LoadRef::Latest(), state).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 loading job 'job' latest: ", kCancelled))));
  EXPECT_EQ(buf, std::vector<char>(saved.size(), 0x5a));  // untouched
  EXPECT_EQ(server_->coordinator().stats().load_reports, 0);
  absl::StatusOr<int64_t> loaded = c->Load(LoadRef::Latest(), state);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 5);
  EXPECT_EQ(buf, saved);
}

// Rank 0 of 2 loads a column shard of rows saved by two ranks: it reads
// part of each stored chunk and waits in VerifyLoad for rank 1 to join its
// load round (the join grace is far away). Cancel ends the wait with
// CANCELLED; every byte the load planned is in the caller's buffer by then
// (unverified: the guarantee is only "not loaded unless OK").
TEST_F(CheckpointerTest, CancelEndsALoadWaitingInVerifyLoad) {
  spec_.coordinator.load_join_grace = absl::Minutes(10);
  StartServer();
  for (const auto& saved : SaveRanks(1, 2))
    ASSERT_TRUE(saved.ok()) << saved.status();
  std::unique_ptr<Checkpointer> c = Connect(0, 2);
  ASSERT_NE(c, nullptr);
  std::vector<char> buf(8 * 2 * 4, 0x5a);  // columns [0, 2) of every row
  StateDict state;
  ASSERT_TRUE(state
                  .AddChunks("w", DType::kFloat32, {8, 4},
                             {TensorChunk{planner::ChunkBox{{0, 0}, {8, 2}},
                                          absl::MakeSpan(buf)}})
                  .ok());
  absl::StatusOr<int64_t> result = absl::UnknownError("not run");
  absl::Notification done;
  std::thread rank0([&] {
    result = c->Load(LoadRef::Step(1), state);
    done.Notify();
  });
  ASSERT_TRUE(WaitUntil(
      [&] { return server_->coordinator().stats().load_reports == 1; }));
  EXPECT_FALSE(done.HasBeenNotified());
  c->Cancel();
  const bool returned = done.WaitForNotificationWithTimeout(absl::Minutes(2));
  EXPECT_TRUE(returned) << "Load did not return after Cancel";
  rank0.join();
  EXPECT_THAT(result.status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 loading job 'job' step 1: ", kCancelled))));
  std::vector<char> want;
  const std::vector<char> w = SavedW();
  for (int row = 0; row < 8; ++row) {
    want.insert(want.end(), w.begin() + row * 16, w.begin() + row * 16 + 8);
  }
  EXPECT_EQ(buf, want);
}

// ---------------------------------------------------------------------------
// First contact: a cairnd this Checkpointer never reached fails its call
// within first_contact_timeout, naming the address and gRPC's reason; one
// that answered before is retried through its restart (max_retries).

// A loopback port bound and closed: connections to it are refused.
int RefusingPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A loopback socket that listens but never accepts: TCP connects (the
// kernel's backlog answers), gRPC's HTTP/2 handshake never completes — an
// address where something other than cairnd listens, or a stalled host.
class SilentListener {
 public:
  SilentListener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(fd_, 64) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  const int fd_;
  int port_ = 0;
};

// Options whose restart budget (200 retries, over 16 minutes) no first
// contact may use up: a test that took it would hit HangGuard.
CheckpointerOptions NeverReachedOptions(const std::string& address) {
  CheckpointerOptions o;
  o.coordinator = address;
  o.job = "job";
  o.max_retries = 200;
  o.security = protocol::ClientSecurity();
  o.store.use_odirect = false;
  return o;
}

// Runs `call` on its own thread and returns its result; after a minute (a
// hang guard, far beyond the first-contact timeout) fails the test and
// cancels `ckpt` so that the call returns.
template <typename T>
absl::StatusOr<T> HangGuard(Checkpointer& ckpt,
                            std::function<absl::StatusOr<T>()> call) {
  absl::StatusOr<T> result = absl::UnknownError("not run");
  absl::Notification done;
  std::thread t([&] {
    result = call();
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Minutes(1))) {
    ADD_FAILURE() << "the call still retried after a minute";
    ckpt.Cancel();
  }
  t.join();
  return result;
}

TEST_F(CheckpointerTest, SaveToAPortWhereNothingListensFailsNamingTheAddress) {
  const int port = RefusingPort();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto c = Checkpointer::Connect(NeverReachedOptions(address));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
  absl::StatusOr<CheckpointInfo> saved =
      HangGuard<CheckpointInfo>(**c, [&] { return (*c)->Save(1, state); });
  EXPECT_THAT(saved, StatusIs(absl::StatusCode::kUnavailable));
  const std::string msg(saved.status().message());
  EXPECT_THAT(msg, HasSubstr("rank 0 saving job 'job' step 1"));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("cairnd at ", address,
                                          " was never reached")));
  EXPECT_THAT(msg, HasSubstr("Connection refused"));
}

TEST_F(CheckpointerTest, LoadFromAnAddressThatNeverAnswersFailsNamingIt) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", silent.port());
  CheckpointerOptions o = NeverReachedOptions(address);
  o.first_contact_timeout = absl::Seconds(2);
  auto c = Checkpointer::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, 0, 1, buf, Placement::Shard(0)).ok());
  absl::StatusOr<int64_t> loaded = HangGuard<int64_t>(
      **c, [&] { return (*c)->Load(LoadRef::Latest(), state); });
  EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kUnavailable));
  const std::string msg(loaded.status().message());
  EXPECT_THAT(msg, HasSubstr("rank 0 loading job 'job'"));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("cairnd at ", address,
                                          " was never reached")));
  EXPECT_THAT(msg, HasSubstr("no answer to the connection attempt"));
}

// cairnd answers, goes away and comes back on the same address 3 s later,
// well past a first-contact timeout of 0.5 s: the call rides the restart
// out on max_retries, as docs/cpp.md promises for a restarting cairnd.
TEST_F(CheckpointerTest, OnceAnsweredACairndRestartIsRetriedThrough) {
  StartServer();
  const int port = server_->port();
  CheckpointerOptions o = Options(0, 1);
  o.max_retries = 16;
  o.first_contact_timeout = absl::Milliseconds(500);
  auto c = Checkpointer::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  SaveOneRank(1);
  ASSERT_TRUE((*c)->List().ok());
  server_.reset();
  spec_.listen_address = absl::StrCat("127.0.0.1:", port);
  std::thread restart([this] {
    absl::SleepFor(absl::Seconds(3));
    StartServer();
  });
  absl::StatusOr<int64_t> latest = (*c)->LatestStep();
  restart.join();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);
}

// A job restarts and saves a step that a process of its previous run was
// waiting in: that run's rank 0 called Save(10) and was killed in BeginSave
// (its rank 1 never came); then the new processes save step 10, in either
// order or at once. The save commits with the new processes' bytes and no
// attempt is aborted: the dead process's arrival never makes a plan, and
// nothing waits cairnd's begin deadline for a rank that was told to fail.
class CheckpointerRestartTest : public CheckpointerTest {
 protected:
  static constexpr int64_t kStep = 10;

  void SetUp() override {
    CheckpointerTest::SetUp();
    // Far beyond a save here, far below the test's timeout.
    spec_.coordinator.begin_deadline = absl::Seconds(30);
  }

  // Rank `rank` of 2's old process saving kStep, killed while it waits in
  // BeginSave: its call is cancelled, which is what cairnd sees of a
  // process that dies (its connection closes). Returns once cairnd has.
  void KillWhileInBeginSave(int rank) {
    StateDict state;
    std::vector<char> buf;
    ASSERT_TRUE(AddW(state, rank, 2, buf, Placement::Shard(0)).ok());
    absl::StatusOr<planner::LocalSavePlan> local = state.ToLocalPlan(rank);
    ASSERT_TRUE(local.ok()) << local.status();
    v1::BeginSaveRequest request;
    request.set_job("job");
    request.set_step(kStep);
    request.set_rank(rank);
    request.set_world_size(2);
    request.set_incarnation(protocol::NewIncarnation());
    convert::LocalPlanToProto(*local, request.mutable_local_plan());
    auto stub = v1::Coordinator::NewStub(protocol::NewCoordinatorChannel(
        absl::StrCat("127.0.0.1:", server_->port())));
    grpc::ClientContext context;
    v1::BeginSaveResponse response;
    grpc::Status status;
    std::thread call(
        [&] { status = stub->BeginSave(&context, request, &response); });
    const bool parked = WaitUntil(
        [&] { return server_->coordinator().stats().saves_in_progress == 1; });
    context.TryCancel();
    call.join();
    ASSERT_TRUE(parked);
    ASSERT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
        << status.error_message();
    ASSERT_TRUE(WaitUntil([&] {
      return server_->coordinator().BeginSaveCallsGoneForTest() == 1;
    }));
  }

  // A new process of `rank` of 2 saves kStep (AddW's "w").
  absl::StatusOr<CheckpointInfo> SaveAs(int rank) {
    std::unique_ptr<Checkpointer> c = Connect(rank, 2);
    if (c == nullptr) return absl::UnknownError("cannot connect");
    StateDict state;
    std::vector<char> buf;
    CAIRN_RETURN_IF_ERROR(AddW(state, rank, 2, buf, Placement::Shard(0)));
    return c->Save(kStep, state);
  }

  void ExpectSavedByTheNewProcesses(
      const absl::StatusOr<CheckpointInfo>& rank0,
      const absl::StatusOr<CheckpointInfo>& rank1) {
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    ASSERT_TRUE(rank1.ok()) << rank1.status();
    EXPECT_EQ(rank0->state, CheckpointState::kCommitted);
    EXPECT_EQ(server_->coordinator().stats().aborts, 0);
    EXPECT_EQ(server_->coordinator().stats().saves_in_progress, 0);
    std::unique_ptr<Checkpointer> reader = Connect(0, 1);
    ASSERT_NE(reader, nullptr);
    EXPECT_EQ(LoadWholeW(*reader, kStep), SavedW());
  }
};

// The new rank 1 first: it used to complete the world with the dead
// process, get a plan, and fail ABORTED ("rank 0 restarted during the save;
// the save starts over", which libcairn does not retry) when the new rank 0
// came; the new rank 0 then waited the begin deadline for rank 1.
TEST_F(CheckpointerRestartTest, NewRank1ThenNewRank0SaveTheStep) {
  StartServer();
  KillWhileInBeginSave(0);
  const int64_t plans = server_->coordinator().stats().plans_built;
  absl::StatusOr<CheckpointInfo> rank1 = absl::UnknownError("not run");
  std::thread t1([&] { rank1 = SaveAs(1); });
  // Rank 1 is in cairnd: the dead process's call was let go of (or, were it
  // not, a plan was made with it).
  EXPECT_TRUE(WaitUntil([&] {
    return server_->coordinator().BeginSaveCallsGoneForTest() == 0 ||
           server_->coordinator().stats().plans_built > plans;
  }));
  EXPECT_EQ(server_->coordinator().stats().plans_built, plans);
  absl::StatusOr<CheckpointInfo> rank0 = SaveAs(0);
  t1.join();
  ExpectSavedByTheNewProcesses(rank0, rank1);
}

TEST_F(CheckpointerRestartTest, NewRank0ThenNewRank1SaveTheStep) {
  StartServer();
  KillWhileInBeginSave(0);
  absl::StatusOr<CheckpointInfo> rank0 = absl::UnknownError("not run");
  std::thread t0([&] { rank0 = SaveAs(0); });
  // Rank 0's new process is in cairnd: the old one's call was let go of.
  EXPECT_TRUE(WaitUntil(
      [&] { return server_->coordinator().BeginSaveCallsGoneForTest() == 0; }));
  absl::StatusOr<CheckpointInfo> rank1 = SaveAs(1);
  t0.join();
  ExpectSavedByTheNewProcesses(rank0, rank1);
}

TEST_F(CheckpointerRestartTest, NewRanksAtOnceSaveTheStep) {
  StartServer();
  KillWhileInBeginSave(0);
  absl::StatusOr<CheckpointInfo> rank0 = absl::UnknownError("not run");
  absl::StatusOr<CheckpointInfo> rank1 = absl::UnknownError("not run");
  std::thread t0([&] { rank0 = SaveAs(0); });
  std::thread t1([&] { rank1 = SaveAs(1); });
  t0.join();
  t1.join();
  ExpectSavedByTheNewProcesses(rank0, rank1);
}

// Two live processes claim rank 0 (a launcher's mistake, not a restart):
// the later one takes the rank, the earlier one, still waiting, is refused
// with an error naming both processes and saying so; the later one's save
// with rank 1 commits.
TEST_F(CheckpointerRestartTest, SecondLiveProcessForARankRefusesTheFirst) {
  StartServer();
  absl::StatusOr<CheckpointInfo> first = absl::UnknownError("not run");
  std::thread p([&] { first = SaveAs(0); });
  ASSERT_TRUE(WaitUntil(
      [&] { return server_->coordinator().stats().saves_in_progress == 1; }));
  absl::StatusOr<CheckpointInfo> second = absl::UnknownError("not run");
  std::thread q([&] { second = SaveAs(0); });
  p.join();
  EXPECT_THAT(
      first.status(),
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr(
                   "save of job 'job' step 10 aborted: rank 0 restarted during "
                   "the save (process ")));
  EXPECT_THAT(std::string(first.status().message()),
              HasSubstr(", which is still waiting in BeginSave: two processes "
                        "for rank 0?)"));
  absl::StatusOr<CheckpointInfo> rank1 = SaveAs(1);
  q.join();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(second->state, CheckpointState::kCommitted);
  std::unique_ptr<Checkpointer> reader = Connect(0, 1);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(LoadWholeW(*reader, kStep), SavedW());
}

TEST(CheckpointInfoTest, FromRecordKeepsEveryFieldAndMapsUnknownStates) {
  v1::CheckpointRecord r;
  r.set_job("llama");
  r.set_step(1200);
  r.set_state(v1::CHECKPOINT_STATE_ABORTED);
  r.set_world_size(8);
  r.set_total_bytes(1 << 20);
  r.set_num_tensors(3);
  r.set_num_bytes_entries(2);
  r.set_created_unix_micros(1'700'000'000'000'000);
  r.set_storage_uri("file:///ckpt");
  r.set_abort_reason("aborted by rank 3: no space left on device");
  const CheckpointInfo info = CheckpointInfoFromProto(r);
  EXPECT_EQ(info.job, "llama");
  EXPECT_EQ(info.step, 1200);
  EXPECT_EQ(info.state, CheckpointState::kAborted);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.bytes, 1u << 20);
  EXPECT_EQ(info.num_tensors, 3);
  EXPECT_EQ(info.num_bytes_entries, 2);
  EXPECT_EQ(info.created, absl::FromUnixMicros(1'700'000'000'000'000));
  EXPECT_EQ(info.committed, absl::InfinitePast());  // never committed
  EXPECT_EQ(info.storage_uri, "file:///ckpt");
  EXPECT_EQ(info.abort_reason, "aborted by rank 3: no space left on device");
  EXPECT_EQ(CheckpointStateFromProto(static_cast<v1::CheckpointState>(99)),
            CheckpointState::kUnknown);
  EXPECT_EQ(CheckpointStateFromProto(v1::CHECKPOINT_STATE_WRITING),
            CheckpointState::kWriting);
  EXPECT_EQ(CheckpointStateFromProto(v1::CHECKPOINT_STATE_DELETING),
            CheckpointState::kDeleting);
}

TEST(CheckpointSummaryTest, ChunkBoxesAreTheManifestsBoxesSortedByBox) {
  v1::CheckpointRecord r;
  r.set_job("llama");
  r.set_step(5);
  r.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  v1::Manifest m;
  v1::ManifestTensor* t = m.add_tensors();
  t->mutable_entry()->set_fqn("wq");
  t->mutable_entry()->set_dtype(convert::DTypeToProto(DType::kFloat32));
  for (int64_t d : {6, 4}) t->mutable_entry()->add_global_shape(d);
  // Columns split in three (the last one narrower), stored out of order.
  const std::vector<planner::ChunkBox> boxes = {
      {{0, 3}, {6, 1}}, {{0, 0}, {6, 2}}, {{0, 2}, {6, 1}}};
  for (const planner::ChunkBox& b : boxes) {
    v1::StoredChunk* c = t->add_chunks();
    convert::BoxToProto(b, c->mutable_box());
    c->mutable_location()->set_length(planner::Volume(b) * 4);
  }
  absl::StatusOr<CheckpointSummary> s = SummaryFromProto(r, m);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->tensors.size(), 1u);
  EXPECT_EQ(s->tensors[0].chunks, 3);
  EXPECT_EQ(s->tensors[0].bytes, 6u * 4 * 4);
  EXPECT_EQ(s->tensors[0].chunk_boxes,
            (std::vector<planner::ChunkBox>{
                {{0, 0}, {6, 2}}, {{0, 2}, {6, 1}}, {{0, 3}, {6, 1}}}));
  // A box this library cannot read is refused naming the tensor.
  t->mutable_chunks(1)->mutable_box()->add_offsets(0);
  EXPECT_THAT(SummaryFromProto(r, m).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("chunk of 'wq' has 3 offsets but 2 sizes")));
}

TEST(CheckpointStateTest, NamesEveryState) {
  EXPECT_EQ(CheckpointStateName(CheckpointState::kWriting), "WRITING");
  EXPECT_EQ(CheckpointStateName(CheckpointState::kCommitted), "COMMITTED");
  EXPECT_EQ(CheckpointStateName(CheckpointState::kAborted), "ABORTED");
  EXPECT_EQ(CheckpointStateName(CheckpointState::kDeleting), "DELETING");
  EXPECT_EQ(CheckpointStateName(CheckpointState::kUnknown), "UNKNOWN");
}

}  // namespace
}  // namespace cairn::client
