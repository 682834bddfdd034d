// The agent's Prometheus metrics: events (persists, replication pushes)
// update counters and histograms with one atomic operation each; state
// (staging memory, replication lag) is read when Prometheus scrapes.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "server/agent/agent.h"

namespace cairn::agent {

void Agent::RegisterMetrics() {
  metrics::Registry& r = *metrics_;
  persist_metrics_ = Persister::Metrics::Register(r);

  r.AddCallbackGauge(
      "cairn_agent_staging_bytes_used",
      "Bytes of staging, tier-0 and replica memory held "
      "(counted against the budget).",
      [this] { return static_cast<double>(pool_->stats().used_bytes); });
  r.AddCallbackGauge(
      "cairn_agent_memory_checkpoint_sets",
      "Ranks' shards of memory checkpoints held (own and replicas; pinned "
      "until cairnd says they are gone or persisted).",
      [this] { return static_cast<double>(tier_.counts().memory_sets); });
  r.AddCallbackGauge("cairn_agent_memory_checkpoint_bytes",
                     "Bytes of the memory checkpoints' shards held.", [this] {
                       return static_cast<double>(tier_.counts().memory_bytes);
                     });
  r.AddCallbackGauge("cairn_agent_staging_budget_bytes",
                     "The staging budget (--staging-budget-mib) in bytes.",
                     [this] { return static_cast<double>(pool_->budget()); });
  r.AddCallbackGauge(
      "cairn_agent_replication_lag_bytes",
      "Bytes of committed checkpoints whose push to their replica peers is "
      "still running (0: every committed checkpoint is replicated, or its "
      "push failed and is counted in "
      "cairn_agent_replication_failures_total).",
      [this] {
        if (persister_ == nullptr) return 0.0;
        return static_cast<double>(persister_->replication_lag().bytes);
      });
  r.AddCallbackGauge(
      "cairn_agent_replication_lag_seconds",
      "Seconds since the oldest committed checkpoint still being pushed to "
      "its replica peers was committed (0 when none is).",
      [this] {
        if (persister_ == nullptr) return 0.0;
        const absl::Time oldest = persister_->replication_lag().oldest_commit;
        if (oldest == absl::InfiniteFuture()) return 0.0;
        return absl::ToDoubleSeconds(absl::Now() - oldest);
      });
}

}  // namespace cairn::agent
