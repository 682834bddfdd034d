#include "client/checkpointer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/checkpoint_info_proto.h"
#include "common/crash_point.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "planner/plan_cache.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "protocol/load_protocol.h"
#include "protocol/save_protocol.h"
#include "storage/checkpoint_layout.h"

namespace cairn::client {
namespace {

// The protocol's PartialChunkCheck for the public option.
protocol::PartialChunkCheck ToProtocol(PartialChunkCheck check) {
  switch (check) {
    case PartialChunkCheck::kCollective:
      return protocol::PartialChunkCheck::kCollective;
    case PartialChunkCheck::kReadWhole:
      return protocol::PartialChunkCheck::kReadWhole;
    case PartialChunkCheck::kNone:
      return protocol::PartialChunkCheck::kNone;
  }
  return protocol::PartialChunkCheck::kCollective;
}

}  // namespace

// Everything behind the public Checkpointer (which holds only this).
class Checkpointer::Impl {
 public:
  explicit Impl(const CheckpointerOptions& options) : options_(options) {}

  absl::Status Connect();
  absl::StatusOr<v1::CheckpointRecord> Save(int64_t step,
                                            const StateDict& state);
  absl::StatusOr<int64_t> Load(LoadRef ref, StateDict& state);
  absl::StatusOr<std::vector<CheckpointInfo>> List(bool include_uncommitted);
  absl::StatusOr<int64_t> LatestStep();
  absl::StatusOr<CheckpointSummary> Describe(int64_t step);
  void Cancel() { cancel_.Cancel(); }

  uint64_t incarnation() const { return protocol_->incarnation(); }
  const TransferStats& last_stats() const { return stats_; }
  const CheckpointerOptions& options() const { return options_; }

 private:
  // CANCELLED: "<where>: cancelled (Checkpointer::Cancel)".
  absl::Status Cancelled(absl::string_view where) const {
    return absl::CancelledError(
        absl::StrCat(where, ": ", cancel_.status().message()));
  }

  // Thread-safe (Cancel() may come from any thread). Set by Cancel(),
  // consumed (Reset) when a Save or Load returns; the save and load
  // protocols check it and register their calls with it.
  protocol::Cancellation cancel_{"cancelled (Checkpointer::Cancel)"};

  // Constant after construction.
  const CheckpointerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  // Whether cairnd has answered on channel_ (see CallWithRetry).
  std::unique_ptr<protocol::CoordinatorContact> contact_;
  std::unique_ptr<ThreadPool> io_pool_;
  std::unique_ptr<protocol::SaveProtocol> protocol_;
  // Loads through the save protocol's store, so a "mem://" store saved to
  // is the one loaded from.
  std::unique_ptr<protocol::LoadProtocol> load_;

  TransferStats stats_;
};

absl::Status Checkpointer::Impl::Connect() {
  const CheckpointerOptions& options = options_;
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(options.job));
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", options.job, "': rank ", options.rank,
                     " is out of range for world_size ", options.world_size));
  }
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("cairnd address is required");
  }
  CAIRN_ASSIGN_OR_RETURN(channel_, protocol::NewCoordinatorChannel(
                                       options.coordinator, options.security));
  stub_ = v1::Coordinator::NewStub(channel_);
  contact_ = std::make_unique<protocol::CoordinatorContact>(
      channel_, options.coordinator, options.first_contact_timeout);
  protocol::SaveProtocolOptions p;
  p.job = options.job;
  p.rank = options.rank;
  p.world_size = options.world_size;
  p.collective_timeout = options.collective_timeout;
  p.rpc_timeout = options.rpc_timeout;
  p.max_retries = options.max_retries;
  p.contact = contact_.get();
  p.store = options.store;
  p.cancellation = &cancel_;
  protocol_ = std::make_unique<protocol::SaveProtocol>(stub_.get(), p);
  protocol::LoadProtocolOptions l;
  l.job = options.job;
  l.rank = options.rank;
  l.world_size = options.world_size;
  l.collective_timeout = options.collective_timeout;
  l.rpc_timeout = options.rpc_timeout;
  l.max_retries = options.max_retries;
  l.contact = contact_.get();
  l.partial_chunk_check = ToProtocol(options.partial_chunk_check);
  l.store = options.store;
  l.store_for = [this](const std::string& uri) {
    return protocol_->StoreFor(uri);
  };
  l.cancellation = &cancel_;
  l.after_plan_load_for_test = options.after_plan_load_for_test;
  load_ = std::make_unique<protocol::LoadProtocol>(stub_.get(), l);
  io_pool_ = std::make_unique<ThreadPool>(std::max(1, options.io_threads));
  return absl::OkStatus();
}

using protocol::CallWithRetry;

absl::StatusOr<v1::CheckpointRecord> Checkpointer::Impl::Save(
    int64_t step, const StateDict& state) {
  stats_ = TransferStats();
  // A Cancel() is consumed by the Save or Load it cancelled (or that ran
  // when it came), whatever that call returns.
  absl::Cleanup consume_cancel = [this] { cancel_.Reset(); };
  const std::string where = absl::StrCat(
      "rank ", options_.rank, " saving job '", options_.job, "' step ", step);
  if (cancel_.cancelled()) return Cancelled(where);
  CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
  const absl::Time t0 = absl::Now();
  absl::StatusOr<planner::LocalSavePlan> local =
      state.ToLocalPlan(options_.rank);
  if (!local.ok()) {
    return absl::Status(local.status().code(),
                        absl::StrCat(where, ": ", local.status().message()));
  }
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<protocol::PlannedSave> save,
                         protocol_->Begin(step, *local));
  stats_.sent_fingerprint_only = save->sent_fingerprint_only();
  stats_.plan_from_cache = save->plan().plan_from_cache();
  if (options_.before_commit_for_test) {
    save->SetBeforeCommitForTest(options_.before_commit_for_test);
  }
  const absl::Time t1 = absl::Now();
  stats_.plan_time = t1 - t0;

  // Where each planned item's bytes are in this process.
  protocol::ItemSources sources;
  for (const TensorShard& t : state.tensors()) {
    for (const TensorChunk& c : t.chunks)
      sources.AddChunk(t.fqn, c.box, c.data);
  }
  for (const BytesEntry& b : state.bytes()) {
    sources.AddBytes(b.fqn,
                     absl::Span<const char>(b.blob->data(), b.blob->size()));
  }
  stats_.bytes = save->planned_bytes();
  stats_.bytes_storage = stats_.bytes;
  stats_.items = save->plan().rank_plan().writes_size();
  absl::Status written = save->WriteAll(sources, *io_pool_);
  const absl::Time t2 = absl::Now();
  stats_.io_time = t2 - t1;
  if (!written.ok()) return save->Abort(written);
  absl::StatusOr<v1::CheckpointRecord> record = save->Commit();
  if (!record.ok() && !cancel_.cancelled()) {
    // Refused (bad results, another process took this rank's place) or not
    // answered in time: the save must not linger in cairnd until its commit
    // deadline. cairnd ignores this if the save is already gone or started
    // over without this process. cairnd's answer already names the cause
    // (and its code, e.g. DEADLINE_EXCEEDED, is what callers act on).
    (void)save->Abort(record.status());
    return record.status();
  }
  // Cancelled: Commit aborted the save (or returned the committed record).
  if (!record.ok()) return record.status();
  stats_.commit_time = absl::Now() - t2;
  return record;
}

absl::StatusOr<int64_t> Checkpointer::Impl::Load(LoadRef ref,
                                                 StateDict& state) {
  stats_ = TransferStats();
  // A Cancel() is consumed by the Save or Load it cancelled (or that ran
  // when it came), whatever that call returns.
  absl::Cleanup consume_cancel = [this] { cancel_.Reset(); };
  const std::optional<int64_t> step =
      ref.latest() ? std::nullopt : std::optional<int64_t>(ref.step());
  if (cancel_.cancelled()) return Cancelled(load_->Where(step));
  if (absl::Status s = state.CheckLoadable(); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(load_->Where(step), ": ", s.message()));
  }
  // Where each wanted chunk's bytes go: the state's buffers (StateDict
  // checked them as LoadDestinations does, so adding them cannot fail).
  protocol::LoadDestinations dests;
  for (const TensorShard& t : state.tensors()) {
    std::vector<protocol::ChunkDestination> chunks;
    chunks.reserve(t.chunks.size());
    for (const TensorChunk& c : t.chunks) chunks.push_back({c.box, c.data});
    if (absl::Status s =
            dests.AddTensor(t.fqn, t.dtype, t.global_shape, std::move(chunks));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(load_->Where(step), ": ", s.message()));
    }
  }
  for (const BytesEntry& b : state.bytes()) {
    if (absl::Status s = dests.AddBytes(b.fqn, b.blob); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(load_->Where(step), ": ", s.message()));
    }
  }
  absl::StatusOr<int64_t> loaded = load_->Load(step, dests, *io_pool_);
  const protocol::LoadStats& done = load_->last_stats();
  stats_.bytes = done.bytes;
  stats_.bytes_storage = done.bytes_storage;
  stats_.items = done.items;
  stats_.chunks_verified_by_cairnd = done.chunks_verified_by_cairnd;
  stats_.chunks_verified_locally = done.chunks_verified_locally;
  stats_.plan_time = done.plan_time;
  stats_.io_time = done.io_time;
  return loaded;
}

absl::StatusOr<std::vector<CheckpointInfo>> Checkpointer::Impl::List(
    bool include_uncommitted) {
  v1::ListCheckpointsRequest request;
  request.set_job(options_.job);
  request.set_include_uncommitted(include_uncommitted);
  absl::StatusOr<v1::ListCheckpointsResponse> listed = CallWithRetry(
      &v1::Coordinator::Stub::ListCheckpoints, *stub_, request,
      options_.rpc_timeout, options_.max_retries, nullptr, contact_.get());
  if (!listed.ok()) {
    return absl::Status(
        listed.status().code(),
        absl::StrCat("rank ", options_.rank,
                     " listing the checkpoints of job '", options_.job,
                     "': ", listed.status().message()));
  }
  std::vector<CheckpointInfo> out;
  out.reserve(listed->checkpoints_size());
  for (const v1::CheckpointRecord& r : listed->checkpoints()) {
    if (r.job() != options_.job) continue;
    out.push_back(CheckpointInfoFromProto(r));
  }
  return out;
}

absl::StatusOr<int64_t> Checkpointer::Impl::LatestStep() {
  // cairnd resolves `latest` (the newest COMMITTED step) with the lookup.
  v1::GetCheckpointRequest request;
  request.set_job(options_.job);
  request.set_latest(true);
  request.set_record_only(true);  // the step is all it needs
  absl::StatusOr<v1::GetCheckpointResponse> got = CallWithRetry(
      &v1::Coordinator::Stub::GetCheckpoint, *stub_, request,
      options_.rpc_timeout, options_.max_retries, nullptr, contact_.get());
  if (!got.ok()) {
    return absl::Status(
        got.status().code(),
        absl::StrCat("rank ", options_.rank,
                     " asking for the latest committed step of job '",
                     options_.job, "': ", got.status().message()));
  }
  return got->checkpoint().step();
}

absl::StatusOr<CheckpointSummary> Checkpointer::Impl::Describe(int64_t step) {
  const std::string what =
      absl::StrCat("rank ", options_.rank, " describing job '", options_.job,
                   "' step ", step);
  if (absl::Status s = storage::ValidateStep(step); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  v1::GetCheckpointRequest request;
  request.set_job(options_.job);
  request.set_step(step);
  absl::StatusOr<v1::GetCheckpointResponse> got = CallWithRetry(
      &v1::Coordinator::Stub::GetCheckpoint, *stub_, request,
      options_.rpc_timeout, options_.max_retries, nullptr, contact_.get());
  if (!got.ok()) {
    return absl::Status(got.status().code(),
                        absl::StrCat(what, ": ", got.status().message()));
  }
  if (got->checkpoint().state() != v1::CHECKPOINT_STATE_COMMITTED) {
    const CheckpointState state =
        CheckpointStateFromProto(got->checkpoint().state());
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": it is ", CheckpointStateName(state),
        got->checkpoint().abort_reason().empty()
            ? std::string()
            : absl::StrCat(" (", got->checkpoint().abort_reason(), ")"),
        ", not committed: it has no manifest to describe"));
  }
  absl::StatusOr<CheckpointSummary> summary =
      SummaryFromProto(got->checkpoint(), got->manifest());
  if (!summary.ok()) {
    return absl::Status(summary.status().code(),
                        absl::StrCat(what, ": ", summary.status().message()));
  }
  return summary;
}

// ---------------------------------------------------------------------------
// Checkpointer: the public face, forwarding to Impl.

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

Checkpointer::~Checkpointer() = default;

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Connect(
    const CheckpointerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CAIRN_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

absl::StatusOr<CheckpointInfo> Checkpointer::Save(int64_t step,
                                                  const StateDict& state) {
  CAIRN_ASSIGN_OR_RETURN(v1::CheckpointRecord record, impl_->Save(step, state));
  return CheckpointInfoFromProto(record);
}

absl::StatusOr<int64_t> Checkpointer::Load(LoadRef ref, StateDict& state) {
  return impl_->Load(ref, state);
}

absl::StatusOr<std::vector<CheckpointInfo>> Checkpointer::List(
    bool include_uncommitted) {
  return impl_->List(include_uncommitted);
}

absl::StatusOr<int64_t> Checkpointer::LatestStep() {
  return impl_->LatestStep();
}

absl::StatusOr<CheckpointSummary> Checkpointer::Describe(int64_t step) {
  return impl_->Describe(step);
}

void Checkpointer::Cancel() { impl_->Cancel(); }

uint64_t Checkpointer::incarnation() const { return impl_->incarnation(); }

const TransferStats& Checkpointer::last_stats() const {
  return impl_->last_stats();
}

const CheckpointerOptions& Checkpointer::options() const {
  return impl_->options();
}

}  // namespace cairn::client
