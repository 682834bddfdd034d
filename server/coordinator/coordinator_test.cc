// The coordinator library in-process (no gRPC): the save/commit/abort state
// machine, plan and fingerprint caching, deadlines, retention and recovery,
// on a shared memory store ("mem://name") or a fault-injecting one.
#include "server/coordinator/coordinator.h"

#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_cache.h"
#include "proto/convert/plan_convert.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/fault_injection_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A "faulty://name" scheme: a FaultInjectionStore over mem://name whose
// rules the test programs through g_faults.
storage::FaultInjectionStore* g_faults = nullptr;

void RegisterFaultyScheme() {
  static bool done = [] {
    storage::RegisterShardStoreScheme(
        "faulty",
        [](absl::string_view rest, const storage::StoreOptions&)
            -> absl::StatusOr<std::unique_ptr<storage::ShardStore>> {
          auto base = storage::OpenMemoryShardStore(rest);
          if (!base.ok()) return base.status();
          auto f =
              std::make_unique<storage::FaultInjectionStore>(std::move(*base));
          g_faults = f.get();
          return std::unique_ptr<storage::ShardStore>(std::move(f));
        });
    // "faultyfile:///dir": the same over a real directory (posix).
    storage::RegisterShardStoreScheme(
        "faultyfile",
        [](absl::string_view rest, const storage::StoreOptions& o)
            -> absl::StatusOr<std::unique_ptr<storage::ShardStore>> {
          auto base = storage::OpenShardStore(absl::StrCat("file://", rest), o);
          if (!base.ok()) return base.status();
          auto f =
              std::make_unique<storage::FaultInjectionStore>(std::move(*base));
          g_faults = f.get();
          return std::unique_ptr<storage::ShardStore>(std::move(f));
        });
    return true;
  }();
  (void)done;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(base ? base : "/tmp", "/cairn-coord-", name, "-", getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// One fp32 tensor "w" of shape [rows, 4], split by rows over the ranks, plus
// a replicated bias "b" [4] every rank holds, plus bytes "rng" on every rank.
v1::LocalSavePlan RankPlan(int rank, int world, int64_t rows = 8) {
  v1::LocalSavePlan p;
  p.set_rank(rank);
  const int64_t per = (rows + world - 1) / world;
  const int64_t begin = std::min<int64_t>(rank * per, rows);
  const int64_t size = std::min<int64_t>(per, rows - begin);
  auto add = [&](const std::string& fqn, std::vector<int64_t> shape,
                 std::vector<int64_t> off, std::vector<int64_t> sz) {
    v1::WriteItem* it = p.add_items();
    it->set_kind(v1::WriteItem::KIND_TENSOR_CHUNK);
    it->mutable_tensor()->set_fqn(fqn);
    it->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) it->mutable_tensor()->add_global_shape(d);
    int64_t vol = 1;
    for (size_t d = 0; d < off.size(); ++d) {
      it->mutable_chunk()->add_offsets(off[d]);
      it->mutable_chunk()->add_sizes(sz[d]);
      vol *= sz[d];
    }
    it->set_length(static_cast<uint64_t>(vol) * 4);
  };
  add("w", {rows, 4}, {begin, 0}, {size, 4});
  add("b", {4}, {0}, {4});
  v1::WriteItem* rng = p.add_items();
  rng->set_kind(v1::WriteItem::KIND_BYTES);
  rng->set_bytes_fqn("rng");
  rng->set_length(16);
  return p;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterFaultyScheme();
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.storage_uri = "mem://" + name;
    options_.catalog_path = TempDir(name);
    options_.worker_threads = 2;
  }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(options_.catalog_path);
    if (!data_dir_.empty()) std::filesystem::remove_all(data_dir_);
  }

  // Storage in a real directory (the posix store), behind the fault injector
  // ("faultyfile://") when `faulty`. Fresh catalog and storage each call.
  void UsePosix(bool faulty = false) {
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    coordinator_.reset();
    disk_.reset();
    std::filesystem::remove_all(options_.catalog_path);
    data_dir_ = TempDir(name + "-data");
    std::filesystem::create_directories(data_dir_);
    options_.storage_uri =
        absl::StrCat(faulty ? "faultyfile://" : "file://", data_dir_);
  }
  // The storage directory as a restarted cairnd (or the CLI) opens it.
  storage::ShardStore& Disk() {
    if (disk_ == nullptr) {
      disk_ = storage::OpenShardStore("file://" + data_dir_).value();
    }
    return *disk_;
  }
  // A cairnd that died (its catalog and storage as they are) starts again,
  // without injected faults.
  void Restart() {
    coordinator_.reset();
    options_.storage_uri = "file://" + data_dir_;
    Start();
  }
  // Edits the catalog while no coordinator has it open.
  void EditCatalog(const std::function<void(storage::Catalog&)>& edit) {
    ASSERT_EQ(coordinator_, nullptr);
    auto catalog = storage::Catalog::Open(options_.catalog_path);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    edit(**catalog);
  }
  // A writer of `key` that dies mid-write: its temp file stays.
  void DeadWriter(const std::string& key) {
    auto w = Disk().NewWriter(key);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(absl::MakeConstSpan(std::string(5000, 'z'))).ok());
    (*w)->SimulateCrashForTest();
  }
  int TempFiles() {
    int n = 0;
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(data_dir_)) {
      if (absl::StartsWith(e.path().filename().string(), ".cairn-tmp")) ++n;
    }
    return n;
  }
  absl::StatusOr<v1::CheckpointRecord> Record(const std::string& job,
                                              int64_t step) {
    v1::GetCheckpointRequest get;
    get.set_job(job);
    get.set_step(step);
    auto r = coordinator_->GetCheckpoint(get);
    if (!r.ok()) return r.status();
    return r->checkpoint();
  }
  std::vector<int64_t> ListedSteps(const std::string& job) {
    v1::ListCheckpointsRequest list;
    list.set_job(job);
    auto l = coordinator_->ListCheckpoints(list);
    EXPECT_TRUE(l.ok()) << l.status();
    std::vector<int64_t> steps;
    if (l.ok()) {
      for (const auto& r : l->checkpoints()) steps.push_back(r.step());
    }
    return steps;
  }
  // What every restart must guarantee: each listed checkpoint has a MANIFEST
  // whose every byte verifies, `latest` is the newest of them, every
  // MANIFEST on storage is listed, and nothing else is left on storage.
  void ExpectCatalogAndStorageAgree(const std::string& job) {
    std::vector<int64_t> listed = ListedSteps(job);
    for (int64_t step : listed) {
      auto m = storage::ReadManifest(Disk(), job, step);
      ASSERT_TRUE(m.ok()) << "listed step " << step << ": " << m.status();
      EXPECT_TRUE(storage::VerifyCheckpoint(Disk(), *m).ok()) << step;
    }
    EXPECT_EQ(LatestStep(job), listed.empty() ? -1 : listed.back());
    auto on_disk = storage::ListCommittedSteps(Disk(), job);
    ASSERT_TRUE(on_disk.ok());
    EXPECT_EQ(*on_disk, listed);
    auto incomplete = storage::ListIncompleteSteps(Disk(), job);
    ASSERT_TRUE(incomplete.ok());
    EXPECT_THAT(*incomplete, ::testing::IsEmpty());
    EXPECT_EQ(TempFiles(), 0);
  }

  std::string data_dir_;
  std::unique_ptr<storage::ShardStore> disk_;

  void Start() {
    auto c = Coordinator::Create(options_);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }

  using BeginResult = absl::StatusOr<v1::BeginSaveResponse>;
  using CommitResult = absl::StatusOr<v1::CommitSaveResponse>;

  std::future<BeginResult> Begin(const std::string& job, int64_t step, int rank,
                                 int world,
                                 std::optional<v1::LocalSavePlan> plan,
                                 std::string fingerprint = "",
                                 uint64_t incarnation = 0) {
    v1::BeginSaveRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_incarnation(incarnation);
    if (plan) {
      *req.mutable_local_plan() = *plan;
    } else {
      req.set_plan_fingerprint(fingerprint);
    }
    auto promise = std::make_shared<std::promise<BeginResult>>();
    coordinator_->BeginSave(
        req, [promise](BeginResult r) { promise->set_value(std::move(r)); });
    return promise->get_future();
  }

  // Writes every planned item of `plan` with deterministic bytes; returns the
  // commit request with their crc32c.
  v1::CommitSaveRequest Write(const std::string& job, int64_t step, int rank,
                              const v1::BeginSaveResponse& plan) {
    auto store = storage::OpenShardStore(plan.storage_uri());
    EXPECT_TRUE(store.ok());
    v1::CommitSaveRequest commit;
    commit.set_job(job);
    commit.set_step(step);
    commit.set_rank(rank);
    std::map<std::string, std::string> objects;
    for (const v1::PlannedWrite& w : plan.rank_plan().writes()) {
      std::string& obj = objects[w.location().object_key()];
      std::string bytes(w.location().length(),
                        static_cast<char>('a' + (w.location().offset() % 26)));
      obj.resize(std::max<size_t>(obj.size(), w.location().offset()));
      obj.replace(w.location().offset(), bytes.size(), bytes);
      v1::WriteResult* r = commit.add_results();
      *r->mutable_location() = w.location();
      r->set_crc32c(storage::Crc32c(bytes));
    }
    for (const auto& [key, data] : objects) {
      EXPECT_TRUE((*store)
                      ->Put(absl::StrCat(plan.step_prefix(), key),
                            absl::MakeConstSpan(data.data(), data.size()))
                      .ok());
    }
    return commit;
  }

  std::future<CommitResult> Commit(const v1::CommitSaveRequest& req) {
    auto promise = std::make_shared<std::promise<CommitResult>>();
    coordinator_->CommitSave(
        req, [promise](CommitResult r) { promise->set_value(std::move(r)); });
    return promise->get_future();
  }

  // A whole save by `world` ranks; returns each rank's BeginSave answer.
  std::vector<v1::BeginSaveResponse> Save(const std::string& job, int64_t step,
                                          int world, int64_t rows = 8) {
    std::vector<std::future<BeginResult>> begins;
    for (int r = 0; r < world; ++r) {
      begins.push_back(Begin(job, step, r, world, RankPlan(r, world, rows)));
    }
    std::vector<v1::BeginSaveResponse> plans;
    for (auto& f : begins) {
      BeginResult b = f.get();
      EXPECT_TRUE(b.ok()) << b.status();
      plans.push_back(*b);
    }
    std::vector<std::future<CommitResult>> commits;
    for (int r = 0; r < world; ++r) {
      commits.push_back(Commit(Write(job, step, r, plans[r])));
    }
    for (auto& f : commits) {
      CommitResult c = f.get();
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) {
        EXPECT_EQ(c->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
      }
    }
    return plans;
  }

  // PlanLoad of columns [col, col + cols) of every row of "w" (from Save's
  // 8 x 4 tensor) for `rank` of a load by `world` ranks, in a load round.
  v1::PlanLoadRequest ColumnsRequest(int rank, int64_t col, int64_t cols,
                                     int world = 2, int64_t step = 1) {
    v1::PlanLoadRequest req;
    req.set_job("job");
    if (step < 0) {
      req.set_latest(true);
    } else {
      req.set_step(step);
    }
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_verify_in_round(true);
    v1::WantedChunk* w = req.add_wanted();
    w->mutable_tensor()->set_fqn("w");
    w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    w->mutable_tensor()->add_global_shape(8);
    w->mutable_tensor()->add_global_shape(4);
    w->mutable_box()->add_offsets(0);
    w->mutable_box()->add_offsets(col);
    w->mutable_box()->add_sizes(8);
    w->mutable_box()->add_sizes(cols);
    return req;
  }
  v1::PlanLoadResponse PlanColumns(int rank, int64_t col, int64_t cols,
                                   int world = 2, int64_t step = 1) {
    auto r =
        coordinator_->PlanLoad(ColumnsRequest(rank, col, cols, world, step));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::PlanLoadResponse();
  }

  // The VerifyLoad request a client sends after reading `plan`'s partial
  // items from storage, as Checkpointer::ReadItems computes it.
  v1::VerifyLoadRequest Pieces(const v1::PlanLoadResponse& plan, int rank,
                               int world) {
    auto store = storage::OpenShardStore(plan.storage_uri());
    EXPECT_TRUE(store.ok());
    v1::VerifyLoadRequest req;
    req.set_job("job");
    req.set_step(plan.step());
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_load_round(plan.load_round());
    for (const v1::ReadItem& it : plan.reads()) {
      std::string chunk(it.source().length(), '\0');
      EXPECT_TRUE(
          (*store)
              ->Read(absl::StrCat(plan.step_prefix(), it.source().object_key()),
                     {it.source().offset(), it.source().length()},
                     absl::MakeSpan(chunk))
              .ok());
      storage::Crc32cPieces pieces;
      uint64_t needed = 0;
      for (const v1::CopySegment& s : it.segments()) {
        pieces.Add(s.src_offset(), chunk.data() + s.src_offset(), s.length());
        needed += s.length();
      }
      if (needed == it.source().length()) continue;  // checked by the rank
      v1::ChunkPiece* p = req.add_pieces();
      p->set_fqn(it.fqn());
      *p->mutable_source() = it.source();
      *p->mutable_overlap() = it.overlap();
      p->set_crc_term(pieces.Finish(it.source().length()));
    }
    return req;
  }

  using VerifyResult = absl::StatusOr<v1::VerifyLoadResponse>;
  std::future<VerifyResult> Verify(const v1::VerifyLoadRequest& req) {
    auto promise = std::make_shared<std::promise<VerifyResult>>();
    coordinator_->VerifyLoad(
        req, [promise](VerifyResult r) { promise->set_value(std::move(r)); });
    return promise->get_future();
  }

  int64_t LatestStep(const std::string& job) {
    v1::PlanLoadRequest req;
    req.set_job(job);
    req.set_latest(true);
    auto r = coordinator_->PlanLoad(req);
    return r.ok() ? r->step() : -1;
  }

  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, ReplicatedItemsAreWrittenOnceAndCommitted) {
  Start();
  std::vector<v1::BeginSaveResponse> plans = Save("job", 1, 3);
  int bias_writers = 0, rng_writers = 0, w_chunks = 0;
  for (const auto& p : plans) {
    for (const auto& w : p.rank_plan().writes()) {
      if (w.item().kind() == v1::WriteItem::KIND_BYTES) ++rng_writers;
      if (w.item().tensor().fqn() == "b") ++bias_writers;
      if (w.item().tensor().fqn() == "w") ++w_chunks;
      EXPECT_THAT(w.location().object_key(), HasSubstr("attempt-"));
      EXPECT_EQ(w.location().offset() % 4096, 0u);
    }
  }
  EXPECT_EQ(bias_writers, 1);
  EXPECT_EQ(rng_writers, 1);
  EXPECT_EQ(w_chunks, 3);
  v1::GetCheckpointRequest get;
  get.set_job("job");
  get.set_step(1);
  auto got = coordinator_->GetCheckpoint(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(got->manifest().tensors_size(), 2);
  EXPECT_EQ(got->manifest().bytes_entries_size(), 1);
  EXPECT_EQ(LatestStep("job"), 1);
}

TEST_F(CoordinatorTest, UnchangedPlansSendFingerprintsAndHitThePlanCache) {
  Start();
  std::vector<v1::BeginSaveResponse> first = Save("job", 1, 2);
  EXPECT_FALSE(first[0].plan_from_cache());
  // Step 2: both ranks send only the fingerprint they got back.
  std::vector<std::future<BeginResult>> begins;
  for (int r = 0; r < 2; ++r) {
    begins.push_back(
        Begin("job", 2, r, 2, std::nullopt, first[r].plan_fingerprint()));
  }
  std::vector<v1::BeginSaveResponse> second;
  for (auto& f : begins) {
    BeginResult b = f.get();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_FALSE(b->resend_plan());
    EXPECT_TRUE(b->plan_from_cache());
    second.push_back(*b);
  }
  std::vector<std::future<CommitResult>> commits;
  for (int r = 0; r < 2; ++r)
    commits.push_back(Commit(Write("job", 2, r, second[r])));
  for (auto& f : commits) ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(coordinator_->stats().plans_built, 1);
  EXPECT_EQ(coordinator_->stats().plans_from_cache, 1);
  // One rank changes its plan (a bigger tensor): a rebuild, not the cache.
  Save("job", 3, 2, /*rows=*/10);
  EXPECT_EQ(coordinator_->stats().plans_built, 2);
  EXPECT_EQ(LatestStep("job"), 3);
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
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("rank 0"));
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
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(CoordinatorTest, MissingRankAbortsAtTheBeginDeadline) {
  options_.begin_deadline = absl::Milliseconds(200);
  Start();
  BeginResult r = Begin("job", 4, 0, 3, RankPlan(0, 3)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("[1, 2]"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("job 'job' step 4"));
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
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("disk full on node 7"));
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
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("operator gave up"));
  }
  EXPECT_EQ(coordinator_->stats().saves_in_progress, 0);
  EXPECT_EQ(coordinator_->stats().aborts_remembered, 6);
  // A late CommitSave of an aborted save learns why.
  v1::CommitSaveRequest late;
  late.set_job("big");
  late.set_step(3);
  late.set_rank(0);
  CommitResult c = Commit(late).get();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("job 'big' step 3"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("operator gave up"));
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
    EXPECT_EQ(parked.get().status().code(), absl::StatusCode::kAborted);
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
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(a3.status().message()),
              HasSubstr("rank 0 of job 'a' step 3"));
  EXPECT_THAT(std::string(a3.status().message()), HasSubstr("2 of job 'a'"));
  auto b1 = Begin("b", 1, 0, 2, RankPlan(0, 2));
  BeginResult c1 = Begin("c", 1, 0, 2, RankPlan(0, 2)).get();
  EXPECT_EQ(c1.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c1.status().message()), HasSubstr("3 in total"));
  // Ranks of a save already in progress are never refused.
  auto a1_rank1 = Begin("a", 1, 1, 2, RankPlan(1, 2));
  ASSERT_TRUE(a1.get().ok());
  ASSERT_TRUE(a1_rank1.get().ok());
  // Freeing a slot (an abort) lets a new save in.
  v1::AbortSaveRequest abort;
  abort.set_job("a");
  abort.set_step(2);
  ASSERT_TRUE(coordinator_->AbortSave(abort).ok());
  EXPECT_EQ(a2.get().status().code(), absl::StatusCode::kAborted);
  auto a3_again = Begin("a", 3, 0, 2, RankPlan(0, 2));
  auto a3_rank1 = Begin("a", 3, 1, 2, RankPlan(1, 2));
  EXPECT_TRUE(a3_again.get().ok());
  EXPECT_TRUE(a3_rank1.get().ok());
  coordinator_.reset();  // answers b1 UNAVAILABLE
  EXPECT_EQ(b1.get().status().code(), absl::StatusCode::kUnavailable);
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
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
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

TEST_F(CoordinatorTest, LocalPlansAreBoundedPerRankAndPerSave) {
  options_.max_plan_items_per_rank = 3;
  options_.max_plan_items_per_save = 5;
  options_.max_fqn_bytes = 16;
  Start();
  v1::LocalSavePlan big = RankPlan(0, 1);
  *big.add_items() = big.items(0);
  BeginResult r = Begin("job", 1, 0, 1, big).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 0 of job 'job' step 1"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("4 items"));

  v1::LocalSavePlan long_fqn = RankPlan(0, 1);
  long_fqn.mutable_items(2)->set_bytes_fqn(std::string(100, 'f'));
  r = Begin("job", 1, 0, 1, long_fqn).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("100 bytes"));

  r = Begin("job", 1, 0, 1, std::nullopt, std::string(1 << 20, 'z')).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("fingerprint"));

  // Two ranks of 3 items each exceed 5 items per save: the second is refused.
  auto first = Begin("job", 2, 0, 2, RankPlan(0, 2));
  r = Begin("job", 2, 1, 2, RankPlan(1, 2)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 1 of job 'job' step 2"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at most 5"));
  coordinator_.reset();
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorTest, LoadRequestsAreBoundedAndLoadPlansCachedByBytes) {
  options_.max_plan_items_per_rank = 4;
  options_.max_fqn_bytes = 16;
  options_.load_plan_cache_bytes = 64;  // smaller than any answer
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse one = PlanColumns(0, 0, 4);
  PlanColumns(0, 0, 4);
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 0);

  v1::PlanLoadRequest req;
  req.set_job("job");
  req.set_step(1);
  req.set_rank(3);
  for (int i = 0; i < 5; ++i) req.add_wanted_bytes("rng");
  auto r = coordinator_->PlanLoad(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 3 loading job 'job'"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at most 4"));
  req.clear_wanted_bytes();
  req.add_wanted_bytes(std::string(1000, 'r'));
  r = coordinator_->PlanLoad(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("1000 bytes"));

  v1::VerifyLoadRequest verify;
  verify.set_job("job");
  verify.set_step(1);
  verify.set_rank(1);
  verify.set_world_size(2);
  for (int i = 0; i < 5; ++i) verify.add_pieces()->set_fqn("w");
  VerifyResult v = Verify(verify).get();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("rank 1 verifying its load of job 'job'"));
}

TEST_F(CoordinatorTest, CommitResultsMustMatchThePlan) {
  Start();
  BeginResult r = Begin("job", 1, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(r.ok());
  v1::CommitSaveRequest c = Write("job", 1, 0, *r);
  c.mutable_results(0)->mutable_location()->set_offset(12345);
  CommitResult bad = Commit(c).get();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("the plan says"));
  c.mutable_results()->RemoveLast();
  bad = Commit(c).get();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
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

TEST_F(CoordinatorTest, DeleteRefusesASaveInProgressAndRetentionKeepsNewest) {
  options_.keep_last = 2;
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  auto pending = Begin("job", 3, 0, 2, RankPlan(0, 2));  // waits for rank 1
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(3);
  EXPECT_EQ(coordinator_->DeleteCheckpoint(del).code(),
            absl::StatusCode::kFailedPrecondition);
  auto other = Begin("job", 3, 1, 2, RankPlan(1, 2));
  BeginResult p0 = pending.get(), p1 = other.get();
  ASSERT_TRUE(p0.ok() && p1.ok());
  auto c0 = Commit(Write("job", 3, 0, *p0));
  ASSERT_TRUE(Commit(Write("job", 3, 1, *p1)).get().ok());
  ASSERT_TRUE(c0.get().ok());
  v1::ListCheckpointsRequest list;
  list.set_job("job");
  auto l = coordinator_->ListCheckpoints(list);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->checkpoints_size(), 2);  // step 1 fell to retention
  EXPECT_EQ(l->checkpoints(0).step(), 2);
  EXPECT_EQ(l->checkpoints(1).step(), 3);
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(0);
  EXPECT_EQ(coordinator_->GarbageCollect(gc).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, RestartRebuildsCatalogAndRemovesIncompleteSteps) {
  Start();
  Save("job", 1, 2);
  auto b0 = Begin("job", 2, 0, 1, RankPlan(0, 1));
  BeginResult r = b0.get();
  ASSERT_TRUE(r.ok());
  Write("job", 2, 0, *r);  // written, never committed: the process "crashes"
  coordinator_.reset();
  std::filesystem::remove_all(options_.catalog_path);  // catalog lost too
  Start();
  EXPECT_EQ(LatestStep("job"), 1);
  auto store = storage::OpenShardStore(options_.storage_uri);
  ASSERT_TRUE(store.ok());
  auto incomplete = storage::ListIncompleteSteps(**store, "job");
  ASSERT_TRUE(incomplete.ok());
  EXPECT_TRUE(incomplete->empty());
}

TEST_F(CoordinatorTest, ShutdownAnswersParkedRanksUnavailable) {
  Start();
  auto parked = Begin("job", 1, 0, 2, RankPlan(0, 2));
  coordinator_->Shutdown();
  BeginResult r = parked.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorTest, IdenticalLoadPlansComeFromTheCache) {
  Start();
  Save("job", 1, 2);
  v1::PlanLoadRequest req;
  req.set_job("job");
  req.set_latest(true);
  v1::WantedChunk* w = req.add_wanted();
  w->mutable_tensor()->set_fqn("w");
  w->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  w->mutable_tensor()->add_global_shape(8);
  w->mutable_tensor()->add_global_shape(4);
  w->mutable_box()->add_offsets(2);
  w->mutable_box()->add_offsets(0);
  w->mutable_box()->add_sizes(4);
  w->mutable_box()->add_sizes(4);
  req.add_wanted_bytes("rng");
  auto a = coordinator_->PlanLoad(req);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->reads_size(), 2);  // rows 2..5 span both stored chunks
  EXPECT_EQ(a->bytes_entries_size(), 1);
  req.set_rank(5);
  auto b = coordinator_->PlanLoad(req);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  EXPECT_EQ(coordinator_->stats().load_plans_from_cache, 1);
  req.add_wanted_bytes("missing");
  auto c = coordinator_->PlanLoad(req);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'missing'"));
}

TEST_F(CoordinatorTest, ThousandRanksOfTwoJobsSaveConcurrently) {
  Start();
  constexpr int kWorld = 1024;
  std::vector<std::future<BeginResult>> begins;
  for (int r = 0; r < kWorld; ++r) {
    for (const char* job : {"a", "b"}) {
      begins.push_back(Begin(job, 7, r, kWorld, RankPlan(r, kWorld, 2048)));
    }
  }
  std::vector<std::future<CommitResult>> commits;
  for (int i = 0; i < static_cast<int>(begins.size()); ++i) {
    BeginResult b = begins[i].get();
    ASSERT_TRUE(b.ok()) << b.status();
    commits.push_back(Commit(Write(i % 2 ? "b" : "a", 7, i / 2, *b)));
  }
  for (auto& c : commits) ASSERT_TRUE(c.get().ok());
  EXPECT_EQ(LatestStep("a"), 7);
  EXPECT_EQ(LatestStep("b"), 7);
  v1::GetCheckpointRequest get;
  get.set_job("b");
  get.set_step(7);
  auto got = coordinator_->GetCheckpoint(get);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->manifest().tensors_size(), 2);
  EXPECT_EQ(got->manifest().tensors(1).chunks_size(), kWorld);  // "w"
  EXPECT_EQ(got->checkpoint().world_size(), kWorld);
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

TEST_F(CoordinatorTest, VerifyLoadCombinesThePiecesOfEveryRank) {
  Start();
  Save("job", 1, 2);  // "w" [8, 4] stored as rows 0-3 and rows 4-7
  // Two ranks load it by columns: each needs half of both stored chunks.
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  v1::VerifyLoadRequest right = Pieces(PlanColumns(1, 2, 2), 1, 2);
  ASSERT_EQ(left.pieces_size(), 2);
  ASSERT_EQ(right.pieces_size(), 2);
  auto a = Verify(left);
  // Rank 0 is parked until rank 1 reports.
  EXPECT_EQ(a.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  auto b = Verify(right);
  VerifyResult ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->verify_locally_size(), 0);
  EXPECT_EQ(rb->verify_locally_size(), 0);
  EXPECT_EQ(ra->chunks_verified(), 2);
  EXPECT_EQ(rb->chunks_verified(), 2);
  EXPECT_EQ(coordinator_->stats().load_chunks_verified, 2);
  EXPECT_EQ(coordinator_->stats().load_chunks_unverified, 0);
}

TEST_F(CoordinatorTest, VerifyLoadSendsBackPiecesItCannotVerify) {
  Start();
  Save("job", 1, 2);
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  v1::VerifyLoadRequest right = Pieces(PlanColumns(1, 2, 2), 1, 2);
  // Rank 1 read damaged bytes of the second stored chunk (rows 4-7).
  int damaged = -1;
  for (int i = 0; i < right.pieces_size(); ++i) {
    if (right.pieces(i).overlap().offsets(0) == 4) damaged = i;
  }
  ASSERT_GE(damaged, 0);
  right.mutable_pieces(damaged)->set_crc_term(right.pieces(damaged).crc_term() ^
                                              0x100);
  auto a = Verify(left);
  auto b = Verify(right);
  VerifyResult ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  // Both readers of the damaged chunk re-read it; the other chunk passed.
  ASSERT_EQ(ra->verify_locally_size(), 1);
  EXPECT_EQ(left.pieces(ra->verify_locally(0)).overlap().offsets(0), 4);
  EXPECT_THAT(rb->verify_locally(), ::testing::ElementsAre(damaged));
  EXPECT_EQ(ra->chunks_verified(), 1);
  EXPECT_EQ(rb->chunks_verified(), 1);

  // One rank loading only the left half alone covers no chunk completely.
  v1::VerifyLoadRequest alone = Pieces(PlanColumns(0, 0, 2, 1), 0, 1);
  VerifyResult rc = Verify(alone).get();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(rc->verify_locally_size(), 2);
  EXPECT_EQ(rc->chunks_verified(), 0);
}

TEST_F(CoordinatorTest, VerifyLoadRoundExpiresAtTheDeadlineAndRetriesReplace) {
  options_.load_verify_deadline = absl::Milliseconds(300);
  Start();
  Save("job", 1, 2);
  v1::VerifyLoadRequest left = Pieces(PlanColumns(0, 0, 2), 0, 2);
  PlanColumns(1, 2, 2);  // rank 1 plans, then never reports (it died)
  // A retried call replaces the first; the first is answered ABORTED.
  auto first = Verify(left);
  auto retry = Verify(left);
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kAborted);
  VerifyResult r = retry.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("ranks [1]"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("job 'job' step 1"));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("never called VerifyLoad"));
}

TEST_F(CoordinatorTest, VerifyLoadRejectsBadRequests) {
  options_.load_join_grace = absl::Hours(1);  // rank 1 plans at the end
  Start();
  Save("job", 1, 2);
  const v1::VerifyLoadRequest good = Pieces(PlanColumns(0, 0, 2), 0, 2);
  ASSERT_EQ(good.pieces_size(), 2);
  auto expect = [&](v1::VerifyLoadRequest req, absl::StatusCode code,
                    const std::string& text) {
    VerifyResult r = Verify(req).get();
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
  };
  v1::VerifyLoadRequest req = good;
  req.set_rank(2);
  expect(req, absl::StatusCode::kInvalidArgument, "out of range");
  req = good;
  req.set_step(7);
  expect(req, absl::StatusCode::kNotFound, "step 7");
  req = good;
  req.set_job("../etc");
  expect(req, absl::StatusCode::kInvalidArgument, "../etc");
  req = good;
  req.mutable_pieces(1)->mutable_source()->set_offset(12345);
  expect(req, absl::StatusCode::kInvalidArgument,
         "rank 0 verifying its load of job 'job' step 1: piece 1 of 'w'");
  req = good;
  req.mutable_pieces(0)->set_fqn("b");
  expect(req, absl::StatusCode::kInvalidArgument, "belongs to 'w'");
  req = good;
  req.mutable_pieces(0)->mutable_overlap()->set_sizes(1, 9);
  expect(req, absl::StatusCode::kInvalidArgument, "not inside the stored");
  req = good;
  req.mutable_pieces(0)->mutable_source()->set_length(3);
  expect(req, absl::StatusCode::kInvalidArgument, "length 3");
  req = good;
  req.set_load_round(0);
  expect(req, absl::StatusCode::kFailedPrecondition, "no load round");
  req = good;
  req.set_load_round(good.load_round() + 1);
  expect(req, absl::StatusCode::kNotFound, "is over");
  req = good;
  req.set_world_size(3);
  expect(req, absl::StatusCode::kInvalidArgument, "by 2 ranks");
  req = good;
  req.set_rank(1);
  expect(req, absl::StatusCode::kInvalidArgument, "did not plan");
  // Nothing was parked by the bad calls: a good round still completes.
  auto a = Verify(good);
  VerifyResult b = Verify(Pieces(PlanColumns(1, 2, 2), 1, 2)).get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->chunks_verified(), 2);
  EXPECT_TRUE(a.get().ok());
}

// `latest` is resolved once per load round: a commit landing between two
// ranks' PlanLoads does not hand them different steps.
TEST_F(CoordinatorTest, LatestIsResolvedOncePerLoadRoundWhileACommitLands) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2, /*step=*/-1);
  EXPECT_EQ(a.step(), 1);
  Save("job", 2, 2);  // commits between the ranks' PlanLoads
  ASSERT_EQ(LatestStep("job"), 2);
  v1::PlanLoadResponse b = PlanColumns(1, 2, 2, 2, /*step=*/-1);
  ASSERT_EQ(b.step(), 1);  // (a wrong step would park rank 1 alone below)
  ASSERT_EQ(b.load_round(), a.load_round());
  // Both report; the round verifies both stored chunks of step 1.
  auto va = Verify(Pieces(a, 0, 2));
  VerifyResult vb = Verify(Pieces(b, 1, 2)).get();
  ASSERT_TRUE(vb.ok()) << vb.status();
  EXPECT_EQ(vb->chunks_verified(), 2);
  ASSERT_TRUE(va.get().ok());
  // The next load is a new round: the newest step.
  EXPECT_EQ(PlanColumns(0, 0, 2, 2, /*step=*/-1).step(), 2);
}

// A retried PlanLoad (its answer was lost) gets the same round and step.
TEST_F(CoordinatorTest, RetriedPlanLoadRejoinsItsRound) {
  options_.load_join_grace = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2, -1);
  Save("job", 2, 2);
  v1::PlanLoadResponse again = PlanColumns(0, 0, 2, 2, -1);
  ASSERT_EQ(again.step(), 1);
  EXPECT_EQ(again.load_round(), a.load_round());
}

// Ranks of one load that disagree on world_size are refused at once, with
// both sizes named; the rank already waiting in VerifyLoad gets it too
// (it used to wait for the verify deadline and then be told OK).
TEST_F(CoordinatorTest, LoadRanksDisagreeingOnWorldSizeFailAtOnce) {
  options_.load_join_grace = absl::Hours(1);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 2);
  auto parked = Verify(Pieces(a, 0, 2));
  absl::StatusOr<v1::PlanLoadResponse> b =
      coordinator_->PlanLoad(ColumnsRequest(1, 2, 2, /*world=*/3));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
      << b.status();
  const std::string msg(b.status().message());
  EXPECT_THAT(msg, HasSubstr("job 'job' step 1"));
  EXPECT_THAT(msg, HasSubstr("rank 1 says world_size 3"));
  EXPECT_THAT(msg, HasSubstr("ranks [0] (1 of 2)"));
  EXPECT_THAT(msg, HasSubstr("say world_size 2"));
  ASSERT_EQ(parked.wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  VerifyResult r = parked.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("world_size 3"));
}

// A rank loading alone (its peers load later, or never) is not held for
// absent ranks: the round's membership closes after the join grace, and its
// partly read chunks, which nobody else read, are sent back to verify
// locally. The next rank forms its own round.
TEST_F(CoordinatorTest, RanksLoadingOneAfterAnotherWaitOnlyForTheGrace) {
  options_.load_join_grace = absl::Milliseconds(100);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 2);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    v1::PlanLoadResponse p = PlanColumns(rank, rank * 2, 2);
    auto v = Verify(Pieces(p, rank, 2));
    ASSERT_EQ(v.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    VerifyResult r = v.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->verify_locally_size(), 2);
    EXPECT_EQ(r->chunks_verified(), 0);
  }
}

// A report without pieces (the rank's load failed, or it read every chunk
// whole) is answered at once; a rank whose PlanLoad is refused leaves the
// round, and the others complete without it.
TEST_F(CoordinatorTest, EmptyReportsAreAnsweredAtOnceAndRefusedRanksLeave) {
  options_.load_join_grace = absl::Hours(1);
  options_.load_verify_deadline = absl::Hours(1);
  Start();
  Save("job", 1, 3);
  v1::PlanLoadResponse a = PlanColumns(0, 0, 2, 3);
  v1::PlanLoadResponse b = PlanColumns(1, 2, 2, 3);
  v1::PlanLoadRequest bad = ColumnsRequest(2, 0, 4, 3);
  bad.mutable_wanted(0)->mutable_tensor()->set_fqn("nope");
  EXPECT_EQ(coordinator_->PlanLoad(bad).status().code(),
            absl::StatusCode::kNotFound);
  v1::VerifyLoadRequest empty = Pieces(a, 0, 3);
  empty.clear_pieces();
  VerifyResult e = Verify(empty).get();  // not parked
  ASSERT_TRUE(e.ok()) << e.status();
  // Rank 2 (refused) is not a member: the round is open (grace) with ranks
  // 0 and 1; rank 2 plans again, fine this time, and completes it.
  auto vb = Verify(Pieces(b, 1, 3));
  v1::PlanLoadResponse c = PlanColumns(2, 0, 2, 3);
  EXPECT_EQ(c.load_round(), a.load_round());
  v1::VerifyLoadRequest vc = Pieces(c, 2, 3);
  vc.clear_pieces();
  ASSERT_TRUE(Verify(vc).get().ok());
  VerifyResult rb = vb.get();
  ASSERT_TRUE(rb.ok()) << rb.status();
}

// A rank that says another world size fails the whole save at once: the
// parked ranks are told why (not "never called BeginSave" after the begin
// deadline), and so is a rank of the broken save arriving later.
TEST_F(CoordinatorTest, BeginSaveWorldSizeMismatchAbortsTheSaveAtOnce) {
  options_.begin_deadline = absl::Hours(1);
  Start();
  auto r0 = Begin("job", 5, 0, 3, RankPlan(0, 3));
  BeginResult r1 = Begin("job", 5, 1, 2, RankPlan(1, 2)).get();
  ASSERT_EQ(r1.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(r1.status().message());
  EXPECT_THAT(msg, HasSubstr("job 'job' step 5"));
  EXPECT_THAT(msg, HasSubstr("rank 1 says world_size 2"));
  EXPECT_THAT(msg, HasSubstr("ranks [0] (1 of 3) say world_size 3"));
  ASSERT_EQ(r0.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  BeginResult p0 = r0.get();
  EXPECT_EQ(p0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p0.status().message()),
              HasSubstr("rank 1 says world_size 2"));
  BeginResult p2 = Begin("job", 5, 2, 3, RankPlan(2, 3)).get();
  EXPECT_EQ(p2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p2.status().message()),
              HasSubstr("rank 1 says world_size 2"));
  // Rank 0 again is a new attempt (the job was restarted, fixed).
  auto n0 = Begin("job", 5, 0, 2, RankPlan(0, 2));
  auto n1 = Begin("job", 5, 1, 2, RankPlan(1, 2));
  EXPECT_TRUE(n0.get().ok());
  EXPECT_TRUE(n1.get().ok());
}

// ---------------------------------------------------------------------------
// Crash windows between the catalog and storage (real posix store, RocksDB).

// The attempt directory of a plan ("attempt-...").
std::string AttemptOf(const v1::BeginSaveResponse& plan) {
  const std::string& key = plan.rank_plan().writes(0).location().object_key();
  return key.substr(0, key.find('/'));
}

TEST_F(CoordinatorTest, CrashAfterManifestPublishIsCommittedOnRestart) {
  UsePosix();
  Start();
  Save("job", 1, 2);
  std::vector<v1::BeginSaveResponse> plans = Save("job", 2, 2);
  auto committed = Record("job", 2);
  ASSERT_TRUE(committed.ok());
  coordinator_.reset();
  // What a SIGKILL between publishing the MANIFEST and recording the commit
  // leaves: the WRITING record PlanSession wrote and a durable MANIFEST.
  // Also a rank of another attempt that died mid-write, and that attempt's
  // object a zombie wrote after its cleanup.
  EditCatalog([&](storage::Catalog& catalog) {
    v1::CheckpointRecord writing;
    writing.set_job("job");
    writing.set_step(2);
    writing.set_state(v1::CHECKPOINT_STATE_WRITING);
    writing.set_world_size(2);
    writing.set_created_unix_micros(committed->created_unix_micros());
    writing.set_storage_uri(committed->storage_uri());
    ASSERT_TRUE(catalog.PutCheckpoint(writing).ok());
  });
  const std::string step2 = storage::StepPrefix("job", 2);
  DeadWriter(step2 + AttemptOf(plans[0]) + "/data-rank1");
  DeadWriter(step2 + "attempt-000000000bad/data-0");
  ASSERT_TRUE(Disk()
                  .Put(step2 + "attempt-000000000bad/data-1",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_EQ(TempFiles(), 2);

  Start();
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_COMMITTED)
      << v1::CheckpointState_Name(rec->state()) << " " << rec->abort_reason();
  EXPECT_EQ(rec->total_bytes(), committed->total_bytes());
  EXPECT_EQ(rec->num_tensors(), committed->num_tensors());
  EXPECT_EQ(rec->num_bytes_entries(), committed->num_bytes_entries());
  EXPECT_EQ(rec->world_size(), 2);
  EXPECT_EQ(rec->created_unix_micros(), committed->created_unix_micros());
  EXPECT_EQ(LatestStep("job"), 2);
  EXPECT_THAT(ListedSteps("job"), ::testing::ElementsAre(1, 2));
  auto keys = Disk().List(step2);
  ASSERT_TRUE(keys.ok());
  for (const std::string& k : *keys) EXPECT_THAT(k, Not(HasSubstr("bad")));
  ExpectCatalogAndStorageAgree("job");
  // Retention sees it like any other committed checkpoint.
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(1);
  auto collected = coordinator_->GarbageCollect(gc);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_THAT(collected->deleted_steps(), ::testing::ElementsAre(1));
  ExpectCatalogAndStorageAgree("job");
}

TEST_F(CoordinatorTest, RestartAbortsSavesWithoutManifestAndRemovesTheirBytes) {
  UsePosix();
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  coordinator_.reset();
  // Step 2 was in flight (written, no MANIFEST yet); step 3 had just begun:
  // its only rank died mid-write, so its directory holds only a temp file.
  ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", 2)).ok());
  DeadWriter(storage::StepPrefix("job", 3) + "attempt-000000000003/data-0");
  EditCatalog([&](storage::Catalog& catalog) {
    for (int64_t step : {2, 3}) {
      v1::CheckpointRecord writing;
      writing.set_job("job");
      writing.set_step(step);
      writing.set_state(v1::CHECKPOINT_STATE_WRITING);
      writing.set_world_size(1);
      ASSERT_TRUE(catalog.PutCheckpoint(writing).ok());
    }
  });
  Start();
  for (int64_t step : {2, 3}) {
    auto rec = Record("job", step);
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_ABORTED) << step;
    EXPECT_THAT(rec->abort_reason(), HasSubstr("restarted during the save"));
  }
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/job/0000000000000002"));
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/job/0000000000000003"));
  ExpectCatalogAndStorageAgree("job");
  EXPECT_EQ(LatestStep("job"), 1);
}

TEST_F(CoordinatorTest, RestartReconcilesRecordsAndManifestsBothWays) {
  UsePosix();
  Start();
  for (int64_t step : {1, 2, 3}) Save("job", step, 1);
  coordinator_.reset();
  // The catalog lost step 2's record (it is not empty, so no rebuild), and
  // step 3's MANIFEST is gone from storage (removed by hand).
  EditCatalog([&](storage::Catalog& catalog) {
    ASSERT_TRUE(catalog.DeleteCheckpoint("job", 2).ok());
  });
  ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", 3)).ok());
  Start();
  auto two = Record("job", 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->state(), v1::CHECKPOINT_STATE_COMMITTED);
  auto three = Record("job", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(three->abort_reason(), HasSubstr("MANIFEST was missing"));
  EXPECT_EQ(LatestStep("job"), 2);
  ExpectCatalogAndStorageAgree("job");

  // No committed record has its MANIFEST: storage not mounted, not empty.
  coordinator_.reset();
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(Disk().Delete(storage::ManifestKey("job", step)).ok());
  }
  auto refused = Coordinator::Create(options_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("is the storage mounted"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(options_.catalog_path));
}

// Kills storage at every mutation of a `cairn rm` of the newest step, and of
// a commit whose retention deletes the older one: while cairnd runs on, no
// listed checkpoint or `latest` is one that cannot load, and after a restart
// catalog and storage agree with nothing left over.
TEST_F(CoordinatorTest, CrashAtEveryStorageMutationOfADeleteOrRetention) {
  for (bool retention : {false, true}) {
    for (int64_t n = 1;; ++n) {
      SCOPED_TRACE(absl::StrCat(retention ? "retention" : "rm",
                                ", crash at mutation ", n));
      UsePosix(/*faulty=*/true);
      options_.keep_last = retention ? 1 : 0;
      Start();
      Save("job", 1, 1);
      if (!retention) Save("job", 2, 1);
      g_faults->CrashAtMutation(n);
      if (retention) {
        BeginResult b = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
        ASSERT_TRUE(b.ok()) << b.status();
        (void)Commit(Write("job", 2, 0, *b)).get();
      } else {
        v1::DeleteCheckpointRequest del;
        del.set_job("job");
        del.set_step(2);
        (void)coordinator_->DeleteCheckpoint(del);
      }
      const bool crashed = g_faults->crashed();
      // (`latest` is the newest listed step; loading it needs the storage
      // that just "died", so only the MANIFEST is checked, on the disk.)
      for (int64_t step : ListedSteps("job")) {
        auto m = storage::ReadManifest(Disk(), "job", step);
        EXPECT_TRUE(m.ok()) << "listed step " << step << ": " << m.status();
      }
      Restart();
      ExpectCatalogAndStorageAgree("job");
      if (!retention) {
        EXPECT_EQ(LatestStep("job"), 1);
      }
      if (HasFailure() || !crashed) break;  // every crash point was tried
    }
  }
}

// The first save of a job killed mid-write leaves nothing but temp files:
// no object is visible, so the job itself is not listed. Recovery must still
// find and remove them (a crash test found 64 MiB files kept forever).
TEST_F(CoordinatorTest, RestartRemovesTempFilesOfAJobWithNothingElse) {
  UsePosix();
  Start();
  DeadWriter(storage::StepPrefix("fresh", 1) + "attempt-000000000001/data-0");
  ASSERT_EQ(TempFiles(), 1);
  Restart();
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/fresh"));
  ExpectCatalogAndStorageAgree("fresh");
}

TEST_F(CoordinatorTest, GcAndCommitRemoveTempFilesAndOtherAttemptsObjects) {
  UsePosix();
  Start();
  std::vector<v1::BeginSaveResponse> plans = Save("job", 1, 2);
  const std::string step1 = storage::StepPrefix("job", 1);
  // A rank that died mid-write (its 64 MiB temp file), and a zombie of an
  // aborted attempt writing after that attempt's cleanup.
  DeadWriter(step1 + AttemptOf(plans[0]) + "/data-9");
  ASSERT_TRUE(Disk()
                  .Put(step1 + "attempt-00000000dead/data-0",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_EQ(TempFiles(), 1);
  v1::GarbageCollectRequest gc;
  gc.set_job("job");
  gc.set_keep_last(1);
  ASSERT_TRUE(coordinator_->GarbageCollect(gc).ok());
  ExpectCatalogAndStorageAgree("job");
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/" + step1 +
                                       "attempt-00000000dead"));

  // The same garbage in a step before its commit goes with the commit.
  BeginResult b = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  ASSERT_TRUE(b.ok());
  const std::string step2 = storage::StepPrefix("job", 2);
  DeadWriter(step2 + "attempt-00000000dead/data-0");
  ASSERT_TRUE(Disk()
                  .Put(step2 + "attempt-00000000dead/data-1",
                       absl::MakeConstSpan("zombie", 6))
                  .ok());
  ASSERT_TRUE(Commit(Write("job", 2, 0, *b)).get().ok());
  ExpectCatalogAndStorageAgree("job");
  EXPECT_EQ(LatestStep("job"), 2);
}

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
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job 'job' step 2 is already committed"));
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(LatestStep("job"), 2);
  ExpectCatalogAndStorageAgree("job");
}

TEST_F(CoordinatorTest,
       DeletingStepIsNeverListedLoadedOrSavedAndRestartEndsIt) {
  UsePosix(/*faulty=*/true);
  Start();
  Save("job", 1, 1);
  Save("job", 2, 1);
  // The data of step 2 cannot be deleted: `cairn rm` fails half-way.
  storage::FaultRule rule;
  rule.ops = storage::kFaultDelete;
  rule.key_contains = "0000000000000002/";
  rule.count = -1;
  rule.status = absl::UnavailableError("disk went away");
  g_faults->AddRule(rule);
  v1::DeleteCheckpointRequest del;
  del.set_job("job");
  del.set_step(2);
  absl::Status s = coordinator_->DeleteCheckpoint(del);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk went away"));
  auto rec = Record("job", 2);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->state(), v1::CHECKPOINT_STATE_DELETING);
  EXPECT_THAT(ListedSteps("job"), ::testing::ElementsAre(1));
  EXPECT_EQ(LatestStep("job"), 1);
  v1::PlanLoadRequest load;
  load.set_job("job");
  load.set_step(2);
  EXPECT_EQ(coordinator_->PlanLoad(load).status().code(),
            absl::StatusCode::kFailedPrecondition);
  BeginResult again = Begin("job", 2, 0, 1, RankPlan(0, 1)).get();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("job 'job' step 2 is being deleted"));
  // A restart finishes the deletion.
  Restart();
  EXPECT_EQ(Record("job", 2).status().code(), absl::StatusCode::kNotFound);
  ExpectCatalogAndStorageAgree("job");
}

// ---------------------------------------------------------------------------
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
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(aborted.status().message()),
              HasSubstr("save of job 'job' step 7 aborted: rank 1 restarted "
                        "during the save"));
  // The old rank-1 process is refused in whatever follows.
  v1::CommitSaveRequest stale = Write("job", 7, 1, *r1);
  stale.set_incarnation(kRank1);
  // Rank 0 saves again (same process) and joins the new attempt.
  auto b0_again = Begin("job", 7, 0, 2, RankPlan(0, 2), "", kRank0);
  BeginResult n0 = b0_again.get(), n1 = b1_again.get();
  ASSERT_TRUE(n0.ok() && n1.ok()) << n0.status() << n1.status();
  EXPECT_NE(AttemptOf(*n0), AttemptOf(*r0));
  CommitResult old = Commit(stale).get();
  EXPECT_EQ(old.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(old.status().message()),
              HasSubstr("rank 1 of job 'job' step 7: this process"));
  v1::AbortSaveRequest stale_abort;
  stale_abort.set_job("job");
  stale_abort.set_step(7);
  stale_abort.set_rank(1);
  stale_abort.set_incarnation(kRank1);
  stale_abort.set_reason("its CommitSave failed");
  EXPECT_EQ(coordinator_->AbortSave(stale_abort).code(),
            absl::StatusCode::kFailedPrecondition);
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
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(first.status().message()),
              HasSubstr("rank 0 called BeginSave again after reporting its "
                        "writes"));
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
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("rank 0 committed twice with different checksums"));
  EXPECT_EQ(p0.get().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(LatestStep("job"), -1);
}

}  // namespace
}  // namespace cairn::coordinator
