// Load rounds end to end: a real cairnd process and libcairn ranks (threads
// of this process, a Checkpointer each) over loopback. Loads of one step
// that follow each other, by ranks of other world sizes, with the
// verification modes that make a rank plan twice, and after a load that
// failed for ranks disagreeing on the world size.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/checkpointer.h"
#include "client/state_dict.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "tests/testing/e2e_harness.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using client::Checkpointer;
using client::CheckpointerOptions;
using client::LoadRef;
using client::PartialChunkCheck;
using client::StateDict;
using planner::DType;
using planner::Placement;
using ::testing::HasSubstr;

constexpr int64_t kRows = 12;  // "w" is float32 [12, 4]; "b" float32 [4]
constexpr int64_t kCols = 4;

class LoadRoundsE2ETest : public testing::EndToEndTest {
 protected:
  CheckpointerOptions Options(int rank, int world,
                              PartialChunkCheck check) const {
    CheckpointerOptions o;
    o.coordinator = cairnd_->address();
    o.job = "job";
    o.rank = rank;
    o.world_size = world;
    o.partial_chunk_check = check;
    o.max_retries = 0;
    o.rpc_timeout = absl::Minutes(1);
    o.collective_timeout = absl::Minutes(2);
    o.store.use_odirect = false;
    return o;
  }

  static planner::DTensorLayout Rows(int world) {
    planner::DTensorLayout layout{{{world}, {}}, {Placement::Shard(0)}};
    for (int r = 0; r < world; ++r) layout.mesh.ranks.push_back(r);
    return layout;
  }

  // Step 1 by 2 ranks: "w" split by rows, element (i, j) = 4 i + j, and
  // "b" = {1, 2, 3, 4} replicated.
  void SaveStep1() {
    std::vector<absl::Status> saved(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto c = Checkpointer::Connect(
            Options(r, 2, PartialChunkCheck::kCollective));
        if (!c.ok()) {
          saved[r] = c.status();
          return;
        }
        std::vector<float> w(kRows / 2 * kCols);
        for (size_t i = 0; i < w.size(); ++i) {
          w[i] = static_cast<float>(r * w.size() + i);
        }
        std::vector<float> b = {1, 2, 3, 4};
        planner::DTensorLayout replicated{{{2}, {0, 1}},
                                          {Placement::Replicate()}};
        StateDict state;
        absl::Status s = state.AddDTensor(
            "w", DType::kFloat32, {kRows, kCols}, Rows(2), r,
            absl::MakeSpan(reinterpret_cast<char*>(w.data()), w.size() * 4));
        if (s.ok()) {
          s = state.AddDTensor(
              "b", DType::kFloat32, {4}, replicated, r,
              absl::MakeSpan(reinterpret_cast<char*>(b.data()), b.size() * 4));
        }
        saved[r] = s.ok() ? (*c)->Save(1, state).status() : s;
      });
    }
    for (auto& t : ranks) t.join();
    for (const absl::Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  }

  // Rank `rank` of a load of step 1 by `world` ranks that wants only "w"
  // (its rows): what Load returned, and its rows checked.
  absl::Status LoadW(int rank, int world, PartialChunkCheck check) {
    auto c = Checkpointer::Connect(Options(rank, world, check));
    if (!c.ok()) return c.status();
    const int64_t rows = kRows / world;
    std::vector<float> w(rows * kCols, -1);
    StateDict state;
    absl::Status s = state.AddDTensor(
        "w", DType::kFloat32, {kRows, kCols}, Rows(world), rank,
        absl::MakeSpan(reinterpret_cast<char*>(w.data()), w.size() * 4));
    if (!s.ok()) return s;
    absl::StatusOr<int64_t> step = (*c)->Load(LoadRef::Step(1), state);
    if (!step.ok()) return step.status();
    for (size_t i = 0; i < w.size(); ++i) {
      const float want = static_cast<float>(rank * rows * kCols + i);
      if (w[i] != want) {
        return absl::DataLossError(absl::StrCat("rank ", rank, " of ", world,
                                                ": element ", i, " is ", w[i],
                                                ", saved ", want));
      }
    }
    return absl::OkStatus();
  }

  // Every rank of a load by `world` ranks, one thread each.
  std::vector<absl::Status> LoadAll(int world, PartialChunkCheck check) {
    std::vector<absl::Status> out(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] { out[r] = LoadW(r, world, check); });
    }
    for (auto& t : ranks) t.join();
    return out;
  }
};

// Ranks that load only some of the checkpoint's tensors and verify without
// the round (read-whole, or no verification) plan twice: libcairn's
// short-form PlanLoad is answered resend_wanted and the rank sends its
// wanted chunks in full. A load by 6 such ranks, then one by 3 within the
// join grace: both load (the second was refused, "rank 1 says world_size 3
// but ranks [...] of the load say world_size 6", by a round the first
// load's resends had opened after its round was complete).
TEST_F(LoadRoundsE2ETest, LoadsThatPlanTwiceLeaveNoRoundToRefuseTheNext) {
  StartCairnd({"--load-join-grace", "3600"});
  SaveStep1();
  for (PartialChunkCheck check :
       {PartialChunkCheck::kReadWhole, PartialChunkCheck::kNone}) {
    SCOPED_TRACE(check == PartialChunkCheck::kNone ? "none" : "read-whole");
    for (int world : {6, 3, 2}) {
      SCOPED_TRACE(absl::StrCat(world, " ranks"));
      std::vector<absl::Status> loaded = LoadAll(world, check);
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(loaded[r].ok()) << "rank " << r << ": " << loaded[r];
      }
    }
  }
}

// A job's load fails (ranks 0 and 2 of 3 planned, then died without
// reporting; rank 1 said world_size 2) and the job is restarted after the
// join grace: the new ranks load, those that were members of the failed
// round too (they got its error until its verify deadline).
TEST_F(LoadRoundsE2ETest, ALoadAfterAFailedRoundLoads) {
  StartCairnd({"--load-join-grace", "2", "--load-verify-deadline", "600"});
  SaveStep1();
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(testing::CairndChannel(cairnd_->address()));
  for (int rank : {0, 2}) {
    v1::PlanLoadRequest req;
    req.set_job("job");
    req.set_step(1);
    req.set_rank(rank);
    req.set_world_size(3);
    req.set_verify_in_round(true);
    v1::WantedChunk* w = req.add_wanted();
    w->mutable_tensor()->set_fqn("w");
    w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    w->mutable_tensor()->add_global_shape(kRows);
    w->mutable_tensor()->add_global_shape(kCols);
    w->mutable_box()->add_offsets(rank * 4);
    w->mutable_box()->add_offsets(0);
    w->mutable_box()->add_sizes(4);
    w->mutable_box()->add_sizes(kCols);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    v1::PlanLoadResponse resp;
    grpc::Status s = stub->PlanLoad(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const absl::Status wrong = LoadW(1, 2, PartialChunkCheck::kCollective);
  ASSERT_THAT(
      wrong,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 1 says world_size 2 but ranks [0, 2] (2 of 3) "
                         "of the load say world_size 3")));
  absl::SleepFor(absl::Seconds(3));  // past the grace: the job restarted
  std::vector<absl::Status> loaded = LoadAll(3, PartialChunkCheck::kCollective);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(loaded[r].ok()) << "rank " << r << ": " << loaded[r];
  }
}

}  // namespace
}  // namespace cairn
