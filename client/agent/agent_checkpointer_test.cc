// libcairn's agent mode against a real cairnd and a real cairn-agent, both
// in-process (cairnd on loopback port 0, the agent on a Unix socket in a temp
// dir): AsyncSave returns a future whose Wait gives the committed
// CheckpointInfo, loads come from agent memory or fall back to storage, and
// failures name the rank, job and step.
#include "client/agent/agent_checkpointer.h"

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent/agent_server.h"
#include "server/coordinator/coordinator_server.h"

namespace cairn::client {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kCancelled[] = "cancelled (AgentCheckpointer::Cancel)";

// Polls `done` (a bound on the wait, not a time asserted: a test fails on
// what it then finds).
bool WaitUntil(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  while (!done() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
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

class AgentCheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The agent's socket path must fit sun_path.
    dir_ = testing::MakeSocketTempDir("agent-ckpt");
    ASSERT_FALSE(dir_.empty());
    std::filesystem::create_directories(dir_ + "/ckpt");
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = "127.0.0.1:0";
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
  }
  void TearDown() override {
    agent_.reset();
    cairnd_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::string Socket() const { return dir_ + "/agent.sock"; }

  // Restarts cairnd (on `port`, 0: any) with `edit` applied to its options.
  void RestartCairnd(
      const std::function<void(coordinator::CoordinatorOptions&)>& edit,
      int port = 0) {
    cairnd_.reset();
    coordinator::CoordinatorServer::Spec spec;
    spec.listen_address = absl::StrCat("127.0.0.1:", port);
    spec.coordinator.storage_uri = absl::StrCat("file://", dir_, "/ckpt");
    spec.coordinator.catalog_path = dir_ + "/catalog";
    edit(spec.coordinator);
    auto c = coordinator::CoordinatorServer::Start(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    cairnd_ = std::move(*c);
  }

  // A direct-mode rank of job "job" (for the ranks that do not use the
  // agent, and for reading cairnd's records).
  std::unique_ptr<Checkpointer> Direct(
      int rank, int world, std::function<void()> before_commit = nullptr) {
    CheckpointerOptions o = Options(rank, world).direct;
    o.before_commit_for_test = std::move(before_commit);
    auto c = Checkpointer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  void StartAgent() {
    agent::AgentServer::Spec spec;
    spec.unix_socket = Socket();
    spec.agent.node_id = 0;
    spec.agent.num_nodes = 1;
    spec.agent.coordinator = absl::StrCat("127.0.0.1:", cairnd_->port());
    spec.agent.staging_budget_bytes = 16 << 20;
    spec.agent.store.durable = false;
    auto s = agent::AgentServer::Start(std::move(spec));
    ASSERT_TRUE(s.ok()) << s.status();
    agent_ = std::move(*s);
  }

  AgentCheckpointerOptions Options(int rank, int world) const {
    AgentCheckpointerOptions o;
    o.agent_socket = Socket();
    o.direct.coordinator = absl::StrCat("127.0.0.1:", cairnd_->port());
    o.direct.job = "job";
    o.direct.rank = rank;
    o.direct.world_size = world;
    o.direct.max_retries = 0;
    o.direct.store.use_odirect = false;
    o.rpc_timeout = absl::Seconds(10);
    o.wait_for_space = absl::Seconds(5);
    return o;
  }

  // "w": fp32 [16] held whole by a single rank, filled from `seed`.
  static absl::Status AddW(StateDict& state, std::vector<char>& buf,
                           char seed) {
    buf.assign(64, 0);
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<char>(seed + i * 3);
    }
    return state.AddChunks(
        "w", planner::DType::kFloat32, {16},
        {TensorChunk{planner::ChunkBox{{0}, {16}}, absl::MakeSpan(buf)}});
  }

  // Rank `rank`'s part of "w": fp32 [4 * world], elements [4r, 4r + 4),
  // filled from `seed`.
  static absl::Status AddShard(StateDict& state, std::vector<char>& buf,
                               int rank, int world, char seed) {
    buf.assign(16, 0);
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<char>(seed + rank * 16 + i);
    }
    return state.AddChunks(
        "w", planner::DType::kFloat32, {4 * world},
        {TensorChunk{planner::ChunkBox{{4 * rank}, {4}}, absl::MakeSpan(buf)}});
  }

  // "big": `bytes` of uint8 held whole by rank 0, filled from `seed`.
  static absl::Status AddBig(StateDict& state, std::vector<char>& buf,
                             int64_t bytes, char seed) {
    buf.assign(static_cast<size_t>(bytes), seed);
    return state.AddChunks(
        "big", planner::DType::kUInt8, {bytes},
        {TensorChunk{planner::ChunkBox{{0}, {bytes}}, absl::MakeSpan(buf)}});
  }

  std::string dir_;
  std::unique_ptr<coordinator::CoordinatorServer> cairnd_;
  std::unique_ptr<agent::AgentServer> agent_;
};

TEST_F(AgentCheckpointerTest, AsyncSaveCommitsAndLoadComesFromAgentMemory) {
  StartAgent();
  auto c = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'a').ok());
  absl::StatusOr<SaveFuture> f = (*c)->AsyncSave(6, state);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->step(), 6);
  EXPECT_EQ((*c)->last_save_stats().bytes, 64u);
  absl::StatusOr<CheckpointInfo> info = f->Wait(absl::Seconds(30));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job, "job");
  EXPECT_EQ(info->step, 6);
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
  EXPECT_EQ(info->world_size, 1);
  EXPECT_EQ(info->bytes, 64u);

  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  absl::StatusOr<int64_t> loaded = (*c)->Load(LoadRef::Latest(), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 6);
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kAgentMemory);
  EXPECT_TRUE((*c)->last_agent_load_error().ok());
  EXPECT_EQ((*c)->last_load_bytes_local(), 64u);
  EXPECT_EQ(got, buf);
}

// FutureOf: another checkpointer of the same job and rank (as in DCP's
// PROCESS executor's child) waits for a save this one staged, and learns a
// failed save's error too.
TEST_F(AgentCheckpointerTest, FutureOfWaitsForASaveAnotherCheckpointerStaged) {
  StartAgent();
  auto stager = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(stager.ok()) << stager.status();
  auto waiter = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'f').ok());
  ASSERT_TRUE((*stager)->AsyncSave(8, state).ok());
  SaveFuture f = (*waiter)->FutureOf(8);
  EXPECT_EQ(f.step(), 8);
  absl::StatusOr<CheckpointInfo> info = f.Wait(absl::Seconds(30));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 8);
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
  EXPECT_EQ(info->bytes, 64u);
  // A step nobody staged is not waited for forever: the agent says so, or
  // the wait ends at its timeout.
  absl::StatusOr<CheckpointInfo> none =
      (*waiter)->FutureOf(9).Wait(absl::Seconds(1));
  EXPECT_THAT(none,
              StatusIs(::testing::AnyOf(absl::StatusCode::kNotFound,
                                        absl::StatusCode::kDeadlineExceeded)));
}

TEST_F(AgentCheckpointerTest, LoadFallsBackToStorageWhenTheAgentIsDown) {
  StartAgent();
  auto c = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'b').ok());
  auto f = (*c)->AsyncSave(8, state);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->Wait(absl::Seconds(30)).ok());
  agent_.reset();  // the agent is gone: its memory tiers with it

  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  absl::StatusOr<int64_t> loaded = (*c)->Load(LoadRef::Step(8), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 8);
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kStorage);
  EXPECT_FALSE((*c)->last_agent_load_error().ok());
  EXPECT_EQ(got, buf);
}

TEST_F(AgentCheckpointerTest, AsyncSaveWithoutAgentNamesRankJobAndStep) {
  auto c = AgentCheckpointer::Connect(Options(1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'c').ok());
  const absl::Status s = (*c)->AsyncSave(3, state).status();
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("rank 1 saving job 'job' step 3 via agent")));
}

TEST_F(AgentCheckpointerTest, UnsaveableStateIsRefusedNamingTheTensor) {
  auto c = AgentCheckpointer::Connect(Options(0, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf(64);
  planner::DTensorLayout partial{{{2}, {0, 1}},
                                 {planner::Placement::Partial()}};
  ASSERT_TRUE(state
                  .AddDTensor("model.pending", planner::DType::kFloat32, {16},
                              partial, 0, absl::MakeSpan(buf))
                  .ok());
  const absl::Status s = (*c)->AsyncSave(3, state).status();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("rank 0 saving job 'job' step 3 via agent"),
                        HasSubstr("'model.pending'"))));
}

TEST_F(AgentCheckpointerTest, ConnectRefusesBadOptions) {
  AgentCheckpointerOptions o = Options(0, 1);
  o.agent_socket.clear();
  EXPECT_THAT(AgentCheckpointer::Connect(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("agent mode needs the agent's socket")));
  o = Options(2, 2);
  EXPECT_THAT(
      AgentCheckpointer::Connect(o).status(),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("job 'job': rank 2 is out of range for world_size 2")));
  o = Options(0, 1);
  o.direct.job = "no spaces";
  EXPECT_THAT(AgentCheckpointer::Connect(o),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// With nothing running, Cancel cancels the next AsyncSave, Wait or Load at
// once (nothing reaches the agent); two Cancels before a call are one, and
// the call after it runs normally. A Wait for a save that already committed
// returns it and leaves the Cancel to the next call.
TEST_F(AgentCheckpointerTest, CancelWithNothingRunningCancelsOnlyTheNextCall) {
  StartAgent();
  auto c = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'c').ok());
  (*c)->Cancel();
  (*c)->Cancel();
  EXPECT_THAT(
      (*c)->AsyncSave(5, state).status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr(absl::StrCat(
                   "rank 0 saving job 'job' step 5 via agent: ", kCancelled))));
  std::unique_ptr<Checkpointer> reader = Direct(0, 1);
  ASSERT_NE(reader, nullptr);
  EXPECT_FALSE(RecordOf(*reader, 5).has_value());

  absl::StatusOr<SaveFuture> f = (*c)->AsyncSave(5, state);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<CheckpointInfo> info = f->Wait(absl::Seconds(60));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
  // A Wait for a save that already committed cancels nothing, so the
  // Cancel stays for the next call.
  (*c)->Cancel();
  info = f->Wait(absl::Seconds(60));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 5);
  EXPECT_THAT(
      (*c)->AsyncSave(6, state).status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr(absl::StrCat(
                   "rank 0 saving job 'job' step 6 via agent: ", kCancelled))));

  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  const std::vector<char> blank = got;
  (*c)->Cancel();
  EXPECT_THAT((*c)->Load(LoadRef::Latest(), back).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 loading job 'job' latest: ", kCancelled))));
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kNone);
  EXPECT_EQ(got, blank);
  absl::StatusOr<int64_t> loaded = (*c)->Load(LoadRef::Latest(), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 5);
  EXPECT_EQ(got, buf);
}

// Rank 0 saves through the agent, ranks 1 and 2 directly; rank 2 is held
// before its CommitSave, so the save cannot commit. Cancel on rank 0 while
// it waits for its future: the agent aborts the save at cairnd, so rank 1
// fails ABORTED naming rank 0 and the reason while rank 2 is still held
// (nothing else could end its save), rank 0's Wait returns CANCELLED, the
// step is listed ABORTED and the previous checkpoint stays the latest. The
// next step commits with the same AgentCheckpointer.
TEST_F(AgentCheckpointerTest, CancelDuringWaitAbortsTheSaveForEveryRank) {
  RestartCairnd([](coordinator::CoordinatorOptions& o) {
    o.begin_deadline = absl::Minutes(10);
    o.commit_deadline = absl::Minutes(10);
  });
  StartAgent();
  auto c0 = AgentCheckpointer::Connect(Options(0, 3));
  ASSERT_TRUE(c0.ok()) << c0.status();
  std::vector<std::unique_ptr<Checkpointer>> direct(3);
  absl::Notification rank2_at_commit, release_rank2;
  bool hold_rank2 = false;
  direct[1] = Direct(1, 3);
  direct[2] = Direct(2, 3, [&] {
    if (!hold_rank2) return;
    rank2_at_commit.Notify();
    release_rank2.WaitForNotification();
  });
  ASSERT_NE(direct[1], nullptr);
  ASSERT_NE(direct[2], nullptr);
  std::vector<StateDict> states(3);
  std::vector<std::vector<char>> bufs(3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(AddShard(states[r], bufs[r], r, 3, 'a').ok());
  }
  // Step 1 by every rank; then step 2 with rank 2 held.
  for (int64_t step : {1, 2}) {
    hold_rank2 = step == 2;
    std::vector<absl::StatusOr<CheckpointInfo>> results(
        3, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 1; r < 3; ++r) {
      threads.emplace_back(
          [&, r] { results[r] = direct[r]->Save(step, states[r]); });
    }
    absl::StatusOr<SaveFuture> f = (*c0)->AsyncSave(step, states[0]);
    ASSERT_TRUE(f.ok()) << f.status();
    if (step == 1) {
      results[0] = f->Wait(absl::Seconds(60));
      for (auto& t : threads) t.join();
      for (int r = 0; r < 3; ++r) {
        ASSERT_TRUE(results[r].ok())
            << "rank " << r << ": " << results[r].status();
      }
      continue;
    }
    // Rank 2 has its plan: every rank, rank 0's agent too, joined the save.
    rank2_at_commit.WaitForNotification();
    std::thread waiter([&] { results[0] = f->Wait(absl::Seconds(120)); });
    (*c0)->Cancel();
    threads[0].join();  // rank 1: only an abort can end its save now
    EXPECT_THAT(
        results[1].status(),
        StatusIs(absl::StatusCode::kAborted,
                 HasSubstr(absl::StrCat("aborted by rank 0: ", kCancelled))));
    waiter.join();
    EXPECT_THAT(results[0].status(),
                StatusIs(absl::StatusCode::kCancelled,
                         HasSubstr(absl::StrCat(
                             "rank 0 saving job 'job' step 2 via agent: ",
                             kCancelled))));
    release_rank2.Notify();
    threads[1].join();
    EXPECT_THAT(
        results[2].status(),
        StatusIs(absl::StatusCode::kAborted,
                 HasSubstr(absl::StrCat("aborted by rank 0: ", kCancelled))));
  }
  std::optional<CheckpointInfo> rec = RecordOf(*direct[1], 2);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, CheckpointState::kAborted);
  absl::StatusOr<int64_t> latest = direct[1]->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);

  // The previous checkpoint loads (rank 0's part from the agent's memory).
  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddShard(back, got, 0, 3, 'z').ok());
  absl::StatusOr<int64_t> loaded = (*c0)->Load(LoadRef::Step(1), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(got, bufs[0]);

  // Step 3 commits, rank 0 through the same AgentCheckpointer.
  hold_rank2 = false;
  std::vector<absl::StatusOr<CheckpointInfo>> results(
      3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = direct[r]->Save(3, states[r]); });
  }
  absl::StatusOr<SaveFuture> f = (*c0)->AsyncSave(3, states[0]);
  ASSERT_TRUE(f.ok()) << f.status();
  results[0] = f->Wait(absl::Seconds(60));
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->state, CheckpointState::kCommitted);
  }
}

// AsyncSave waits for staging space, which rank 0's step 1 (a persist
// waiting for rank 1, who never comes) holds: Cancel from another thread
// ends the wait with CANCELLED, and the agent reserves nothing for it.
// Cancelling step 1 as well frees its space: a save of another job that
// needs it stages and commits.
TEST_F(AgentCheckpointerTest, CancelEndsAWaitForStagingSpaceAndFreesIt) {
  RestartCairnd([](coordinator::CoordinatorOptions& o) {
    o.begin_deadline = absl::Minutes(10);
  });
  StartAgent();  // a budget of 16 MiB
  constexpr int64_t kBig = 12 << 20;
  AgentCheckpointerOptions o = Options(0, 2);
  // Only the cancel can end the wait before this (then RESOURCE_EXHAUSTED).
  o.wait_for_space = absl::Seconds(60);
  auto c = AgentCheckpointer::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddBig(state, buf, kBig, 'b').ok());
  absl::StatusOr<SaveFuture> f1 = (*c)->AsyncSave(1, state);
  ASSERT_TRUE(f1.ok()) << f1.status();

  absl::StatusOr<SaveFuture> f2 = absl::UnknownError("not run");
  std::thread saver([&] { f2 = (*c)->AsyncSave(2, state); });
  absl::SleepFor(absl::Milliseconds(200));  // likely waiting by now
  (*c)->Cancel();
  saver.join();
  EXPECT_THAT(
      f2.status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr(absl::StrCat(
                   "rank 0 saving job 'job' step 2 via agent: ", kCancelled))));

  (*c)->Cancel();
  EXPECT_THAT(
      f1->Wait(absl::Seconds(60)).status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr(absl::StrCat(
                   "rank 0 saving job 'job' step 1 via agent: ", kCancelled))));

  AgentCheckpointerOptions other = Options(0, 1);
  other.direct.job = "other";
  auto solo = AgentCheckpointer::Connect(other);
  ASSERT_TRUE(solo.ok()) << solo.status();
  absl::StatusOr<SaveFuture> f3 = (*solo)->AsyncSave(1, state);
  ASSERT_TRUE(f3.ok()) << f3.status();
  absl::StatusOr<CheckpointInfo> info = f3->Wait(absl::Seconds(60));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
}

// A save larger than the agent's budget streams; rank 1 never comes, so
// AsyncSave waits in StageBucket for cairnd's plan while the agent waits in
// BeginSave. Cancel from another thread: AsyncSave returns CANCELLED and the
// agent aborts the save at cairnd (listed ABORTED, the reason naming rank 0).
// The next step streams and commits.
TEST_F(AgentCheckpointerTest, CancelStopsAStreamingSaveAndAbortsItAtCairnd) {
  RestartCairnd([](coordinator::CoordinatorOptions& o) {
    o.begin_deadline = absl::Minutes(10);
  });
  StartAgent();  // a budget of 16 MiB
  auto c = AgentCheckpointer::Connect(Options(0, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddBig(state, buf, 24 << 20, 's').ok());
  absl::StatusOr<SaveFuture> f = absl::UnknownError("not run");
  absl::Notification returned;
  std::thread saver([&] {
    f = (*c)->AsyncSave(1, state);
    returned.Notify();
  });
  // Rank 0's agent has joined the save at cairnd (and waits for rank 1).
  ASSERT_TRUE(WaitUntil(
      [&] { return cairnd_->coordinator().stats().saves_in_progress == 1; }));
  EXPECT_FALSE(returned.HasBeenNotified());
  (*c)->Cancel();
  saver.join();
  EXPECT_THAT(
      f.status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr(absl::StrCat(
                   "rank 0 saving job 'job' step 1 via agent: ", kCancelled))));
  std::unique_ptr<Checkpointer> reader = Direct(1, 2);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(WaitUntil([&] {
    std::optional<CheckpointInfo> rec = RecordOf(*reader, 1);
    return rec.has_value() && rec->state == CheckpointState::kAborted;
  }));
  EXPECT_THAT(RecordOf(*reader, 1)->abort_reason,
              HasSubstr(absl::StrCat("aborted by rank 0: ")));
  EXPECT_THAT(RecordOf(*reader, 1)->abort_reason, HasSubstr(kCancelled));

  // Rank 1 holds a tensor of its own, "w" whole.
  StateDict small;
  std::vector<char> small_buf;
  ASSERT_TRUE(AddShard(small, small_buf, 0, 1, 'r').ok());
  absl::StatusOr<CheckpointInfo> rank1 = absl::UnknownError("not run");
  std::thread other([&] { rank1 = reader->Save(2, small); });
  absl::StatusOr<SaveFuture> next = (*c)->AsyncSave(2, state);
  absl::StatusOr<CheckpointInfo> info =
      next.ok() ? next->Wait(absl::Seconds(60)) : next.status();
  other.join();
  EXPECT_GT((*c)->last_save_stats().streamed_buckets, 0);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(info->state, CheckpointState::kCommitted);
}

// cairnd is down: the agent cannot resolve the load, so Load falls back to
// storage, whose calls to cairnd retry with backoff (for about a minute).
// Cancel from another thread ends the load with CANCELLED wherever it is,
// the buffers untouched; once cairnd is back the next load succeeds.
TEST_F(AgentCheckpointerTest, CancelEndsALoadRetryingWhileCairndIsDown) {
  StartAgent();
  auto saver = AgentCheckpointer::Connect(Options(0, 1));
  ASSERT_TRUE(saver.ok()) << saver.status();
  StateDict state;
  std::vector<char> buf;
  ASSERT_TRUE(AddW(state, buf, 'l').ok());
  auto f = (*saver)->AsyncSave(6, state);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->Wait(absl::Seconds(60)).ok());

  AgentCheckpointerOptions o = Options(0, 1);
  o.direct.max_retries = 16;  // without the cancel: UNAVAILABLE after them
  auto c = AgentCheckpointer::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const int port = cairnd_->port();
  cairnd_.reset();
  StateDict back;
  std::vector<char> got;
  ASSERT_TRUE(AddW(back, got, 'z').ok());
  const std::vector<char> blank = got;
  absl::StatusOr<int64_t> loaded = absl::UnknownError("not run");
  std::thread loader([&] { loaded = (*c)->Load(LoadRef::Latest(), back); });
  absl::SleepFor(absl::Milliseconds(300));  // likely retrying by now
  (*c)->Cancel();
  loader.join();
  EXPECT_THAT(loaded.status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr(absl::StrCat(
                           "rank 0 loading job 'job' latest: ", kCancelled))));
  EXPECT_EQ((*c)->last_load_source(), LoadSource::kNone);
  EXPECT_EQ(got, blank);

  RestartCairnd([](coordinator::CoordinatorOptions&) {}, port);
  loaded = (*c)->Load(LoadRef::Step(6), back);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 6);
  EXPECT_EQ(got, buf);
}

}  // namespace
}  // namespace cairn::client
