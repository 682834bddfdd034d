// The coordinator facade: creation, shutdown, the reaper of deadlines,
// statistics and the catalog queries. The protocols live beside it:
// coordinator_save.cc, coordinator_load.cc, coordinator_retention.cc,
// recovery.cc.

#include "server/coordinator/coordinator.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/bounded_queue.h"
#include "common/crash_point.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "planner/box.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/coordinator_internal.h"
#include "server/coordinator/load_verifier.h"
#include "server/coordinator/recovery.h"
#include "server/coordinator/request_bounds.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  if (options.storage_uri.empty()) {
    return absl::InvalidArgumentError("coordinator: storage URI is required");
  }
  if (options.catalog_path.empty()) {
    return absl::InvalidArgumentError("coordinator: catalog path is required");
  }
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator: keep_last must be >= 0, got ", options.keep_last));
  }
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardStore> store,
                         storage::OpenShardStore(options.storage_uri));
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::Catalog> catalog,
                         storage::Catalog::Open(options.catalog_path));
  // One cairnd per storage: taken before recovery deletes anything.
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardStore> lease_store,
                         storage::OpenShardStore(store->uri()));
  storage::LeaseOptions lease_options;
  lease_options.role = "cairnd";
  lease_options.detail = absl::StrCat("catalog ", options.catalog_path);
  lease_options.ttl = options.storage_lease_ttl;
  lease_options.wait = options.storage_lease_wait;
  lease_options.on_lost = options.on_storage_lease_lost;
  CAIRN_ASSIGN_OR_RETURN(
      std::unique_ptr<storage::StorageLease> lease,
      storage::StorageLease::Acquire(*lease_store, std::move(lease_options)));
  // The manifests of memory checkpoints: beside the catalog (whose lock
  // keeps a second cairnd out), durable like storage.
  const std::string memory_path = options.memory_manifest_path.empty()
                                      ? options.catalog_path + "-memory"
                                      : options.memory_manifest_path;
  CAIRN_ASSIGN_OR_RETURN(
      std::unique_ptr<storage::ShardStore> memory_store,
      storage::OpenShardStore(absl::StrCat("file://", memory_path)));
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(store), std::move(catalog)));
  c->lease_store_ = std::move(lease_store);
  c->lease_ = std::move(lease);
  c->memory_store_ = std::move(memory_store);
  RecoveryOptions recovery{options.catalog_path,
                           options.clean_incomplete_on_start};
  recovery.lease = c->lease_.get();
  recovery.memory_store = c->memory_store_.get();
  CAIRN_RETURN_IF_ERROR(Recover(*c->store_, *c->catalog_, recovery));
  CAIRN_ASSIGN_OR_RETURN(
      c->agents_, AgentRegistry::Open(c->catalog_.get(), options.max_agents));
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options,
                         std::unique_ptr<storage::ShardStore> store,
                         std::unique_ptr<storage::Catalog> catalog)
    : options_(options),
      store_(std::move(store)),
      catalog_(std::move(catalog)),
      holdings_(options.holdings_lease, absl::Now()),
      storage_settings_(
          absl::StrCat(store_->uri(), "|align=", options.save_plan.alignment,
                       "|prefix=", options.save_plan.object_prefix)),
      plan_cache_(options.plan_cache_bytes),
      manifests_(options.load_index_cache_bytes),
      load_plans_(options.load_plan_cache_bytes),
      load_layouts_seen_(kLoadLayoutsSeenBytes),
      // Round ids differ across restarts, so a report for a round of the
      // previous process never lands in a new one.
      load_rounds_(
          [&options] {
            LoadRounds::Options o;
            o.join_grace = options.load_join_grace;
            o.verify_deadline = options.load_verify_deadline;
            o.combine_threads = std::max(options.worker_threads, 1);
            o.max_rounds_per_job = options.max_load_rounds_per_job;
            o.max_rounds = options.max_load_rounds;
            return o;
          }(),
          absl::Uniform<uint64_t>(absl::BitGen(), 1, uint64_t{1} << 62),
          [this](std::function<void()> work) {
            workers_->Schedule(std::move(work));
          }),
      known_plans_(options.known_plan_cache_bytes),
      workers_(std::make_unique<ThreadPool>(options.worker_threads)) {
  RegisterMetrics();
  reaper_ = std::thread([this] { ReaperLoop(); });
}

Coordinator::~Coordinator() {
  Shutdown();
  if (reaper_.joinable()) reaper_.join();
  workers_.reset();  // drains pending work while members are alive
  lease_.reset();    // released once nothing can change the storage
}

void Coordinator::SetServingAddress(std::string address) {
  if (lease_ != nullptr) lease_->SetAddress(std::move(address));
}

absl::Status Coordinator::CheckStorageLease(absl::string_view what) const {
  if (lease_ == nullptr) return absl::OkStatus();
  absl::Status s = lease_->Check();
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": refused: ", s.message()));
}

void Coordinator::Shutdown() {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    stopping_ = true;
    std::vector<std::shared_ptr<SaveSession>> live;
    for (auto& [key, s] : sessions_) live.push_back(s);
    for (auto& s : live) {
      // A commit under way finishes (the destructor drains the workers):
      // aborting it could delete objects a published MANIFEST names.
      if (s->phase() == Phase::kCommitting) continue;
      AbortSessionLocked(s,
                         absl::UnavailableError(absl::StrCat(
                             "cairnd is shutting down; restart the save of ",
                             SaveName(s->job(), s->step()))),
                         &answers);
    }
  }
  for (auto& a : answers) a();
  load_rounds_.Shutdown();
}

int Coordinator::BeginSaveCallsGoneForTest() const {
  absl::MutexLock lock(&mu_);
  int gone = 0;
  for (const auto& [key, s] : sessions_) gone += s->CallsGone();
  return gone;
}

Coordinator::Stats Coordinator::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.saves_in_progress = static_cast<int64_t>(sessions_.size());
  stats.aborts_remembered = static_cast<int64_t>(tombstones_.size());
  const LoadRounds::Stats rounds = load_rounds_.stats();
  stats.load_reports = rounds.reports;
  stats.load_chunks_verified = rounds.chunks_verified;
  stats.load_chunks_unverified = rounds.chunks_unverified;
  return stats;
}

void Coordinator::ReaperLoop() {
  absl::Time tended = absl::Now();
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    mu_.AwaitWithTimeout(absl::Condition(&shutting_down_),
                         absl::Milliseconds(50));
    if (shutting_down_) break;
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<SaveSession>> expired;
    std::vector<std::function<void()>> answers;
    for (auto& [key, s] : sessions_) {
      if (!s->Expired(now)) continue;
      // Ranks whose processes have gone are not waiting: the deadline counts
      // from the earliest rank still there.
      for (auto& [r, done] : s->WithdrawDeparted()) {
        answers.push_back([done = std::move(done)] {
          done(absl::CancelledError("the BeginSave call was cancelled"));
        });
      }
      if (s->Expired(now)) expired.push_back(s);
    }
    for (auto& s : expired) {
      AbortSessionLocked(
          s,
          s->DeadlineStatus(options_.begin_deadline, options_.commit_deadline),
          &answers);
    }
    mu_.Unlock();
    for (auto& a : answers) a();
    load_rounds_.Advance(now);
    if (now - tended >= absl::Seconds(1)) {
      tended = now;
      TendMemoryCheckpoints();
    }
    mu_.Lock();
  }
}

// ---------------------------------------------------------------------------
// Load and catalog queries

absl::StatusOr<std::shared_ptr<const Coordinator::LoadedCheckpoint>>
Coordinator::LoadCheckpoint(const std::string& job, int64_t step) {
  const SaveKey key{job, step};
  if (auto hit = manifests_.Lookup(key)) return hit;
  // Every rank of a load round asks at once: one builds, the others wait for
  // it (two workers building the same index cost twice the CPU and held two
  // copies at the peak).
  std::shared_ptr<LoadingCheckpoint> loading;
  bool build = false;
  {
    absl::MutexLock lock(&loading_mu_);
    std::shared_ptr<LoadingCheckpoint>& slot = loading_[key];
    if (slot == nullptr) {
      slot = std::make_shared<LoadingCheckpoint>();
      build = true;
    }
    loading = slot;
  }
  if (!build) {
    loading->done.WaitForNotification();
    return loading->result;
  }
  // A build that finished between the lookup above and taking the slot.
  if (auto hit = manifests_.Lookup(key)) {
    loading->result = std::move(hit);
  } else {
    const absl::Time start = absl::Now();
    loading->result = BuildLoadedCheckpoint(job, step);
    if (loading->result.ok()) {
      const size_t bytes = (*loading->result)->MemoryBytes();
      manifests_.Insert(key, *loading->result, bytes);
      // The first PlanLoad of a step waits for this; at thousands of ranks
      // it is seconds, so say what it was.
      const planner::LoadPlanner& p = *(*loading->result)->planner;
      CAIRN_LOG(info,
                "job '{}' step {}: checkpoint loaded for planning: {} tensors, "
                "{} stored chunks, {} tilings, {:.0f} MiB, {:.2f} s",
                job, step, p.num_tensors(), p.num_chunk_ids(), p.num_indexes(),
                static_cast<double>(bytes) / (1 << 20),
                absl::ToDoubleSeconds(absl::Now() - start));
      if (bytes > options_.load_index_cache_bytes) {
        CAIRN_LOG(warn,
                  "job '{}' step {}: its load index takes {} MiB, more than "
                  "--load-index-cache-mib {}: it is not kept, and every "
                  "PlanLoad round of the step builds it again",
                  job, step, (bytes >> 20) + 1,
                  options_.load_index_cache_bytes >> 20);
      }
    }
  }
  {
    absl::MutexLock lock(&loading_mu_);
    loading_.erase(key);
  }
  loading->done.Notify();
  return loading->result;
}

namespace {

// Converted tensors on their way from the manifest's reader (decoding,
// checking and converting the next tensors) to the planner's builder
// (indexing the previous ones) on a thread of its own, at most this many at
// once: enough to smooth tensors of different sizes, few enough to stay
// small (the largest tensor of a 16k-rank checkpoint is ~1 MB of chunks).
constexpr size_t kMaxPendingTensors = 16;

}  // namespace

absl::StatusOr<std::shared_ptr<const Coordinator::LoadedCheckpoint>>
Coordinator::BuildLoadedCheckpoint(const std::string& job, int64_t step) {
  auto loaded = std::make_shared<LoadedCheckpoint>();
  // Tensor by tensor, the manifest's bytes read through a window: neither
  // the parsed manifest (~300 bytes a stored chunk) nor its bytes (~75) are
  // ever whole in memory beside the planner (~70).
  // Chunks name their objects by index into the manifest's object list (the
  // validator looked each key up already): no key is copied or hashed per
  // chunk.
  std::optional<planner::LoadPlanner::Builder> builder;
  auto objects_of = [](const v1::Manifest& header) {
    return std::vector<std::string>(header.objects().begin(),
                                    header.objects().end());
  };
  // This thread reads, checks and converts; the builder adds on a thread of
  // its own (started with the first tensor, when the object list is known):
  // at 16k ranks each side is seconds of CPU, and the load round's ranks
  // wait for both.
  BoundedQueue<planner::StoredTensorByIndex> handoff(kMaxPendingTensors);
  TaskGroup::Options building_options;
  building_options.thread_per_task = true;
  TaskGroup building(building_options);
  auto build = [&]() -> absl::Status {
    while (std::optional<planner::StoredTensorByIndex> t = handoff.Pop()) {
      if (absl::Status added = builder->Add(*std::move(t)); !added.ok()) {
        handoff.Stop();
        return added;
      }
    }
    return absl::OkStatus();
  };
  CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * manifest_store,
                         ManifestStoreOf(job, step));
  absl::StatusOr<storage::ManifestSummary> manifest =
      storage::ReadManifestByTensor(
          *manifest_store, job, step,
          [&](const storage::TensorOfManifest& t) -> absl::Status {
            // A build takes seconds at thousands of ranks: shutdown does
            // not wait for it.
            if (stopping_.load(std::memory_order_relaxed)) {
              return absl::UnavailableError(
                  absl::StrCat("cairnd is shutting down; the load of job '",
                               job, "' step ", step, " was not planned"));
            }
            if (!builder.has_value()) {
              builder.emplace(objects_of(t.header));
              building.Run(build);
            }
            CAIRN_ASSIGN_OR_RETURN(planner::StoredTensorByIndex tensor,
                                   convert::StoredTensorByIndexFromProto(
                                       t.tensor, t.chunk_objects));
            // A refusal is the builder's error, which Wait() returns below.
            if (!handoff.Push(std::move(tensor))) {
              return absl::AbortedError("the planner's builder stopped");
            }
            return absl::OkStatus();
          });
  handoff.Close();
  // The builder's error first: when it stopped, the read only saw a refusal.
  CAIRN_RETURN_IF_ERROR(building.Wait());
  CAIRN_RETURN_IF_ERROR(manifest.status());
  if (!builder.has_value()) builder.emplace(objects_of(manifest->header));
  loaded->bytes_entries.assign(
      std::make_move_iterator(
          manifest->header.mutable_bytes_entries()->begin()),
      std::make_move_iterator(manifest->header.mutable_bytes_entries()->end()));
  for (int i = 0; i < static_cast<int>(loaded->bytes_entries.size()); ++i) {
    loaded->bytes_index[loaded->bytes_entries[i].fqn()] = i;
  }
  loaded->planner = std::move(*builder).Finish();
  loaded->tensors_digest =
      convert::TensorsDigestOf(*loaded->planner, &loaded->tensors_by_fqn);
  {
    absl::MutexLock lock(&mu_);
    ++stats_.manifests_loaded;
  }
  m_.load_indexes_built->Increment();
  return std::shared_ptr<const LoadedCheckpoint>(std::move(loaded));
}

size_t Coordinator::LoadedCheckpoint::MemoryBytes() const {
  size_t bytes = sizeof(*this) + planner->MemoryBytes() +
                 tensors_by_fqn.capacity() * sizeof(int) +
                 tensors_digest.capacity() +
                 bytes_index.capacity() * (sizeof(std::string) + sizeof(int));
  for (const v1::ManifestBytes& b : bytes_entries) {
    bytes += b.SpaceUsedLong() + b.fqn().size();  // the fqn again, the key
  }
  return bytes;
}

void Coordinator::PrepareLoad(const std::string& job, int64_t step) {
  if (stopping_.load(std::memory_order_relaxed)) return;
  // A job that restarts loads its newest checkpoint: the older ones leave
  // memory (a load of one builds it again).
  manifests_.EraseIf(
      [&](const SaveKey& k) { return k.first == job && k.second < step; });
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> loaded =
      LoadCheckpoint(job, step);
  if (!loaded.ok()) {
    if (!stopping_.load(std::memory_order_relaxed)) {
      CAIRN_LOG(warn,
                "job '{}' step {}: preparing its load index after the commit "
                "failed ({}); the first PlanLoad of it builds it",
                job, step, loaded.status().ToString());
    }
    return;
  }
  m_.load_indexes_prepared->Increment();
  absl::MutexLock lock(&mu_);
  ++stats_.loads_prepared;
}

absl::StatusOr<v1::ListCheckpointsResponse> Coordinator::ListCheckpoints(
    const v1::ListCheckpointsRequest& request) {
  if (!request.job().empty()) {
    CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  }
  CAIRN_ASSIGN_OR_RETURN(
      std::vector<v1::CheckpointRecord> records,
      catalog_->ListCheckpoints(request.job(), request.include_uncommitted()));
  SettleHoldings(records);
  const absl::Time now = absl::Now();
  v1::ListCheckpointsResponse resp;
  for (v1::CheckpointRecord& r : records) {
    AnnotateRecord(&r, now);
    *resp.add_checkpoints() = std::move(r);
  }
  return resp;
}

absl::StatusOr<v1::GetCheckpointResponse> Coordinator::GetCheckpoint(
    const v1::GetCheckpointRequest& request) {
  const std::string& job = request.job();
  if (request.ref_case() != v1::GetCheckpointRequest::kLatest) {
    CAIRN_RETURN_IF_ERROR(ValidateJobStep(job, request.step()));
    return GetCheckpointOfStep(job, request.step(), !request.record_only());
  }
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
  if (!request.latest()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetCheckpoint of job '", job,
                     "': latest must be true (or give a step)"));
  }
  // The newest COMMITTED record (the catalog skips WRITING, ABORTED and
  // DELETING ones). A deletion may start between resolving and reading the
  // manifest: then the next newest is resolved again.
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::CheckpointRecord> newest = NewestRestorable(job);
    CAIRN_RETURN_IF_ERROR(newest.status());
    absl::StatusOr<v1::GetCheckpointResponse> got =
        GetCheckpointOfStep(job, newest->step(), !request.record_only());
    if (attempt < 3 &&
        (!got.ok() || (!request.record_only() && !got->has_manifest()))) {
      absl::StatusOr<v1::CheckpointRecord> now =
          catalog_->GetCheckpoint(job, newest->step());
      if (!now.ok() || now->state() != v1::CHECKPOINT_STATE_COMMITTED) {
        continue;  // deleted meanwhile
      }
    }
    return got;
  }
}

absl::StatusOr<v1::GetCheckpointResponse> Coordinator::GetCheckpointOfStep(
    const std::string& job, int64_t step, bool with_manifest) {
  absl::StatusOr<v1::CheckpointRecord> rec = RecordOfStep(*catalog_, job, step);
  if (!rec.ok()) return rec.status();
  v1::GetCheckpointResponse resp;
  *resp.mutable_checkpoint() = *rec;
  if (rec->tier() == v1::TIER_MEMORY) {
    SettleHoldings({*rec});
    AnnotateRecord(resp.mutable_checkpoint(), absl::Now());
  }
  if (with_manifest && rec->state() == v1::CHECKPOINT_STATE_COMMITTED) {
    // Read from storage, not kept by cairnd: a loaded checkpoint keeps only
    // its compact planner (the manifest of a 4096-rank save is ~0.5 GB).
    CAIRN_ASSIGN_OR_RETURN(
        *resp.mutable_manifest(),
        storage::ReadManifest(ManifestStore(*rec), job, step));
  }
  return resp;
}

}  // namespace cairn::coordinator
