// libcairn against a real cairnd server (the Coordinator library behind its
// gRPC service, in-process, on loopback port 0, posix storage in a temp dir).
#include "client/checkpointer.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::client {
namespace {

using planner::DType;
using planner::Placement;
using ::testing::HasSubstr;

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(
        base ? base : "/tmp", "/cairn-client-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
        getpid());
    std::filesystem::remove_all(dir_);
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
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss)
        << loaded.status();
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
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound)
        << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("missing"));
    c.reset();
  }
  EXPECT_EQ(server_->coordinator().stats().load_reports, 0);
}

}  // namespace
}  // namespace cairn::client
