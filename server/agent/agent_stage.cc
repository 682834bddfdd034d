// A rank's save through the agent: BeginStage (reserve a segment, or start
// a streaming save when the save exceeds the budget), StageBucket (a
// streaming save's next bucket), FinishStage (copy GPU items, hand the set
// to the persister), CancelSave and WaitSave.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "server/agent/agent.h"
#include "server/agent/items.h"
#include "storage/checkpoint_keys.h"

namespace cairn::agent {

using copier::CopySource;
using internal::AlignUp;
using internal::IsBytes;
using internal::ItemBox;
using internal::ItemElemSize;
using internal::ItemFqn;
using internal::kAlign;
using internal::Where;

absl::Status Agent::AwaitRoomBesidePinned(const std::string& where,
                                          uint64_t bytes) {
  const uint64_t need = StagingPool::SegmentSize(bytes);
  const uint64_t budget = pool_->budget();
  const absl::Time until =
      absl::Now() +
      std::max(absl::Seconds(2), 3 * options_.holdings_report_interval);
  absl::Time reported = absl::InfinitePast();
  while (true) {
    const MemoryTier::Counts held = tier_.counts();
    // Nothing pinned, or larger than the whole budget anyway: the pool
    // answers (waits for room, or refuses naming the budget).
    if (held.memory_bytes == 0 || need > budget ||
        held.memory_bytes + need <= budget) {
      return absl::OkStatus();
    }
    if (absl::Now() >= until) {
      return absl::ResourceExhaustedError(absl::StrCat(
          where, ": staging ", bytes,
          " bytes does not fit this agent's "
          "budget of ",
          budget, " bytes beside the ", held.memory_bytes,
          " bytes of memory checkpoints it holds (", held.memory_sets,
          " ranks' shards, pinned until cairnd drops or persists them): raise "
          "--staging-budget-mib, keep fewer memory checkpoints (cairn policy "
          "--keep-memory), or save to the persistent tier"));
    }
    // Drops come with the answer to a report: ask for one now.
    if (reporter_ != nullptr &&
        absl::Now() - reported > absl::Milliseconds(500)) {
      (void)reporter_->ReportOnce();
      reported = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<v1::BeginStageResponse> Agent::BeginStage(
    const v1::BeginStageRequest& request,
    const std::function<bool()>& caller_gone) {
  const std::string where =
      Where(request.job(), request.step(), request.rank());
  CAIRN_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  CAIRN_RETURN_IF_ERROR(storage::ValidateStep(request.step()));
  if (request.world_size() < 1 || request.rank() < 0 ||
      request.rank() >= request.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": rank out of range for world size ", request.world_size()));
  }
  auto set = std::make_shared<ItemSet>();
  set->job = request.job();
  set->step = request.step();
  set->rank = request.rank();
  set->world_size = request.world_size();
  set->incarnation = request.incarnation();
  if (!v1::Tier_IsValid(request.tier())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown tier ", request.tier()));
  }
  set->tier_asked = request.tier();
  v1::BeginStageResponse response;
  uint64_t total = 0;
  for (const v1::StageItem& si : request.items()) {
    const v1::WriteItem& w = si.item();
    if (!IsBytes(w)) {
      const size_t elem = ItemElemSize(w);
      const planner::ChunkBox box = ItemBox(w);
      if (elem == 0 || box.offsets.size() != box.sizes.size() ||
          static_cast<uint64_t>(planner::Volume(box)) * elem != w.length()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": item '", w.tensor().fqn(), "' ",
                         planner::BoxToString(box), " has length ", w.length(),
                         " that does not match its box and dtype"));
      }
    }
    StagedItem item;
    item.item = w;
    item.offset = total;
    total = AlignUp(total + w.length(), kAlign);
    v1::StageItem* out = response.add_items();
    *out = si;
    out->set_staging_offset(item.offset);
    set->items.push_back(std::move(item));
  }
  const absl::Duration wait =
      request.wait_for_space_ms() > 0
          ? absl::Milliseconds(request.wait_for_space_ms())
          : options_.wait_for_space;
  if (request.tier() == v1::TIER_MEMORY &&
      StagingPool::SegmentSize(total) > pool_->budget()) {
    // A memory checkpoint exists only in memory: it must fit whole.
    return absl::ResourceExhaustedError(absl::StrCat(
        where, ": a memory save of ", total,
        " bytes does not fit this agent's staging budget of ", pool_->budget(),
        " bytes (--staging-budget-mib); save it to the "
        "persistent tier or raise the budget"));
  }
  if (request.allow_streaming() &&
      StagingPool::SegmentSize(total) > pool_->budget()) {
    // Larger than the whole budget: stream it through buckets.
    constexpr uint64_t kGranule = StagingPool::kSegmentGranule;
    StreamingSave::Options so;
    so.save_id = next_id_.fetch_add(1);
    so.bucket_bytes = std::max(
        kGranule, std::min(options_.stream_bucket_bytes, pool_->budget() / 2) /
                      kGranule * kGranule);
    so.wait_for_space = wait;
    so.idle_timeout = options_.stream_idle_timeout;
    auto st = std::make_shared<StreamingSave>(std::move(set), so, *pool_);
    for (v1::StageItem& si : *response.mutable_items()) {
      si.clear_staging_offset();
    }
    response.set_save_id(st->save_id());
    response.set_streaming(true);
    response.set_bucket_bytes(st->bucket_bytes());
    CAIRN_RETURN_IF_ERROR(persister_->Stream(st));
    CAIRN_LOG(info, "node {}: {} streams {} bytes in buckets of {}",
              options_.node_id, where, total, st->bucket_bytes());
    return response;
  }
  // Memory checkpoints are pinned: room they hold comes back only when
  // cairnd drops them (retention, answered within a report or two). A save
  // that cannot fit beside them is refused now rather than waiting out
  // wait_for_space.
  if (absl::Status s = AwaitRoomBesidePinned(where, total); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<shm::ShmSegment>> seg =
      pool_->Allocate(total, absl::Now() + wait, caller_gone);
  if (seg.ok() && caller_gone && caller_gone()) {
    // Nobody would copy into it or hand it over: free it now.
    seg = absl::CancelledError("the rank gave up on BeginStage");
  }
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat(where, ": ", seg.status().message()));
  }
  set->segment = std::move(*seg);
  const uint64_t id = next_id_.fetch_add(1);
  response.set_save_id(id);
  response.set_shm_name(set->segment->name());
  response.set_shm_size(set->segment->size());
  persister_->Expect(*set);
  absl::MutexLock l(&mu_);
  staging_[id] = std::move(set);
  return response;
}

absl::StatusOr<v1::StageBucketResponse> Agent::StageBucket(
    const v1::StageBucketRequest& request,
    const std::function<bool()>& caller_gone) {
  std::shared_ptr<StreamingSave> st = persister_->FindStream(request.save_id());
  if (st == nullptr) {
    return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                            ": no streaming save with id ",
                                            request.save_id()));
  }
  absl::StatusOr<v1::StageBucketResponse> r =
      st->NextBucket(request, caller_gone);
  if (r.ok() && r->bucket() != 0) ++streamed_buckets_;
  return r;
}

absl::Status Agent::FinishStage(const v1::FinishStageRequest& request) {
  if (std::shared_ptr<StreamingSave> st =
          persister_->FindStream(request.save_id())) {
    return st->Finish(request);
  }
  std::shared_ptr<ItemSet> set;
  {
    absl::MutexLock l(&mu_);
    auto it = staging_.find(request.save_id());
    if (it == staging_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                              ": no staged save with id ",
                                              request.save_id()));
    }
    set = std::move(it->second);
    staging_.erase(it);
  }
  const std::string where = Where(set->job, set->step, set->rank);
  // GPU items are copied into the segment before the persist starts.
  auto copy_device_items = [&]() -> absl::Status {
    if (request.device_items_size() == 0) return absl::OkStatus();
    if (options_.device_copier == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(where,
                       ": GPU items need the cuda copier, which this "
                       "agent does not have (no CUDA device or build)"));
    }
    // One copier serves the whole agent; GPU snapshots are serialized.
    static absl::Mutex copier_mu;
    absl::MutexLock cl(&copier_mu);
    for (const v1::StageItem& di : request.device_items()) {
      CopySource src;
      src.kind = CopySource::Kind::kCudaIpc;
      src.cuda_ipc_handle = di.cuda().handle();
      src.offset = di.cuda().offset();
      src.device = di.cuda().device();
      if (di.staging_offset() + di.item().length() > set->segment->size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": GPU item '", ItemFqn(di.item()),
                         "' lies outside the staging segment"));
      }
      CAIRN_RETURN_IF_ERROR(options_.device_copier->Copy(
          src, absl::MakeSpan(set->segment->data() + di.staging_offset(),
                              di.item().length())));
    }
    return options_.device_copier->Flush();
  };
  return persister_->Persist(set, request.die_before_commit_for_test(),
                             copy_device_items);
}

absl::Status Agent::CancelSave(const v1::CancelSaveRequest& request) {
  const std::string where =
      Where(request.job(), request.step(), request.rank());
  std::shared_ptr<ItemSet> dropped;  // its segment is released off the lock
  {
    absl::MutexLock l(&mu_);
    // Still being staged: nothing was sent to cairnd for it, and the rank
    // copies into it no more.
    for (auto it = staging_.begin(); it != staging_.end(); ++it) {
      if (CancelNames(request, *it->second)) {
        dropped = std::move(it->second);
        staging_.erase(it);
        break;
      }
    }
  }
  if (dropped != nullptr) {
    persister_->Fail(*dropped,
                     absl::CancelledError(absl::StrCat(
                         where, ": cancelled (AgentCheckpointer::Cancel)")));
  }
  if (persister_->Cancel(request) || dropped != nullptr) {
    CAIRN_LOG(info, "node {}: {} cancelled by the rank", options_.node_id,
              where);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointRecord> Agent::WaitSave(
    const v1::WaitSaveRequest& request) {
  return persister_->Wait(request);
}

}  // namespace cairn::agent
