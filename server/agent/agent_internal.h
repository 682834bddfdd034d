// Internals shared by the files of the agent library (agent.cc,
// streaming_save.cc, persister.cc, agent_load.cc): a streaming save's state
// and the metrics. Not part of the agent's interface.
#ifndef CAIRN_SERVER_AGENT_AGENT_INTERNAL_H_
#define CAIRN_SERVER_AGENT_AGENT_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "common/metrics.h"
#include "common/shm/shm_segment.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "proto/convert/plan_convert.h"
#include "server/agent/agent.h"
#include "server/agent/items.h"

namespace cairn::agent {
// One streaming save (see agent.h). The persist thread produces `pieces`
// once (plan_ready); StageBucket hands out consecutive runs of them as
// buckets; the persist thread takes filled buckets in order.
struct Agent::Stream {
  struct Piece {
    int write = 0;  // index in cairnd's plan for this rank
    uint64_t item_offset = 0;
    uint64_t length = 0;
  };
  struct Bucket {
    uint64_t seq = 0;
    std::shared_ptr<shm::ShmSegment> segment;
    size_t begin = 0, end = 0;      // pieces [begin, end)
    std::vector<uint64_t> offsets;  // per piece, in the segment
  };

  std::shared_ptr<Set> set;  // items only, no segment
  uint64_t save_id = 0;
  uint64_t bucket_bytes = 0;
  absl::Duration wait_for_space;
  std::string where;
  // Bytes cairnd's plan has this rank write (persist thread only).
  uint64_t written_bytes = 0;

  absl::Mutex mu;
  absl::Status failed ABSL_GUARDED_BY(mu);
  bool plan_ready ABSL_GUARDED_BY(mu) = false;
  std::vector<Piece> pieces ABSL_GUARDED_BY(mu);
  std::vector<int> write_item ABSL_GUARDED_BY(mu);  // plan write -> item
  size_t next_piece ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  std::optional<Bucket> handed ABSL_GUARDED_BY(mu);  // with the rank
  std::deque<Bucket> filled ABSL_GUARDED_BY(mu);     // for the persist thread
  bool finished ABSL_GUARDED_BY(mu) = false;         // FinishStage arrived
  bool die_before_commit ABSL_GUARDED_BY(mu) = false;
  bool rank_in_call ABSL_GUARDED_BY(mu) = false;
  absl::Time last_call ABSL_GUARDED_BY(mu);

  // Waits (mu held) until `ready`, failing when the stream failed, the agent
  // stops, or the rank has made no call for `idle` (it died mid-stream).
  absl::Status AwaitRank(const std::function<bool()>& ready,
                         absl::Duration idle, const std::atomic<bool>& stopping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return ready() || !failed.ok();
    };
    while (true) {
      if (!failed.ok()) return failed;
      if (ready()) return absl::OkStatus();
      if (stopping.load()) {
        return absl::UnavailableError(
            absl::StrCat(where, ": cairn-agent is stopping"));
      }
      if (!rank_in_call && absl::Now() - last_call > idle) {
        return absl::AbortedError(
            absl::StrCat(where, ": the rank made no streaming call for ",
                         absl::FormatDuration(idle),
                         " (killed mid-stream?); the save is aborted"));
      }
      mu.AwaitWithTimeout(absl::Condition(&cond), absl::Milliseconds(50));
    }
  }
};

// The agent's metrics (registered by agent_metrics.cc), and the state behind
// replication lag: committed sets whose pushes to their replica peers are
// still running.
struct Agent::Metrics {
  metrics::Counter* bytes_persisted = nullptr;
  metrics::Histogram* persist_seconds = nullptr;
  metrics::Counter* persists_committed = nullptr;
  metrics::Counter* persists_failed = nullptr;
  metrics::Gauge* persist_queue = nullptr;
  metrics::Counter* replication_sent_bytes = nullptr;
  metrics::Counter* replication_received_bytes = nullptr;
  metrics::Counter* replication_failures = nullptr;

  struct Replicating {
    uint64_t bytes = 0;
    absl::Time committed;
  };
  absl::Mutex mu;
  std::map<uint64_t, Replicating> replicating ABSL_GUARDED_BY(mu);
  uint64_t next_replication ABSL_GUARDED_BY(mu) = 0;

  // A committed set of `bytes` starts replicating; returns its id for
  // ReplicationDone.
  uint64_t ReplicationStarted(uint64_t bytes, absl::Time committed) {
    absl::MutexLock l(&mu);
    replicating[++next_replication] = Replicating{bytes, committed};
    return next_replication;
  }
  void ReplicationDone(uint64_t id) {
    absl::MutexLock l(&mu);
    replicating.erase(id);
  }
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_INTERNAL_H_
