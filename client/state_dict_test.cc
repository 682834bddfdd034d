// StateDict keeps each tensor's layout and each buffer's length, so a layout
// that cannot be saved and a buffer of the wrong size are errors naming the
// tensor, not silently wrong data or a write past the buffer.
#include "client/state_dict.h"

#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::client {
namespace {

using ::cairn::testing::StatusIs;
using planner::DType;
using planner::Placement;
using ::testing::AllOf;
using ::testing::HasSubstr;

planner::DTensorLayout Mesh2(Placement p) {
  return planner::DTensorLayout{{{2}, {0, 1}}, {p}};
}

TEST(StateDictTest, DTensorKeepsItsLayout) {
  StateDict state;
  std::vector<char> buf(4 * 4 * 4);  // rows [4:8] of [8, 4] fp32 on rank 1
  ASSERT_TRUE(state
                  .AddDTensor("w", DType::kFloat32, {8, 4},
                              Mesh2(Placement::Shard(0)), 1,
                              absl::MakeSpan(buf))
                  .ok());
  ASSERT_EQ(state.tensors().size(), 1u);
  const TensorShard& t = state.tensors()[0];
  ASSERT_TRUE(t.layout.has_value());
  EXPECT_EQ(t.layout->placements[0], Placement::Shard(0));
  ASSERT_EQ(t.chunks.size(), 1u);
  EXPECT_EQ(t.chunks[0].data.size(), buf.size());
  EXPECT_EQ(t.chunks[0].data.data(), buf.data());
}

TEST(StateDictTest, BufferOfTheWrongSizeIsRefusedNamingTheTensor) {
  StateDict state;
  std::vector<char> small(4 * 4 * 4 - 1);
  absl::Status s =
      state.AddDTensor("model.wq", DType::kFloat32, {8, 4},
                       Mesh2(Placement::Shard(0)), 1, absl::MakeSpan(small));
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'model.wq'"), HasSubstr("[4:8, 0:4]"),
                             HasSubstr("64 bytes, got 63"))));

  // A larger buffer too: a wrong dtype would otherwise go unnoticed.
  std::vector<char> large(2 * 4 * 4 * 4);
  s = state.AddDTensor("model.wk", DType::kFloat32, {8, 4},
                       Mesh2(Placement::Shard(0)), 0, absl::MakeSpan(large));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'model.wk'")));

  std::vector<char> ok(4 * 4);
  s = state.AddChunks("b", DType::kFloat32, {4},
                      {TensorChunk{planner::ChunkBox{{0}, {4}},
                                   absl::MakeSpan(ok.data(), 15)}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("'b' chunk [0:4]")));
  EXPECT_TRUE(state.tensors().empty());

  // A rank outside the mesh holds nothing and passes nothing.
  EXPECT_TRUE(state
                  .AddDTensor("w", DType::kFloat32, {8, 4},
                              Mesh2(Placement::Shard(0)), 5, {})
                  .ok());
  EXPECT_THAT(
      state.AddDTensor("w2", DType::kFloat32, {8, 4},
                       Mesh2(Placement::Shard(0)), 5, absl::MakeSpan(ok)),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StateDictTest, PartialPlacementIsNeitherSavedNorLoaded) {
  StateDict state;
  std::vector<char> buf(8 * 4 * 4);
  ASSERT_TRUE(state
                  .AddDTensor("grad.acc", DType::kFloat32, {8, 4},
                              Mesh2(Placement::Partial()), 1,
                              absl::MakeSpan(buf))
                  .ok());
  absl::StatusOr<planner::LocalSavePlan> plan = state.ToLocalPlan(1);
  EXPECT_THAT(plan,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'grad.acc'"), HasSubstr("Partial()"))));
  absl::Status load = state.CheckLoadable();
  EXPECT_THAT(load, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("'grad.acc'")));
}

// Save refuses a Partial() tensor before any call to cairnd, naming the job,
// step, rank and tensor (cairnd's address here is never contacted).
TEST(StateDictTest, CheckpointerRefusesPartialPlacementsNamingJobStepRank) {
  CheckpointerOptions o;
  o.coordinator = "127.0.0.1:1";
  o.job = "llm";
  o.rank = 1;
  o.world_size = 2;
  o.max_retries = 0;
  o.rpc_timeout = absl::Seconds(5);
  o.collective_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Checkpointer>> ckpt = Checkpointer::Connect(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  StateDict state;
  std::vector<char> buf(8 * 4 * 4);
  ASSERT_TRUE(state
                  .AddDTensor("grad.acc", DType::kFloat32, {8, 4},
                              Mesh2(Placement::Partial()), 1,
                              absl::MakeSpan(buf))
                  .ok());
  absl::Status s = (*ckpt)->Save(5, state).status();
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 1 saving job 'llm' step 5"),
                             HasSubstr("'grad.acc'"), HasSubstr("Partial()"))));

  s = (*ckpt)->Load(LoadRef::Latest(), state).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("rank 1 loading job 'llm' latest"),
                                HasSubstr("'grad.acc'"))));
}

}  // namespace
}  // namespace cairn::client
