#include "server/coordinator/save_session.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/large_array.h"
#include "common/status_macros.h"
#include "proto/convert/plan_convert.h"
#include "server/coordinator/messages.h"
#include "server/coordinator/request_bounds.h"
#include "storage/checkpoint_layout.h"
#include "storage/manifest.h"

namespace cairn::coordinator {

SaveSession::SaveSession(std::string job, int64_t step, int world_size,
                         std::string attempt, std::string storage_uri,
                         absl::Time now, absl::Duration begin_deadline)
    : job_(std::move(job)),
      step_(step),
      world_size_(world_size),
      attempt_(std::move(attempt)),
      storage_uri_(std::move(storage_uri)),
      step_prefix_(storage::StepPrefix(job_, step_)),
      created_(now),
      begin_deadline_(begin_deadline),
      deadline_(now + begin_deadline) {}

SaveSession::RankState SaveSession::Rank(int rank) const {
  RankState state;
  if (phase_ == Phase::kGathering) {
    auto a = arrivals_.find(rank);
    if (a != arrivals_.end()) {
      state.in_save = true;
      state.incarnation = a->second.incarnation;
      if (auto w = begin_waiters_.find(rank); w != begin_waiters_.end()) {
        for (const ParkedBegin& call : w->second) {
          state.waiting = state.waiting || (call.gone && !call.gone());
        }
      }
    } else if (auto d = departed_.find(rank); d != departed_.end()) {
      state.departed = true;
      state.incarnation = d->second;
    }
  } else if (rank >= 0 && static_cast<size_t>(rank) < incarnations_.size()) {
    state.in_save = true;
    state.incarnation = incarnations_[rank];
    state.reported = static_cast<size_t>(rank) < results_.size() &&
                     results_[rank].has_value();
  }
  return state;
}

std::vector<int> SaveSession::ArrivedRanks() const {
  std::vector<int> arrived;
  for (const auto& [r, a] : arrivals_) arrived.push_back(r);
  std::sort(arrived.begin(), arrived.end());
  return arrived;
}

absl::Status SaveSession::WorldSizeMismatch(int rank, int world) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "save of ", SaveName(job_, step_), " aborted: rank ", rank,
      " says world_size ", world, " but ranks ",
      RankList(ArrivedRanks(), world_size_), " say world_size ", world_size_,
      "; every rank of a save must pass the same world_size"));
}

SaveSession::Arrival SaveSession::Arrive(
    int rank, std::shared_ptr<const planner::PackedLocalPlan> plan,
    std::string fingerprint, std::string held_plan_id, uint64_t incarnation,
    int64_t max_plan_items, absl::Time now, Done<v1::BeginSaveResponse>& done,
    CallerGone gone, absl::StatusOr<v1::BeginSaveResponse>* answer) {
  const std::string* arrived_fingerprint = nullptr;
  if (phase_ == Phase::kGathering) {
    auto a = arrivals_.find(rank);
    if (a != arrivals_.end()) arrived_fingerprint = &a->second.fingerprint;
  } else {
    arrived_fingerprint = &fingerprints_[rank];
  }
  if (arrived_fingerprint != nullptr) {
    // A retry (or a duplicate rank): same plan, same answer.
    if (*arrived_fingerprint != fingerprint) {
      *answer = absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " of ", SaveName(job_, step_),
          " called BeginSave twice with different plans (duplicate "
          "rank?)"));
      return Arrival::kAnswered;
    }
    if (phase_ == Phase::kGathering || phase_ == Phase::kPlanning) {
      begin_waiters_[rank].push_back({std::move(done), std::move(gone)});
      return Arrival::kParked;
    }
    *answer = RankResponse(rank);
    return Arrival::kAnswered;
  }
  if (phase_ != Phase::kGathering) {
    *answer = absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " of ", SaveName(job_, step_),
                     " arrived after the plan was built"));
    return Arrival::kAnswered;
  }
  const int64_t items =
      plan == nullptr ? 0 : static_cast<int64_t>(plan->items.size());
  if (plan_items_ + items > max_plan_items) {
    *answer = absl::ResourceExhaustedError(absl::StrCat(
        "rank ", rank, " of ", SaveName(job_, step_), ": its ", items,
        " plan items would bring the save to ", plan_items_ + items,
        " items; at most ", max_plan_items,
        " per save are accepted (cairnd --max-plan-items-per-save)"));
    return Arrival::kAnswered;
  }
  plan_items_ += items;
  // Every rank before it left: the begin deadline counts from this one.
  if (arrivals_.empty() && any_departed_) deadline_ = now + begin_deadline_;
  arrivals_[rank] = Arrived{std::move(plan), std::move(fingerprint),
                            std::move(held_plan_id), incarnation, now};
  departed_.erase(rank);
  begin_waiters_[rank].push_back({std::move(done), std::move(gone)});
  if (++arrived_ < world_size_) return Arrival::kParked;
  // Every rank is here: the world is real, lay the session out densely.
  phase_ = Phase::kPlanning;
  departed_.clear();
  plans_.resize(world_size_);
  fingerprints_.resize(world_size_);
  held_plan_ids_.resize(world_size_);
  incarnations_.resize(world_size_);
  for (auto& [r, a] : arrivals_) {
    plans_[r] = std::move(a.plan);
    fingerprints_[r] = std::move(a.fingerprint);
    held_plan_ids_[r] = std::move(a.held_plan_id);
    incarnations_[r] = a.incarnation;
  }
  arrivals_.clear();
  return Arrival::kAllArrived;
}

std::vector<SaveSession::BeginWaiter> SaveSession::NeedPlansOf(
    const std::vector<int>& ranks) {
  std::vector<bool> resend(static_cast<size_t>(world_size_), false);
  for (int r : ranks) resend[r] = true;
  phase_ = Phase::kGathering;
  arrived_ = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (resend[r]) continue;
    arrivals_[r] =
        Arrived{std::move(plans_[r]), std::move(fingerprints_[r]),
                std::move(held_plan_ids_[r]), incarnations_[r], created_};
    ++arrived_;
  }
  plans_.clear();
  fingerprints_.clear();
  held_plan_ids_.clear();
  incarnations_.clear();
  std::vector<BeginWaiter> waiters;
  for (int r : ranks) {
    auto it = begin_waiters_.find(r);
    if (it == begin_waiters_.end()) continue;
    for (auto& call : it->second) waiters.emplace_back(r, std::move(call.done));
    begin_waiters_.erase(it);
  }
  return waiters;
}

std::vector<SaveSession::BeginWaiter> SaveSession::WithdrawIfDeparted(
    int rank) {
  std::vector<BeginWaiter> left;
  if (phase_ != Phase::kGathering) return left;
  auto a = arrivals_.find(rank);
  auto w = begin_waiters_.find(rank);
  if (a == arrivals_.end() || w == begin_waiters_.end() || w->second.empty()) {
    return left;
  }
  for (const ParkedBegin& call : w->second) {
    if (!call.gone || !call.gone()) return left;  // its process may be there
  }
  for (ParkedBegin& call : w->second) {
    left.emplace_back(rank, std::move(call.done));
  }
  begin_waiters_.erase(w);
  if (a->second.plan != nullptr) {
    plan_items_ -= static_cast<int64_t>(a->second.plan->items.size());
  }
  departed_[rank] = a->second.incarnation;
  arrivals_.erase(a);
  --arrived_;
  any_departed_ = true;
  return left;
}

std::vector<SaveSession::BeginWaiter> SaveSession::WithdrawDeparted() {
  std::vector<BeginWaiter> left;
  if (phase_ != Phase::kGathering) return left;
  for (int rank : ArrivedRanks()) {
    for (BeginWaiter& w : WithdrawIfDeparted(rank)) {
      left.push_back(std::move(w));
    }
  }
  if (any_departed_ && !arrivals_.empty()) {
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [r, a] : arrivals_) earliest = std::min(earliest, a.at);
    deadline_ = earliest + begin_deadline_;
  }
  return left;
}

int SaveSession::CallsGone() const {
  int gone = 0;
  for (const auto& [r, calls] : begin_waiters_) {
    for (const ParkedBegin& call : calls) gone += call.gone && call.gone();
  }
  return gone;
}

std::vector<SaveSession::BeginWaiter> SaveSession::Planned(
    std::shared_ptr<const planner::GlobalSavePlan> plan, std::string plan_id,
    uint64_t version, bool from_cache, absl::Time now,
    absl::Duration commit_deadline) {
  plan_ = std::move(plan);
  plan_id_ = std::move(plan_id);
  // The local plans served their purpose (the known-plan cache keeps what
  // its bound allows): at thousands of ranks they are gigabytes.
  plans_ = {};
  plan_version_ = version;
  plan_from_cache_ = from_cache;
  phase_ = Phase::kWriting;
  results_.resize(world_size_);
  deadline_ = now + commit_deadline;
  std::vector<BeginWaiter> waiters;
  for (auto& [r, calls] : begin_waiters_) {
    for (auto& call : calls) waiters.emplace_back(r, std::move(call.done));
  }
  begin_waiters_.clear();
  return waiters;
}

absl::StatusOr<v1::BeginSaveResponse> SaveSession::RankResponse(
    int rank) const {
  v1::BeginSaveResponse r;
  r.set_plan_version(plan_version_);
  r.set_plan_from_cache(plan_from_cache_);
  r.set_plan_fingerprint(fingerprints_[rank]);
  r.set_storage_uri(storage_uri_);
  r.set_step_prefix(step_prefix_);
  r.set_plan_id(plan_id_);
  r.set_attempt(attempt_);
  r.set_tier(tier_);
  r.set_replicas(replicas_);
  if (!plan_id_.empty() && held_plan_ids_[rank] == plan_id_) {
    // The rank holds this very plan: at thousands of ranks, sending it again
    // would be most of the round's bytes.
    r.set_rank_plan_unchanged(true);
    return r;
  }
  convert::RankPlanToProto(*plan_, rank, r.mutable_rank_plan());
  // Object keys of this attempt live in its own directory.
  const std::string key =
      absl::StrCat(attempt_, "/", plan_->ranks[rank].object_key);
  for (v1::PlannedWrite& w : *r.mutable_rank_plan()->mutable_writes()) {
    w.mutable_location()->set_object_key(key);
  }
  return r;
}

absl::Status SaveSession::CheckIncarnation(int rank,
                                           uint64_t incarnation) const {
  const uint64_t in_save = incarnations_[rank];
  if (incarnation != 0 && in_save != 0 && incarnation != in_save) {
    // An old process of a rank that restarted: its objects belong to an
    // attempt that was aborted, never to this one.
    return absl::AbortedError(absl::StrFormat(
        "rank %d of %s: this process (%016x) is not the one in the save "
        "(%016x): the rank restarted and the save started over",
        rank, SaveName(job_, step_), incarnation, in_save));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> SaveSession::CheckResults(
    int rank, const v1::CommitSaveRequest& request) const {
  const planner::RankSavePlan& mine = plan_->ranks[rank];
  const auto& results = request.results();
  const bool short_form = !request.plan_id().empty() ||
                          !request.attempt().empty() ||
                          !request.crc32cs().empty();
  if (short_form) {
    const std::string who =
        absl::StrCat("rank ", rank, " of ", SaveName(job_, step_));
    if (!results.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, " sent both write results and checksums"));
    }
    if (plan_id_.empty() || request.plan_id() != plan_id_ ||
        request.attempt() != attempt_) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " reports writes of plan ",
          absl::CHexEscape(Truncated(request.plan_id(), 64)), " in attempt '",
          Truncated(request.attempt(), 256), "' but this save's plan is ",
          absl::CHexEscape(plan_id_), " in attempt '", attempt_, "'"));
    }
    if (request.crc32cs_size() != static_cast<int>(mine.writes.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, " reported ", request.crc32cs_size(),
          " checksums but its plan has ", mine.writes.size(), " writes"));
    }
    return std::vector<uint32_t>(request.crc32cs().begin(),
                                 request.crc32cs().end());
  }
  if (results.size() != static_cast<int>(mine.writes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", SaveName(job_, step_), " reported ",
                     results.size(), " write results but its plan has ",
                     mine.writes.size(), " writes"));
  }
  for (int i = 0; i < results.size(); ++i) {
    const v1::StorageLocation& got = results[i].location();
    const planner::PlannedWrite& want = mine.writes[i];
    absl::string_view key = got.object_key();
    const bool in_attempt =
        absl::ConsumePrefix(&key, attempt_) && absl::ConsumePrefix(&key, "/");
    if (!in_attempt || key != mine.object_key || got.offset() != want.offset ||
        got.length() != want.length) {
      const std::string want_key = absl::StrCat(attempt_, "/", mine.object_key);
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " of ", SaveName(job_, step_), " result ",
                       i, " for '", plan_->EntryOf(want).fqn, "' is at ",
                       Truncated(got.object_key(), 256), "@", got.offset(), "+",
                       got.length(), " but the plan says ", want_key, "@",
                       want.offset, "+", want.length));
    }
  }
  std::vector<uint32_t> crc32cs;
  crc32cs.reserve(results.size());
  for (const v1::WriteResult& r : results) crc32cs.push_back(r.crc32c());
  return crc32cs;
}

SaveSession::Report SaveSession::Commit(int rank, std::vector<uint32_t> crc32cs,
                                        Done<v1::CommitSaveResponse>& done,
                                        absl::Status* answer) {
  if (phase_ == Phase::kAborted) {
    *answer = abort_status_;
    return Report::kAnswered;
  }
  auto& slot = results_[rank];
  const bool same = !slot.has_value() || *slot == crc32cs;
  if (!same && phase_ == Phase::kWriting) {
    // The rank rewrote objects it had reported: what is on storage now
    // cannot be trusted to match either report.
    return Report::kConflict;
  }
  if (!same) {
    *answer = absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", SaveName(job_, step_),
                     " committed twice with different checksums"));
    return Report::kAnswered;
  }
  if (!slot.has_value()) {
    slot = std::move(crc32cs);
    ++reported_;
  }
  commit_waiters_.push_back(std::move(done));
  if (reported_ == world_size_ && phase_ == Phase::kWriting) {
    phase_ = Phase::kCommitting;
    return Report::kAllReported;
  }
  return Report::kParked;
}

std::vector<SaveSession::Done<v1::CommitSaveResponse>>
SaveSession::TakeCommitWaiters() {
  std::vector<Done<v1::CommitSaveResponse>> waiters =
      std::move(commit_waiters_);
  commit_waiters_.clear();
  return waiters;
}

std::vector<int> SaveSession::MissingRanks() const {
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    const bool in = phase_ == Phase::kGathering
                        ? arrivals_.contains(r)
                        : static_cast<size_t>(r) < results_.size() &&
                              results_[r].has_value();
    if (!in) missing.push_back(r);
  }
  return missing;
}

bool SaveSession::Expired(absl::Time now) const {
  return (phase_ == Phase::kGathering || phase_ == Phase::kWriting) &&
         now > deadline_;
}

absl::Status SaveSession::DeadlineStatus(absl::Duration begin_deadline,
                                         absl::Duration commit_deadline) const {
  const bool gathering = phase_ == Phase::kGathering;
  return absl::DeadlineExceededError(absl::StrCat(
      "save of ", SaveName(job_, step_), " aborted: ranks ",
      RankList(MissingRanks(), world_size_),
      gathering ? " never called BeginSave within "
                : " never called CommitSave within ",
      absl::FormatDuration(gathering ? begin_deadline : commit_deadline)));
}

bool SaveSession::Abort(const absl::Status& status,
                        std::vector<std::function<void()>>* answers) {
  if (phase_ == Phase::kAborted) return false;
  phase_ = Phase::kAborted;
  abort_status_ = status;
  arrivals_.clear();  // (plans may still be read by the planning step)
  for (auto& [r, calls] : begin_waiters_) {
    for (auto& call : calls) {
      answers->push_back(
          [done = std::move(call.done), status] { done(status); });
    }
  }
  begin_waiters_.clear();
  for (auto& done : commit_waiters_) {
    answers->push_back([done = std::move(done), status] { done(status); });
  }
  commit_waiters_.clear();
  return true;
}

absl::Status SaveSession::BuildManifest(v1::Manifest* m) const {
  return BuildManifest(m, [m](v1::ManifestTensor& t) {
    m->add_tensors()->Swap(&t);
    return absl::OkStatus();
  });
}

// Every write's chunk, gathered by tensor with what its message needs (32
// bytes a chunk instead of its message), and the manifest's header.
struct SaveSession::ManifestParts {
  struct Chunk {
    const int64_t* box;  // offsets, then sizes, in the rank's coords
    uint64_t offset;
    uint64_t length;
    uint32_t rank;
    uint32_t crc32c;
  };
  v1::Manifest header;            // every field but the tensors
  std::vector<std::string> keys;  // object key by rank
  std::vector<uint32_t> first;    // tensor t's chunks: [first[t], first[t+1])
  // Each tensor's sorted by box; first.back() of them. Fresh pages from the
  // kernel (on huge pages), not the heap: zeroing them once more, or
  // faulting them in 4 KiB at a time, would each be a large share of a
  // commit.
  LargeArray<Chunk> chunks;
};

absl::StatusOr<std::shared_ptr<const SaveSession::ManifestParts>>
SaveSession::GatherManifest() const {
  auto parts = std::make_shared<ManifestParts>();
  v1::Manifest* m = &parts->header;
  m->set_format_version(storage::kManifestFormatVersion);
  m->set_job(job_);
  m->set_step(step_);
  m->set_world_size(world_size_);
  m->set_created_unix_micros(absl::ToUnixMicros(created_));

  // Tensors and bytes entries in fqn order, the plan's entries' order; every
  // tensor of the plan appears, even one with no bytes. Each write names its
  // entry by index: slot[e] is entry e's index among the manifest's tensors
  // or bytes entries.
  const std::vector<planner::PlannedEntry>& entries = plan_->entries;
  std::vector<int> slot(entries.size());
  int num_tensors = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const planner::PlannedEntry& entry = entries[e];
    if (e > 0 && entries[e - 1].fqn >= entry.fqn) {
      return absl::InternalError(absl::StrCat(SaveName(job_, step_),
                                              ": the plan's entries are not "
                                              "sorted and unique at '",
                                              entry.fqn, "'"));
    }
    if (entry.kind != planner::WriteItem::Kind::kTensorChunk) {
      slot[e] = m->bytes_entries_size();
      m->add_bytes_entries()->set_fqn(entry.fqn);
    } else {
      slot[e] = num_tensors++;
    }
  }

  // First pass over every write: the header's fields (objects, bytes
  // entries, total) and, for each tensor, how many chunks it has.
  // Object keys are in this attempt's directory (CheckResults checked that
  // the ranks wrote there), made once per object, not per write.
  std::vector<std::string>& keys = parts->keys;
  keys.resize(world_size_);
  std::vector<uint32_t>& first = parts->first;
  first.assign(num_tensors + 1, 0);
  uint64_t total = 0;
  for (int r = 0; r < world_size_; ++r) {
    const planner::RankSavePlan& rp = plan_->ranks[r];
    if (rp.writes.empty()) continue;
    keys[r] = absl::StrCat(attempt_, "/", rp.object_key);
    m->add_objects(keys[r]);
    const std::vector<uint32_t>& crc32cs = *results_[r];
    for (size_t i = 0; i < rp.writes.size(); ++i) {
      const planner::PlannedWrite& w = rp.writes[i];
      if (w.entry >= entries.size()) {
        return absl::InternalError(
            absl::StrCat(SaveName(job_, step_), ": write ", i, " of rank ", r,
                         " names entry ", w.entry, " of ", entries.size()));
      }
      total += w.length;
      if (entries[w.entry].kind == planner::WriteItem::Kind::kTensorChunk) {
        ++first[slot[w.entry] + 1];
        continue;
      }
      v1::ManifestBytes* b = m->mutable_bytes_entries(slot[w.entry]);
      v1::StorageLocation* location = b->mutable_location();
      location->set_object_key(keys[r]);
      location->set_offset(w.offset);
      location->set_length(w.length);
      b->set_crc32c(crc32cs[i]);
      b->set_writer_rank(r);
    }
  }
  // Second pass, rank by rank: each tensor's chunks gathered by a counting
  // sort. Gathering them tensor by tensor instead would read each rank's
  // writes and checksums out of order: at 16k ranks, a cache miss or three
  // for each of 18 M chunks, most of the gathering's time.
  for (int t = 0; t < num_tensors; ++t) first[t + 1] += first[t];
  CAIRN_ASSIGN_OR_RETURN(
      parts->chunks,
      LargeArray<ManifestParts::Chunk>::Allocate(
          first.back(), absl::StrCat(SaveName(job_, step_),
                                     ": the commit's gathered chunks")));
  ManifestParts::Chunk* chunks = parts->chunks.get();
  {
    std::vector<uint32_t> next(first.begin(), first.end() - 1);
    for (int r = 0; r < world_size_; ++r) {
      const planner::RankSavePlan& rp = plan_->ranks[r];
      if (rp.writes.empty()) continue;
      const std::vector<uint32_t>& crc32cs = *results_[r];
      for (size_t i = 0; i < rp.writes.size(); ++i) {
        const planner::PlannedWrite& w = rp.writes[i];
        if (entries[w.entry].kind != planner::WriteItem::Kind::kTensorChunk) {
          continue;
        }
        chunks[next[slot[w.entry]]++] = ManifestParts::Chunk{
            rp.coords.data() + w.box_begin, w.offset, w.length,
            static_cast<uint32_t>(r), crc32cs[i]};
      }
    }
  }
  // Each tensor's chunks by offsets.
  int t = 0;
  for (const planner::PlannedEntry& entry : entries) {
    if (entry.kind != planner::WriteItem::Kind::kTensorChunk) continue;
    const size_t dims = entry.global_shape.size();
    std::sort(
        chunks + first[t], chunks + first[t + 1],
        [dims](const ManifestParts::Chunk& a, const ManifestParts::Chunk& b) {
          return std::lexicographical_compare(a.box, a.box + dims, b.box,
                                              b.box + dims);
        });
    ++t;
  }
  // A bytes entry is written once (replicas are planned once); one no rank
  // wrote is left out, as it was never stored.
  auto* bytes = m->mutable_bytes_entries();
  int kept = 0;
  for (int i = 0; i < bytes->size(); ++i) {
    if (!bytes->Get(i).has_location()) continue;
    if (kept != i) bytes->SwapElements(kept, i);
    ++kept;
  }
  bytes->DeleteSubrange(kept, bytes->size() - kept);
  // Objects sorted, as a set of keys.
  auto* listed = m->mutable_objects();
  std::sort(listed->begin(), listed->end());
  listed->erase(std::unique(listed->begin(), listed->end()), listed->end());
  m->set_total_bytes(total);
  return parts;
}

absl::Status SaveSession::BuildManifest(
    v1::Manifest* m,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor) const {
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<const ManifestParts> parts,
                         GatherManifest());
  return BuildManifest(*parts, m, on_tensor);
}

absl::Status SaveSession::BuildManifest(
    const ManifestParts& parts, v1::Manifest* m,
    absl::FunctionRef<absl::Status(v1::ManifestTensor&)> on_tensor) const {
  *m = parts.header;
  // Tensor by tensor. One message is reused for every tensor: its chunks
  // (and their boxes and locations) are overwritten in place, every field
  // set, instead of made and freed each time (allocating and freeing them
  // would be a large share of a commit).
  v1::ManifestTensor t;
  std::vector<std::unique_ptr<v1::StoredChunk>> spare;
  int s = 0;
  for (const planner::PlannedEntry& entry : plan_->entries) {
    if (entry.kind != planner::WriteItem::Kind::kTensorChunk) continue;
    v1::TensorEntry* te = t.mutable_entry();
    te->set_fqn(entry.fqn);
    te->set_dtype(convert::DTypeToProto(entry.dtype));
    te->mutable_global_shape()->Assign(entry.global_shape.begin(),
                                       entry.global_shape.end());
    const size_t dims = entry.global_shape.size();
    const ManifestParts::Chunk* begin = parts.chunks.get() + parts.first[s];
    const ManifestParts::Chunk* end = parts.chunks.get() + parts.first[s + 1];
    ++s;
    // Exactly n chunk messages, kept (not cleared: that would free their
    // boxes and locations) in `spare` while a tensor needs fewer.
    auto* chunks = t.mutable_chunks();
    const int n = static_cast<int>(end - begin);
    while (chunks->size() > n) spare.emplace_back(chunks->ReleaseLast());
    while (chunks->size() < n && !spare.empty()) {
      chunks->AddAllocated(spare.back().release());
      spare.pop_back();
    }
    chunks->Reserve(n);
    while (chunks->size() < n) chunks->Add();
    for (const ManifestParts::Chunk* g = begin; g != end; ++g) {
      v1::StoredChunk* c = chunks->Mutable(static_cast<int>(g - begin));
      c->mutable_box()->mutable_offsets()->Assign(g->box, g->box + dims);
      c->mutable_box()->mutable_sizes()->Assign(g->box + dims,
                                                g->box + 2 * dims);
      v1::StorageLocation* location = c->mutable_location();
      location->set_object_key(parts.keys[g->rank]);
      location->set_offset(g->offset);
      location->set_length(g->length);
      c->set_crc32c(g->crc32c);
      c->set_writer_rank(static_cast<int32_t>(g->rank));
    }
    CAIRN_RETURN_IF_ERROR(on_tensor(t));
  }
  return absl::OkStatus();
}

void SaveSession::SetHolders(int rank, std::vector<int> nodes) {
  if (holders_.size() < static_cast<size_t>(world_size_)) {
    holders_.resize(world_size_);
  }
  if (rank >= 0 && rank < world_size_) holders_[rank] = std::move(nodes);
}

}  // namespace cairn::coordinator
