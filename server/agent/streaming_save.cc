// Save staging: BeginStage (reserve a segment, or start a streaming save
// when the save exceeds the budget), StageBucket (hand out the next bucket
// of a streaming save) and FinishStage (copy GPU items, hand to the
// persister).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "planner/transfer_plan.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/agent.h"
#include "server/agent/agent_internal.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"

namespace cairn::agent {

using copier::CopySource;
using internal::AlignUp;
using internal::IsBytes;
using internal::ItemBox;
using internal::ItemElemSize;
using internal::ItemFqn;
using internal::kAlign;
constexpr uint64_t kSegmentGranule = StagingPool::kSegmentGranule;
using internal::Where;
using shm::ShmSegment;

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
  auto set = std::make_shared<Set>();
  set->job = request.job();
  set->step = request.step();
  set->rank = request.rank();
  set->world_size = request.world_size();
  set->incarnation = request.incarnation();
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
    Item item;
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
  if (request.allow_streaming() &&
      StagingPool::SegmentSize(total) > pool_->budget()) {
    // Larger than the whole budget: stream it through buckets.
    auto st = std::make_shared<Stream>();
    st->set = std::move(set);
    st->save_id = next_id_.fetch_add(1);
    st->bucket_bytes =
        std::max(kSegmentGranule,
                 std::min(options_.stream_bucket_bytes, pool_->budget() / 2) /
                     kSegmentGranule * kSegmentGranule);
    st->wait_for_space = wait;
    st->where = where;
    {
      absl::MutexLock sl(&st->mu);
      st->last_call = absl::Now();
    }
    for (v1::StageItem& si : *response.mutable_items()) {
      si.clear_staging_offset();
    }
    response.set_save_id(st->save_id);
    response.set_streaming(true);
    response.set_bucket_bytes(st->bucket_bytes);
    {
      absl::MutexLock l(&mu_);
      results_[Key{st->set->job, st->set->step, st->set->rank}] = SaveResult();
      streams_[st->save_id] = st;
    }
    CAIRN_RETURN_IF_ERROR(
        StartPersistThread([this, st] { PersistStream(st); }));
    CAIRN_LOG(info, "node {}: {} streams {} bytes in buckets of {}",
              options_.node_id, where, total, st->bucket_bytes);
    return response;
  }
  absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
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
  absl::MutexLock l(&mu_);
  results_[Key{set->job, set->step, set->rank}] = SaveResult();
  staging_[id] = std::move(set);
  return response;
}

absl::Status Agent::FinishStage(const v1::FinishStageRequest& request) {
  std::shared_ptr<Set> set;
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock l(&mu_);
    auto s = streams_.find(request.save_id());
    if (s != streams_.end()) stream = s->second;
  }
  if (stream != nullptr) {
    absl::MutexLock l(&stream->mu);
    if (!stream->failed.ok()) return stream->failed;
    if (request.device_items_size() > 0) {
      stream->failed = absl::UnimplementedError(
          absl::StrCat(stream->where,
                       ": GPU items cannot be streamed (the save exceeds "
                       "the staging budget)"));
      return stream->failed;
    }
    if (!stream->plan_ready || stream->next_piece < stream->pieces.size() ||
        stream->handed.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(stream->where,
                       ": streaming save is not fully staged; call "
                       "StageBucket until end_of_stream first"));
    }
    stream->finished = true;
    stream->die_before_commit = request.die_before_commit_for_test();
    stream->last_call = absl::Now();
    return absl::OkStatus();
  }
  {
    absl::MutexLock l(&mu_);
    auto it = staging_.find(request.save_id());
    if (it == staging_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                              ": no staged save with id ",
                                              request.save_id()));
    }
    set = it->second;
    staging_.erase(it);
    // Cancellable (CancelSave) from here until its persist ends.
    persisting_[Key{set->job, set->step, set->rank}] = set;
  }
  const std::string where = Where(set->job, set->step, set->rank);
  // Unless its persist starts, it is not persisting.
  bool handed_over = false;
  absl::Cleanup forget = [&] {
    if (handed_over) return;
    absl::MutexLock l(&mu_);
    auto p = persisting_.find(Key{set->job, set->step, set->rank});
    if (p != persisting_.end() && p->second == set) persisting_.erase(p);
  };
  if (request.device_items_size() > 0) {
    if (options_.device_copier == nullptr) {
      absl::MutexLock l(&mu_);
      SaveResult& r = results_[Key{set->job, set->step, set->rank}];
      r.done = true;
      r.status = absl::FailedPreconditionError(
          absl::StrCat(where,
                       ": GPU items need the cuda copier, which this "
                       "agent does not have (no CUDA device or build)"));
      return r.status;
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
    CAIRN_RETURN_IF_ERROR(options_.device_copier->Flush());
  }
  absl::Status started = StartPersistThread(
      [this, set, die = request.die_before_commit_for_test()] {
        Persist(set, die);
      });
  handed_over = started.ok();
  return started;
}

absl::StatusOr<v1::StageBucketResponse> Agent::StageBucket(
    const v1::StageBucketRequest& request,
    const std::function<bool()>& caller_gone) {
  std::shared_ptr<Stream> st;
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(request.save_id());
    if (it == streams_.end()) {
      return absl::NotFoundError(absl::StrCat("node ", options_.node_id,
                                              ": no streaming save with id ",
                                              request.save_id()));
    }
    st = it->second;
  }
  const absl::Time deadline =
      absl::Now() + (request.wait_for_space_ms() > 0
                         ? absl::Milliseconds(request.wait_for_space_ms())
                         : st->wait_for_space);
  bool entered = false;
  auto next = [&]() -> absl::StatusOr<v1::StageBucketResponse> {
    v1::StageBucketResponse response;
    {
      absl::MutexLock l(&st->mu);
      if (!st->failed.ok()) return st->failed;
      if (st->rank_in_call) {
        return absl::FailedPreconditionError(
            absl::StrCat(st->where, ": concurrent StageBucket calls"));
      }
      if (request.filled_bucket() != 0) {
        if (!st->handed.has_value() ||
            st->handed->seq != request.filled_bucket()) {
          return absl::FailedPreconditionError(
              absl::StrCat(st->where, ": bucket ", request.filled_bucket(),
                           " is not the one handed out"));
        }
        st->filled.push_back(std::move(*st->handed));
        st->handed.reset();
      } else if (st->handed.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat(st->where, ": bucket ", st->handed->seq,
                         " was handed out and not returned filled"));
      }
      st->rank_in_call = true;
      entered = true;
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
        return st->plan_ready || !st->failed.ok();
      };
      if (!st->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat(st->where, ": cairnd's plan did not arrive in time"));
      }
      if (!st->failed.ok()) return st->failed;
      if (st->next_piece == st->pieces.size()) {
        response.set_end_of_stream(true);
        return response;
      }
    }
    // The only wait of a streaming rank: space for the next bucket (the
    // persist thread frees the previous ones as it writes them).
    absl::StatusOr<std::shared_ptr<ShmSegment>> seg =
        pool_->Allocate(st->bucket_bytes, deadline, caller_gone);
    if (!seg.ok()) {
      return absl::Status(
          seg.status().code(),
          absl::StrCat(st->where, ": ", seg.status().message()));
    }
    absl::MutexLock l(&st->mu);
    if (!st->failed.ok()) return st->failed;
    Stream::Bucket b;
    b.seq = st->next_seq++;
    b.segment = std::move(*seg);
    b.begin = st->next_piece;
    uint64_t cursor = 0;
    while (st->next_piece < st->pieces.size() &&
           cursor + st->pieces[st->next_piece].length <= st->bucket_bytes) {
      const Stream::Piece& p = st->pieces[st->next_piece];
      v1::StagePiece* out = response.add_pieces();
      out->set_item(st->write_item[p.write]);
      out->set_item_offset(p.item_offset);
      out->set_length(p.length);
      out->set_staging_offset(cursor);
      b.offsets.push_back(cursor);
      cursor = AlignUp(cursor + p.length, kAlign);
      ++st->next_piece;
    }
    b.end = st->next_piece;
    response.set_bucket(b.seq);
    response.set_shm_name(b.segment->name());
    response.set_shm_size(b.segment->size());
    st->handed = std::move(b);
    ++streamed_buckets_;
    return response;
  };
  absl::StatusOr<v1::StageBucketResponse> r = next();
  if (entered) {
    absl::MutexLock l(&st->mu);
    st->rank_in_call = false;
    st->last_call = absl::Now();
  }
  return r;
}

}  // namespace cairn::agent
