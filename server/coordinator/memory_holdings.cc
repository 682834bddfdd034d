// MemoryHoldings (memory_holdings.h).
#include "server/coordinator/memory_holdings.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace cairn::coordinator {

bool MemoryHoldings::LiveLocked(const NodeState& n, absl::Time now) const {
  return now - n.node.last_report <= lease_;
}

void MemoryHoldings::Report(const v1::ReportHoldingsRequest& report,
                            absl::Time now) {
  absl::MutexLock l(&mu_);
  NodeState& n = nodes_[report.node_id()];
  const bool restarted = n.reported && n.incarnation != report.incarnation();
  std::map<SetKey, Held> held;
  for (const v1::HeldShards& h : report.held()) {
    held[SetKey{h.job(), h.step(), h.rank()}] = Held{};
  }
  // Sets a commit recorded less than a lease ago stay unless the agent
  // restarted: this report may have been sent before it kept them.
  if (!restarted) {
    for (const auto& [key, h] : n.held) {
      if (now - h.committed < lease_ && held.count(key) == 0) held[key] = h;
    }
  }
  n.held = std::move(held);
  n.incarnation = report.incarnation();
  n.reported = true;
  n.node.node_id = report.node_id();
  n.node.num_nodes = report.num_nodes();
  n.node.budget_bytes = report.budget_bytes();
  n.node.used_bytes = report.used_bytes();
  n.node.last_report = now;
}

void MemoryHoldings::Committed(const std::string& job, int64_t step,
                               const std::vector<std::vector<int>>& holders,
                               absl::Time now) {
  absl::MutexLock l(&mu_);
  for (int rank = 0; rank < static_cast<int>(holders.size()); ++rank) {
    for (int node : holders[rank]) {
      NodeState& n = nodes_[node];
      if (!n.reported) {
        // Known from this commit only: live for a lease, until it reports.
        n.node.node_id = node;
        n.node.last_report = now;
      }
      n.held[SetKey{job, step, rank}].committed = now;
    }
  }
}

MemoryHoldings::Copies MemoryHoldings::CopiesOf(const std::string& job,
                                                int64_t step, int world,
                                                absl::Time now) const {
  Copies c;
  c.by_rank.resize(std::max(world, 0));
  absl::ReaderMutexLock l(&mu_);
  std::set<int> nodes;
  for (const auto& [id, n] : nodes_) {
    if (!LiveLocked(n, now)) continue;
    auto it = n.held.lower_bound(SetKey{job, step, 0});
    for (; it != n.held.end() && std::get<0>(it->first) == job &&
           std::get<1>(it->first) == step;
         ++it) {
      const int rank = std::get<2>(it->first);
      if (rank < 0 || rank >= world) continue;
      c.by_rank[rank].push_back(id);
      nodes.insert(id);
    }
  }
  c.nodes.assign(nodes.begin(), nodes.end());
  c.fewest = world > 0 ? std::numeric_limits<int>::max() : 0;
  for (int r = 0; r < world; ++r) {
    const int copies = static_cast<int>(c.by_rank[r].size());
    c.fewest = std::min(c.fewest, copies);
    if (copies == 0) c.ranks_without.push_back(r);
  }
  return c;
}

std::vector<MemoryHoldings::Node> MemoryHoldings::Nodes(absl::Time now) const {
  std::vector<Node> out;
  absl::ReaderMutexLock l(&mu_);
  for (const auto& [id, n] : nodes_) {
    if (!n.reported) continue;
    Node node = n.node;
    node.live = LiveLocked(n, now);
    out.push_back(node);
  }
  return out;
}

int MemoryHoldings::LiveNodes(absl::Time now) const {
  int live = 0;
  for (const Node& n : Nodes(now)) live += n.live ? 1 : 0;
  return live;
}

bool MemoryHoldings::Settled(const std::set<int>& expected,
                             absl::Time now) const {
  if (now >= SettleDeadline()) return true;
  absl::ReaderMutexLock l(&mu_);
  for (int node : expected) {
    auto it = nodes_.find(node);
    if (it == nodes_.end() || !it->second.reported) return false;
  }
  return true;
}

}  // namespace cairn::coordinator
