// The save protocol through the coordinator (no gRPC): BeginSave,
// CommitSave, AbortSave; plan and fingerprint caching, deadlines,
// idempotent retries, restarted ranks, bounded sessions and tombstones.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/testing/status_matchers.h"
#include "server/coordinator/coordinator_test_fixture.h"
#include "spdlog/sinks/base_sink.h"
#include "storage/checkpoint_layout.h"

namespace cairn::coordinator {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, UnchangedPlansSendFingerprintsAndHitThePlanCache) {
  Start();
  std::vector<v1::BeginSaveResponse> first = Save("job", 1, 2);
  EXPECT_FALSE(first[0].plan_from_cache());
  // Step 2: both ranks send only the fingerprint they got back.
  for (const v1::BeginSaveResponse& b : Save("job", 2, 2, 8, &first)) {
    EXPECT_FALSE(b.resend_plan());
    EXPECT_TRUE(b.plan_from_cache());
  }
  EXPECT_EQ(coordinator_->stats().plans_built, 1);
  EXPECT_EQ(coordinator_->stats().plans_from_cache, 1);
  // One rank changes its plan (a bigger tensor): a rebuild, not the cache.
  Save("job", 3, 2, /*rows=*/10);
  EXPECT_EQ(coordinator_->stats().plans_built, 2);
  EXPECT_EQ(LatestStep("job"), 3);
}

TEST_F(CoordinatorTest,
       EvictedLocalPlansAreNotNeededWhileTheGlobalPlanIsCached) {
  options_.known_plan_cache_bytes = 16;  // smaller than any local plan
  Start();
  std::vector<v1::BeginSaveResponse> first = Save("job", 1, 2);
  for (const v1::BeginSaveResponse& b : Save("job", 2, 2, 8, &first)) {
    EXPECT_FALSE(b.resend_plan());
    EXPECT_TRUE(b.plan_from_cache());
  }
  EXPECT_EQ(LatestStep("job"), 2);
  EXPECT_EQ(coordinator_->stats().plans_built, 1);
}

TEST_F(CoordinatorTest,
       RanksWhosePlansAreEvictedResendThemWhenThePlanIsRebuilt) {
  options_.known_plan_cache_bytes = 16;  // smaller than any local plan
  options_.plan_cache_bytes = 16;        // no global plan is cached either
  Start();
  std::vector<v1::BeginSaveResponse> first = Save("job", 1, 3);
  // Ranks 0 and 2 send fingerprints, rank 1 its whole plan: all three are
  // in before cairnd finds it needs the plans of 0 and 2.
  std::vector<std::future<BeginResult>> begins;
  for (int r = 0; r < 3; ++r) {
    begins.push_back(r == 1 ? Begin("job", 2, r, 3, RankPlan(r, 3))
                            : Begin("job", 2, r, 3, std::nullopt,
                                    first[r].plan_fingerprint()));
  }
  BeginResult b0 = begins[0].get(), b2 = begins[2].get();
  ASSERT_TRUE(b0.ok()) << b0.status();
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_TRUE(b0->resend_plan());
  EXPECT_TRUE(b2->resend_plan());
  // Rank 1 stays parked until they resend.
  EXPECT_EQ(begins[1].wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);
  std::vector<std::future<BeginResult>> again;
  again.push_back(Begin("job", 2, 0, 3, RankPlan(0, 3)));
  again.push_back(Begin("job", 2, 2, 3, RankPlan(2, 3)));
  std::vector<v1::BeginSaveResponse> plans(3);
  BeginResult b1 = begins[1].get();
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_FALSE(b1->resend_plan());
  plans[1] = *b1;
  for (int i = 0; i < 2; ++i) {
    BeginResult b = again[i].get();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_FALSE(b->resend_plan());
    plans[i * 2] = *b;
  }
  std::vector<std::future<CommitResult>> commits;
  for (int r = 0; r < 3; ++r)
    commits.push_back(Commit(Write("job", 2, r, plans[r])));
  for (auto& f : commits) ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(LatestStep("job"), 2);
  EXPECT_EQ(coordinator_->stats().plans_built, 2);
}

// Keeps the messages cairnd logs.
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

// A plan the plan cache cannot hold is built anew at every save: cairnd says
// so, naming the save and the --plan-cache-mib that would hold it.
TEST_F(CoordinatorTest, PlansLargerThanThePlanCacheAreLoggedWithTheSizeToSet) {
  options_.plan_cache_bytes = 16;
  auto sink = std::make_shared<LineSink>();
  Logger().sinks().push_back(sink);  // before cairnd's threads start
  Start();
  std::vector<v1::BeginSaveResponse> first = Save("job", 1, 2);
  Save("job", 2, 2, 8, &first);
  coordinator_.reset();  // no thread logs while the sink goes
  Logger().sinks().pop_back();
  std::vector<std::string> warned;
  for (const std::string& line : sink->Lines()) {
    if (absl::StrContains(line, "larger than the plan cache")) {
      warned.push_back(line);
    }
  }
  ASSERT_EQ(warned.size(), 2u) << absl::StrJoin(sink->Lines(), "\n");
  EXPECT_THAT(warned[0],
              HasSubstr("job 'job' step 1: its global plan (1 MiB)"));
  EXPECT_THAT(warned[0], HasSubstr("(--plan-cache-mib 0)"));
  EXPECT_THAT(warned[0], HasSubstr("set --plan-cache-mib to at least 1"));
  EXPECT_THAT(warned[1], HasSubstr("job 'job' step 2"));
}

// A manifest over manifest_held_bytes (--manifest-held-mib) is encoded twice
// and streamed: the same checkpoint is committed, whole and verifiable.
TEST_F(CoordinatorTest, StreamedManifestsCommitTheSameCheckpoint) {
  UsePosix();
  options_.manifest_held_bytes = 0;
  Start();
  Save("job", 1, 3);
  Save("job", 2, 3);
  EXPECT_EQ(LatestStep("job"), 2);
  auto m = storage::ReadManifest(Disk(), "job", 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->world_size(), 3);
  EXPECT_GT(m->tensors_size(), 0);
  auto record = Record("job", 2);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->total_bytes(), m->total_bytes());
  EXPECT_EQ(record->num_tensors(), m->tensors_size());
  ExpectCatalogAndStorageAgree("job");
}

TEST_F(CoordinatorTest, UnknownFingerprintAsksTheRankToResend) {
  Start();
  BeginResult r =
      Begin("job", 1, 0, 1, std::nullopt, "not-a-fingerprint").get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resend_plan());
}

TEST_F(CoordinatorTest, RetriedBeginSaveIsIdempotentAndDuplicateRankRejected) {
  Start();
  auto a = Begin("job", 1, 0, 2, RankPlan(0, 2));
  auto a_retry = Begin("job", 1, 0, 2, RankPlan(0, 2));
  BeginResult dup = Begin("job", 1, 0, 2, RankPlan(1, 2)).get();
  EXPECT_THAT(
      dup, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0")));
  auto b = Begin("job", 1, 1, 2, RankPlan(1, 2));
  BeginResult ra = a.get(), rr = a_retry.get(), rb = b.get();
  ASSERT_TRUE(ra.ok() && rr.ok() && rb.ok());
  EXPECT_EQ(ra->rank_plan().SerializeAsString(),
            rr->rank_plan().SerializeAsString());
  // A retry after the plan was built gets the same answer at once.
  BeginResult late = Begin("job", 1, 1, 2, RankPlan(1, 2)).get();
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->rank_plan().SerializeAsString(),
            rb->rank_plan().SerializeAsString());
  // Commits, including a retried one, then a retry after the commit.
  v1::CommitSaveRequest c0 = Write("job", 1, 0, *ra);
  auto f0 = Commit(c0);
  auto f0_retry = Commit(c0);
  auto f1 = Commit(Write("job", 1, 1, *rb));
  EXPECT_TRUE(f0.get().ok());
  EXPECT_TRUE(f0_retry.get().ok());
  EXPECT_TRUE(f1.get().ok());
  CommitResult after = Commit(c0).get();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  // The committed step cannot be saved again.
  BeginResult again = Begin("job", 1, 0, 2, RankPlan(0, 2)).get();
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(CoordinatorTest, MissingRankAbortsAtTheBeginDeadline) {
  options_.begin_deadline = absl::Milliseconds(200);
  Start();
  BeginResult r = Begin("job", 4, 0, 3, RankPlan(0, 3)).get();
  EXPECT_THAT(
      r, StatusIs(absl::StatusCode::kDeadlineExceeded,
                  AllOf(HasSubstr("[1, 2]"), HasSubstr("job 'job' step 4"))));
  v1::ListCheckpointsRequest list;
  list.set_include_uncommitted(true);
  // The abort is recorded off the lock; wait for it briefly.
  for (int i = 0; i < 100; ++i) {
    auto l = coordinator_->ListCheckpoints(list);
    ASSERT_TRUE(l.ok());
    if (l->checkpoints_size() == 1) {
      EXPECT_EQ(l->checkpoints(0).state(), v1::CHECKPOINT_STATE_ABORTED);
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "abort never recorded";
}

TEST_F(CoordinatorTest, AbortSaveAnswersWaitingRanksAndKeepsLatest) {
  Start();
  Save("job", 1, 2);
  auto b0 = Begin("job", 2, 0, 2, RankPlan(0, 2));
  auto b1 = Begin("job", 2, 1, 2, RankPlan(1, 2));
  BeginResult r0 = b0.get();
  ASSERT_TRUE(r0.ok());
  ASSERT_TRUE(b1.get().ok());
  auto waiting = Commit(Write("job", 2, 0, *r0));
  v1::AbortSaveRequest abort;
  abort.set_job("job");
  abort.set_step(2);
  abort.set_rank(1);
  abort.set_reason("disk full on node 7");
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  CommitResult c = waiting.get();
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kAborted,
                          HasSubstr("disk full on node 7")));
  EXPECT_EQ(LatestStep("job"), 1);
}

// Issue 11: an aborted save used to stay in memory (with world_size-sized
// vectors) until the same step was saved again.
TEST_F(CoordinatorTest, AbortedSavesAreFreedAndLateCallsStillAnswered) {
  Start();
  constexpr int kHugeWorld = 1 << 20;
  std::vector<std::future<BeginResult>> parked;
  for (int step = 1; step <= 6; ++step) {
    parked.push_back(Begin("big", step, 0, kHugeWorld, RankPlan(0, 1)));
  }
  EXPECT_EQ(coordinator_->stats().saves_in_progress, 6);
  for (int step = 1; step <= 6; ++step) {
    v1::AbortSaveRequest abort;
    abort.set_job("big");
    abort.set_step(step);
    abort.set_rank(0);
    abort.set_reason("operator gave up");
    ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
    // A retried AbortSave of the same save is fine.
    ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  }
  for (auto& f : parked) {
    BeginResult r = f.get();
    EXPECT_THAT(
        r, StatusIs(absl::StatusCode::kAborted, HasSubstr("operator gave up")));
  }
  EXPECT_EQ(coordinator_->stats().saves_in_progress, 0);
  EXPECT_EQ(coordinator_->stats().aborts_remembered, 6);
  // A late CommitSave of an aborted save learns why.
  v1::CommitSaveRequest late;
  late.set_job("big");
  late.set_step(3);
  late.set_rank(0);
  CommitResult c = Commit(late).get();
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kAborted,
                          AllOf(HasSubstr("job 'big' step 3"),
                                HasSubstr("operator gave up"))));
  // The same step can be saved again, in a fresh attempt.
  Save("big", 3, 2);
  EXPECT_EQ(LatestStep("big"), 3);
  EXPECT_EQ(coordinator_->stats().saves_in_progress, 0);
}

// Every abort used to leave an ABORTED record for good.
TEST_F(CoordinatorTest, AbortedRecordsOfAJobAreBounded) {
  Start();
  Save("job", 1000, 1);
  for (int step = 1; step <= 70; ++step) {
    auto parked = Begin("job", step, 0, 2, RankPlan(0, 2));
    v1::AbortSaveRequest abort;
    abort.set_job("job");
    abort.set_step(step);
    ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
    EXPECT_THAT(parked.get(), StatusIs(absl::StatusCode::kAborted));
  }
  v1::ListCheckpointsRequest list;
  list.set_job("job");
  list.set_include_uncommitted(true);
  auto l = coordinator_->ListCheckpoints(list);
  ASSERT_TRUE(l.ok()) << l.status();
  std::vector<int64_t> aborted;
  for (const auto& r : l->checkpoints()) {
    if (r.state() == v1::CHECKPOINT_STATE_ABORTED) aborted.push_back(r.step());
    if (r.step() == 1000) {
      EXPECT_EQ(r.state(), v1::CHECKPOINT_STATE_COMMITTED);
    }
  }
  ASSERT_EQ(aborted.size(), 64u);
  EXPECT_EQ(*std::min_element(aborted.begin(), aborted.end()), 7);
  EXPECT_EQ(LatestStep("job"), 1000);
}

TEST_F(CoordinatorTest, SavesInProgressAreBoundedPerJobAndInTotal) {
  options_.max_sessions_per_job = 2;
  options_.max_sessions = 3;
  Start();
  auto a1 = Begin("a", 1, 0, 2, RankPlan(0, 2));
  auto a2 = Begin("a", 2, 0, 2, RankPlan(0, 2));
  BeginResult a3 = Begin("a", 3, 0, 2, RankPlan(0, 2)).get();
  EXPECT_THAT(a3, StatusIs(absl::StatusCode::kResourceExhausted,
                           AllOf(HasSubstr("rank 0 of job 'a' step 3"),
                                 HasSubstr("2 of job 'a'"))));
  auto b1 = Begin("b", 1, 0, 2, RankPlan(0, 2));
  BeginResult c1 = Begin("c", 1, 0, 2, RankPlan(0, 2)).get();
  EXPECT_THAT(c1, StatusIs(absl::StatusCode::kResourceExhausted,
                           HasSubstr("3 in total")));
  // Ranks of a save already in progress are never refused.
  auto a1_rank1 = Begin("a", 1, 1, 2, RankPlan(1, 2));
  ASSERT_TRUE(a1.get().ok());
  ASSERT_TRUE(a1_rank1.get().ok());
  // Freeing a slot (an abort) lets a new save in.
  v1::AbortSaveRequest abort;
  abort.set_job("a");
  abort.set_step(2);
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  EXPECT_THAT(a2.get(), StatusIs(absl::StatusCode::kAborted));
  auto a3_again = Begin("a", 3, 0, 2, RankPlan(0, 2));
  auto a3_rank1 = Begin("a", 3, 1, 2, RankPlan(1, 2));
  EXPECT_TRUE(a3_again.get().ok());
  EXPECT_TRUE(a3_rank1.get().ok());
  coordinator_.reset();  // answers b1 UNAVAILABLE
  EXPECT_THAT(b1.get(), StatusIs(absl::StatusCode::kUnavailable));
}

// A 64 MiB abort reason used to land whole in the catalog (and in the log).
TEST_F(CoordinatorTest, AbortReasonIsTruncated) {
  Start();
  auto parked = Begin("job", 5, 0, 2, RankPlan(0, 2));
  v1::AbortSaveRequest abort;
  abort.set_job("job");
  abort.set_step(5);
  abort.set_rank(0);
  abort.set_reason(std::string(64 << 20, 'x'));
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  BeginResult r = parked.get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kAborted));
  EXPECT_LT(r.status().message().size(), 2048u);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("...(truncated, 67108864 bytes)"));
  v1::ListCheckpointsRequest list;
  list.set_include_uncommitted(true);
  auto l = coordinator_->ListCheckpoints(list);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->checkpoints_size(), 1);
  EXPECT_EQ(l->checkpoints(0).state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_LT(l->checkpoints(0).abort_reason().size(), 2048u);
  EXPECT_LT(l->ByteSizeLong(), size_t{4} << 10);
}

TEST_F(CoordinatorTest, CommitResultsMustMatchThePlan) {
  Start();
  BeginResult r = Begin("job", 1, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(r.ok());
  v1::CommitSaveRequest c = Write("job", 1, 0, *r);
  c.mutable_results(0)->mutable_location()->set_offset(12345);
  CommitResult bad = Commit(c).get();
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("the plan says")));
  c.mutable_results()->RemoveLast();
  bad = Commit(c).get();
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinatorTest, ShortCommitsOfThePlanCommitAndOthersAreRefused) {
  UsePosix();
  Start();
  std::vector<std::future<BeginResult>> begun;
  for (int r = 0; r < 2; ++r)
    begun.push_back(Begin("job", 1, r, 2, RankPlan(r, 2)));
  std::vector<v1::CommitSaveRequest> commits;
  for (int r = 0; r < 2; ++r) {
    BeginResult b = begun[r].get();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_FALSE(b->plan_id().empty());
    ASSERT_FALSE(b->attempt().empty());
    v1::CommitSaveRequest full = Write("job", 1, r, *b);
    // The short form SaveProtocol sends: the checksums alone.
    v1::CommitSaveRequest c;
    c.set_job("job");
    c.set_step(1);
    c.set_rank(r);
    c.set_plan_id(b->plan_id());
    c.set_attempt(b->attempt());
    for (const v1::WriteResult& w : full.results()) c.add_crc32cs(w.crc32c());
    commits.push_back(c);
  }
  v1::CommitSaveRequest stale = commits[0];
  stale.set_plan_id("not this plan");
  CommitResult refused = Commit(stale).get();
  EXPECT_THAT(
      refused,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("rank 0 of job 'job' step 1 reports writes of plan")));
  std::future<CommitResult> c0 = Commit(commits[0]);
  CommitResult c1 = Commit(commits[1]).get();
  ASSERT_TRUE(c1.ok()) << c1.status();
  ASSERT_TRUE(c0.get().ok());
  EXPECT_EQ(c1->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  // The manifest holds the reported checksums: the checkpoint verifies.
  absl::StatusOr<v1::Manifest> m = storage::ReadManifest(Disk(), "job", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  const absl::Status verified = storage::VerifyCheckpoint(Disk(), *m);
  EXPECT_TRUE(verified.ok()) << verified;
}

TEST_F(CoordinatorTest, OversizeHeldPlanIdIsRefusedNamingTheRank) {
  Start();
  v1::BeginSaveRequest req;
  req.set_job("job");
  req.set_step(4);
  req.set_rank(1);
  req.set_world_size(2);
  *req.mutable_local_plan() = RankPlan(1, 2);
  req.set_held_plan_id(std::string(65, 'x'));
  auto promise = std::make_shared<std::promise<BeginResult>>();
  coordinator_->BeginSave(
      req, [promise](BeginResult r) { promise->set_value(std::move(r)); });
  BeginResult r = promise->get_future().get();
  EXPECT_THAT(
      r,
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 1 of job 'job' step 4 sent a held plan id of 65 "
                         "bytes")));
  // Nothing was opened: the same rank with a sane request still saves.
  req.set_held_plan_id("");
  req.set_world_size(1);
  req.set_rank(0);
  *req.mutable_local_plan() = RankPlan(0, 1);
  auto again = std::make_shared<std::promise<BeginResult>>();
  coordinator_->BeginSave(
      req, [again](BeginResult r) { again->set_value(std::move(r)); });
  BeginResult ok = again->get_future().get();
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST_F(CoordinatorTest, FailedManifestPublishAbortsAndKeepsPreviousLatest) {
  options_.storage_uri = "faulty://publishfail";
  Start();
  ASSERT_NE(g_faults, nullptr);
  Save("job", 1, 2);
  storage::FaultRule rule;
  rule.ops = storage::kFaultPut;
  rule.key_contains = "MANIFEST";
  rule.action = storage::FaultAction::kCrashBeforeRename;
  g_faults->AddRule(rule);
  auto b0 = Begin("job", 2, 0, 2, RankPlan(0, 2));
  auto b1 = Begin("job", 2, 1, 2, RankPlan(1, 2));
  BeginResult r0 = b0.get(), r1 = b1.get();
  ASSERT_TRUE(r0.ok() && r1.ok());
  // Data goes to the base store directly (the fault is on the coordinator's).
  auto c0 = Commit(Write("job", 2, 0, *r0));
  auto c1 = Commit(Write("job", 2, 1, *r1));
  EXPECT_FALSE(c0.get().ok());
  EXPECT_FALSE(c1.get().ok());
  EXPECT_EQ(LatestStep("job"), 1);
  auto steps = storage::ListCommittedSteps(
      *storage::OpenMemoryShardStore("publishfail").value(), "job");
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>({1}));
}

// A rank that says another world size fails the whole save at once: the
// parked ranks are told why (not "never called BeginSave" after the begin
// deadline), and so is a rank of the broken save arriving later.
TEST_F(CoordinatorTest, BeginSaveWorldSizeMismatchAbortsTheSaveAtOnce) {
  options_.begin_deadline = absl::Hours(1);
  Start();
  auto r0 = Begin("job", 5, 0, 3, RankPlan(0, 3));
  BeginResult r1 = Begin("job", 5, 1, 2, RankPlan(1, 2)).get();
  ASSERT_THAT(r1, StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string msg(r1.status().message());
  EXPECT_THAT(msg, HasSubstr("job 'job' step 5"));
  EXPECT_THAT(msg, HasSubstr("rank 1 says world_size 2"));
  EXPECT_THAT(msg, HasSubstr("ranks [0] (1 of 3) say world_size 3"));
  ASSERT_EQ(r0.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  BeginResult p0 = r0.get();
  EXPECT_THAT(p0, StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("rank 1 says world_size 2")));
  BeginResult p2 = Begin("job", 5, 2, 3, RankPlan(2, 3)).get();
  EXPECT_THAT(p2, StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("rank 1 says world_size 2")));
  // Rank 0 again is a new attempt (the job was restarted, fixed).
  auto n0 = Begin("job", 5, 0, 2, RankPlan(0, 2));
  auto n1 = Begin("job", 5, 1, 2, RankPlan(1, 2));
  EXPECT_TRUE(n0.get().ok());
  EXPECT_TRUE(n1.get().ok());
}

// Storage, not the catalog, says what is committed (real posix store).
TEST_F(CoordinatorTest,
       StepCommittedOnStorageButNotInTheCatalogIsNotSavedOver) {
  UsePosix();
  Start();
  Save("job", 1, 1);
  // Step 2 is committed on storage while the catalog does not know it (its
  // catalog write failed after the publish).
  storage::TestCheckpointSpec spec;
  spec.step = 2;
  auto manifest = storage::WriteTestCheckpoint(Disk(), spec);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  BeginResult r = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kAlreadyExists,
                          HasSubstr("job 'job' step 2 is already committed")));
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(LatestStep("job"), 2);
  ExpectCatalogAndStorageAgree("job");
}

// A commit never publishes an object whose bytes differ from its crc32c.
TEST_F(CoordinatorTest, RestartedRankStartsTheSaveOverInsteadOfRejoiningIt) {
  UsePosix();
  Start();
  constexpr uint64_t kRank0 = 0xa0, kRank1 = 0xb1, kRank1Again = 0xb2;
  auto b0 = Begin("job", 7, 0, 2, RankPlan(0, 2), "", kRank0);
  auto b1 = Begin("job", 7, 1, 2, RankPlan(1, 2), "", kRank1);
  BeginResult r0 = b0.get(), r1 = b1.get();
  ASSERT_TRUE(r0.ok() && r1.ok());
  v1::CommitSaveRequest c0 = Write("job", 7, 0, *r0);
  c0.set_incarnation(kRank0);
  auto committed0 = Commit(c0);  // parked: rank 1 has not reported
  // Rank 1's process is killed and a new one saves the same step: it must
  // not get the old attempt (where rank 0's reported objects are).
  auto b1_again = Begin("job", 7, 1, 2, RankPlan(1, 2), "", kRank1Again);
  CommitResult aborted = committed0.get();
  EXPECT_THAT(
      aborted,
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr("save of job 'job' step 7 aborted: rank 1 restarted "
                         "during the save")));
  // The old rank-1 process is refused in whatever follows.
  v1::CommitSaveRequest stale = Write("job", 7, 1, *r1);
  stale.set_incarnation(kRank1);
  // Rank 0 saves again (same process) and joins the new attempt.
  auto b0_again = Begin("job", 7, 0, 2, RankPlan(0, 2), "", kRank0);
  BeginResult n0 = b0_again.get(), n1 = b1_again.get();
  ASSERT_TRUE(n0.ok() && n1.ok()) << n0.status() << n1.status();
  EXPECT_NE(AttemptOf(*n0), AttemptOf(*r0));
  CommitResult old = Commit(stale).get();
  EXPECT_THAT(old,
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("rank 1 of job 'job' step 7: this process")));
  v1::AbortSaveRequest stale_abort;
  stale_abort.set_job("job");
  stale_abort.set_step(7);
  stale_abort.set_rank(1);
  stale_abort.set_incarnation(kRank1);
  stale_abort.set_reason("its CommitSave failed");
  EXPECT_THAT(coordinator_->AbortSave(stale_abort),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::CommitSaveRequest n0c = Write("job", 7, 0, *n0);
  n0c.set_incarnation(kRank0);
  v1::CommitSaveRequest n1c = Write("job", 7, 1, *n1);
  n1c.set_incarnation(kRank1Again);
  auto f0 = Commit(n0c);
  auto f1 = Commit(n1c);
  ASSERT_TRUE(f0.get().ok());
  ASSERT_TRUE(f1.get().ok());
  EXPECT_EQ(LatestStep("job"), 7);
  ExpectCatalogAndStorageAgree("job");  // every byte verifies
  // The aborted attempt's directory is gone.
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(
      data_dir_, "/", storage::StepPrefix("job", 7), AttemptOf(*r0))));
}

// A job restarts while its old rank 0 process, killed waiting in BeginSave,
// is still in the save (cairnd sees its call cancelled): the new processes
// save the step in that attempt, rank 1 arriving before rank 0's new
// process and rank 2 last. Nothing is aborted; rank 1 never gets a plan
// made with the process that is gone.
TEST_F(CoordinatorTest, RankWhoseProcessIsGoneIsReplacedNotRestarted) {
  Start();
  std::atomic<bool> old0_gone = false;
  auto old0 = Begin("job", 4, 0, 3, RankPlan(0, 3), "", 0xa0,
                    [&] { return old0_gone.load(); });
  old0_gone = true;
  auto b1 = Begin("job", 4, 1, 3, RankPlan(1, 3), "", 0xb1);
  auto b0 = Begin("job", 4, 0, 3, RankPlan(0, 3), "", 0xa1);
  BeginResult left = old0.get();
  EXPECT_THAT(left,
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("rank 0 of job 'job' step 4 left the save")));
  EXPECT_EQ(b1.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);  // waits for rank 2
  EXPECT_EQ(coordinator_->BeginSaveCallsGoneForTest(), 0);
  auto b2 = Begin("job", 4, 2, 3, RankPlan(2, 3), "", 0xc2);
  std::vector<BeginResult> plans = {b0.get(), b1.get(), b2.get()};
  std::vector<std::future<CommitResult>> commits;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(plans[r].ok()) << "rank " << r << ": " << plans[r].status();
    EXPECT_EQ(AttemptOf(*plans[r]), AttemptOf(*plans[0]));
    v1::CommitSaveRequest c = Write("job", 4, r, *plans[r]);
    c.set_incarnation(r == 0 ? 0xa1 : r == 1 ? 0xb1 : 0xc2);
    commits.push_back(Commit(c));
  }
  for (auto& c : commits) EXPECT_TRUE(c.get().ok());
  EXPECT_EQ(LatestStep("job"), 4);
  EXPECT_EQ(coordinator_->stats().aborts, 0);
}

// A rank cancelled in BeginSave (Checkpointer::Cancel) aborts the save with
// AbortSave right after; if another rank arrived in between and let it go
// (its call was cancelled), its AbortSave still aborts the save.
TEST_F(CoordinatorTest, ProcessWhoseBeginSaveLeftStillAbortsTheSave) {
  Start();
  std::atomic<bool> cancelled = false;
  auto b0 = Begin("job", 5, 0, 2, RankPlan(0, 2), "", 0xa0,
                  [&] { return cancelled.load(); });
  cancelled = true;
  auto b1 = Begin("job", 5, 1, 2, RankPlan(1, 2), "", 0xb1);
  EXPECT_THAT(b0.get(), StatusIs(absl::StatusCode::kCancelled));
  v1::AbortSaveRequest other;
  other.set_job("job");
  other.set_step(5);
  other.set_rank(0);
  other.set_incarnation(0xa7);  // not the process that left
  EXPECT_THAT(coordinator_->AbortSave(other),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::AbortSaveRequest abort = other;
  abort.set_incarnation(0xa0);
  abort.set_reason("cancelled (Checkpointer::Cancel)");
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  BeginResult r1 = b1.get();
  EXPECT_THAT(
      r1, StatusIs(absl::StatusCode::kAborted,
                   HasSubstr(
                       "aborted by rank 0: cancelled (Checkpointer::Cancel)")));
}

// At the begin deadline a rank whose process is gone is not waiting: the
// ranks that are get the whole deadline from the earliest of them.
TEST_F(CoordinatorTest, BeginDeadlineIgnoresARankWhoseProcessIsGone) {
  options_.begin_deadline = absl::Seconds(3);
  Start();
  auto old0 =
      Begin("job", 6, 0, 3, RankPlan(0, 3), "", 0xa0, [] { return true; });
  absl::SleepFor(absl::Seconds(2));
  auto b1 = Begin("job", 6, 1, 3, RankPlan(1, 3), "", 0xb1);
  absl::SleepFor(absl::Milliseconds(1500));  // past the first deadline
  EXPECT_THAT(old0.get(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(b1.wait_for(std::chrono::milliseconds(0)),
            std::future_status::timeout);
  auto b0 = Begin("job", 6, 0, 3, RankPlan(0, 3), "", 0xa1);
  auto b2 = Begin("job", 6, 2, 3, RankPlan(2, 3), "", 0xc2);
  for (auto* b : {&b0, &b1, &b2}) {
    BeginResult r = b->get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ(coordinator_->stats().aborts, 0);
}

TEST_F(CoordinatorTest, RankThatSavesAgainAfterReportingStartsTheSaveOver) {
  UsePosix();
  Start();
  auto b0 = Begin("job", 3, 0, 2, RankPlan(0, 2), "", 5);
  auto b1 = Begin("job", 3, 1, 2, RankPlan(1, 2), "", 6);
  BeginResult r0 = b0.get(), r1 = b1.get();
  ASSERT_TRUE(r0.ok() && r1.ok());
  v1::CommitSaveRequest c0 = Write("job", 3, 0, *r0);
  c0.set_incarnation(5);
  auto parked = Commit(c0);
  // The same process calls Save(3) again (its CommitSave timed out on its
  // side): it would rewrite objects whose crc32c cairnd holds.
  auto again = Begin("job", 3, 0, 2, RankPlan(0, 2), "", 5);
  CommitResult first = parked.get();
  EXPECT_THAT(
      first,
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr("rank 0 called BeginSave again after reporting its "
                         "writes")));
  // A retry of BeginSave before reporting is still a retry.
  auto b1_retry = Begin("job", 3, 1, 2, RankPlan(1, 2), "", 6);
  BeginResult n0 = again.get(), n1 = b1_retry.get();
  ASSERT_TRUE(n0.ok() && n1.ok());
  EXPECT_EQ(AttemptOf(*n0), AttemptOf(*n1));
  EXPECT_NE(AttemptOf(*n0), AttemptOf(*r0));
  auto b1_retry2 = Begin("job", 3, 1, 2, RankPlan(1, 2), "", 6).get();
  ASSERT_TRUE(b1_retry2.ok());
  EXPECT_EQ(AttemptOf(*b1_retry2), AttemptOf(*n1));

  // Two reports with different checksums: the first can no longer be
  // trusted to describe what is on storage.
  v1::CommitSaveRequest n0c = Write("job", 3, 0, *n0);
  n0c.set_incarnation(5);
  auto p0 = Commit(n0c);
  n0c.mutable_results(0)->set_crc32c(n0c.results(0).crc32c() ^ 1);
  CommitResult twice = Commit(n0c).get();
  EXPECT_THAT(
      twice,
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr("rank 0 committed twice with different checksums")));
  EXPECT_THAT(p0.get(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(LatestStep("job"), -1);
}

}  // namespace
}  // namespace cairn::coordinator
