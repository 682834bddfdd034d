// The agent's Prometheus metrics: events (persists, replication pushes)
// update counters and histograms with one atomic operation each; state
// (staging memory, replication lag) is read when Prometheus scrapes.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "server/agent/agent.h"
#include "server/agent/agent_internal.h"

namespace cairn::agent {

using metrics::Histogram;

void Agent::RegisterMetrics() {
  metrics::Registry& r = *metrics_;
  m_ = std::make_unique<Metrics>();
  m_->bytes_persisted = r.AddCounter(
      "cairn_agent_bytes_persisted_total",
      "Bytes this agent wrote to storage for ranks' saves that committed "
      "(staged and streamed; what cairnd's plan had each rank write, so a "
      "replicated item deduplicated to another rank is not counted).");
  m_->persist_seconds = r.AddHistogram(
      "cairn_agent_persist_duration_seconds",
      "Committed persists of one rank's save: from the hand-over (FinishStage, "
      "or a streaming save's start) to cairnd's commit.",
      Histogram::LatencyBuckets());
  metrics::Family<metrics::Counter>* persists = r.AddCounterFamily(
      "cairn_agent_persists_total",
      "Persists of one rank's save finished, by result (committed, failed).",
      {"result"});
  m_->persists_committed = persists->Get({"committed"});
  m_->persists_failed = persists->Get({"failed"});
  m_->persist_queue = r.AddGauge(
      "cairn_agent_persist_queue_depth",
      "Ranks' saves handed to this agent and not yet committed or failed "
      "(writing, or waiting for an earlier save of the same rank).");
  metrics::Family<metrics::Counter>* replication = r.AddCounterFamily(
      "cairn_agent_replication_bytes_total",
      "Replica bytes pushed to peer agents (direction=\"sent\") and "
      "received from them (direction=\"received\").",
      {"direction"});
  m_->replication_sent_bytes = replication->Get({"sent"});
  m_->replication_received_bytes = replication->Get({"received"});
  m_->replication_failures =
      r.AddCounter("cairn_agent_replication_failures_total",
                   "Replica pushes to a peer agent that failed.");

  r.AddCallbackGauge(
      "cairn_agent_staging_bytes_used",
      "Bytes of staging, tier-0 and replica memory held "
      "(counted against the budget).",
      [this] { return static_cast<double>(pool_->stats().used_bytes); });
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
        absl::MutexLock l(&m_->mu);
        double bytes = 0;
        for (const auto& [id, rep] : m_->replicating) bytes += rep.bytes;
        return bytes;
      });
  r.AddCallbackGauge(
      "cairn_agent_replication_lag_seconds",
      "Seconds since the oldest committed checkpoint still being pushed to "
      "its replica peers was committed (0 when none is).",
      [this] {
        absl::MutexLock l(&m_->mu);
        absl::Time oldest = absl::InfiniteFuture();
        for (const auto& [id, rep] : m_->replicating) {
          oldest = std::min(oldest, rep.committed);
        }
        if (oldest == absl::InfiniteFuture()) return 0.0;
        return absl::ToDoubleSeconds(absl::Now() - oldest);
      });
}

}  // namespace cairn::agent
