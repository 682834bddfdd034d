#include "server/agent/streaming_save.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "planner/box.h"

namespace cairn::agent {

using internal::AlignUp;
using internal::ItemBox;
using internal::ItemFqn;
using internal::kAlign;
using internal::PlanName;
using internal::Where;

StreamingSave::StreamingSave(std::shared_ptr<ItemSet> set, Options options,
                             StagingPool& pool)
    : set_(std::move(set)),
      options_(options),
      where_(Where(set_->job, set_->step, set_->rank)),
      pool_(pool) {
  absl::MutexLock l(&mu_);
  last_call_ = absl::Now();
}

absl::StatusOr<v1::StageBucketResponse> StreamingSave::NextBucket(
    const v1::StageBucketRequest& request,
    const std::function<bool()>& caller_gone) {
  const absl::Time deadline =
      absl::Now() + (request.wait_for_space_ms() > 0
                         ? absl::Milliseconds(request.wait_for_space_ms())
                         : options_.wait_for_space);
  bool entered = false;
  absl::StatusOr<v1::StageBucketResponse> r =
      NextBucketInCall(request, deadline, caller_gone, entered);
  if (entered) {
    absl::MutexLock l(&mu_);
    rank_in_call_ = false;
    last_call_ = absl::Now();
  }
  return r;
}

absl::StatusOr<v1::StageBucketResponse> StreamingSave::NextBucketInCall(
    const v1::StageBucketRequest& request, absl::Time deadline,
    const std::function<bool()>& caller_gone, bool& entered) {
  v1::StageBucketResponse response;
  {
    absl::MutexLock l(&mu_);
    if (!failed_.ok()) return failed_;
    if (rank_in_call_) {
      return absl::FailedPreconditionError(
          absl::StrCat(where_, ": concurrent StageBucket calls"));
    }
    if (request.filled_bucket() != 0) {
      if (!handed_.has_value() || handed_->seq != request.filled_bucket()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where_, ": bucket ", request.filled_bucket(),
                         " is not the one handed out"));
      }
      filled_.push_back(std::move(*handed_));
      handed_.reset();
    } else if (handed_.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where_, ": bucket ", handed_->seq,
                       " was handed out and not returned filled"));
    }
    rank_in_call_ = true;
    entered = true;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return plan_ready_ || !failed_.ok();
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat(where_, ": cairnd's plan did not arrive in time"));
    }
    if (!failed_.ok()) return failed_;
    if (next_piece_ == pieces_.size()) {
      response.set_end_of_stream(true);
      return response;
    }
  }
  // The only wait of a streaming rank: space for the next bucket (the
  // persist side frees the previous ones as it writes them).
  absl::StatusOr<std::shared_ptr<shm::ShmSegment>> seg =
      pool_.Allocate(options_.bucket_bytes, deadline, caller_gone);
  if (!seg.ok()) {
    return absl::Status(seg.status().code(),
                        absl::StrCat(where_, ": ", seg.status().message()));
  }
  absl::MutexLock l(&mu_);
  if (!failed_.ok()) return failed_;
  Bucket b;
  b.seq = next_seq_++;
  b.segment = std::move(*seg);
  b.begin = next_piece_;
  uint64_t cursor = 0;
  while (next_piece_ < pieces_.size() &&
         cursor + pieces_[next_piece_].length <= options_.bucket_bytes) {
    const Piece& p = pieces_[next_piece_];
    v1::StagePiece* out = response.add_pieces();
    out->set_item(write_item_[p.write]);
    out->set_item_offset(p.item_offset);
    out->set_length(p.length);
    out->set_staging_offset(cursor);
    b.offsets.push_back(cursor);
    cursor = AlignUp(cursor + p.length, kAlign);
    ++next_piece_;
  }
  b.end = next_piece_;
  response.set_bucket(b.seq);
  response.set_shm_name(b.segment->name());
  response.set_shm_size(b.segment->size());
  handed_ = std::move(b);
  return response;
}

absl::Status StreamingSave::Finish(const v1::FinishStageRequest& request) {
  absl::MutexLock l(&mu_);
  if (!failed_.ok()) return failed_;
  if (request.device_items_size() > 0) {
    failed_ = absl::UnimplementedError(
        absl::StrCat(where_,
                     ": GPU items cannot be streamed (the save exceeds "
                     "the staging budget)"));
    return failed_;
  }
  if (!plan_ready_ || next_piece_ < pieces_.size() || handed_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_,
                     ": streaming save is not fully staged; call "
                     "StageBucket until end_of_stream first"));
  }
  finished_ = true;
  die_before_commit_ = request.die_before_commit_for_test();
  last_call_ = absl::Now();
  return absl::OkStatus();
}

void StreamingSave::Fail(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  if (failed_.ok()) failed_ = status;
}

absl::StatusOr<std::vector<StreamingSave::Piece>> StreamingSave::SetPlan(
    const v1::RankSavePlan& plan,
    const std::vector<protocol::PlannedObject>& objects) {
  const auto& writes = plan.writes();
  std::map<std::pair<std::string, planner::ChunkBox>, int> by_key;
  for (size_t i = 0; i < set_->items.size(); ++i) {
    by_key[{PlanName(set_->items[i].item), ItemBox(set_->items[i].item)}] =
        static_cast<int>(i);
  }
  std::vector<int> write_item(writes.size());
  for (int i = 0; i < writes.size(); ++i) {
    const v1::WriteItem& w = writes[i].item();
    auto it = by_key.find({PlanName(w), ItemBox(w)});
    if (it == by_key.end() || set_->items[it->second].item.length() !=
                                  writes[i].location().length()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cairnd planned '", ItemFqn(w), "' ",
          planner::BoxToString(ItemBox(w)),
          " for this rank, which did not stage it with that length"));
    }
    write_item[i] = it->second;
  }
  std::vector<Piece> pieces;
  for (const protocol::PlannedObject& object : objects) {
    for (int i : object.writes) {
      if (i < 0 || i >= writes.size()) {
        return absl::InternalError(absl::StrCat(where_, ": object '",
                                                object.key, "' names write ", i,
                                                " of ", writes.size()));
      }
      const uint64_t len = writes[i].location().length();
      for (uint64_t off = 0; off < len; off += options_.bucket_bytes) {
        pieces.push_back({i, off, std::min(options_.bucket_bytes, len - off)});
      }
    }
  }
  absl::MutexLock l(&mu_);
  pieces_ = pieces;
  write_item_ = std::move(write_item);
  plan_ready_ = true;
  return pieces;
}

absl::Status StreamingSave::AwaitRank(const std::function<bool()>& ready,
                                      const std::atomic<bool>& stopping) {
  auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ready() || !failed_.ok();
  };
  while (true) {
    if (!failed_.ok()) return failed_;
    if (ready()) return absl::OkStatus();
    if (stopping.load()) {
      return absl::UnavailableError(
          absl::StrCat(where_, ": cairn-agent is stopping"));
    }
    if (!rank_in_call_ && absl::Now() - last_call_ > options_.idle_timeout) {
      return absl::AbortedError(
          absl::StrCat(where_, ": the rank made no streaming call for ",
                       absl::FormatDuration(options_.idle_timeout),
                       " (killed mid-stream?); the save is aborted"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&cond), absl::Milliseconds(50));
  }
}

absl::StatusOr<StreamingSave::Bucket> StreamingSave::TakeFilled(
    const std::atomic<bool>& stopping) {
  absl::MutexLock l(&mu_);
  absl::Status s = AwaitRank(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !filled_.empty(); },
      stopping);
  if (!s.ok()) return s;
  Bucket b = std::move(filled_.front());
  filled_.pop_front();
  return b;
}

absl::StatusOr<bool> StreamingSave::AwaitFinished(
    const std::atomic<bool>& stopping) {
  absl::MutexLock l(&mu_);
  absl::Status s = AwaitRank(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; }, stopping);
  if (!s.ok()) return s;
  return die_before_commit_;
}

void StreamingSave::End(const absl::Status& result) {
  absl::MutexLock l(&mu_);
  if (!result.ok() && failed_.ok()) failed_ = result;
  if (handed_.has_value()) pool_.Discard(handed_->segment.get());
  handed_.reset();
  filled_.clear();
  pieces_.clear();
}

}  // namespace cairn::agent
