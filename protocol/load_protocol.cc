// The one load protocol (see load_protocol.h).
#include "protocol/load_protocol.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::protocol {
namespace {

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
// destinations' order.
std::vector<const ChunkDestination*> AddWanted(const LoadDestinations& dests,
                                               v1::PlanLoadRequest* request) {
  using Tensor = LoadDestinations::Tensor;
  std::vector<const Tensor*> order;
  bool one_each = true;
  for (const Tensor& t : dests.tensors()) {
    int chunks = 0;
    for (const ChunkDestination& c : t.chunks) {
      chunks += planner::Volume(c.box) > 0;
    }
    // A scalar has no empty box: a rank without it cannot say so.
    if (chunks > 1 || (chunks == 0 && t.global_shape.empty())) {
      one_each = false;
    }
    order.push_back(&t);
  }
  if (one_each) {
    std::sort(order.begin(), order.end(),
              [](const Tensor* a, const Tensor* b) { return a->fqn < b->fqn; });
  }
  std::vector<const ChunkDestination*> out;
  const auto add = [&](const Tensor& t, const planner::ChunkBox& box,
                       const ChunkDestination* dest) {
    v1::WantedChunk* w = request->add_wanted();
    w->mutable_tensor()->set_fqn(t.fqn);
    w->mutable_tensor()->set_dtype(convert::DTypeToProto(t.dtype));
    w->mutable_tensor()->mutable_global_shape()->Assign(t.global_shape.begin(),
                                                        t.global_shape.end());
    convert::BoxToProto(box, w->mutable_box());
    out.push_back(dest);
  };
  for (const Tensor* t : order) {
    const ChunkDestination* held = nullptr;
    for (const ChunkDestination& c : t->chunks) {
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
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// LoadDestinations

absl::Status LoadDestinations::CheckNewName(const std::string& fqn) const {
  if (names_.contains(fqn)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", fqn, "' is already a destination of this load"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkBuffer(absl::string_view fqn, planner::DType dtype,
                              const planner::Shape& global_shape,
                              const planner::ChunkBox& box,
                              absl::Span<const char> data) {
  const size_t elem = planner::DTypeSize(dtype);
  absl::Status s = planner::ValidateBoxInShape(box, global_shape);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("tensor '", fqn, "': ", s.message()));
  }
  // Volume(box) <= Volume(global_shape), which ValidateShape bounds.
  const uint64_t need = static_cast<uint64_t>(planner::Volume(box)) * elem;
  if (data.size() != need) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", fqn, "' chunk ", planner::BoxToString(box),
                     " of ", planner::DTypeName(dtype), " needs a buffer of ",
                     need, " bytes, got ", data.size()));
  }
  if (data.data() == nullptr && need > 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", fqn, "' chunk ",
                                                   planner::BoxToString(box),
                                                   " has no data buffer"));
  }
  return absl::OkStatus();
}

absl::Status LoadDestinations::AddTensor(std::string fqn, planner::DType dtype,
                                         planner::Shape global_shape,
                                         std::vector<ChunkDestination> chunks) {
  CAIRN_RETURN_IF_ERROR(CheckNewName(fqn));
  const size_t elem = planner::DTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", fqn, "' has no valid dtype"));
  }
  for (const ChunkDestination& c : chunks) {
    CAIRN_RETURN_IF_ERROR(
        CheckChunkBuffer(fqn, dtype, global_shape, c.box, c.data));
  }
  names_.insert(fqn);
  tensors_.push_back(Tensor{std::move(fqn), dtype, std::move(global_shape),
                            std::move(chunks)});
  return absl::OkStatus();
}

absl::Status LoadDestinations::AddBytes(std::string fqn, std::string* blob) {
  CAIRN_RETURN_IF_ERROR(CheckNewName(fqn));
  if (blob == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes entry '", fqn, "' has no blob"));
  }
  names_.insert(fqn);
  bytes_.push_back(Bytes{std::move(fqn), blob});
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// LoadProtocol

LoadProtocol::LoadProtocol(v1::Coordinator::Stub* stub,
                           LoadProtocolOptions options)
    : stub_(stub), options_(std::move(options)) {}

std::string LoadProtocol::Where(std::optional<int64_t> step) const {
  return step.has_value()
             ? absl::StrCat("rank ", options_.rank, " loading job '",
                            options_.job, "' step ", *step)
             : absl::StrCat("rank ", options_.rank, " loading job '",
                            options_.job, "' latest");
}

bool LoadProtocol::cancelled() const {
  return options_.cancellation != nullptr && options_.cancellation->cancelled();
}

absl::Status LoadProtocol::Cancelled(absl::string_view where) const {
  return absl::CancelledError(
      absl::StrCat(where, ": ", options_.cancellation->status().message()));
}

absl::StatusOr<storage::ShardStore*> LoadProtocol::StoreFor(
    const std::string& uri) {
  if (options_.store_for) return options_.store_for(uri);
  if (store_ == nullptr || store_uri_ != uri) {
    CAIRN_ASSIGN_OR_RETURN(store_,
                           storage::OpenShardStore(uri, options_.store));
    store_uri_ = uri;
  }
  return store_.get();
}

absl::StatusOr<int64_t> LoadProtocol::Load(std::optional<int64_t> step,
                                           const LoadDestinations& dests,
                                           ThreadPool& pool) {
  stats_ = LoadStats();
  Cancellation* const cancel = options_.cancellation;
  if (cancelled()) return Cancelled(Where(step));
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
  if (step.has_value()) {
    request.set_step(*step);
  } else {
    request.set_latest(true);
  }
  // wanted[i]: where wanted chunk i goes (null: an empty box, nothing to
  // read).
  const std::vector<const ChunkDestination*> wanted =
      AddWanted(dests, &request);
  for (const LoadDestinations::Bytes& b : dests.bytes()) {
    request.add_wanted_bytes(b.fqn);
  }

  // The short form when the rank wants one box of each tensor: their digest
  // and boxes, a fraction of the full form's bytes (no fqn, dtype or shape
  // per chunk). cairnd asks for the full form when the checkpoint's tensors
  // differ from this rank's.
  v1::PlanLoadRequest short_form;
  const bool compact_wanted = convert::CompactWanted(request, &short_form);
  absl::StatusOr<v1::PlanLoadResponse> planned =
      CallWithRetry(&v1::Coordinator::Stub::PlanLoad, *stub_,
                    compact_wanted ? short_form : request, options_.rpc_timeout,
                    options_.max_retries, cancel, options_.contact);
  if (planned.ok() && planned->resend_wanted()) {
    const v1::PlanLoadResponse asked = *std::move(planned);
    planned =
        compact_wanted
            ? CallWithRetry(&v1::Coordinator::Stub::PlanLoad, *stub_, request,
                            options_.rpc_timeout, options_.max_retries, cancel,
                            options_.contact)
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
  if (!planned.ok() && cancelled()) {
    // Nothing read. If cairnd answered the cancelled call after all, this
    // rank is a member of a load round that never hears from it: its
    // peers verify locally after cairnd's verify deadline.
    return Cancelled(Where(step));
  }
  if (absl::IsUnavailable(planned.status())) {
    // Not answered (CallWithRetry's own error): name the load.
    return absl::UnavailableError(
        absl::StrCat(Where(step), ": ", planned.status().message()));
  }
  if (!planned.ok()) {
    // Refused (a dtype or shape that differs, say): cairnd took this rank
    // out of the load round, so the others do not wait for it.
    return planned.status();
  }
  if (planned->tier() == v1::TIER_MEMORY) {
    // Nothing of it is on storage: only the agents holding it can serve it.
    if (JoinsLoadCollective() && planned->load_round() != 0) {
      ReportLoadFailure(LoadReport(*planned));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        Where(planned->step()),
        ": a memory checkpoint, held in cairn-agents' memory and not on "
        "storage: load it through cairn-agent, or write it to storage first "
        "(cairn persist JOB STEP)"));
  }
  if (absl::Status s = convert::ExpandReadColumns(request, &*planned);
      !s.ok()) {
    // cairnd took this rank into its load round: the others must not wait.
    if (JoinsLoadCollective() && planned->load_round() != 0) {
      ReportLoadFailure(LoadReport(*planned));
    }
    return absl::Status(
        s.code(), absl::StrCat(Where(planned->step()), ": ", s.message()));
  }
  const v1::PlanLoadResponse& plan = *planned;
  if (options_.after_plan_load_for_test) {
    options_.after_plan_load_for_test(plan.step());
  }
  const absl::Time t1 = absl::Now();
  stats_.plan_time = t1 - t0;
  absl::Status read = ReadItems(request, plan, wanted, pool);
  if (read.ok() && cancelled()) read = cancel->status();
  if (read.ok()) read = ReadBytesEntries(plan, dests);
  if (!read.ok()) {
    return absl::Status(read.code(),
                        absl::StrCat(Where(plan.step()), ": ", read.message()));
  }
  stats_.io_time = absl::Now() - t1;
  return plan.step();
}

absl::Status LoadProtocol::ReadBytesEntries(const v1::PlanLoadResponse& plan,
                                            const LoadDestinations& dests) {
  // Bytes entries come back in request order.
  if (plan.bytes_entries_size() != static_cast<int>(dests.bytes().size())) {
    return absl::InternalError(absl::StrCat(
        "cairnd returned ", plan.bytes_entries_size(), " bytes entries for ",
        dests.bytes().size(), " requested"));
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
    *dests.bytes()[i].blob = std::move(blob);
  }
  return absl::OkStatus();
}

absl::Status LoadProtocol::ReadItems(
    const v1::PlanLoadRequest& request, const v1::PlanLoadResponse& plan,
    const std::vector<const ChunkDestination*>& dests, ThreadPool& pool) {
  const PartialChunkCheck check = options_.partial_chunk_check;
  Cancellation* const cancel = options_.cancellation;
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
    // The caller's buffer, writable (LoadDestinations lends it to the load).
    dst[i] = dests[it.dest_index()]->data.data();
    // LoadDestinations checked that the buffer is exactly the chunk's size.
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
      jobs.push_back([this, cancel, &read, i] {
        return cancelled() ? cancel->status() : read(i);
      });
    }
    return RunAll(&pool, std::move(jobs));
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
                      options_.collective_timeout, options_.max_retries, cancel,
                      options_.contact);
    // Every planned byte is in place, its partly read chunks unverified.
    if (!verdict.ok() && cancelled()) return cancel->status();
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

bool LoadProtocol::JoinsLoadCollective() const {
  return options_.partial_chunk_check == PartialChunkCheck::kCollective;
}

v1::VerifyLoadRequest LoadProtocol::LoadReport(
    const v1::PlanLoadResponse& plan) const {
  v1::VerifyLoadRequest report;
  report.set_job(options_.job);
  report.set_step(plan.step());
  report.set_rank(options_.rank);
  report.set_world_size(options_.world_size);
  report.set_load_round(plan.load_round());
  return report;
}

void LoadProtocol::ReportLoadFailure(const v1::VerifyLoadRequest& request) {
  // A report without pieces is answered at once (cairnd only records that
  // this rank is done), so this waits for nothing: no call outlives the
  // Load. Best effort: if cairnd cannot be told, the others verify locally
  // after its deadline.
  absl::StatusOr<v1::VerifyLoadResponse> r =
      CallWithRetry(&v1::Coordinator::Stub::VerifyLoad, *stub_, request,
                    std::min(options_.rpc_timeout, absl::Seconds(30)),
                    /*max_retries=*/0);
  if (!r.ok()) {
    CAIRN_LOG(warn, "rank {}: could not tell cairnd that its load failed: {}",
              options_.rank, r.status().ToString());
  }
}

}  // namespace cairn::protocol
