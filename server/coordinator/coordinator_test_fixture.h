// The test fixture of the coordinator's tests (testonly): a Coordinator
// in-process on a shared memory store ("mem://name"), a real directory, or a
// fault-injecting store over either, with helpers that play the ranks of a
// save or a load and restart cairnd.
#ifndef CAIRN_SERVER_COORDINATOR_COORDINATOR_TEST_FIXTURE_H_
#define CAIRN_SERVER_COORDINATOR_COORDINATOR_TEST_FIXTURE_H_

#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_cache.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/coordinator.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/fault_injection_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::coordinator {

// A "faulty://name" scheme: a FaultInjectionStore over mem://name whose
// rules the test programs through g_faults.
inline storage::FaultInjectionStore* g_faults = nullptr;

inline void RegisterFaultyScheme() {
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

// One fp32 tensor "w" of shape [rows, 4], split by rows over the ranks, plus
// a replicated bias "b" [4] every rank holds, plus bytes "rng" on every rank.
inline v1::LocalSavePlan RankPlan(int rank, int world, int64_t rows = 8) {
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

// The attempt directory of a plan ("attempt-...").
inline std::string AttemptOf(const v1::BeginSaveResponse& plan) {
  const std::string& key = plan.rank_plan().writes(0).location().object_key();
  return key.substr(0, key.find('/'));
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterFaultyScheme();
    const std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.storage_uri = "mem://" + name;
    options_.catalog_path = testing::MakeTempDir("coord-" + name);
    options_.worker_threads = 2;
  }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(options_.catalog_path);
    std::filesystem::remove_all(options_.catalog_path + "-memory");
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
    std::filesystem::remove_all(options_.catalog_path + "-memory");
    data_dir_ = testing::MakeTempDir("coord-" + name + "-data");
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
                                 uint64_t incarnation = 0,
                                 Coordinator::CallerGone gone = nullptr) {
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
        req, [promise](BeginResult r) { promise->set_value(std::move(r)); },
        std::move(gone));
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
  // With `previous` (answers of an earlier save), the ranks send only the
  // plan fingerprints those answers gave back.
  std::vector<v1::BeginSaveResponse> Save(
      const std::string& job, int64_t step, int world, int64_t rows = 8,
      const std::vector<v1::BeginSaveResponse>* previous = nullptr) {
    std::vector<std::future<BeginResult>> begins;
    for (int r = 0; r < world; ++r) {
      begins.push_back(
          previous == nullptr
              ? Begin(job, step, r, world, RankPlan(r, world, rows))
              : Begin(job, step, r, world, std::nullopt,
                      (*previous)[r].plan_fingerprint()));
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
  // The same answered in read columns (as libcairn asks), expanded as
  // libcairn does.
  v1::PlanLoadResponse PlanColumnsExpanded(int rank, int64_t col, int64_t cols,
                                           int world = 2, int64_t step = 1) {
    v1::PlanLoadRequest req = ColumnsRequest(rank, col, cols, world, step);
    req.set_read_columns(true);
    auto r = coordinator_->PlanLoad(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return v1::PlanLoadResponse();
    EXPECT_TRUE(r->has_read_columns());
    EXPECT_EQ(r->reads_size(), 0);
    EXPECT_TRUE(convert::ExpandReadColumns(req, &*r).ok());
    return *r;
  }

  // The VerifyLoad request a client sends after reading `plan`'s partial
  // items from storage, as protocol::LoadProtocol::ReadItems computes it.
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
      if (it.has_chunk()) {
        p->set_chunk(it.chunk());
      } else {
        p->set_fqn(it.fqn());
        *p->mutable_source() = it.source();
      }
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

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_COORDINATOR_TEST_FIXTURE_H_
