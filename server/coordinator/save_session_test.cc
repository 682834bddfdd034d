// The save-session state machine alone (save_session.h): arrivals, planning,
// reports, deadlines and aborts, with explicit times and no storage, threads
// or gRPC.
#include "server/coordinator/save_session.h"

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/save_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/coordinator_test_fixture.h"
#include "storage/manifest.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Phase = SaveSession::Phase;
using BeginResult = absl::StatusOr<v1::BeginSaveResponse>;
using CommitResult = absl::StatusOr<v1::CommitSaveResponse>;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

std::shared_ptr<const planner::PackedLocalPlan> Plan(
    const v1::LocalSavePlan& local) {
  static planner::EntryInterner* interner = new planner::EntryInterner;
  return std::make_shared<const planner::PackedLocalPlan>(
      interner->Pack(convert::LocalPlanFromProto(local).value()).value());
}

class SaveSessionTest : public ::testing::Test {
 protected:
  void Open(int world) {
    session_ = std::make_unique<SaveSession>("job", 7, world, "attempt-1",
                                             "mem://x", kT0, absl::Minutes(1));
  }
  // Rank `rank` arrives with its RankPlan (or `fingerprint` for it).
  SaveSession::Arrival Arrive(int rank, std::string fingerprint = "",
                              uint64_t incarnation = 0,
                              int64_t max_items = 1000,
                              SaveSession::CallerGone gone = nullptr,
                              absl::Time now = kT0) {
    auto plan = Plan(make_plan_(rank, session_->world_size()));
    if (fingerprint.empty()) {
      fingerprint = planner::FingerprintLocalPlan(plan->Unpack());
    }
    SaveSession::Done<v1::BeginSaveResponse> done =
        [this, rank](BeginResult r) { begun_.emplace_back(rank, r); };
    return session_->Arrive(rank, plan, fingerprint, held_plan_ids_[rank],
                            incarnation, max_items, now, done, std::move(gone),
                            &answer_);
  }
  // Every rank arrives, the plan is built and given to the session; returns
  // the parked calls answered.
  void ArriveAllAndPlan(int world, uint64_t incarnation = 0,
                        std::string plan_id = "plan-id") {
    Open(world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(Arrive(r, "", incarnation),
                r + 1 < world ? SaveSession::Arrival::kParked
                              : SaveSession::Arrival::kAllArrived);
    }
    std::vector<const planner::PackedLocalPlan*> locals;
    for (const auto& p : session_->plans()) locals.push_back(p.get());
    auto plan = planner::BuildGlobalSavePlan("job", 7, locals, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (auto& [r, done] : session_->Planned(
             std::make_shared<const planner::GlobalSavePlan>(*plan), plan_id, 3,
             false, kT0 + absl::Seconds(5), absl::Hours(1))) {
      done(session_->RankResponse(r));
    }
  }
  // What rank `rank` reports after writing its plan (crc `crc` each).
  std::vector<v1::WriteResult> Results(int rank, uint32_t crc = 1) {
    std::vector<v1::WriteResult> results;
    const absl::StatusOr<v1::BeginSaveResponse> plan =
        session_->RankResponse(rank);
    EXPECT_TRUE(plan.ok()) << plan.status();
    for (const v1::PlannedWrite& w : plan->rank_plan().writes()) {
      v1::WriteResult r;
      *r.mutable_location() = w.location();
      r.set_crc32c(crc);
      results.push_back(r);
    }
    return results;
  }
  SaveSession::Report Commit(int rank, uint32_t crc = 1) {
    SaveSession::Done<v1::CommitSaveResponse> done =
        [this, rank](CommitResult r) { committed_.emplace_back(rank, r); };
    std::vector<uint32_t> crc32cs;
    for (const v1::WriteResult& r : Results(rank, crc)) {
      crc32cs.push_back(r.crc32c());
    }
    return session_->Commit(rank, std::move(crc32cs), done, &commit_answer_);
  }

  // Rank `rank`'s local plan in a save by `world` ranks.
  std::function<v1::LocalSavePlan(int rank, int world)> make_plan_ =
      [](int rank, int world) { return RankPlan(rank, world); };
  std::unique_ptr<SaveSession> session_;
  BeginResult answer_;
  absl::Status commit_answer_;
  std::vector<std::pair<int, BeginResult>> begun_;
  std::vector<std::pair<int, CommitResult>> committed_;
  // BeginSaveRequest.held_plan_id by rank (Arrive).
  std::map<int, std::string> held_plan_ids_;
};

TEST_F(SaveSessionTest, GathersArrivalsThenLaysThemOutByRank) {
  Open(3);
  EXPECT_EQ(Arrive(2, "", 22), SaveSession::Arrival::kParked);
  EXPECT_EQ(Arrive(0, "", 20), SaveSession::Arrival::kParked);
  EXPECT_EQ(session_->phase(), Phase::kGathering);
  EXPECT_THAT(session_->ArrivedRanks(), ElementsAre(0, 2));
  EXPECT_THAT(session_->MissingRanks(), ElementsAre(1));
  EXPECT_TRUE(session_->Rank(2).in_save);
  EXPECT_EQ(session_->Rank(2).incarnation, 22u);
  EXPECT_FALSE(session_->Rank(1).in_save);
  EXPECT_TRUE(session_->plans().empty());  // nothing sized by world_size yet
  EXPECT_EQ(Arrive(1, "", 21), SaveSession::Arrival::kAllArrived);
  EXPECT_EQ(session_->phase(), Phase::kPlanning);
  ASSERT_EQ(session_->plans().size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(session_->fingerprints()[r],
              planner::FingerprintLocalPlan(Plan(RankPlan(r, 3))->Unpack()));
    EXPECT_EQ(session_->Rank(r).incarnation, static_cast<uint64_t>(20 + r));
  }
  EXPECT_TRUE(begun_.empty());  // all parked until the plan is built
}

TEST_F(SaveSessionTest, RetryIsParkedAndAnotherPlanForTheRankIsRefused) {
  Open(2);
  EXPECT_EQ(Arrive(0), SaveSession::Arrival::kParked);
  EXPECT_EQ(Arrive(0), SaveSession::Arrival::kParked);  // a retry
  EXPECT_EQ(Arrive(0, "another-fingerprint"), SaveSession::Arrival::kAnswered);
  EXPECT_THAT(
      answer_,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 0 of job 'job' step 7 called BeginSave twice "
                         "with different plans")));
  EXPECT_EQ(session_->arrived(), 1);
}

TEST_F(SaveSessionTest, PlanItemsOfTheWholeSaveAreBounded) {
  Open(2);
  EXPECT_EQ(Arrive(0, "", 0, /*max_items=*/5), SaveSession::Arrival::kParked);
  EXPECT_EQ(Arrive(1, "", 0, /*max_items=*/5), SaveSession::Arrival::kAnswered);
  EXPECT_THAT(
      answer_,
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("rank 1 of job 'job' step 7: its 3 plan items would "
                         "bring the save to 6 items; at most 5")));
  EXPECT_THAT(session_->ArrivedRanks(), ElementsAre(0));
}

TEST_F(SaveSessionTest, PlannedAnswersEveryParkedCallInTheAttemptDirectory) {
  ArriveAllAndPlan(2);
  ASSERT_EQ(begun_.size(), 2u);
  EXPECT_EQ(session_->phase(), Phase::kWriting);
  EXPECT_EQ(session_->deadline(), kT0 + absl::Seconds(5) + absl::Hours(1));
  for (const auto& [rank, r] : begun_) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->plan_version(), 3u);
    EXPECT_EQ(r->storage_uri(), "mem://x");
    EXPECT_EQ(r->step_prefix(), session_->step_prefix());
    EXPECT_EQ(r->plan_fingerprint(), session_->fingerprints()[rank]);
    ASSERT_GT(r->rank_plan().writes_size(), 0);
    for (const auto& w : r->rank_plan().writes()) {
      EXPECT_TRUE(absl::StartsWith(w.location().object_key(), "attempt-1/"))
          << w.location().object_key();
    }
  }
  // A retry after the plan was built is answered at once, the same way.
  EXPECT_EQ(Arrive(1), SaveSession::Arrival::kAnswered);
  ASSERT_TRUE(answer_.ok());
  const auto& first = begun_[0].first == 1 ? begun_[0] : begun_[1];
  EXPECT_EQ(answer_->SerializeAsString(), first.second->SerializeAsString());
}

TEST_F(SaveSessionTest, ARankHoldingThePlanIdGetsNoPlanOthersGetTheirs) {
  held_plan_ids_ = {{0, "plan-id"}, {1, "an-older-plan-id"}, {2, "plan-id"}};
  ArriveAllAndPlan(4, 0, "plan-id");  // rank 3 holds no plan
  ASSERT_EQ(begun_.size(), 4u);
  for (const auto& [rank, r] : begun_) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->plan_id(), "plan-id");
    EXPECT_EQ(r->attempt(), "attempt-1");
    const bool holds = rank == 0 || rank == 2;
    EXPECT_EQ(r->rank_plan_unchanged(), holds) << "rank " << rank;
    if (holds) {
      EXPECT_FALSE(r->has_rank_plan()) << "rank " << rank;
    } else {
      EXPECT_EQ(r->rank_plan().writes_size(),
                static_cast<int>(session_->plan()->ranks[rank].writes.size()))
          << "rank " << rank;
    }
  }
}

TEST_F(SaveSessionTest, WithoutAPlanIdEveryRankGetsItsPlan) {
  held_plan_ids_ = {{0, ""}, {1, ""}};
  ArriveAllAndPlan(2, 0, "");  // a plan without id: nothing matches ""
  for (const auto& [rank, r] : begun_) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->rank_plan_unchanged());
    EXPECT_GT(r->rank_plan().writes_size(), 0);
  }
}

TEST_F(SaveSessionTest, NeedPlansOfSendsThoseRanksBackToArriveAgain) {
  Open(3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(Arrive(r, "", 10 + r), r < 2 ? SaveSession::Arrival::kParked
                                           : SaveSession::Arrival::kAllArrived);
  }
  EXPECT_EQ(Arrive(2, "", 12), SaveSession::Arrival::kParked);  // a retry
  std::vector<SaveSession::BeginWaiter> resend = session_->NeedPlansOf({0, 2});
  ASSERT_EQ(resend.size(), 3u);  // rank 0's call, rank 2's call and retry
  std::set<int> asked;
  for (const auto& [r, done] : resend) asked.insert(r);
  EXPECT_EQ(asked, (std::set<int>{0, 2}));
  EXPECT_EQ(session_->phase(), Phase::kGathering);
  EXPECT_EQ(session_->arrived(), 1);
  EXPECT_EQ(session_->ArrivedRanks(), std::vector<int>{1});
  EXPECT_TRUE(session_->Rank(1).in_save);
  EXPECT_EQ(session_->Rank(1).incarnation, 11u);
  EXPECT_FALSE(session_->Rank(0).in_save);
  // They arrive again (with their plans); the last one completes the world.
  EXPECT_EQ(Arrive(2, "", 12), SaveSession::Arrival::kParked);
  EXPECT_EQ(Arrive(0, "", 10), SaveSession::Arrival::kAllArrived);
  ASSERT_EQ(session_->plans().size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_NE(session_->plans()[r], nullptr);
    EXPECT_EQ(session_->plans()[r]->rank, r);
    EXPECT_EQ(session_->Rank(r).incarnation, 10u + r);
  }
}

// A rank whose parked BeginSave calls have all gone (its process died while
// it waited) leaves the gathering as if it had never arrived: the world is
// not complete without it, and a new process for it arrives without
// restarting anything. One whose caller may still be there stays.
TEST_F(SaveSessionTest, RankWhoseCallsAreGoneLeavesTheGathering) {
  Open(2);
  bool old0_gone = false;
  EXPECT_EQ(Arrive(0, "", 10, 1000, [&] { return old0_gone; }),
            SaveSession::Arrival::kParked);
  EXPECT_TRUE(session_->WithdrawIfDeparted(0).empty());  // still there
  EXPECT_TRUE(session_->Rank(0).waiting);
  EXPECT_EQ(session_->CallsGone(), 0);
  old0_gone = true;
  EXPECT_FALSE(session_->Rank(0).waiting);
  EXPECT_EQ(session_->CallsGone(), 1);
  std::vector<SaveSession::BeginWaiter> left = session_->WithdrawIfDeparted(0);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].first, 0);
  EXPECT_EQ(session_->arrived(), 0);
  EXPECT_EQ(session_->CallsGone(), 0);
  EXPECT_FALSE(session_->Rank(0).in_save);
  EXPECT_TRUE(session_->Rank(0).departed);
  EXPECT_EQ(session_->Rank(0).incarnation, 10u);
  EXPECT_THAT(session_->MissingRanks(), ElementsAre(0, 1));
  // Rank 1 does not complete the world (and has the whole begin deadline);
  // the new rank 0 does.
  EXPECT_EQ(Arrive(1, "", 21, 1000, nullptr, kT0 + absl::Seconds(50)),
            SaveSession::Arrival::kParked);
  EXPECT_EQ(session_->deadline(), kT0 + absl::Seconds(110));
  EXPECT_EQ(Arrive(0, "", 20), SaveSession::Arrival::kAllArrived);
  EXPECT_EQ(session_->Rank(0).incarnation, 20u);
  EXPECT_FALSE(session_->Rank(0).departed);
  EXPECT_EQ(session_->Rank(1).incarnation, 21u);
  EXPECT_TRUE(begun_.empty());  // the left call is the caller's to answer
}

TEST_F(SaveSessionTest, RankStaysWhileAnyOfItsCallsMayBeThere) {
  Open(3);
  bool first_gone = false;
  Arrive(0, "", 10, 1000, [&] { return first_gone; });
  Arrive(0, "", 10);  // a retry by a caller cairnd cannot watch
  Arrive(1, "", 11, 1000, [] { return false; });
  first_gone = true;
  EXPECT_TRUE(session_->WithdrawDeparted().empty());
  EXPECT_THAT(session_->ArrivedRanks(), ElementsAre(0, 1));
  EXPECT_EQ(session_->CallsGone(), 1);
  // Once planning, nobody leaves: the plan may be out.
  Arrive(2, "", 12, 1000, [] { return true; });
  EXPECT_EQ(session_->phase(), Phase::kPlanning);
  EXPECT_TRUE(session_->WithdrawDeparted().empty());
  EXPECT_TRUE(session_->Rank(2).in_save);
}

// The ranks still waiting get the whole begin deadline from the earliest of
// them, never what a departed process had left of it.
TEST_F(SaveSessionTest, BeginDeadlineCountsFromTheEarliestRankStillThere) {
  Open(3);
  Arrive(
      0, "", 10, 1000, [] { return true; }, kT0);
  Arrive(1, "", 11, 1000, nullptr, kT0 + absl::Seconds(40));
  EXPECT_TRUE(session_->Expired(kT0 + absl::Seconds(61)));
  ASSERT_EQ(session_->WithdrawDeparted().size(), 1u);
  EXPECT_EQ(session_->deadline(), kT0 + absl::Seconds(100));
  EXPECT_FALSE(session_->Expired(kT0 + absl::Seconds(61)));
  EXPECT_TRUE(session_->Expired(kT0 + absl::Seconds(101)));
  EXPECT_EQ(
      session_->DeadlineStatus(absl::Minutes(1), absl::Hours(1)).message(),
      "save of job 'job' step 7 aborted: ranks [0, 2] (2 of 3) never "
      "called BeginSave within 1m");
  // Nothing departed: the deadline stays the first arrival's.
  Open(2);
  Arrive(
      0, "", 10, 1000, [] { return false; }, kT0);
  EXPECT_TRUE(session_->WithdrawDeparted().empty());
  EXPECT_EQ(session_->deadline(), kT0 + absl::Minutes(1));
}

TEST_F(SaveSessionTest, ResultsMustMatchThePlanAndTheProcess) {
  ArriveAllAndPlan(2, /*incarnation=*/5);
  std::vector<v1::WriteResult> results = Results(0, /*crc=*/77);
  v1::CommitSaveRequest req;
  req.mutable_results()->Assign(results.begin(), results.end());
  absl::StatusOr<std::vector<uint32_t>> crcs = session_->CheckResults(0, req);
  ASSERT_TRUE(crcs.ok()) << crcs.status();
  EXPECT_EQ(*crcs, std::vector<uint32_t>(results.size(), 77));
  ASSERT_GE(req.results_size(), 1);
  req.mutable_results(0)->mutable_location()->set_offset(12345);
  absl::Status s = session_->CheckResults(0, req).status();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("rank 0 of job 'job' step 7 result 0 for '"),
                        HasSubstr("the plan says attempt-1/"))));
  req.mutable_results()->RemoveLast();
  s = session_->CheckResults(0, req).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("reported " + std::to_string(req.results_size()) +
                        " write results but its plan has"));

  EXPECT_TRUE(session_->CheckIncarnation(0, 5).ok());
  EXPECT_TRUE(session_->CheckIncarnation(0, 0).ok());  // not sent
  s = session_->CheckIncarnation(1, 6);
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kAborted,
                  HasSubstr("rank 1 of job 'job' step 7: this process "
                            "(0000000000000006) is not the one in the save "
                            "(0000000000000005)")));
}

TEST_F(SaveSessionTest, ReportsCommitOnceEveryRankIsInAndConflictsAbort) {
  ArriveAllAndPlan(3);
  EXPECT_EQ(Commit(0), SaveSession::Report::kParked);
  EXPECT_TRUE(session_->Rank(0).reported);
  EXPECT_EQ(Commit(0), SaveSession::Report::kParked);  // a retry
  EXPECT_EQ(Commit(0, /*crc=*/2), SaveSession::Report::kConflict);
  EXPECT_EQ(Commit(2), SaveSession::Report::kParked);
  EXPECT_THAT(session_->MissingRanks(), ElementsAre(1));
  EXPECT_EQ(Commit(1), SaveSession::Report::kAllReported);
  EXPECT_EQ(session_->phase(), Phase::kCommitting);
  // Other checksums once the commit began: refused, the commit goes on.
  EXPECT_EQ(Commit(2, /*crc=*/9), SaveSession::Report::kAnswered);
  EXPECT_THAT(
      commit_answer_,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 2 of job 'job' step 7 committed twice with "
                         "different checksums")));
  EXPECT_EQ(session_->TakeCommitWaiters().size(), 4u);  // 0, 0, 2, 1
  EXPECT_TRUE(session_->TakeCommitWaiters().empty());
}

TEST_F(SaveSessionTest, ShortCommitsMustNameThisSavesPlanAndAttempt) {
  ArriveAllAndPlan(2);
  const size_t writes = Results(1).size();
  ASSERT_FALSE(session_->plan_id().empty());
  v1::CommitSaveRequest req;
  req.set_plan_id(session_->plan_id());
  req.set_attempt(session_->attempt());
  for (size_t i = 0; i < writes; ++i) req.add_crc32cs(100 + i);
  absl::StatusOr<std::vector<uint32_t>> crcs = session_->CheckResults(1, req);
  ASSERT_TRUE(crcs.ok()) << crcs.status();
  ASSERT_EQ(crcs->size(), writes);
  EXPECT_EQ((*crcs)[0], 100u);

  v1::CommitSaveRequest other_plan = req;
  other_plan.set_plan_id("another plan");
  absl::Status s = session_->CheckResults(1, other_plan).status();
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kFailedPrecondition,
                  HasSubstr("rank 1 of job 'job' step 7 reports writes of plan "
                            "another plan in attempt 'attempt-1'")));
  v1::CommitSaveRequest other_attempt = req;
  other_attempt.set_attempt("attempt-0");
  EXPECT_THAT(session_->CheckResults(1, other_attempt),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::CommitSaveRequest short_by_one = req;
  short_by_one.mutable_crc32cs()->RemoveLast();
  s = session_->CheckResults(1, short_by_one).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("reported " + std::to_string(writes - 1) +
                                    " checksums but its plan has " +
                                    std::to_string(writes) + " writes")));
  v1::CommitSaveRequest both = req;
  std::vector<v1::WriteResult> results = Results(1);
  both.mutable_results()->Assign(results.begin(), results.end());
  s = session_->CheckResults(1, both).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("sent both write results and checksums")));
}

TEST_F(SaveSessionTest, ManifestNamesEveryTensorChunkSortedAndEveryObject) {
  ArriveAllAndPlan(3);
  for (int r = 0; r < 3; ++r) Commit(r, /*crc=*/100 + r);
  google::protobuf::Arena arena;
  auto* m = google::protobuf::Arena::CreateMessage<v1::Manifest>(&arena);
  const absl::Status built = session_->BuildManifest(m);
  ASSERT_TRUE(built.ok()) << built;
  const absl::Status valid = storage::ValidateManifest(*m);
  ASSERT_TRUE(valid.ok()) << valid;
  EXPECT_EQ(m->job(), "job");
  EXPECT_EQ(m->step(), 7);
  EXPECT_EQ(m->world_size(), 3);
  EXPECT_EQ(m->created_unix_micros(), absl::ToUnixMicros(kT0));
  ASSERT_EQ(m->tensors_size(), 2);  // "b" (replicated, written once), "w"
  EXPECT_EQ(m->tensors(0).entry().fqn(), "b");
  EXPECT_EQ(m->tensors(0).chunks_size(), 1);
  const v1::ManifestTensor& w = m->tensors(1);
  EXPECT_EQ(w.entry().fqn(), "w");
  ASSERT_EQ(w.chunks_size(), 3);
  uint64_t total = 0;
  for (int c = 0; c < 3; ++c) {
    // Sorted by offsets: rank c wrote rows [3c, 3c + 3).
    EXPECT_EQ(w.chunks(c).box().offsets(0), 3 * c);
    EXPECT_EQ(w.chunks(c).writer_rank(), c);
    EXPECT_EQ(w.chunks(c).crc32c(), 100u + c);
  }
  ASSERT_EQ(m->bytes_entries_size(), 1);
  EXPECT_EQ(m->bytes_entries(0).fqn(), "rng");
  for (const auto& t : m->tensors()) {
    for (const auto& c : t.chunks()) total += c.location().length();
  }
  total += m->bytes_entries(0).location().length();
  EXPECT_EQ(m->total_bytes(), total);
  for (const std::string& o : m->objects()) {
    EXPECT_TRUE(absl::StartsWith(o, "attempt-1/")) << o;
  }
}

// Many tensors, each replicated (one chunk) or split by rows among the
// first k ranks (k chunks), 1-D or 2-D, in a random order of kinds: the
// manifest built for a streaming consumer (one message reused, its chunks
// overwritten, fewer or more from tensor to tensor) is the one built into a
// whole Manifest (fresh messages), tensor by tensor, byte for byte.
TEST_F(SaveSessionTest, ManifestStreamedTensorByTensorIsTheWholeOne) {
  constexpr int kWorld = 5;
  constexpr int kTensors = 40;
  std::mt19937 rng(17);
  struct Layout {
    int split;  // ranks the rows are split among; 1: replicated
    bool two_dims;
    int64_t rows;
  };
  std::vector<Layout> layouts;
  for (int i = 0; i < kTensors; ++i) {
    layouts.push_back(Layout{static_cast<int>(rng() % kWorld) + 1,
                             rng() % 2 == 0,
                             static_cast<int64_t>(kWorld + rng() % 20)});
  }
  make_plan_ = [&layouts](int rank, int world) {
    v1::LocalSavePlan p;
    p.set_rank(rank);
    for (size_t i = 0; i < layouts.size(); ++i) {
      const Layout& l = layouts[i];
      const int64_t per = (l.rows + l.split - 1) / l.split;
      const int part = l.split == 1 ? 0 : rank;
      if (part >= l.split) continue;  // not among this tensor's writers
      const int64_t begin = std::min<int64_t>(part * per, l.rows);
      const int64_t size = std::min<int64_t>(per, l.rows - begin);
      if (size == 0) continue;
      v1::WriteItem* it = p.add_items();
      it->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
      it->mutable_tensor()->set_fqn(absl::StrFormat("t%02d", i));
      it->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
      it->mutable_tensor()->add_global_shape(l.rows);
      it->mutable_chunk()->add_offsets(begin);
      it->mutable_chunk()->add_sizes(size);
      int64_t volume = size;
      if (l.two_dims) {
        it->mutable_tensor()->add_global_shape(3);
        it->mutable_chunk()->add_offsets(0);
        it->mutable_chunk()->add_sizes(3);
        volume *= 3;
      }
      it->set_length(static_cast<uint64_t>(volume) * 4);
    }
    (void)world;
    return p;
  };
  ArriveAllAndPlan(kWorld);
  for (int r = 0; r < kWorld; ++r) Commit(r, /*crc=*/100 + r);

  v1::Manifest whole;
  const absl::Status built = session_->BuildManifest(&whole);
  ASSERT_TRUE(built.ok()) << built;
  ASSERT_TRUE(storage::ValidateManifest(whole).ok());
  ASSERT_EQ(whole.tensors_size(), kTensors);
  // Built twice from one gathering, as a commit publishing a large
  // manifest does: the same both times.
  auto parts = session_->GatherManifest();
  ASSERT_TRUE(parts.ok()) << parts.status();
  std::vector<std::string> streamed;
  for (int run = 0; run < 2; ++run) {
    v1::Manifest header;
    std::vector<std::string> tensors;
    const absl::Status by_tensor =
        session_->BuildManifest(**parts, &header, [&](v1::ManifestTensor& t) {
          tensors.push_back(t.SerializeAsString());
          return absl::OkStatus();
        });
    ASSERT_TRUE(by_tensor.ok()) << by_tensor;
    v1::Manifest whole_header = whole;
    whole_header.clear_tensors();
    EXPECT_EQ(header.SerializeAsString(), whole_header.SerializeAsString());
    if (run == 1) {
      EXPECT_EQ(tensors, streamed);
    }
    streamed = std::move(tensors);
  }
  ASSERT_EQ(streamed.size(), static_cast<size_t>(kTensors));
  for (int i = 0; i < kTensors; ++i) {
    const v1::ManifestTensor& t = whole.tensors(i);
    // Each tensor has the chunks its layout gives it, rows ascending.
    const Layout& l = layouts[i];
    const int64_t per = (l.rows + l.split - 1) / l.split;
    const int64_t chunks = (l.rows + per - 1) / per;
    ASSERT_EQ(t.chunks_size(), chunks) << t.entry().fqn();
    for (int c = 0; c < t.chunks_size(); ++c) {
      EXPECT_EQ(t.chunks(c).box().offsets(0), c * per) << t.entry().fqn();
      EXPECT_EQ(t.chunks(c).box().offsets_size(), l.two_dims ? 2 : 1);
    }
    EXPECT_EQ(streamed[i], t.SerializeAsString()) << t.entry().fqn();
  }
}

TEST_F(SaveSessionTest, DeadlinesNameTheMissingRanks) {
  Open(4);
  Arrive(1);
  Arrive(3);
  const absl::Time deadline = kT0 + absl::Minutes(1);
  EXPECT_FALSE(session_->Expired(deadline));
  EXPECT_TRUE(session_->Expired(deadline + absl::Microseconds(1)));
  absl::Status s = session_->DeadlineStatus(absl::Minutes(1), absl::Hours(2));
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               "save of job 'job' step 7 aborted: ranks [0, 2] (2 of 4) never "
               "called BeginSave within 1m"));

  ArriveAllAndPlan(3);
  Commit(0);
  EXPECT_FALSE(session_->Expired(kT0 + absl::Minutes(30)));
  EXPECT_TRUE(session_->Expired(kT0 + absl::Hours(2)));
  s = session_->DeadlineStatus(absl::Minutes(1), absl::Hours(2));
  EXPECT_EQ(s.message(),
            "save of job 'job' step 7 aborted: ranks [1, 2] (2 of 3) never "
            "called CommitSave within 2h");
  Commit(1);
  Commit(2);  // committing: no deadline applies any more
  EXPECT_FALSE(session_->Expired(kT0 + absl::Hours(100)));
}

TEST_F(SaveSessionTest, AbortAnswersEveryParkedCallOnce) {
  Open(3);
  Arrive(0);
  Arrive(0);
  Arrive(2);
  const absl::Status status = absl::AbortedError("operator gave up");
  std::vector<std::function<void()>> answers;
  EXPECT_TRUE(session_->Abort(status, &answers));
  EXPECT_EQ(session_->phase(), Phase::kAborted);
  EXPECT_EQ(session_->abort_status(), status);
  EXPECT_TRUE(session_->ArrivedRanks().empty());
  ASSERT_EQ(answers.size(), 3u);
  for (auto& a : answers) a();
  ASSERT_EQ(begun_.size(), 3u);
  for (const auto& [rank, r] : begun_) EXPECT_EQ(r.status(), status);
  answers.clear();
  EXPECT_FALSE(session_->Abort(absl::CancelledError("again"), &answers));
  EXPECT_TRUE(answers.empty());
  EXPECT_EQ(session_->abort_status(), status);
}

TEST_F(SaveSessionTest, AbortAnswersParkedCommitsAndLaterReports) {
  ArriveAllAndPlan(2);
  Commit(0);
  std::vector<std::function<void()>> answers;
  ASSERT_TRUE(session_->Abort(absl::AbortedError("rank 1 died"), &answers));
  ASSERT_EQ(answers.size(), 1u);
  answers[0]();
  ASSERT_EQ(committed_.size(), 1u);
  EXPECT_THAT(std::string(committed_[0].second.status().message()),
              HasSubstr("rank 1 died"));
  EXPECT_EQ(Commit(1), SaveSession::Report::kAnswered);
  EXPECT_THAT(commit_answer_, StatusIs(absl::StatusCode::kAborted));
}

TEST_F(SaveSessionTest, WorldSizeMismatchNamesBothSizes) {
  Open(3);
  Arrive(0);
  const absl::Status s = session_->WorldSizeMismatch(1, 2);
  EXPECT_THAT(
      s,
      StatusIs(absl::StatusCode::kInvalidArgument,
               "save of job 'job' step 7 aborted: rank 1 says world_size 2 but "
               "ranks [0] (1 of 3) say world_size 3; every rank of a save must "
               "pass the same world_size"));
}

}  // namespace
}  // namespace cairn::coordinator
