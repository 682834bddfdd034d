// MemoryHoldings: what the cairn-agents hold in memory, learnt from their
// periodic reports (ReportHoldings), and so which memory checkpoints can be
// restored now.
//
// A node is live while its reports keep coming: the last one arrived within
// `lease`. Each report replaces what the node held before; a node whose
// process changed (a new incarnation: the agent restarted) holds only what
// its new report lists. A commit (Committed) records the holders the ranks
// named before their next reports confirm them: a report that does not list
// a set recorded by a commit less than one lease ago leaves it (the report
// may have left the agent before the commit).
//
// After cairnd starts, nothing is known until agents report: Settled says
// whether every node named by `expected` has reported since, or the first
// lease has passed (a node that has not reported by then is not live).
//
// Thread-safe: every method may be called concurrently (one mutex, a leaf).
#ifndef CAIRN_SERVER_COORDINATOR_MEMORY_HOLDINGS_H_
#define CAIRN_SERVER_COORDINATOR_MEMORY_HOLDINGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/cairn.pb.h"

namespace cairn::coordinator {

class MemoryHoldings {
 public:
  // `lease`: how long a node counts as live after its last report.
  MemoryHoldings(absl::Duration lease, absl::Time start)
      : lease_(lease), start_(start) {}
  MemoryHoldings(const MemoryHoldings&) = delete;
  MemoryHoldings& operator=(const MemoryHoldings&) = delete;

  absl::Duration lease() const { return lease_; }

  // A node's report, received at `now`.
  void Report(const v1::ReportHoldingsRequest& report, absl::Time now);

  // A memory checkpoint committed at `now`: holders[r] are the nodes that
  // hold rank r's shards (CommitSaveRequest.holder_nodes).
  void Committed(const std::string& job, int64_t step,
                 const std::vector<std::vector<int>>& holders, absl::Time now);

  // The live copies of (job, step)'s ranks [0, world).
  struct Copies {
    int fewest = 0;                         // fewest live copies of any rank
    std::vector<int> nodes;                 // live nodes holding any, sorted
    std::vector<int> ranks_without;         // ranks with no live copy, sorted
    std::vector<std::vector<int>> by_rank;  // live holders of each rank
  };
  Copies CopiesOf(const std::string& job, int64_t step, int world,
                  absl::Time now) const;

  // A node that reported, and when.
  struct Node {
    int node_id = 0;
    int num_nodes = 0;
    uint64_t budget_bytes = 0;
    uint64_t used_bytes = 0;
    absl::Time last_report;
    bool live = false;
  };
  // Every node that reported since start, by id.
  std::vector<Node> Nodes(absl::Time now) const;
  int LiveNodes(absl::Time now) const;

  // Whether what the agents hold is known (see above).
  bool Settled(const std::set<int>& expected, absl::Time now) const;
  // When Settled turns true at the latest.
  absl::Time SettleDeadline() const { return start_ + lease_; }

 private:
  using SetKey = std::tuple<std::string, int64_t, int>;  // job, step, rank
  struct Held {
    absl::Time committed = absl::InfinitePast();  // by Committed, when
  };
  struct NodeState {
    Node node;
    uint64_t incarnation = 0;
    bool reported = false;  // since start (Committed alone does not count)
    std::map<SetKey, Held> held;
  };
  bool LiveLocked(const NodeState& n, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_;
  const absl::Time start_;
  mutable absl::Mutex mu_;
  std::map<int, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_MEMORY_HOLDINGS_H_
