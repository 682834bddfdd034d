// The one save protocol (see save_protocol.h).
#include "protocol/save_protocol.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/crash_point.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "planner/plan_cache.h"
#include "proto/convert/plan_convert.h"
#include "protocol/coordinator_call.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::protocol {
namespace {

// The ItemSources key of a tensor chunk (a bytes entry has an empty box).
std::string SourceKey(absl::string_view fqn, const planner::ChunkBox& box) {
  return absl::StrCat(fqn, "\n", planner::BoxToString(box));
}

}  // namespace

uint64_t NewIncarnation() {
  static absl::Mutex* mu = new absl::Mutex;
  static absl::BitGen* gen = new absl::BitGen;
  absl::MutexLock lock(mu);
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(*gen);
  return id;
}

// ---------------------------------------------------------------------------
// ItemSources

void ItemSources::AddChunk(absl::string_view fqn, const planner::ChunkBox& box,
                           absl::Span<const char> data) {
  spans_[SourceKey(fqn, box)] = data;
}

void ItemSources::AddBytes(absl::string_view fqn, absl::Span<const char> data) {
  spans_[SourceKey(fqn, planner::ChunkBox())] = data;
}

absl::StatusOr<absl::Span<const char>> ItemSources::Find(
    const v1::PlannedWrite& w) const {
  const bool is_bytes = w.item().kind() == v1::WriteItem::KIND_BYTES;
  const std::string& fqn =
      is_bytes ? w.item().bytes_fqn() : w.item().tensor().fqn();
  planner::ChunkBox box;
  if (!is_bytes) {
    CAIRN_ASSIGN_OR_RETURN(box, convert::BoxFromProto(w.item().chunk(), fqn));
  }
  auto it = spans_.find(SourceKey(fqn, box));
  if (it == spans_.end() || it->second.size() != w.location().length()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cairnd planned ", ItemName(w.item()), " (", w.location().length(),
        " bytes) for this rank, which does not hold it with "
        "that length"));
  }
  return it->second;
}

// ---------------------------------------------------------------------------
// SaveProtocol

SaveProtocol::SaveProtocol(v1::Coordinator::Stub* stub,
                           SaveProtocolOptions options)
    : stub_(stub),
      options_(std::move(options)),
      incarnation_(NewIncarnation()) {}

absl::StatusOr<storage::ShardStore*> SaveProtocol::StoreFor(
    const std::string& uri) {
  if (store_ == nullptr || store_uri_ != uri) {
    CAIRN_ASSIGN_OR_RETURN(store_,
                           storage::OpenShardStore(uri, options_.store));
    store_uri_ = uri;
  }
  return store_.get();
}

std::string SaveProtocol::Where(int64_t step) const {
  return absl::StrCat("rank ", options_.rank, " saving job '", options_.job,
                      "' step ", step);
}

absl::StatusOr<std::unique_ptr<PlannedSave>> SaveProtocol::Begin(
    int64_t step, const planner::LocalSavePlan& local) {
  CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
  Cancellation* const cancel = options_.cancellation;
  if (cancel != nullptr && cancel->cancelled()) {
    // Nothing at cairnd yet: nothing to abort.
    return absl::CancelledError(
        absl::StrCat(Where(step), ": ", cancel->status().message()));
  }
  const std::string fingerprint = planner::FingerprintLocalPlan(local);
  v1::BeginSaveRequest begin;
  begin.set_job(options_.job);
  begin.set_step(step);
  begin.set_rank(options_.rank);
  begin.set_world_size(options_.world_size);
  begin.set_incarnation(incarnation_);
  begin.set_held_plan_id(held_plan_id_);
  begin.set_tier(tier_.tier);
  begin.set_agent_holds(tier_.agent_holds);
  begin.set_replicas(tier_.replicas);
  bool fingerprint_only = false;
  if (fingerprint == last_fingerprint_) {
    begin.set_plan_fingerprint(fingerprint);
    fingerprint_only = true;
  } else {
    convert::LocalPlanToProto(local, begin.mutable_local_plan());
  }
  auto begin_save = [&]() -> absl::StatusOr<v1::BeginSaveResponse> {
    absl::StatusOr<v1::BeginSaveResponse> plan =
        CallWithRetry(&v1::Coordinator::Stub::BeginSave, *stub_, begin,
                      options_.collective_timeout, options_.max_retries, cancel,
                      options_.contact);
    if (!plan.ok() && cancel != nullptr && cancel->cancelled()) {
      // cairnd may hold this rank in the save (waiting for the others):
      // abort it there, so the other ranks fail now, not at its deadline.
      return AbortStep(step, plan.status());
    }
    if (absl::IsUnavailable(plan.status())) {
      // Not answered (CallWithRetry's own error): name the save.
      return absl::UnavailableError(
          absl::StrCat(Where(step), ": ", plan.status().message()));
    }
    return plan;
  };
  CAIRN_ASSIGN_OR_RETURN(v1::BeginSaveResponse plan, begin_save());
  if (plan.resend_plan()) {
    // cairnd no longer holds the plan of that fingerprint: send it whole.
    fingerprint_only = false;
    convert::LocalPlanToProto(local, begin.mutable_local_plan());
    CAIRN_ASSIGN_OR_RETURN(plan, begin_save());
  }
  last_fingerprint_ = fingerprint;
  const absl::Status held = UseOrHoldRankPlan(plan);
  std::unique_ptr<PlannedSave> save(
      new PlannedSave(this, step, std::move(plan), fingerprint_only));
  absl::Status ready = [&]() -> absl::Status {
    CAIRN_RETURN_IF_ERROR(held);
    CAIRN_ASSIGN_OR_RETURN(save->objects_, GroupByObject(save->plan_));
    CAIRN_ASSIGN_OR_RETURN(save->store_, StoreFor(save->plan_.storage_uri()));
    return absl::OkStatus();
  }();
  if (!ready.ok()) return save->Abort(ready);
  return save;
}

absl::Status SaveProtocol::UseOrHoldRankPlan(v1::BeginSaveResponse& plan) {
  const std::string key_prefix = absl::StrCat(plan.attempt(), "/");
  if (plan.rank_plan_unchanged()) {
    if (held_plan_id_.empty() || held_plan_id_ != plan.plan_id()) {
      return absl::InternalError(absl::StrCat(
          "cairnd answered that this rank's plan is unchanged (plan id ",
          plan.plan_id(), ") but this process holds ",
          held_plan_id_.empty() ? "no plan"
                                : absl::StrCat("plan id ", held_plan_id_)));
    }
    *plan.mutable_rank_plan() = held_rank_plan_;
    for (v1::PlannedWrite& w : *plan.mutable_rank_plan()->mutable_writes()) {
      w.mutable_location()->set_object_key(
          absl::StrCat(key_prefix, w.location().object_key()));
    }
    return absl::OkStatus();
  }
  held_plan_id_.clear();
  held_rank_plan_.Clear();
  if (plan.plan_id().empty() || plan.attempt().empty()) return absl::OkStatus();
  held_rank_plan_ = plan.rank_plan();
  for (v1::PlannedWrite& w : *held_rank_plan_.mutable_writes()) {
    absl::string_view key = w.location().object_key();
    if (!absl::ConsumePrefix(&key, key_prefix)) {
      // Not in the attempt's directory: not a plan this process can reuse.
      held_rank_plan_.Clear();
      return absl::OkStatus();
    }
    w.mutable_location()->set_object_key(std::string(key));
  }
  held_plan_id_ = plan.plan_id();
  return absl::OkStatus();
}

absl::Status SaveProtocol::AbortStep(int64_t step, const absl::Status& failure,
                                     absl::Status* abort_answer) {
  const SaveProtocolOptions& o = options_;
  v1::Coordinator::Stub& stub = *stub_;
  v1::AbortSaveRequest abort;
  abort.set_job(o.job);
  abort.set_step(step);
  abort.set_rank(o.rank);
  abort.set_reason(std::string(failure.message()));
  abort.set_incarnation(incarnation_);
  if (o.contact != nullptr && !o.contact->reached()) {
    // cairnd never answered this process: it holds nothing of it to abort.
    if (abort_answer != nullptr) *abort_answer = absl::OkStatus();
    return absl::Status(failure.code(),
                        absl::StrCat(Where(step), ": ", failure.message()));
  }
  // Never cancelled: an abort is how a cancelled save ends.
  absl::Status answer =
      CallWithRetry(&v1::Coordinator::Stub::AbortSave, stub, abort,
                    o.rpc_timeout, 1, nullptr, o.contact)
          .status();
  if (abort_answer != nullptr) *abort_answer = answer;
  // cairnd records the first abort of a save (and deletes its objects only
  // after recording it): if that was not this rank's, it is the cause.
  v1::GetCheckpointRequest get;
  get.set_job(o.job);
  get.set_step(step);
  get.set_record_only(true);
  absl::StatusOr<v1::GetCheckpointResponse> rec =
      CallWithRetry(&v1::Coordinator::Stub::GetCheckpoint, stub, get,
                    o.rpc_timeout, 1, nullptr, o.contact);
  if (rec.ok() && rec->checkpoint().state() == v1::CHECKPOINT_STATE_ABORTED &&
      !rec->checkpoint().abort_reason().empty() &&
      !absl::StrContains(rec->checkpoint().abort_reason(),
                         absl::StrCat("aborted by rank ", o.rank, ":"))) {
    return absl::AbortedError(
        absl::StrCat(Where(step), ": ", rec->checkpoint().abort_reason(),
                     " (this rank then failed: ", failure.message(), ")"));
  }
  return absl::Status(failure.code(),
                      absl::StrCat(Where(step), ": ", failure.message()));
}

// ---------------------------------------------------------------------------
// PlannedSave

PlannedSave::PlannedSave(SaveProtocol* protocol, int64_t step,
                         v1::BeginSaveResponse plan, bool sent_fingerprint_only)
    : protocol_(protocol),
      step_(step),
      where_(protocol->Where(step)),
      plan_(std::move(plan)),
      sent_fingerprint_only_(sent_fingerprint_only) {
  commit_.set_job(protocol->options_.job);
  commit_.set_step(step);
  commit_.set_rank(protocol->options_.rank);
  commit_.set_incarnation(protocol->incarnation_);
  const auto& writes = plan_.rank_plan().writes();
  commit_.mutable_results()->Reserve(writes.size());
  for (const v1::PlannedWrite& w : writes) {
    *commit_.add_results()->mutable_location() = w.location();
  }
}

uint64_t PlannedSave::planned_bytes() const {
  uint64_t bytes = 0;
  for (const v1::PlannedWrite& w : plan_.rank_plan().writes()) {
    bytes += w.location().length();
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<PlannedObjectWriter>> PlannedSave::OpenObject(
    size_t i) {
  if (i >= objects_.size()) {
    return absl::OutOfRangeError(absl::StrCat(where_, ": object ", i, " of ",
                                              objects_.size(), " planned"));
  }
  return PlannedObjectWriter::Open(*store_, plan_, objects_[i], &commit_);
}

absl::Status PlannedSave::WriteAll(const ItemSources& sources,
                                   ThreadPool& pool) {
  const Cancellation* cancel = protocol_->options_.cancellation;
  // Checked before each object and item: once cancelled nothing new starts
  // (the objects left unfinished are deleted when the save is aborted).
  auto check_cancelled = [cancel]() -> absl::Status {
    if (cancel != nullptr && cancel->cancelled()) return cancel->status();
    return absl::OkStatus();
  };
  std::vector<std::function<absl::Status()>> jobs;
  jobs.reserve(objects_.size());
  for (size_t i = 0; i < objects_.size(); ++i) {
    jobs.push_back([&, i]() -> absl::Status {
      CAIRN_RETURN_IF_ERROR(check_cancelled());
      CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<PlannedObjectWriter> writer,
                             OpenObject(i));
      for (int w : objects_[i].writes) {
        CAIRN_RETURN_IF_ERROR(check_cancelled());
        CAIRN_ASSIGN_OR_RETURN(absl::Span<const char> data,
                               sources.Find(plan_.rank_plan().writes(w)));
        CAIRN_RETURN_IF_ERROR(writer->WriteItem(data));
        CAIRN_CRASH_POINT("client.write.mid_object");
      }
      return writer->Close();
    });
  }
  return RunAll(&pool, std::move(jobs));
}

absl::Status PlannedSave::RecordHeld(const ItemSources& sources,
                                     const std::vector<int>& holder_nodes) {
  const auto& writes = plan_.rank_plan().writes();
  for (int i = 0; i < writes.size(); ++i) {
    absl::StatusOr<absl::Span<const char>> data = sources.Find(writes[i]);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(where_, ": ", data.status().message()));
    }
    commit_.mutable_results(i)->set_crc32c(
        storage::Crc32c(data->data(), data->size()));
  }
  commit_.clear_holder_nodes();
  for (int n : holder_nodes) commit_.add_holder_nodes(n);
  return absl::OkStatus();
}

v1::CommitSaveRequest PlannedSave::CommitRequest() const {
  if (plan_.plan_id().empty() || plan_.attempt().empty()) return commit_;
  // cairnd named its plan: the short form, the checksums alone (4 bytes per
  // write instead of a WriteResult with its object key).
  v1::CommitSaveRequest request;
  request.set_job(commit_.job());
  request.set_step(commit_.step());
  request.set_rank(commit_.rank());
  request.set_incarnation(commit_.incarnation());
  *request.mutable_holder_nodes() = commit_.holder_nodes();
  request.set_plan_id(plan_.plan_id());
  request.set_attempt(plan_.attempt());
  request.mutable_crc32cs()->Reserve(commit_.results_size());
  for (const v1::WriteResult& r : commit_.results()) {
    request.add_crc32cs(r.crc32c());
  }
  return request;
}

absl::StatusOr<v1::CheckpointRecord> PlannedSave::Commit() {
  CAIRN_CRASH_POINT("client.before_commit");
  if (before_commit_for_test_) before_commit_for_test_();
  const SaveProtocolOptions& o = protocol_->options_;
  Cancellation* const cancel = o.cancellation;
  const v1::CommitSaveRequest request = CommitRequest();
  absl::StatusOr<v1::CommitSaveResponse> done = CallWithRetry(
      &v1::Coordinator::Stub::CommitSave, *protocol_->stub_, request,
      o.collective_timeout, o.max_retries, cancel, o.contact);
  if (done.ok()) return done->checkpoint();
  if (cancel == nullptr || !cancel->cancelled()) return done.status();
  // Cancelled (before the call or while it waited for the other ranks):
  // abort the save, unless cairnd refuses because every rank has committed
  // (it is being committed, or already is). Then the outcome is the
  // commit's, which a CommitSave not cancelled waits for and returns (cairnd
  // answers a repeated one, from the catalog once committed).
  absl::Status abort_answer;
  absl::Status aborted =
      protocol_->AbortStep(step_, cancel->status(), &abort_answer);
  if (!absl::IsFailedPrecondition(abort_answer) &&
      !absl::IsNotFound(abort_answer)) {
    return aborted;
  }
  done = CallWithRetry(&v1::Coordinator::Stub::CommitSave, *protocol_->stub_,
                       request, o.collective_timeout, o.max_retries, nullptr,
                       o.contact);
  if (!done.ok()) return aborted;
  return done->checkpoint();
}

absl::Status PlannedSave::Abort(const absl::Status& failure) {
  return protocol_->AbortStep(step_, failure);
}

}  // namespace cairn::protocol
