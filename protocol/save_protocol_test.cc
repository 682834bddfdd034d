// The save protocol against a real cairnd (the Coordinator library behind its
// gRPC service, in-process, on loopback port 0, posix storage in a temp
// dir): fingerprints, writes, commit, the before-commit hook, the errors
// of a failed save (naming job, step, rank, item and object; ABORTED with the
// first reason when another rank aborted first), and cancellation.
#include "protocol/save_protocol.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "server/coordinator/coordinator_server.h"
#include "storage/checksum.h"

namespace cairn::protocol {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

class SaveProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    std::filesystem::create_directories(dir_ + "/checkpoints");
    spec_.listen_address = "127.0.0.1:0";
    spec_.coordinator.storage_uri =
        absl::StrCat("file://", dir_, "/checkpoints");
    spec_.coordinator.catalog_path = dir_ + "/catalog";
    StartServer();
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

  std::unique_ptr<SaveProtocol> Protocol(int rank, int world,
                                         Cancellation* cancel = nullptr) {
    SaveProtocolOptions o;
    o.job = "job";
    o.rank = rank;
    o.world_size = world;
    o.max_retries = 0;
    o.cancellation = cancel;
    return std::make_unique<SaveProtocol>(stub_.get(), o);
  }

  // cairnd's record of `step`.
  v1::CheckpointRecord Record(int64_t step) {
    v1::GetCheckpointRequest get;
    get.set_job("job");
    get.set_step(step);
    v1::GetCheckpointResponse got;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetCheckpoint(&ctx, get, &got);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return got.checkpoint();
  }

  // Both ranks of a 2-rank save of `step` past BeginSave.
  std::vector<std::unique_ptr<PlannedSave>> BeginBoth(
      std::vector<std::unique_ptr<SaveProtocol>>& p, int64_t step) {
    std::vector<std::unique_ptr<PlannedSave>> saves(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto s = p[r]->Begin(step, Local(r, 2));
        EXPECT_TRUE(s.ok()) << s.status();
        if (s.ok()) saves[r] = std::move(*s);
      });
    }
    for (auto& t : ranks) t.join();
    return saves;
  }

  // Rank `rank`'s plan: one fp32 chunk of "w" [8] (rows split by rank) and,
  // on rank 0, a bytes entry "rng".
  static planner::LocalSavePlan Local(int rank, int world) {
    planner::LocalSavePlan local;
    local.rank = rank;
    planner::WriteItem w;
    w.fqn = "w";
    w.dtype = planner::DType::kFloat32;
    w.global_shape = {8};
    w.box = {{rank * 8 / world}, {8 / world}};
    w.length = static_cast<uint64_t>(8 / world) * 4;
    local.items.push_back(w);
    if (rank == 0) {
      planner::WriteItem b;
      b.kind = planner::WriteItem::Kind::kBytes;
      b.fqn = "rng";
      b.dtype = planner::DType::kUInt8;  // as StateDict::ToLocalPlan makes it
      b.length = 5;
      local.items.push_back(b);
    }
    return local;
  }

  std::string dir_;
  coordinator::CoordinatorServer::Spec spec_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(SaveProtocolTest, SavesAndSendsOnlyTheFingerprintWhenThePlanIsSame) {
  std::unique_ptr<SaveProtocol> p = Protocol(0, 1);
  const planner::LocalSavePlan local = Local(0, 1);
  std::string w(32, 'w'), rng = "seed!";
  ItemSources sources;
  sources.AddChunk("w", local.items[0].box, w);
  sources.AddBytes("rng", rng);
  ThreadPool pool(2);
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    auto save = p->Begin(step, local);
    ASSERT_TRUE(save.ok()) << save.status();
    EXPECT_EQ((*save)->sent_fingerprint_only(), step > 1);
    // From the second save on cairnd does not send the rank plan again: the
    // one this process holds is used, in the new attempt's directory (the
    // commit below checks every location against cairnd's plan).
    EXPECT_EQ((*save)->plan().rank_plan_unchanged(), step > 1);
    EXPECT_FALSE((*save)->plan().plan_id().empty());
    for (const PlannedObject& o : (*save)->objects()) {
      EXPECT_TRUE(
          absl::StartsWith(o.key, absl::StrCat((*save)->plan().step_prefix(),
                                               (*save)->plan().attempt(), "/")))
          << o.key;
    }
    EXPECT_EQ((*save)->where(),
              absl::StrCat("rank 0 saving job 'job' step ", step));
    EXPECT_EQ((*save)->planned_bytes(), 32u + 5);
    ASSERT_TRUE((*save)->WriteAll(sources, pool).ok());
    bool hook_ran = false;
    (*save)->SetBeforeCommitForTest([&] { hook_ran = true; });
    absl::StatusOr<v1::CheckpointRecord> record = (*save)->Commit();
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_TRUE(hook_ran);
    EXPECT_EQ(record->state(), v1::CHECKPOINT_STATE_COMMITTED);
    EXPECT_EQ(record->step(), step);
    EXPECT_EQ(record->total_bytes(), 32u + 5);
  }
  EXPECT_EQ(server_->coordinator().stats().commits, 3);

  // A restarted cairnd (same address) no longer holds the plan: it asks
  // for it, and the same Begin sends it.
  const int port = server_->port();
  server_.reset();
  spec_.listen_address = absl::StrCat("127.0.0.1:", port);
  auto restarted = coordinator::CoordinatorServer::Start(spec_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);
  auto save = p->Begin(4, local);
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_FALSE((*save)->sent_fingerprint_only());
  // The rebuilt plan is the same plan (same id): still not sent again.
  EXPECT_TRUE((*save)->plan().rank_plan_unchanged());
  ASSERT_TRUE((*save)->WriteAll(sources, pool).ok());
  ASSERT_TRUE((*save)->Commit().ok());
  EXPECT_EQ(server_->coordinator().stats().plans_built, 1);
  // And from then on the fingerprint again.
  save = p->Begin(5, local);
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_TRUE((*save)->sent_fingerprint_only());
  ASSERT_TRUE((*save)->WriteAll(sources, pool).ok());
  ASSERT_TRUE((*save)->Commit().ok());

  // A changed local plan is a new global plan: sent whole, then held.
  planner::LocalSavePlan grown = local;
  planner::WriteItem extra = grown.items[1];
  extra.fqn = "extra";
  extra.length = 3;
  grown.items.push_back(extra);
  std::string extra_bytes = "abc";
  sources.AddBytes("extra", extra_bytes);
  for (int64_t step = 6; step <= 7; ++step) {
    SCOPED_TRACE(step);
    save = p->Begin(step, grown);
    ASSERT_TRUE(save.ok()) << save.status();
    EXPECT_EQ((*save)->plan().rank_plan_unchanged(), step == 7);
    EXPECT_EQ((*save)->planned_bytes(), 32u + 5 + 3);
    ASSERT_TRUE((*save)->WriteAll(sources, pool).ok());
    absl::StatusOr<v1::CheckpointRecord> record = (*save)->Commit();
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->total_bytes(), 32u + 5 + 3);
  }
}

TEST_F(SaveProtocolTest, CommittedItemsCarryTheCrcOfTheirBytes) {
  std::unique_ptr<SaveProtocol> p = Protocol(0, 1);
  const planner::LocalSavePlan local = Local(0, 1);
  std::string w(32, '\0'), rng = "seed!";
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>(i * 13);
  ItemSources sources;
  sources.AddChunk("w", local.items[0].box, w);
  sources.AddBytes("rng", rng);
  ThreadPool pool(2);
  auto save = p->Begin(9, local);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WriteAll(sources, pool).ok());
  ASSERT_TRUE((*save)->Commit().ok());
  v1::GetCheckpointRequest get;
  get.set_job("job");
  get.set_step(9);
  v1::GetCheckpointResponse got;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetCheckpoint(&ctx, get, &got).ok());
  ASSERT_EQ(got.manifest().tensors_size(), 1);
  ASSERT_EQ(got.manifest().tensors(0).chunks_size(), 1);
  EXPECT_EQ(got.manifest().tensors(0).chunks(0).crc32c(), storage::Crc32c(w));
  ASSERT_EQ(got.manifest().bytes_entries_size(), 1);
  EXPECT_EQ(got.manifest().bytes_entries(0).crc32c(), storage::Crc32c(rng));
  // The bytes are where the manifest says, padding included.
  const v1::StorageLocation& loc = got.manifest().bytes_entries(0).location();
  auto store = p->StoreFor(got.checkpoint().storage_uri());
  ASSERT_TRUE(store.ok()) << store.status();
  std::string back(loc.length(), '\0');
  ASSERT_TRUE((*store)
                  ->Read((*save)->plan().step_prefix() + loc.object_key(),
                         {loc.offset(), loc.length()}, absl::MakeSpan(back))
                  .ok());
  EXPECT_EQ(back, rng);
}

TEST_F(SaveProtocolTest, MissingSourceAbortsNamingJobStepRankAndItem) {
  std::unique_ptr<SaveProtocol> p = Protocol(0, 1);
  const planner::LocalSavePlan local = Local(0, 1);
  std::string w(32, 'w');
  ItemSources sources;
  sources.AddChunk("w", local.items[0].box, w);  // "rng" is missing
  ThreadPool pool(2);
  auto save = p->Begin(3, local);
  ASSERT_TRUE(save.ok()) << save.status();
  const absl::Status written = (*save)->WriteAll(sources, pool);
  EXPECT_THAT(
      written,
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          HasSubstr("cairnd planned bytes entry 'rng' (5 bytes) for this rank, "
                    "which does not hold it with that length")));
  const absl::Status reported = (*save)->Abort(written);
  EXPECT_THAT(
      reported,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr(
                   "rank 0 saving job 'job' step 3: cairnd planned bytes entry "
                   "'rng'")));
  EXPECT_EQ(server_->coordinator().stats().aborts, 1);
  // The save is gone: committing now is refused.
  EXPECT_FALSE((*save)->Commit().ok());
}

TEST_F(SaveProtocolTest, AbortAfterAnotherRankAbortedReportsTheFirstReason) {
  std::vector<std::unique_ptr<SaveProtocol>> p;
  for (int r = 0; r < 2; ++r) p.push_back(Protocol(r, 2));
  std::vector<std::unique_ptr<PlannedSave>> saves(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto s = p[r]->Begin(7, Local(r, 2));
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) saves[r] = std::move(*s);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_NE(saves[0], nullptr);
  ASSERT_NE(saves[1], nullptr);
  // Rank 0 fails first: its own failure comes back (with where it was).
  EXPECT_THAT(
      saves[0]->Abort(absl::ResourceExhaustedError("no space left on device")),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr(
                   "rank 0 saving job 'job' step 7: no space left on device")));
  // Rank 1 then runs into the cleanup: ABORTED with rank 0's reason first.
  const absl::Status s =
      saves[1]->Abort(absl::NotFoundError("temp file vanished"));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kAborted,
                  HasSubstr("rank 1 saving job 'job' step 7: save of job 'job' "
                            "step 7 aborted by rank 0: no space left on device "
                            "(this rank then failed: temp file vanished)")));
}

// Rank 0 of 2 waits in BeginSave for rank 1: Cancel from another thread ends
// the call (not retried, though retries are allowed) and aborts the save at
// cairnd with the reason.
TEST_F(SaveProtocolTest, CancelEndsBeginSaveAndAbortsTheSave) {
  Cancellation cancel("cancelled (test)");
  SaveProtocolOptions o;
  o.job = "job";
  o.rank = 0;
  o.world_size = 2;
  o.max_retries = 16;
  o.cancellation = &cancel;
  SaveProtocol p(stub_.get(), o);
  absl::StatusOr<std::unique_ptr<PlannedSave>> begun =
      absl::UnknownError("not run");
  std::thread rank0([&] { begun = p.Begin(4, Local(0, 2)); });
  while (server_->coordinator().stats().saves_in_progress == 0) {
    absl::SleepFor(absl::Milliseconds(1));  // until rank 0 waits at cairnd
  }
  cancel.Cancel();
  rank0.join();  // cairnd's begin deadline (1 min) would end it otherwise
  EXPECT_THAT(
      begun.status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 saving job 'job' step 4: cancelled (test)")));
  const v1::CheckpointRecord rec = Record(4);
  EXPECT_EQ(rec.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(rec.abort_reason(), HasSubstr("save of job 'job' step 4 aborted "
                                            "by rank 0: cancelled (test)"));
  EXPECT_EQ(server_->coordinator().stats().saves_in_progress, 0);
  // The protocol never resets the cancellation: the next Begin is refused
  // before any call until its owner does.
  EXPECT_THAT(
      p.Begin(5, Local(0, 2)).status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 saving job 'job' step 5: cancelled (test)")));
  EXPECT_EQ(server_->coordinator().stats().saves_in_progress, 0);
}

// Cancelled before WriteAll: no object is written, and Commit (cancelled too)
// aborts the save for every rank: the other rank's Commit fails ABORTED
// naming rank 0 and the reason.
TEST_F(SaveProtocolTest, CancelledSaveWritesNothingAndCommitAbortsIt) {
  Cancellation cancel("cancelled (test)");
  std::vector<std::unique_ptr<SaveProtocol>> p;
  p.push_back(Protocol(0, 2, &cancel));
  p.push_back(Protocol(1, 2));
  std::vector<std::unique_ptr<PlannedSave>> saves = BeginBoth(p, 6);
  ASSERT_NE(saves[0], nullptr);
  ASSERT_NE(saves[1], nullptr);
  std::string w0(16, 'a'), w1(16, 'b'), rng = "seed!";
  ItemSources s0, s1;
  s0.AddChunk("w", Local(0, 2).items[0].box, w0);
  s0.AddBytes("rng", rng);
  s1.AddChunk("w", Local(1, 2).items[0].box, w1);
  ThreadPool pool(2);
  ASSERT_TRUE(saves[1]->WriteAll(s1, pool).ok());
  cancel.Cancel();
  EXPECT_THAT(
      saves[0]->WriteAll(s0, pool),
      StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled (test)")));
  for (const PlannedObject& o : saves[0]->objects()) {
    EXPECT_THAT(saves[0]->store().Size(o.key),
                StatusIs(absl::StatusCode::kNotFound))
        << o.key;
  }
  EXPECT_THAT(
      saves[0]->Commit().status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 saving job 'job' step 6: cancelled (test)")));
  EXPECT_THAT(
      saves[1]->Commit().status(),
      StatusIs(
          absl::StatusCode::kAborted,
          HasSubstr(
              "save of job 'job' step 6 aborted by rank 0: cancelled (test)")));
  EXPECT_EQ(Record(6).state(), v1::CHECKPOINT_STATE_ABORTED);
}

// Rank 0 waits in CommitSave for rank 1: Cancel from another thread ends it
// with CANCELLED and aborts the save; rank 1's commit then fails ABORTED.
TEST_F(SaveProtocolTest, CancelEndsCommitSaveWaitingForTheOtherRank) {
  Cancellation cancel("cancelled (test)");
  std::vector<std::unique_ptr<SaveProtocol>> p;
  p.push_back(Protocol(0, 2, &cancel));
  p.push_back(Protocol(1, 2));
  std::vector<std::unique_ptr<PlannedSave>> saves = BeginBoth(p, 8);
  ASSERT_NE(saves[0], nullptr);
  ASSERT_NE(saves[1], nullptr);
  std::string w0(16, 'a'), w1(16, 'b'), rng = "seed!";
  ItemSources s0, s1;
  s0.AddChunk("w", Local(0, 2).items[0].box, w0);
  s0.AddBytes("rng", rng);
  s1.AddChunk("w", Local(1, 2).items[0].box, w1);
  ThreadPool pool(2);
  ASSERT_TRUE(saves[0]->WriteAll(s0, pool).ok());
  ASSERT_TRUE(saves[1]->WriteAll(s1, pool).ok());
  absl::StatusOr<v1::CheckpointRecord> committed =
      absl::UnknownError("not run");
  absl::Notification committing;
  saves[0]->SetBeforeCommitForTest([&] { committing.Notify(); });
  std::thread rank0([&] { committed = saves[0]->Commit(); });
  committing.WaitForNotification();
  cancel.Cancel();  // rank 0 is in CommitSave, or about to call it
  rank0.join();     // cairnd's commit deadline is an hour away
  EXPECT_THAT(
      committed.status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("rank 0 saving job 'job' step 8: cancelled (test)")));
  EXPECT_THAT(
      saves[1]->Commit().status(),
      StatusIs(
          absl::StatusCode::kAborted,
          HasSubstr(
              "save of job 'job' step 8 aborted by rank 0: cancelled (test)")));
  EXPECT_EQ(Record(8).state(), v1::CHECKPOINT_STATE_ABORTED);
}

// Cancel once every rank has committed: cairnd no longer aborts the save,
// and Commit returns the committed record (never CANCELLED for a committed
// checkpoint), which stays committed.
TEST_F(SaveProtocolTest, CancelAfterEveryRankCommittedReturnsTheCommit) {
  Cancellation cancel("cancelled (test)");
  std::vector<std::unique_ptr<SaveProtocol>> p;
  p.push_back(Protocol(0, 2, &cancel));
  p.push_back(Protocol(1, 2));
  std::vector<std::unique_ptr<PlannedSave>> saves = BeginBoth(p, 9);
  ASSERT_NE(saves[0], nullptr);
  ASSERT_NE(saves[1], nullptr);
  std::string w0(16, 'a'), w1(16, 'b'), rng = "seed!";
  ItemSources s0, s1;
  s0.AddChunk("w", Local(0, 2).items[0].box, w0);
  s0.AddBytes("rng", rng);
  s1.AddChunk("w", Local(1, 2).items[0].box, w1);
  ThreadPool pool(2);
  ASSERT_TRUE(saves[0]->WriteAll(s0, pool).ok());
  ASSERT_TRUE(saves[1]->WriteAll(s1, pool).ok());
  absl::StatusOr<v1::CheckpointRecord> rank1 = absl::UnknownError("not run");
  std::thread t([&] { rank1 = saves[1]->Commit(); });
  absl::StatusOr<v1::CheckpointRecord> rank0 = saves[0]->Commit();
  t.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // The commit answered; a Cancel now (rank 0 asks again, as a call whose
  // answer was cancelled would) gets the committed record.
  cancel.Cancel();
  absl::StatusOr<v1::CheckpointRecord> again = saves[0]->Commit();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(again->step(), 9);
  EXPECT_EQ(Record(9).state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(server_->coordinator().stats().aborts, 0);
}

TEST_F(SaveProtocolTest, BadStepIsInvalidBeforeAnyCall) {
  std::unique_ptr<SaveProtocol> p = Protocol(0, 1);
  EXPECT_THAT(p->Begin(-1, Local(0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(server_->coordinator().stats().plans_built, 0);
}

TEST(IncarnationTest, NonzeroAndDistinct) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t id = NewIncarnation();
    EXPECT_NE(id, 0u);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace cairn::protocol
