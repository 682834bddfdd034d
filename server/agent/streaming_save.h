// StreamingSave: one rank's save larger than the whole staging budget,
// streamed through buckets (see agent.h). Two threads meet in it:
//   the rank's calls  NextBucket hands back the bucket the rank filled and
//                     hands out the next one (allocating it from the staging
//                     pool is the rank's only wait); Finish once every piece
//                     was handed out and returned;
//   the persist side  SetPlan cuts cairnd's plan for the rank into pieces of
//                     at most one bucket; TakeFilled takes filled buckets in
//                     order; AwaitFinished waits for the rank's Finish; End
//                     frees whatever is left.
// Either side fails the save (Fail): the other sees the status at its next
// call or wait. A rank that makes no call for `idle_timeout` while the
// persist side waits on it (killed mid-stream) fails it ABORTED.
//
// Thread-safe. Lock order: a caller's lock (the Persister's) before this
// save's own; the staging pool is called without it held.
#ifndef CAIRN_SERVER_AGENT_STREAMING_SAVE_H_
#define CAIRN_SERVER_AGENT_STREAMING_SAVE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "common/shm/shm_segment.h"
#include "protocol/planned_writer.h"
#include "server/agent/items.h"
#include "server/agent/staging_pool.h"

namespace cairn::agent {

class StreamingSave {
 public:
  // A run of one planned write: bytes [item_offset, item_offset + length) of
  // the item cairnd's write `write` (its index in the rank's plan) names.
  struct Piece {
    int write = 0;
    uint64_t item_offset = 0;
    uint64_t length = 0;
  };
  // Consecutive pieces [begin, end) in one segment, at `offsets` in it.
  struct Bucket {
    uint64_t seq = 0;
    std::shared_ptr<shm::ShmSegment> segment;
    size_t begin = 0, end = 0;
    std::vector<uint64_t> offsets;
  };
  struct Options {
    uint64_t save_id = 0;
    // Size of every bucket (a multiple of StagingPool::kSegmentGranule).
    uint64_t bucket_bytes = 0;
    // How long NextBucket waits for the plan and for space by default.
    absl::Duration wait_for_space = absl::Minutes(10);
    // See above.
    absl::Duration idle_timeout = absl::Seconds(60);
  };

  // `set`: the rank's items, no segment. The pool must outlive this object.
  StreamingSave(std::shared_ptr<ItemSet> set, Options options,
                StagingPool& pool);
  StreamingSave(const StreamingSave&) = delete;
  StreamingSave& operator=(const StreamingSave&) = delete;

  const std::shared_ptr<ItemSet>& set() const { return set_; }
  uint64_t save_id() const { return options_.save_id; }
  uint64_t bucket_bytes() const { return options_.bucket_bytes; }
  // "job 'j' step 5 rank 1": how this save's errors start.
  const std::string& where() const { return where_; }

  // The rank's side.
  // Takes back the bucket request.filled_bucket() names (0: none yet) and
  // hands out the next one, or end_of_stream once every piece is out.
  // Waits for cairnd's plan and for staging space until the request's
  // wait_for_space_ms (default: Options::wait_for_space); `caller_gone`
  // (optional) ends the wait for space CANCELLED. FAILED_PRECONDITION for a
  // bucket that is not the one handed out, or concurrent calls.
  absl::StatusOr<v1::StageBucketResponse> NextBucket(
      const v1::StageBucketRequest& request,
      const std::function<bool()>& caller_gone = nullptr);
  // The rank staged everything (FinishStage): FAILED_PRECONDITION while a
  // piece is still out or not handed out, UNIMPLEMENTED (and the save
  // failed) for GPU items, which cannot be streamed.
  absl::Status Finish(const v1::FinishStageRequest& request);
  // Fails the save with `status` unless it failed already.
  void Fail(const absl::Status& status);

  // The persist side.
  // Matches every write of cairnd's plan for this rank to the staged item it
  // names and cuts them, in `objects` order, into pieces of at most one
  // bucket, which the rank is then handed: FAILED_PRECONDITION naming a
  // write the rank did not stage with that length. Returns the pieces.
  absl::StatusOr<std::vector<Piece>> SetPlan(
      const v1::RankSavePlan& plan,
      const std::vector<protocol::PlannedObject>& objects);
  // The next filled bucket, in order; fails when the save failed, `stopping`
  // is set, or the rank stopped calling (see above).
  absl::StatusOr<Bucket> TakeFilled(const std::atomic<bool>& stopping);
  // Waits as TakeFilled for the rank's Finish; returns whether the rank
  // asked the agent to die before the commit (fault tests).
  absl::StatusOr<bool> AwaitFinished(const std::atomic<bool>& stopping);
  // The persist ended with `result`: a failure is kept for the rank's next
  // call; every bucket still held is discarded, never reused (the rank may
  // still be writing into the one it holds).
  void End(const absl::Status& result);

 private:
  // Waits (mu_ held) until `ready`, failing as TakeFilled says.
  absl::Status AwaitRank(const std::function<bool()>& ready,
                         const std::atomic<bool>& stopping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::StageBucketResponse> NextBucketInCall(
      const v1::StageBucketRequest& request, absl::Time deadline,
      const std::function<bool()>& caller_gone, bool& entered);

  // Constant after construction.
  const std::shared_ptr<ItemSet> set_;
  const Options options_;
  const std::string where_;
  StagingPool& pool_;

  absl::Mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool plan_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Piece> pieces_ ABSL_GUARDED_BY(mu_);
  std::vector<int> write_item_ ABSL_GUARDED_BY(mu_);  // plan write -> item
  size_t next_piece_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<Bucket> handed_ ABSL_GUARDED_BY(mu_);  // with the rank
  std::deque<Bucket> filled_ ABSL_GUARDED_BY(mu_);     // for the persist side
  bool finished_ ABSL_GUARDED_BY(mu_) = false;         // Finish arrived
  bool die_before_commit_ ABSL_GUARDED_BY(mu_) = false;
  bool rank_in_call_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_call_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_STREAMING_SAVE_H_
