#include "client/agent/agent_checkpointer.h"

#include <unistd.h>

#include <cstring>
#include <list>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cairn/v1/agent.grpc.pb.h"
#include "client/checkpoint_info_proto.h"
#include "common/copier/host_copier.h"
#include "common/grpc_status.h"
#include "common/shm/shm_segment.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/convert/plan_convert.h"
#include "protocol/cancellation.h"
#include "protocol/save_protocol.h"
#include "storage/checkpoint_layout.h"

namespace cairn::client {
namespace {

constexpr size_t kMaxMappings = 4;

// What a Cancel() makes the cancelled call return (after "<where>: ").
constexpr absl::string_view kCancelled =
    "cancelled (AgentCheckpointer::Cancel)";

// One call to the agent; with `cancel`, Cancel() cancels it in flight (it
// then fails CANCELLED at once).
template <typename Req, typename Resp>
absl::StatusOr<Resp> Call(grpc::Status (v1::Agent::Stub::*method)(
                              grpc::ClientContext*, const Req&, Resp*),
                          v1::Agent::Stub& stub, const Req& request,
                          absl::Duration timeout,
                          protocol::Cancellation* cancel = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  protocol::Cancellation::ScopedCall registered(cancel, &ctx);
  Resp response;
  CAIRN_RETURN_IF_ERROR(
      FromGrpcStatus((stub.*method)(&ctx, request, &response)));
  return response;
}

std::string SaveWhere(absl::string_view job, int rank, int64_t step) {
  return absl::StrCat("rank ", rank, " saving job '", job, "' step ", step,
                      " via agent");
}

// Tells the agent the rank cancelled its save of `step` (it drops the
// staged copy, or stops the persist and aborts the save at cairnd). Best
// effort: an agent that does not answer holds no save to stop.
void CancelAtAgent(v1::Agent::Stub& stub, absl::string_view job, int rank,
                   int64_t step, uint64_t incarnation, absl::Duration timeout) {
  v1::CancelSaveRequest req;
  req.set_job(std::string(job));
  req.set_step(step);
  req.set_rank(rank);
  req.set_incarnation(incarnation);
  (void)Call(&v1::Agent::Stub::CancelSave, stub, req, timeout);
}

}  // namespace

struct SaveFuture::Target {
  std::shared_ptr<v1::Agent::Stub> stub;
  // The AgentCheckpointer's: its Cancel() stops a Wait too.
  std::shared_ptr<protocol::Cancellation> cancel;
  std::string job;
  int rank = 0;
  uint64_t incarnation = 0;
  absl::Duration rpc_timeout;
};

absl::StatusOr<CheckpointInfo> SaveFuture::Wait(absl::Duration timeout) const {
  const Target& t = *target_;
  v1::WaitSaveRequest req;
  req.set_job(t.job);
  req.set_step(step_);
  req.set_rank(t.rank);
  if (t.cancel->cancelled()) {
    // A save that already ended cancels nothing: its outcome, and the
    // Cancel() stays for the call it is meant for.
    req.set_timeout_ms(1);
    absl::StatusOr<v1::WaitSaveResponse> r =
        Call(&v1::Agent::Stub::WaitSave, *t.stub, req, t.rpc_timeout);
    if (r.ok()) return CheckpointInfoFromProto(r->checkpoint());
    if (!absl::IsDeadlineExceeded(r.status())) return r.status();
  }
  // A Cancel() is consumed by the call it cancelled (or that ran when it
  // came), whatever that call returns.
  absl::Cleanup consume_cancel = [&t] { t.cancel->Reset(); };
  if (!t.cancel->cancelled()) {
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    absl::StatusOr<v1::WaitSaveResponse> r =
        Call(&v1::Agent::Stub::WaitSave, *t.stub, req,
             timeout + absl::Seconds(10), t.cancel.get());
    // The save's own outcome, even if a Cancel() came with it; a wait that
    // was cancelled, or ran out of time as it came, goes on below.
    if (!t.cancel->cancelled() || r.ok() ||
        (!absl::IsCancelled(r.status()) &&
         !absl::IsDeadlineExceeded(r.status()))) {
      if (!r.ok()) return r.status();
      return CheckpointInfoFromProto(r->checkpoint());
    }
  }
  // Cancelled: stop the save at the agent, then take its outcome, which the
  // cancel makes prompt (the agent's calls to cairnd are cancelled).
  CancelAtAgent(*t.stub, t.job, t.rank, step_, t.incarnation, t.rpc_timeout);
  req.set_timeout_ms(absl::ToInt64Milliseconds(t.rpc_timeout));
  absl::StatusOr<v1::WaitSaveResponse> r =
      Call(&v1::Agent::Stub::WaitSave, *t.stub, req,
           t.rpc_timeout + absl::Seconds(10));
  // Every rank had committed: cairnd committed regardless.
  if (r.ok()) return CheckpointInfoFromProto(r->checkpoint());
  // Another rank aborted it first (its reason), or the agent failed it.
  if (!absl::IsCancelled(r.status()) && !absl::IsDeadlineExceeded(r.status()) &&
      !absl::IsNotFound(r.status())) {
    return r.status();
  }
  return absl::CancelledError(
      absl::StrCat(SaveWhere(t.job, t.rank, step_), ": ", kCancelled));
}

// Everything behind the public AgentCheckpointer (which holds only this).
class AgentCheckpointer::Impl {
 public:
  explicit Impl(const AgentCheckpointerOptions& options)
      : options_(options),
        incarnation_(protocol::NewIncarnation()),
        copier_(copier::HostCopierOptions{options.copy_threads}) {}

  absl::Status Connect();
  absl::StatusOr<SaveFuture> AsyncSave(int64_t step, const StateDict& state,
                                       SaveTier tier);
  SaveFuture FutureOf(int64_t step) const;
  absl::StatusOr<int64_t> Load(LoadRef ref, StateDict& state);
  void Cancel();

  const AgentSaveStats& last_save_stats() const { return save_stats_; }
  LoadSource last_load_source() const { return load_source_; }
  const absl::Status& last_agent_load_error() const { return agent_error_; }
  uint64_t last_load_bytes_local() const { return bytes_local_; }
  uint64_t last_load_bytes_peers() const { return bytes_peers_; }

 private:
  absl::StatusOr<shm::ShmSegment*> MapSegment(const std::string& name,
                                              uint64_t size);
  // Sets *resolved to the step the agent resolved when it could not serve
  // the load from memory.
  absl::StatusOr<int64_t> LoadFromAgent(LoadRef ref, StateDict& state,
                                        int64_t* resolved);
  // AsyncSave's copy phase: the whole save into one segment, or streamed.
  absl::Status CopyAll(const v1::BeginStageResponse& staged,
                       const StateDict& state,
                       const planner::LocalSavePlan& local,
                       const std::string& where);
  absl::Status StreamBuckets(const v1::BeginStageResponse& staged,
                             const StateDict& state, const std::string& where);
  // AsyncSave of `step` after a Cancel(): cancels what the agent holds of the
  // save (CancelSave) and returns CANCELLED naming it.
  absl::Status CancelledSave(int64_t step, const std::string& where);
  // The storage fallback of Load, which Cancel() reaches while it runs.
  absl::StatusOr<int64_t> LoadFromStorage(LoadRef ref, StateDict& state,
                                          const std::string& where);

  // Thread-safe (Cancel() may come from any thread). Set by Cancel(),
  // consumed (Reset) when an AsyncSave, Load or SaveFuture::Wait returns;
  // their calls to the agent register with it. Shared with the futures.
  const std::shared_ptr<protocol::Cancellation> cancel_ =
      std::make_shared<protocol::Cancellation>(std::string(kCancelled));
  // Whether Load is in its storage fallback: Cancel() then cancels direct_
  // too (and only then, since a direct_->Cancel() waits for its next Load).
  absl::Mutex direct_mu_;
  bool in_direct_load_ ABSL_GUARDED_BY(direct_mu_) = false;

  // Constant after construction.
  const AgentCheckpointerOptions options_;
  // This process's id for saves (BeginStageRequest.incarnation).
  const uint64_t incarnation_;
  std::shared_ptr<v1::Agent::Stub> stub_;
  std::unique_ptr<Checkpointer> direct_;

  copier::HostCopier copier_;
  // Recently used staging mappings (the agent reuses segments, so steady
  // state saves copy into memory that is already mapped).
  std::list<std::unique_ptr<shm::ShmSegment>> mapped_;
  AgentSaveStats save_stats_;
  LoadSource load_source_ = LoadSource::kNone;
  absl::Status agent_error_;
  uint64_t bytes_local_ = 0;
  uint64_t bytes_peers_ = 0;
};

absl::Status AgentCheckpointer::Impl::Connect() {
  const AgentCheckpointerOptions& options = options_;
  if (options.agent_socket.empty()) {
    return absl::InvalidArgumentError("agent mode needs the agent's socket");
  }
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(options.direct.job));
  const CheckpointerOptions& d = options.direct;
  if (d.world_size < 1 || d.rank < 0 || d.rank >= d.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", d.job, "': rank ", d.rank,
                     " is out of range for world_size ", d.world_size));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  stub_ = v1::Agent::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("unix:", options.agent_socket),
                                grpc::InsecureChannelCredentials(), args));
  if (!d.coordinator.empty()) {
    // Each rank falls back to storage on its own, so a collective check
    // could wait for ranks that loaded from agents' memory: check locally.
    CheckpointerOptions fallback = d;
    if (fallback.partial_chunk_check == PartialChunkCheck::kCollective) {
      fallback.partial_chunk_check = PartialChunkCheck::kReadWhole;
    }
    CAIRN_ASSIGN_OR_RETURN(direct_, Checkpointer::Connect(fallback));
  }
  return absl::OkStatus();
}

absl::StatusOr<shm::ShmSegment*> AgentCheckpointer::Impl::MapSegment(
    const std::string& name, uint64_t size) {
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if ((*it)->name() == name && (*it)->size() >= size) {
      mapped_.splice(mapped_.begin(), mapped_, it);
      return mapped_.front().get();
    }
  }
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<shm::ShmSegment> seg,
                         shm::ShmSegment::Open(name, size));
  mapped_.push_front(std::move(seg));
  while (mapped_.size() > kMaxMappings) mapped_.pop_back();
  return mapped_.front().get();
}

absl::StatusOr<SaveFuture> AgentCheckpointer::Impl::AsyncSave(
    int64_t step, const StateDict& state, SaveTier tier) {
  const absl::Time t0 = absl::Now();
  save_stats_ = AgentSaveStats();
  const CheckpointerOptions& d = options_.direct;
  const std::string where = SaveWhere(d.job, d.rank, step);
  absl::Cleanup consume_cancel = [this] { cancel_->Reset(); };
  if (cancel_->cancelled()) {
    // Nothing sent to the agent: nothing to cancel there.
    return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
  }
  absl::StatusOr<planner::LocalSavePlan> planned = state.ToLocalPlan(d.rank);
  if (!planned.ok()) {
    return absl::Status(planned.status().code(),
                        absl::StrCat(where, ": ", planned.status().message()));
  }
  const planner::LocalSavePlan& local = *planned;
  v1::BeginStageRequest begin;
  begin.set_job(d.job);
  begin.set_step(step);
  begin.set_rank(d.rank);
  begin.set_world_size(d.world_size);
  begin.set_incarnation(incarnation_);
  begin.set_wait_for_space_ms(
      absl::ToInt64Milliseconds(options_.wait_for_space));
  begin.set_allow_streaming(options_.allow_streaming);
  begin.set_tier(tier == SaveTier::kMemory       ? v1::TIER_MEMORY
                 : tier == SaveTier::kPersistent ? v1::TIER_PERSISTENT
                                                 : v1::TIER_UNSPECIFIED);
  {
    v1::LocalSavePlan proto;
    convert::LocalPlanToProto(local, &proto);
    for (v1::WriteItem& w : *proto.mutable_items()) {
      *begin.add_items()->mutable_item() = std::move(w);
    }
  }
  absl::StatusOr<v1::BeginStageResponse> staged =
      Call(&v1::Agent::Stub::BeginStage, *stub_, begin,
           options_.wait_for_space + options_.rpc_timeout, cancel_.get());
  // Cancelled while the agent waited for space (or as it answered): it may
  // have staged the save all the same.
  if (cancel_->cancelled()) return CancelledSave(step, where);
  if (!staged.ok()) {
    return absl::Status(staged.status().code(),
                        absl::StrCat(where, ": ", staged.status().message()));
  }
  const absl::Time t1 = absl::Now();
  absl::Status copied = staged->streaming()
                            ? StreamBuckets(*staged, state, where)
                            : CopyAll(*staged, state, local, where);
  if (cancel_->cancelled()) return CancelledSave(step, where);
  CAIRN_RETURN_IF_ERROR(copied);
  const absl::Time t2 = absl::Now();
  v1::FinishStageRequest finish;
  finish.set_save_id(staged->save_id());
  finish.set_die_before_commit_for_test(
      options_.agent_dies_before_commit_for_test);
  absl::StatusOr<v1::FinishStageResponse> finished =
      Call(&v1::Agent::Stub::FinishStage, *stub_, finish, options_.rpc_timeout,
           cancel_.get());
  // Cancelled as the agent took the save over: stop its persist.
  if (cancel_->cancelled()) return CancelledSave(step, where);
  if (!finished.ok()) {
    return absl::Status(finished.status().code(),
                        absl::StrCat(where, ": ", finished.status().message()));
  }
  save_stats_.begin_time = t1 - t0;
  if (save_stats_.streamed_buckets == 0) save_stats_.copy_time = t2 - t1;
  save_stats_.blocked = absl::Now() - t0;
  return FutureOf(step);
}

SaveFuture AgentCheckpointer::Impl::FutureOf(int64_t step) const {
  auto target = std::make_shared<SaveFuture::Target>();
  target->stub = stub_;
  target->cancel = cancel_;
  target->job = options_.direct.job;
  target->rank = options_.direct.rank;
  target->incarnation = incarnation_;
  target->rpc_timeout = options_.rpc_timeout;
  return SaveFuture(std::move(target), step);
}

absl::Status AgentCheckpointer::Impl::CancelledSave(int64_t step,
                                                    const std::string& where) {
  const CheckpointerOptions& d = options_.direct;
  CancelAtAgent(*stub_, d.job, d.rank, step, incarnation_,
                options_.rpc_timeout);
  return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
}

void AgentCheckpointer::Impl::Cancel() {
  absl::MutexLock l(&direct_mu_);
  cancel_->Cancel();
  if (in_direct_load_) direct_->Cancel();
}

absl::Status AgentCheckpointer::Impl::StreamBuckets(
    const v1::BeginStageResponse& staged, const StateDict& state,
    const std::string& where) {
  // Where each item's bytes are, in ToLocalPlan order.
  std::vector<absl::Span<const char>> items;
  for (const TensorShard& t : state.tensors()) {
    for (const TensorChunk& c : t.chunks) {
      items.emplace_back(c.data);
    }
  }
  for (const BytesEntry& b : state.bytes()) {
    items.emplace_back(b.blob->data(), b.blob->size());
  }
  if (staged.items_size() != static_cast<int>(items.size())) {
    return absl::InternalError(absl::StrCat(where, ": agent answered ",
                                            staged.items_size(), " items for ",
                                            items.size()));
  }
  uint64_t filled = 0;
  while (true) {
    // Once cancelled, no further bucket is asked for (AsyncSave cancels the
    // stream at the agent).
    if (cancel_->cancelled()) return cancel_->status();
    v1::StageBucketRequest req;
    req.set_save_id(staged.save_id());
    req.set_filled_bucket(filled);
    req.set_wait_for_space_ms(
        absl::ToInt64Milliseconds(options_.wait_for_space));
    absl::StatusOr<v1::StageBucketResponse> bucket =
        Call(&v1::Agent::Stub::StageBucket, *stub_, req,
             options_.wait_for_space + options_.rpc_timeout, cancel_.get());
    if (!bucket.ok()) {
      return absl::Status(bucket.status().code(),
                          absl::StrCat(where, ": ", bucket.status().message()));
    }
    if (bucket->end_of_stream()) return absl::OkStatus();
    const absl::Time c0 = absl::Now();
    absl::StatusOr<shm::ShmSegment*> mapped =
        MapSegment(bucket->shm_name(), bucket->shm_size());
    if (!mapped.ok()) {
      // The agent destroys the buckets of a stream that failed (its segment
      // is gone): the stream's failure is the real reason, so ask for it.
      req.set_filled_bucket(bucket->bucket());
      absl::StatusOr<v1::StageBucketResponse> why = Call(
          &v1::Agent::Stub::StageBucket, *stub_, req, options_.rpc_timeout);
      const absl::Status& s = why.ok() ? mapped.status() : why.status();
      return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    }
    shm::ShmSegment* seg = *mapped;
    for (const v1::StagePiece& p : bucket->pieces()) {
      if (cancel_->cancelled()) return cancel_->status();
      if (p.item() < 0 || p.item() >= static_cast<int>(items.size()) ||
          p.item_offset() + p.length() > items[p.item()].size() ||
          p.staging_offset() + p.length() > seg->size()) {
        return absl::InternalError(
            absl::StrCat(where, ": agent placed a piece of item ", p.item(),
                         " outside its item or bucket ", bucket->bucket()));
      }
      CAIRN_RETURN_IF_ERROR(copier_.Copy(
          copier::CopySource::Host(items[p.item()].data() + p.item_offset()),
          absl::MakeSpan(seg->data() + p.staging_offset(), p.length())));
      save_stats_.bytes += p.length();
    }
    CAIRN_RETURN_IF_ERROR(copier_.Flush());
    save_stats_.copy_time += absl::Now() - c0;
    filled = bucket->bucket();
    if (++save_stats_.streamed_buckets ==
        options_.exit_after_stream_buckets_for_test) {
      _exit(137);
    }
  }
}

absl::Status AgentCheckpointer::Impl::CopyAll(
    const v1::BeginStageResponse& staged_r, const StateDict& state,
    const planner::LocalSavePlan& local, const std::string& where) {
  const v1::BeginStageResponse* staged = &staged_r;
  CAIRN_ASSIGN_OR_RETURN(shm::ShmSegment * seg,
                         MapSegment(staged->shm_name(), staged->shm_size()));
  // Items come back in ToLocalPlan order: tensors' chunks, then bytes.
  int i = 0;
  auto dst = [&](uint64_t n) -> absl::StatusOr<absl::Span<char>> {
    const v1::StageItem& si = staged->items(i++);
    if (si.staging_offset() + n > seg->size() || si.item().length() != n) {
      return absl::InternalError(absl::StrCat(where, ": agent placed item ",
                                              i - 1, " outside its segment"));
    }
    return absl::MakeSpan(seg->data() + si.staging_offset(), n);
  };
  if (staged->items_size() != static_cast<int>(local.items.size())) {
    return absl::InternalError(absl::StrCat(where, ": agent answered ",
                                            staged->items_size(), " items for ",
                                            local.items.size()));
  }
  // Once cancelled, no further item is copied (AsyncSave then drops the
  // staged copy at the agent).
  for (const TensorShard& t : state.tensors()) {
    const uint64_t elem = planner::DTypeSize(t.dtype);
    for (const TensorChunk& c : t.chunks) {
      if (cancel_->cancelled()) return cancel_->status();
      const uint64_t n = static_cast<uint64_t>(planner::Volume(c.box)) * elem;
      CAIRN_ASSIGN_OR_RETURN(absl::Span<char> out, dst(n));
      CAIRN_RETURN_IF_ERROR(
          copier_.Copy(copier::CopySource::Host(c.data.data()), out));
      save_stats_.bytes += n;
    }
  }
  for (const BytesEntry& b : state.bytes()) {
    if (cancel_->cancelled()) return cancel_->status();
    CAIRN_ASSIGN_OR_RETURN(absl::Span<char> out, dst(b.blob->size()));
    if (!out.empty()) std::memcpy(out.data(), b.blob->data(), out.size());
    save_stats_.bytes += out.size();
  }
  return copier_.Flush();
}

absl::StatusOr<int64_t> AgentCheckpointer::Impl::LoadFromAgent(
    LoadRef ref, StateDict& state, int64_t* resolved) {
  const CheckpointerOptions& d = options_.direct;
  v1::AgentLoadRequest req;
  req.set_job(d.job);
  req.set_rank(d.rank);
  req.set_world_size(d.world_size);  // `latest` is resolved once per load
  if (ref.latest()) {
    req.set_latest(true);
  } else {
    req.set_step(ref.step());
  }
  std::vector<std::pair<TensorChunk*, uint64_t>> dests;
  for (const TensorShard& t : state.tensors()) {
    for (const TensorChunk& c : t.chunks) {
      if (planner::Volume(c.box) == 0) continue;
      v1::WantedChunk* w = req.add_wanted();
      w->mutable_tensor()->set_fqn(t.fqn);
      w->mutable_tensor()->set_dtype(convert::DTypeToProto(t.dtype));
      w->mutable_tensor()->mutable_global_shape()->Assign(
          t.global_shape.begin(), t.global_shape.end());
      convert::BoxToProto(c.box, w->mutable_box());
      dests.push_back({const_cast<TensorChunk*>(&c),
                       static_cast<uint64_t>(planner::Volume(c.box)) *
                           planner::DTypeSize(t.dtype)});
    }
  }
  for (const BytesEntry& b : state.bytes()) req.add_wanted_bytes(b.fqn);
  CAIRN_ASSIGN_OR_RETURN(v1::AgentLoadResponse resp,
                         Call(&v1::Agent::Stub::Load, *stub_, req,
                              options_.rpc_timeout, cancel_.get()));
  if (resp.unserved_code() != 0) {
    *resolved = resp.step();
    return absl::Status(static_cast<absl::StatusCode>(resp.unserved_code()),
                        resp.unserved_message());
  }
  absl::Status copied = [&]() -> absl::Status {
    if (resp.wanted_offsets_size() != static_cast<int>(dests.size()) ||
        resp.wanted_bytes_offsets_size() !=
            static_cast<int>(state.bytes().size()) ||
        resp.wanted_bytes_lengths_size() !=
            static_cast<int>(state.bytes().size())) {
      return absl::InternalError("agent answered a malformed load");
    }
    CAIRN_ASSIGN_OR_RETURN(
        std::unique_ptr<shm::ShmSegment> seg,
        shm::ShmSegment::Open(resp.shm_name(), resp.shm_size()));
    for (size_t i = 0; i < dests.size(); ++i) {
      const uint64_t off = resp.wanted_offsets(static_cast<int>(i));
      if (off + dests[i].second > seg->size()) {
        return absl::InternalError("agent placed a chunk outside its segment");
      }
      std::memcpy(dests[i].first->data.data(), seg->data() + off,
                  dests[i].second);
    }
    for (size_t i = 0; i < state.bytes().size(); ++i) {
      const uint64_t off = resp.wanted_bytes_offsets(static_cast<int>(i));
      const uint64_t len = resp.wanted_bytes_lengths(static_cast<int>(i));
      if (off + len > seg->size()) {
        return absl::InternalError("agent placed a blob outside its segment");
      }
      state.bytes()[i].blob->assign(seg->data() + off, len);
    }
    return absl::OkStatus();
  }();
  v1::ReleaseLoadRequest rel;
  rel.set_load_id(resp.load_id());
  (void)Call(&v1::Agent::Stub::ReleaseLoad, *stub_, rel, options_.rpc_timeout);
  CAIRN_RETURN_IF_ERROR(copied);
  bytes_local_ = resp.bytes_local();
  bytes_peers_ = resp.bytes_peers();
  return resp.step();
}

absl::StatusOr<int64_t> AgentCheckpointer::Impl::Load(LoadRef ref,
                                                      StateDict& state) {
  load_source_ = LoadSource::kNone;
  bytes_local_ = bytes_peers_ = 0;
  const CheckpointerOptions& d = options_.direct;
  const std::string where = absl::StrCat(
      "rank ", d.rank, " loading job '", d.job, "' ",
      ref.latest() ? std::string("latest") : absl::StrCat("step ", ref.step()));
  absl::Cleanup consume_cancel = [this] { cancel_->Reset(); };
  if (cancel_->cancelled()) {
    return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
  }
  if (absl::Status s = state.CheckLoadable(); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("rank ", options_.direct.rank, " loading job '",
                               options_.direct.job, "': ", s.message()));
  }
  int64_t resolved = -1;
  absl::StatusOr<int64_t> step = LoadFromAgent(ref, state, &resolved);
  agent_error_ = step.status();
  if (step.ok()) {
    load_source_ = LoadSource::kAgentMemory;
    return step;
  }
  // Cancelled: no fallback (the agent frees what it had loaded for it).
  if (cancel_->cancelled()) {
    return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
  }
  if (direct_ == nullptr) return step.status();
  // The next tier: storage, through the direct path; of the step the agent
  // resolved, if it did, which the other ranks of the load got too.
  step = LoadFromStorage(resolved >= 0 ? LoadRef::Step(resolved) : ref, state,
                         where);
  if (step.ok()) load_source_ = LoadSource::kStorage;
  if (!step.ok() && resolved >= 0 && !agent_error_.ok()) {
    // Both tiers failed: say why the agents could not serve it either.
    return absl::Status(step.status().code(),
                        absl::StrCat(step.status().message(),
                                     " (the agents' memory could "
                                     "not serve it: ",
                                     agent_error_.message(), ")"));
  }
  return step;
}

absl::StatusOr<int64_t> AgentCheckpointer::Impl::LoadFromStorage(
    LoadRef ref, StateDict& state, const std::string& where) {
  {
    absl::MutexLock l(&direct_mu_);
    if (cancel_->cancelled()) {
      return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
    }
    in_direct_load_ = true;
  }
  absl::StatusOr<int64_t> step = direct_->Load(ref, state);
  if (absl::IsCancelled(step.status()) && !cancel_->cancelled()) {
    // A Cancel() that reached direct_ as its previous Load returned: this
    // one consumed it at its start, before reading anything. This Load was
    // not cancelled.
    step = direct_->Load(ref, state);
  }
  {
    absl::MutexLock l(&direct_mu_);
    in_direct_load_ = false;
  }
  if (absl::IsCancelled(step.status()) && cancel_->cancelled()) {
    return absl::CancelledError(absl::StrCat(where, ": ", kCancelled));
  }
  return step;
}

// ---------------------------------------------------------------------------
// AgentCheckpointer: the public face, forwarding to Impl.

AgentCheckpointer::AgentCheckpointer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

AgentCheckpointer::~AgentCheckpointer() = default;

absl::StatusOr<std::unique_ptr<AgentCheckpointer>> AgentCheckpointer::Connect(
    const AgentCheckpointerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CAIRN_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<AgentCheckpointer>(
      new AgentCheckpointer(std::move(impl)));
}

absl::StatusOr<SaveFuture> AgentCheckpointer::AsyncSave(int64_t step,
                                                        const StateDict& state,
                                                        SaveTier tier) {
  return impl_->AsyncSave(step, state, tier);
}

SaveFuture AgentCheckpointer::FutureOf(int64_t step) const {
  return impl_->FutureOf(step);
}

absl::StatusOr<int64_t> AgentCheckpointer::Load(LoadRef ref, StateDict& state) {
  return impl_->Load(ref, state);
}

void AgentCheckpointer::Cancel() { impl_->Cancel(); }

const AgentSaveStats& AgentCheckpointer::last_save_stats() const {
  return impl_->last_save_stats();
}
LoadSource AgentCheckpointer::last_load_source() const {
  return impl_->last_load_source();
}
const absl::Status& AgentCheckpointer::last_agent_load_error() const {
  return impl_->last_agent_load_error();
}
uint64_t AgentCheckpointer::last_load_bytes_local() const {
  return impl_->last_load_bytes_local();
}
uint64_t AgentCheckpointer::last_load_bytes_peers() const {
  return impl_->last_load_bytes_peers();
}

}  // namespace cairn::client
