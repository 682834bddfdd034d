#include "client/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "client/checkpoint_info_proto.h"
#include "common/crash_point.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "common/thread_pool.h"
#include "planner/plan_cache.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "protocol/save_protocol.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::client {
namespace {

// "job 'j' step 7" or "job 'j' latest" for messages.
std::string LoadRefName(absl::string_view job, const LoadRef& ref) {
  return ref.latest() ? absl::StrCat("job '", job, "' latest")
                      : absl::StrCat("job '", job, "' step ", ref.step());
}

// A read that a committed checkpoint's MANIFEST promises and storage cannot
// serve. A missing or short object is damage (DATA_LOSS naming `what` and the
// object), unless the step's MANIFEST is missing too: then this host does not
// see the storage cairnd wrote to (not mounted, another path), which is not
// corruption (FAILED_PRECONDITION).
absl::Status ObjectReadError(storage::ShardStore& store,
                             const v1::PlanLoadResponse& plan,
                             const absl::Status& s, absl::string_view what,
                             absl::string_view key) {
  if (absl::IsNotFound(s) || absl::IsOutOfRange(s) || absl::IsDataLoss(s)) {
    const std::string manifest =
        absl::StrCat(plan.step_prefix(), storage::kManifestName);
    if (absl::IsNotFound(s) &&
        absl::IsNotFound(store.Size(manifest).status())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": object ", key,
                       " and the step's MANIFEST are not in ", store.uri(),
                       " as this host sees it (is the storage cairnd uses "
                       "mounted here?): ",
                       s.message()));
    }
    return absl::DataLossError(
        absl::StrCat(what, ": object ", key, " of the committed checkpoint is ",
                     absl::IsNotFound(s) ? "missing"
                                         : "damaged or shorter than its "
                                           "manifest says",
                     ": ", s.message()));
  }
  return absl::Status(
      s.code(), absl::StrCat(what, " in object ", key, ": ", s.message()));
}

// The rank's wanted chunks, added to `request`, and where each one goes. One
// per tensor in fqn order (an empty box, and a null destination, for a tensor
// the rank holds none of) when no tensor has more than one chunk to load: the
// form convert::CompactWanted shortens. Otherwise the non-empty chunks in the
// state dict's order.
std::vector<TensorChunk*> AddWanted(const StateDict& state,
                                    v1::PlanLoadRequest* request) {
  std::vector<const TensorShard*> order;
  bool one_each = true;
  for (const TensorShard& t : state.tensors()) {
    int chunks = 0;
    for (const TensorChunk& c : t.chunks) chunks += planner::Volume(c.box) > 0;
    // A scalar has no empty box: a rank without it cannot say so.
    if (chunks > 1 || (chunks == 0 && t.global_shape.empty())) {
      one_each = false;
    }
    order.push_back(&t);
  }
  if (one_each) {
    std::sort(order.begin(), order.end(),
              [](const TensorShard* a, const TensorShard* b) {
                return a->fqn < b->fqn;
              });
  }
  std::vector<TensorChunk*> dests;
  const auto add = [&](const TensorShard& t, const planner::ChunkBox& box,
                       const TensorChunk* dest) {
    v1::WantedChunk* w = request->add_wanted();
    w->mutable_tensor()->set_fqn(t.fqn);
    w->mutable_tensor()->set_dtype(convert::DTypeToProto(t.dtype));
    w->mutable_tensor()->mutable_global_shape()->Assign(t.global_shape.begin(),
                                                        t.global_shape.end());
    convert::BoxToProto(box, w->mutable_box());
    // The chunk's bytes are the caller's to fill (a span into its buffer).
    dests.push_back(const_cast<TensorChunk*>(dest));
  };
  for (const TensorShard* t : order) {
    const TensorChunk* held = nullptr;
    for (const TensorChunk& c : t->chunks) {
      if (planner::Volume(c.box) == 0) continue;
      if (!one_each) add(*t, c.box, &c);
      held = &c;
    }
    if (!one_each) continue;
    if (held != nullptr) {
      add(*t, held->box, held);
    } else {
      planner::ChunkBox none;
      none.offsets.assign(t->global_shape.size(), 0);
      none.sizes.assign(t->global_shape.size(), 0);
      add(*t, none, nullptr);
    }
  }
  return dests;
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
  // The store of a plan's storage URI (cached).
  absl::StatusOr<storage::ShardStore*> StoreFor(const std::string& uri) {
    return protocol_->StoreFor(uri);
  }
  // dests[i]: where request.wanted(i) goes (null: an empty box).
  absl::Status ReadItems(const v1::PlanLoadRequest& request,
                         const v1::PlanLoadResponse& plan,
                         const std::vector<TensorChunk*>& dests);
  absl::Status ReadBytesEntries(const v1::PlanLoadResponse& plan,
                                StateDict& state);
  // Whether a load reports its partly read chunks to cairnd (VerifyLoad in
  // the load round PlanLoad joined).
  bool JoinsLoadCollective() const;
  // This rank's VerifyLoad request for `plan`'s round, without pieces.
  v1::VerifyLoadRequest LoadReport(const v1::PlanLoadResponse& plan) const;
  // Tells the load round this rank is done (its load failed), so the other
  // ranks are answered without its pieces. Synchronous: cairnd answers a
  // report without pieces at once, and nothing is left running.
  void ReportLoadFailure(const v1::VerifyLoadRequest& request);

  // CANCELLED: "<where>: cancelled (Checkpointer::Cancel)".
  absl::Status Cancelled(absl::string_view where) const {
    return absl::CancelledError(
        absl::StrCat(where, ": ", cancel_.status().message()));
  }

  // Thread-safe (Cancel() may come from any thread). Set by Cancel(),
  // consumed (Reset) when a Save or Load returns; the save protocol and the
  // calls of a load check it and register their calls with it.
  protocol::Cancellation cancel_{"cancelled (Checkpointer::Cancel)"};

  // Constant after construction.
  const CheckpointerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  // Whether cairnd has answered on channel_ (see CallWithRetry).
  std::unique_ptr<protocol::CoordinatorContact> contact_;
  std::unique_ptr<ThreadPool> io_pool_;
  std::unique_ptr<protocol::SaveProtocol> protocol_;

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
  absl::Cleanup consume_cancel = [this] { cancel_.Reset(); };
  if (cancel_.cancelled()) {
    return Cancelled(absl::StrCat("rank ", options_.rank, " loading ",
                                  LoadRefName(options_.job, ref)));
  }
  if (absl::Status s = state.CheckLoadable(); !s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("rank ", options_.rank, " loading ",
                     LoadRefName(options_.job, ref), ": ", s.message()));
  }
  const absl::Time t0 = absl::Now();
  v1::PlanLoadRequest request;
  request.set_job(options_.job);
  request.set_rank(options_.rank);
  // Every load joins cairnd's load round of the job: `latest` is resolved
  // once for all its ranks, and world sizes are checked against each other.
  request.set_world_size(options_.world_size);
  request.set_verify_in_round(JoinsLoadCollective());
  // Read columns (a fraction of the full form's bytes), expanded below.
  request.set_read_columns(true);
  if (ref.latest()) {
    request.set_latest(true);
  } else {
    request.set_step(ref.step());
  }
  // dests[i]: where wanted chunk i goes (null: an empty box, nothing to read).
  std::vector<TensorChunk*> dests = AddWanted(state, &request);
  for (const BytesEntry& b : state.bytes()) request.add_wanted_bytes(b.fqn);

  // The short form when the rank wants one box of each tensor: their digest
  // and boxes, a fraction of the full form's bytes (no fqn, dtype or shape
  // per chunk). cairnd asks for the full form when the checkpoint's tensors
  // differ from this rank's.
  v1::PlanLoadRequest short_form;
  const bool compact_wanted = convert::CompactWanted(request, &short_form);
  absl::StatusOr<v1::PlanLoadResponse> planned =
      CallWithRetry(&v1::Coordinator::Stub::PlanLoad, *stub_,
                    compact_wanted ? short_form : request, options_.rpc_timeout,
                    options_.max_retries, &cancel_, contact_.get());
  if (planned.ok() && planned->resend_wanted()) {
    const v1::PlanLoadResponse asked = *std::move(planned);
    planned =
        compact_wanted
            ? CallWithRetry(&v1::Coordinator::Stub::PlanLoad, *stub_, request,
                            options_.rpc_timeout, options_.max_retries,
                            &cancel_, contact_.get())
            : absl::InternalError(
                  "cairnd asked for the wanted chunks in full, which "
                  "the request held");
    if (planned.ok() && planned->resend_wanted()) {
      planned = absl::InternalError(
          "cairnd asked twice for the wanted chunks in full");
    }
    // cairnd holds this rank in its load round: the others must not wait.
    if (absl::IsInternal(planned.status()) && JoinsLoadCollective() &&
        asked.load_round() != 0) {
      ReportLoadFailure(LoadReport(asked));
    }
  }
  if (!planned.ok() && cancel_.cancelled()) {
    // Nothing read. If cairnd answered the cancelled call after all, this
    // rank is a member of a load round that never hears from it: its
    // peers verify locally after cairnd's verify deadline.
    return Cancelled(absl::StrCat("rank ", options_.rank, " loading ",
                                  LoadRefName(options_.job, ref)));
  }
  if (absl::IsUnavailable(planned.status())) {
    // Not answered (CallWithRetry's own error): name the load.
    return absl::UnavailableError(absl::StrCat(
        "rank ", options_.rank, " loading ", LoadRefName(options_.job, ref),
        ": ", planned.status().message()));
  }
  if (!planned.ok()) {
    // Refused (a dtype or shape that differs, say): cairnd took this rank
    // out of the load round, so the others do not wait for it.
    return planned.status();
  }
  if (absl::Status s = convert::ExpandReadColumns(request, &*planned);
      !s.ok()) {
    // cairnd took this rank into its load round: the others must not wait.
    if (JoinsLoadCollective() && planned->load_round() != 0) {
      ReportLoadFailure(LoadReport(*planned));
    }
    return absl::Status(
        s.code(),
        absl::StrCat("rank ", options_.rank, " loading job '", options_.job,
                     "' step ", planned->step(), ": ", s.message()));
  }
  const v1::PlanLoadResponse& plan = *planned;
  if (options_.after_plan_load_for_test) {
    options_.after_plan_load_for_test(plan.step());
  }
  const absl::Time t1 = absl::Now();
  stats_.plan_time = t1 - t0;
  absl::Status read = ReadItems(request, plan, dests);
  if (read.ok() && cancel_.cancelled()) read = cancel_.status();
  if (read.ok()) read = ReadBytesEntries(plan, state);
  if (!read.ok()) {
    return absl::Status(
        read.code(),
        absl::StrCat("rank ", options_.rank, " loading job '", options_.job,
                     "' step ", plan.step(), ": ", read.message()));
  }
  stats_.io_time = absl::Now() - t1;
  return plan.step();
}

absl::Status Checkpointer::Impl::ReadBytesEntries(
    const v1::PlanLoadResponse& plan, StateDict& state) {
  // Bytes entries come back in request order.
  if (plan.bytes_entries_size() != static_cast<int>(state.bytes().size())) {
    return absl::InternalError(absl::StrCat(
        "cairnd returned ", plan.bytes_entries_size(), " bytes entries for ",
        state.bytes().size(), " requested"));
  }
  CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * store,
                         StoreFor(plan.storage_uri()));
  for (int i = 0; i < plan.bytes_entries_size(); ++i) {
    const v1::ManifestBytes& e = plan.bytes_entries(i);
    const std::string key =
        absl::StrCat(plan.step_prefix(), e.location().object_key());
    std::string blob(e.location().length(), '\0');
    absl::Status s =
        store
            ->Read(key, {e.location().offset(), e.location().length()},
                   absl::MakeSpan(blob))
            .status();
    if (!s.ok()) {
      return ObjectReadError(*store, plan, s,
                             absl::StrCat("bytes entry '", e.fqn(), "'"), key);
    }
    const uint32_t crc = storage::Crc32c(blob.data(), blob.size());
    if (crc != e.crc32c()) {
      return absl::DataLossError(absl::StrFormat(
          "checksum mismatch in bytes entry '%s' at %s: crc32c 0x%08x, "
          "manifest says 0x%08x",
          e.fqn(), key, crc, e.crc32c()));
    }
    stats_.bytes += blob.size();
    stats_.bytes_storage += blob.size();
    *state.bytes()[i].blob = std::move(blob);
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::Impl::ReadItems(
    const v1::PlanLoadRequest& request, const v1::PlanLoadResponse& plan,
    const std::vector<TensorChunk*>& dests) {
  const PartialChunkCheck check = options_.partial_chunk_check;
  // Whatever fails before this rank calls VerifyLoad, it still reports, so
  // that the other ranks are not kept waiting for it until cairnd's deadline.
  bool reported = !JoinsLoadCollective() || plan.load_round() == 0;
  absl::Cleanup report_failure = [&] {
    if (!reported) ReportLoadFailure(LoadReport(plan));
  };
  CAIRN_ASSIGN_OR_RETURN(storage::ShardStore * store,
                         StoreFor(plan.storage_uri()));
  const int n = plan.reads_size();
  // Per read item: where its bytes go and whether it covers its stored chunk.
  std::vector<char*> dst(n);
  std::vector<bool> whole(n);
  std::vector<uint64_t> covered(dests.size());  // bytes read into each
  for (int i = 0; i < n; ++i) {
    const v1::ReadItem& it = plan.reads(i);
    if (it.dest_index() < 0 ||
        it.dest_index() >= static_cast<int>(dests.size())) {
      return absl::InternalError(absl::StrCat(
          "cairnd returned a read for '", it.fqn(), "' with destination ",
          it.dest_index(), " of ", dests.size()));
    }
    if (dests[it.dest_index()] == nullptr) {
      return absl::InternalError(
          absl::StrCat("cairnd returned a read for '", it.fqn(),
                       "', of which this rank wants nothing"));
    }
    dst[i] = dests[it.dest_index()]->data.data();
    // StateDict checked that the buffer is exactly the chunk's size.
    const uint64_t dst_size = dests[it.dest_index()]->data.size();
    uint64_t needed = 0;
    for (const auto& s : it.segments()) {
      if (s.dst_offset() + s.length() > dst_size ||
          s.src_offset() + s.length() > it.source().length()) {
        return absl::InternalError(absl::StrCat(
            "cairnd returned an out-of-bounds segment for '", it.fqn(), "'"));
      }
      needed += s.length();
    }
    whole[i] = needed == it.source().length();
    covered[it.dest_index()] += needed;
    stats_.bytes += needed;
    ++stats_.items;
  }
  // cairnd's planner covers every wanted byte exactly once; an answer that
  // does not (a cairnd older than this client, which does not know the short
  // form of the request and planned nothing) must not pass for a load.
  for (size_t d = 0; d < dests.size(); ++d) {
    const uint64_t size = dests[d] == nullptr ? 0 : dests[d]->data.size();
    if (covered[d] != size) {
      const v1::WantedChunk& w = request.wanted(static_cast<int>(d));
      return absl::InternalError(absl::StrCat(
          "cairnd's plan reads ", covered[d], " of the ", size, " bytes of '",
          w.tensor().fqn(), "' wanted chunk ", d,
          " (a cairnd older than this libcairn plans nothing for the short "
          "form of the request: upgrade cairnd)"));
    }
  }

  std::atomic<uint64_t> storage_bytes{0};
  std::vector<uint32_t> terms(n);  // crc32c terms of partly read chunks
  auto key_of = [&](const v1::ReadItem& it) {
    return absl::StrCat(plan.step_prefix(), it.source().object_key());
  };
  auto chunk_name = [&](const v1::ReadItem& it) {
    return absl::StrCat("'", it.fqn(), "' stored chunk at ",
                        it.source().offset(), "+", it.source().length());
  };
  auto data_loss = [&](const v1::ReadItem& it, uint32_t got) {
    return absl::DataLossError(absl::StrFormat(
        "checksum mismatch in '%s' stored chunk at %s@%d+%d: crc32c "
        "0x%08x, manifest says 0x%08x",
        it.fqn(), key_of(it), it.source().offset(), it.source().length(), got,
        it.source_crc32c()));
  };
  // Reads exactly the item's segments into place; checks a whole chunk, and
  // computes the crc32c term of a partial one for cairnd.
  auto read_needed = [&](int i) -> absl::Status {
    const v1::ReadItem& it = plan.reads(i);
    std::vector<storage::ByteRange> ranges;
    std::vector<absl::Span<char>> outs;
    ranges.reserve(it.segments_size());
    outs.reserve(it.segments_size());
    uint64_t needed = 0;
    for (const auto& s : it.segments()) {
      ranges.push_back({it.source().offset() + s.src_offset(), s.length()});
      outs.push_back(absl::MakeSpan(dst[i] + s.dst_offset(), s.length()));
      needed += s.length();
    }
    if (absl::Status s = store->ReadRanges(key_of(it), ranges, outs); !s.ok()) {
      return ObjectReadError(*store, plan, s, chunk_name(it), key_of(it));
    }
    storage_bytes += needed;
    if (whole[i]) {
      // Segments are sorted by source offset and tile the chunk.
      uint32_t crc = 0;
      for (const auto& out : outs) {
        crc = storage::Crc32cExtend(crc, out.data(), out.size());
      }
      if (crc != it.source_crc32c()) return data_loss(it, crc);
    } else if (check == PartialChunkCheck::kCollective) {
      storage::Crc32cPieces pieces;
      for (int k = 0; k < it.segments_size(); ++k) {
        pieces.Add(it.segments(k).src_offset(), outs[k].data(), outs[k].size());
      }
      terms[i] = pieces.Finish(it.source().length());
    }
    return absl::OkStatus();
  };
  // Reads the item's whole stored chunk, checks it, copies the needed part.
  auto read_whole = [&](int i) -> absl::Status {
    const v1::ReadItem& it = plan.reads(i);
    std::string scratch(it.source().length(), '\0');
    if (absl::Status s =
            store
                ->Read(key_of(it), {it.source().offset(), it.source().length()},
                       absl::MakeSpan(scratch))
                .status();
        !s.ok()) {
      return ObjectReadError(*store, plan, s, chunk_name(it), key_of(it));
    }
    storage_bytes += scratch.size();
    const uint32_t crc = storage::Crc32c(scratch.data(), scratch.size());
    if (crc != it.source_crc32c()) return data_loss(it, crc);
    for (const auto& s : it.segments()) {
      std::memcpy(dst[i] + s.dst_offset(), scratch.data() + s.src_offset(),
                  s.length());
    }
    return absl::OkStatus();
  };
  // Once cancelled, no further item is read (those being read finish).
  auto run = [&](const std::vector<int>& items,
                 const std::function<absl::Status(int)>& read) {
    std::vector<std::function<absl::Status()>> jobs;
    jobs.reserve(items.size());
    for (int i : items) {
      jobs.push_back([this, &read, i] {
        return cancel_.cancelled() ? cancel_.status() : read(i);
      });
    }
    return RunAll(io_pool_.get(), std::move(jobs));
  };

  std::vector<int> exact, partial, local;
  for (int i = 0; i < n; ++i) {
    if (!whole[i] && check == PartialChunkCheck::kReadWhole) {
      local.push_back(i);
    } else {
      exact.push_back(i);
      if (!whole[i] && check == PartialChunkCheck::kCollective) {
        partial.push_back(i);
      }
    }
  }
  absl::Status read = run(exact, read_needed);
  if (read.ok()) read = run(local, read_whole);
  stats_.chunks_verified_locally += local.size();
  if (!reported) {
    if (!read.ok()) return read;  // report_failure tells cairnd
    reported = true;
    v1::VerifyLoadRequest verify = LoadReport(plan);
    for (int i : partial) {
      const v1::ReadItem& it = plan.reads(i);
      v1::ChunkPiece* p = verify.add_pieces();
      if (it.has_chunk()) {  // from read columns: the chunk's id names it
        p->set_chunk(it.chunk());
      } else {
        p->set_fqn(it.fqn());
        *p->mutable_source() = it.source();
      }
      *p->mutable_overlap() = it.overlap();
      p->set_crc_term(terms[i]);
    }
    absl::StatusOr<v1::VerifyLoadResponse> verdict =
        CallWithRetry(&v1::Coordinator::Stub::VerifyLoad, *stub_, verify,
                      options_.collective_timeout, options_.max_retries,
                      &cancel_, contact_.get());
    // Every planned byte is in place, its partly read chunks unverified.
    if (!verdict.ok() && cancel_.cancelled()) return cancel_.status();
    std::vector<int> recheck;
    if (absl::IsInvalidArgument(verdict.status())) {
      // The load itself is wrong (ranks disagree on world_size): no local
      // check makes it right.
      return verdict.status();
    }
    if (verdict.ok()) {
      for (int k : verdict->verify_locally()) {
        if (k < 0 || k >= static_cast<int>(partial.size())) {
          return absl::InternalError(absl::StrCat(
              "cairnd asked to re-verify piece ", k, " of ", partial.size()));
        }
        recheck.push_back(partial[k]);
      }
      stats_.chunks_verified_by_cairnd += verdict->chunks_verified();
    } else {
      CAIRN_LOG(warn,
                "rank {}: cairnd could not verify this load's partly read "
                "chunks ({}); reading {} of them whole",
                options_.rank, verdict.status().ToString(), partial.size());
      recheck = partial;
    }
    read = run(recheck, read_whole);
    stats_.chunks_verified_locally += recheck.size();
  } else if (read.ok() && !partial.empty()) {
    // No load round to verify in (cairnd did not open one): check locally.
    read = run(partial, read_whole);
    stats_.chunks_verified_locally += partial.size();
  }
  stats_.bytes_storage = storage_bytes.load();
  return read;
}

bool Checkpointer::Impl::JoinsLoadCollective() const {
  return options_.partial_chunk_check == PartialChunkCheck::kCollective;
}

v1::VerifyLoadRequest Checkpointer::Impl::LoadReport(
    const v1::PlanLoadResponse& plan) const {
  v1::VerifyLoadRequest report;
  report.set_job(options_.job);
  report.set_step(plan.step());
  report.set_rank(options_.rank);
  report.set_world_size(options_.world_size);
  report.set_load_round(plan.load_round());
  return report;
}

void Checkpointer::Impl::ReportLoadFailure(
    const v1::VerifyLoadRequest& request) {
  // A report without pieces is answered at once (cairnd only records that
  // this rank is done), so this waits for nothing: no call outlives the
  // Checkpointer. Best effort: if cairnd cannot be told, the others verify
  // locally after its deadline.
  absl::StatusOr<v1::VerifyLoadResponse> r =
      CallWithRetry(&v1::Coordinator::Stub::VerifyLoad, *stub_, request,
                    std::min(options_.rpc_timeout, absl::Seconds(30)),
                    /*max_retries=*/0);
  if (!r.ok()) {
    CAIRN_LOG(warn, "rank {}: could not tell cairnd that its load failed: {}",
              options_.rank, r.status().ToString());
  }
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
