// The load protocol of the coordinator: PlanLoad (load rounds, `latest`
// resolved once per round, the load plan cache) and VerifyLoad (ranks'
// pieces combined per stored chunk). See coordinator.h.

#include <algorithm>
#include <atomic>
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
#include "absl/types/span.h"
#include "common/crash_point.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "proto/convert/load_answer.h"
#include "proto/convert/load_request.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_internal.h"
#include "server/coordinator/load_verifier.h"
#include "server/coordinator/request_bounds.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::coordinator {

std::string PlanLoadAnswer::Serialize() const {
  std::string out = plan->bytes;
  convert::AppendLoadRound(load_round, &out);
  return out;
}

absl::StatusOr<v1::PlanLoadResponse> PlanLoadAnswer::Decode() const {
  v1::PlanLoadResponse resp;
  if (!resp.ParseFromString(Serialize())) {
    return absl::InternalError("a PlanLoad answer does not decode");
  }
  return resp;
}

absl::StatusOr<v1::PlanLoadResponse> Coordinator::PlanLoad(
    const v1::PlanLoadRequest& request) {
  CAIRN_ASSIGN_OR_RETURN(PlanLoadAnswer answer, PlanLoadEncoded(request));
  return answer.Decode();
}

namespace {

// Whether `plan` (one that reads nothing) is a resend_wanted answer: a few
// bytes to parse, and only for short-form requests planned empty.
bool IsResendAnswer(const EncodedLoadPlan& plan) {
  v1::PlanLoadResponse resp;
  return resp.ParseFromString(plan.bytes) && resp.resend_wanted();
}

}  // namespace

absl::StatusOr<PlanLoadAnswer> Coordinator::PlanLoadEncoded(
    const v1::PlanLoadRequest& request) {
  const absl::Time start = absl::Now();
  const auto record = [&](const EncodedLoadPlan& plan) {
    RecordLoadPlanned(plan);
    m_.load_plan_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  };
  const std::string& job = request.job();
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(job));
  CAIRN_RETURN_IF_ERROR(CheckLoadRequestBounds(request, options_));
  const int rank = request.rank();
  const int world = request.world_size();
  const bool latest = request.ref_case() != v1::PlanLoadRequest::kStep;
  int64_t step = -1;
  if (!latest) {
    step = request.step();
    CAIRN_RETURN_IF_ERROR(storage::ValidateStep(step));
    absl::StatusOr<v1::CheckpointRecord> rec =
        catalog_->GetCheckpoint(job, step);
    if (!rec.ok()) {
      if (absl::IsNotFound(rec.status())) {
        return absl::NotFoundError(
            absl::StrCat("no checkpoint ", SaveName(job, step)));
      }
      return rec.status();
    }
    if (rec->state() != v1::CHECKPOINT_STATE_COMMITTED) {
      return absl::FailedPreconditionError(
          absl::StrCat(SaveName(job, step), " is not committed (state ",
                       v1::CheckpointState_Name(rec->state()), ")"));
    }
  }
  // The newest committed step, read before the lock (no lock is held across
  // catalog I/O); a live round's step takes precedence over it.
  int64_t newest = -1;
  if (latest) {
    absl::StatusOr<v1::CheckpointRecord> rec = NewestRestorable(job);
    if (rec.ok()) {
      newest = rec->step();
    } else if (!absl::IsNotFound(rec.status())) {
      return rec.status();
    }
  }
  if (world == 0) {  // no round: a one-off load (old clients, tools)
    if (latest && newest < 0) {
      return absl::NotFoundError(
          absl::StrCat("job '", job, "' has no committed checkpoint"));
    }
    CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<const EncodedLoadPlan> planned,
                           PlanLoadOfStep(request, latest ? newest : step));
    record(*planned);
    return PlanLoadAnswer{std::move(planned), 0};
  }
  CAIRN_RETURN_IF_ERROR(ValidateRankOfWorld(
      rank, world, options_.max_world_size,
      absl::StrCat("rank ", rank, " loading job '", job, "'")));

  CAIRN_ASSIGN_OR_RETURN(
      LoadRounds::Joined joined,
      load_rounds_.Join(job, rank, world, request.verify_in_round(), step,
                        newest, absl::Now()));
  absl::StatusOr<std::shared_ptr<const EncodedLoadPlan>> planned =
      PlanLoadOfStep(request, joined.step);
  if (!planned.ok()) {
    CAIRN_LOG(warn, "job '{}' step {} rank {}/{}: load refused: {}", job,
              joined.step, rank, world, planned.status().ToString());
    load_rounds_.Leave(joined.round, rank, absl::Now());
    return planned.status();
  }
  // Nothing planned, the rank asked to send its wanted chunks in full: its
  // next PlanLoad is the same member of the same round, even if the round
  // is complete by then (the ranks of a load that reads fewer tensors than
  // the checkpoint's all plan twice).
  if (!request.tensors_digest().empty() && (*planned)->reads == 0 &&
      IsResendAnswer(**planned)) {
    load_rounds_.Resend(joined, job, rank, world, request.verify_in_round(),
                        absl::Now());
  }
  // One line per load round (rank 0's), the ranks' own at debug.
  if (rank == 0) {
    CAIRN_LOG(info, "job '{}' step {}: load round {} of {} ranks{}", job,
              joined.step, joined.round, world, latest ? " (latest)" : "");
  }
  CAIRN_LOG(debug, "job '{}' step {} rank {}/{}: load planned, {} read items",
            job, joined.step, rank, world, (*planned)->reads);
  record(**planned);
  return PlanLoadAnswer{*std::move(planned), joined.round};
}

namespace {

// What decides a rank's load plan besides the checkpoint, hashed: its wanted
// chunks and bytes entries. (XXH3, hashed as it is read: a short request's
// boxes are tens of KB at 16k ranks, too many to copy and hash slowly for
// every rank of a round.)
std::string LayoutHash(
    const std::vector<planner::WantedChunk>& wanted,
    const google::protobuf::RepeatedPtrField<std::string>& wanted_bytes) {
  planner::StreamedKeyHash k;
  k.PutU64(wanted.size());
  for (const planner::WantedChunk& w : wanted) {
    k.PutString(w.fqn);
    k.PutU64(static_cast<uint64_t>(w.dtype));
    k.PutInts(w.global_shape);
    k.PutInts(w.box.offsets);
    k.PutInts(w.box.sizes);
  }
  k.PutU64(static_cast<uint64_t>(wanted_bytes.size()));
  for (const std::string& fqn : wanted_bytes) k.PutString(fqn);
  return k.Hex();
}

// The same for a short-form request: its digest, boxes and bytes entries.
std::string ShortLayoutHash(const v1::PlanLoadRequest& request) {
  planner::StreamedKeyHash k;
  k.PutString(request.tensors_digest());
  k.PutInts(request.wanted_boxes());
  k.PutU64(static_cast<uint64_t>(request.wanted_bytes_size()));
  for (const std::string& fqn : request.wanted_bytes()) k.PutString(fqn);
  return k.Hex();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const EncodedLoadPlan>>
Coordinator::PlanLoadOfStep(const v1::PlanLoadRequest& request, int64_t step) {
  const std::string& job = request.job();
  const auto refused = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("rank ", request.rank(), " loading ",
                                     SaveName(job, step), ": ", s.message()));
  };
  // A memory checkpoint names no stored object: its ranks load it through
  // their agents (which take only the step from this answer); a rank
  // reading storage itself is told the tier and refuses.
  if (absl::StatusOr<v1::CheckpointRecord> rec =
          catalog_->GetCheckpoint(job, step);
      rec.ok() && rec->tier() == v1::TIER_MEMORY) {
    v1::PlanLoadResponse in_memory;
    in_memory.set_step(step);
    in_memory.set_storage_uri(store_->uri());
    in_memory.set_tier(v1::TIER_MEMORY);
    auto plan = std::make_shared<EncodedLoadPlan>();
    plan->bytes = in_memory.SerializeAsString();
    return plan;
  }
  // The short form names the checkpoint's own tensors by their digest.
  const bool short_form = !request.tensors_digest().empty();
  if (short_form && request.wanted_size() > 0) {
    return refused(absl::InvalidArgumentError(
        absl::StrCat("the request has both tensors_digest and ",
                     request.wanted_size(), " wanted chunks; send one form")));
  }
  std::vector<planner::WantedChunk> wanted;  // the full form
  if (!short_form) {
    wanted.reserve(request.wanted_size());
    for (const v1::WantedChunk& w : request.wanted()) {
      absl::StatusOr<planner::WantedChunk> c = convert::WantedFromProto(w);
      if (!c.ok()) return refused(c.status());
      wanted.push_back(std::move(*c));
    }
  }
  // Identical requests (same rank layout) are answered from the cache. A
  // short request is keyed by its digest and boxes as sent: one answered from
  // the cache matched the checkpoint's digest before (resend_wanted answers
  // are not cached).
  // The form of the answer: full, or read columns.
  const convert::AnswerForm form = convert::AnswerFormOf(request);
  const std::string cache_key =
      absl::StrCat(job, "\n", step, "\n",
                   absl::string_view("fr").substr(static_cast<int>(form), 1),
                   short_form ? ShortLayoutHash(request)
                              : LayoutHash(wanted, request.wanted_bytes()));
  const auto count = [&](bool from_cache) {
    absl::MutexLock lock(&mu_);
    if (short_form) ++stats_.load_requests_short;
    if (from_cache) ++stats_.load_plans_from_cache;
  };
  if (auto hit = load_plans_.Lookup(cache_key)) {
    count(/*from_cache=*/true);
    m_.load_plan_hits->Increment();
    return hit;
  }

  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<const LoadedCheckpoint> ckpt,
                         LoadCheckpoint(job, step));
  if (short_form) {
    if (request.tensors_digest() != ckpt->tensors_digest) {
      {
        absl::MutexLock lock(&mu_);
        ++stats_.load_wanted_resends;
      }
      // Other tensors than the checkpoint's (a subset, another dtype or
      // shape): the rank sends them in full, and is told what differs.
      v1::PlanLoadResponse resend;
      resend.set_step(step);
      resend.set_storage_uri(store_->uri());
      resend.set_resend_wanted(true);
      auto plan = std::make_shared<EncodedLoadPlan>();
      plan->bytes = resend.SerializeAsString();
      return plan;
    }
    if (absl::Status s = convert::CheckWantedBoxes(request, *ckpt->planner,
                                                   ckpt->tensors_by_fqn);
        !s.ok()) {
      return refused(s);
    }
  }
  m_.load_plan_misses->Increment();
  // Each read item is written straight into the answer's wire bytes.
  std::atomic<size_t>& answer_bytes =
      ckpt->answer_bytes[static_cast<int>(form)];
  convert::PlanLoadAnswerWriter answer(
      step, store_->uri(), form, answer_bytes.load(std::memory_order_relaxed));
  // A rank taking read columns derives the copy segments itself.
  const auto add = [&answer](const planner::LoadPlanner::ReadView& r) {
    answer.AddRead(r);
  };
  const bool segments = form == convert::AnswerForm::kFull;
  const absl::Status planned =
      short_form ? ckpt->planner->PlanEach(
                       planner::WantedBoxRun{
                           ckpt->tensors_by_fqn,
                           absl::MakeConstSpan(request.wanted_boxes().data(),
                                               request.wanted_boxes_size())},
                       add, segments)
                 : ckpt->planner->PlanEach(wanted, add, segments);
  if (!planned.ok()) return refused(planned);
  for (const std::string& fqn : request.wanted_bytes()) {
    auto it = ckpt->bytes_index.find(fqn);
    if (it == ckpt->bytes_index.end()) {
      return refused(absl::NotFoundError(
          absl::StrCat("bytes entry '", fqn, "' is not in the checkpoint")));
    }
    answer.AddBytesEntry(ckpt->bytes_entries[it->second]);
  }
  count(/*from_cache=*/false);
  auto plan = std::make_shared<EncodedLoadPlan>();
  plan->reads = answer.reads();
  plan->bytes_to_read = answer.bytes_to_read();
  plan->bytes = std::move(answer).Finish(storage::StepPrefix(job, step));
  answer_bytes.store(plan->bytes.size(), std::memory_order_relaxed);
  // Cached from the second ask of a layout on: in a sharded load most ranks
  // have a layout of their own, and holding every answer would keep up to
  // the cache's bound of answers nobody asks for again in memory; replicas
  // asking for one layout are answered from the cache from the third on.
  static const auto* const kSeen =
      new std::shared_ptr<const bool>(std::make_shared<const bool>(true));
  if (load_layouts_seen_.Lookup(cache_key) == nullptr) {
    load_layouts_seen_.Insert(cache_key, *kSeen, cache_key.size() + 64);
  } else {
    load_plans_.Insert(cache_key, plan, plan->bytes.size() + cache_key.size());
  }
  return plan;
}

// ---------------------------------------------------------------------------
// VerifyLoad

void Coordinator::VerifyLoad(const v1::VerifyLoadRequest& request,
                             Done<v1::VerifyLoadResponse> done) {
  const std::string& job = request.job();
  const int64_t step = request.step();
  const int rank = request.rank();
  const int world = request.world_size();
  if (absl::Status s = ValidateJobStep(job, step); !s.ok()) return done(s);
  if (absl::Status s = CheckLoadRequestBounds(request, options_); !s.ok()) {
    return done(s);
  }
  const std::string who = absl::StrCat("rank ", rank, " verifying its load of ",
                                       SaveName(job, step));
  if (absl::Status s =
          ValidateRankOfWorld(rank, world, options_.max_world_size, who);
      !s.ok()) {
    return done(s);
  }
  if (request.load_round() == 0) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(who,
                     ": no load round (PlanLoad was called without "
                     "world_size); verify partly read chunks locally")));
  }
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> ckpt =
      LoadCheckpoint(job, step);
  if (!ckpt.ok()) {
    return done(absl::Status(ckpt.status().code(),
                             absl::StrCat(who, ": ", ckpt.status().message())));
  }
  const planner::LoadPlanner& stored_tensors = *(*ckpt)->planner;
  LoadRounds::Pieces pieces;
  pieces.Reserve(request.pieces_size());
  planner::StoredChunkView stored;  // reused: no box copy per piece
  for (int i = 0; i < request.pieces_size(); ++i) {
    const v1::ChunkPiece& p = request.pieces(i);
    // The stored chunk, by id (read columns) or by location (the full form).
    const std::optional<std::pair<int, int>> at =
        p.has_chunk() ? stored_tensors.ChunkOfId(p.chunk())
                      : stored_tensors.ChunkAt(p.source().object_key(),
                                               p.source().offset());
    auto bad = [&](absl::string_view what) {
      const std::string chunk =
          p.has_chunk()
              ? absl::StrCat(
                    "stored chunk ", p.chunk(),
                    at.has_value()
                        ? absl::StrCat(" of '", stored_tensors.fqn(at->first),
                                       "'")
                        : "")
              : absl::StrCat("'", p.fqn(), "' at ", p.source().object_key(),
                             "@", p.source().offset());
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": piece ", i, " of ", chunk, ": ", what));
    };
    if (!at.has_value()) {
      return done(bad(p.has_chunk()
                          ? absl::StrCat("the checkpoint has ",
                                         stored_tensors.num_chunk_ids(),
                                         " stored chunks")
                          : "no stored chunk of the checkpoint is there"));
    }
    const auto [t, c] = *at;
    stored_tensors.Fill(t, c, &stored);
    if (!p.has_chunk()) {
      const std::string& fqn = stored_tensors.fqn(t);
      if (fqn != p.fqn()) {
        return done(
            bad(absl::StrCat("the chunk there belongs to '", fqn, "'")));
      }
      if (p.source().length() != stored.length) {
        return done(
            bad(absl::StrCat("length ", p.source().length(),
                             " but the stored chunk has ", stored.length)));
      }
    }
    const v1::ChunkBox& overlap = p.overlap();
    if (!convert::NonEmptyBoxInside(overlap, stored.box)) {
      // Refused: the message says why, from the box as parsed.
      absl::StatusOr<planner::ChunkBox> box =
          convert::BoxFromProto(overlap, stored_tensors.fqn(t));
      if (!box.ok()) return done(bad(box.status().message()));
      return done(bad(absl::StrCat("box ", planner::BoxToString(*box),
                                   " is empty or not inside the stored chunk ",
                                   planner::BoxToString(stored.box))));
    }
    pieces.Add(stored_tensors.Id(t, c), stored.box, p.crc_term(),
               overlap.offsets(), overlap.sizes());
  }

  load_rounds_.Report(
      request.load_round(), job, step, rank, world, who,
      // The stored chunks, kept alive by their loaded checkpoint.
      std::shared_ptr<const planner::LoadPlanner>(*ckpt,
                                                  (*ckpt)->planner.get()),
      std::move(pieces), absl::Now(), std::move(done));
}

}  // namespace cairn::coordinator
