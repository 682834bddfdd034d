// The coordinator's Prometheus metrics: what is counted where, and the gauges
// computed at scrape time. Events (commits, failures, plans) update counters
// and histograms with one atomic operation each; state (saves in progress,
// the catalog) is read when Prometheus scrapes.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/save_session.h"

namespace cairn::coordinator {

using metrics::Histogram;
using metrics::Sample;

void Coordinator::RegisterMetrics() {
  metrics::Registry& r = metrics_;
  m_.save_seconds = r.AddHistogram(
      "cairn_save_duration_seconds",
      "Committed saves: from the first rank's BeginSave of the attempt to "
      "the commit (manifest published, catalog updated).",
      Histogram::LatencyBuckets());
  m_.commit_seconds = r.AddHistogram(
      "cairn_commit_duration_seconds",
      "Successful commits: from the last rank's CommitSave to the manifest "
      "published and the catalog updated.",
      Histogram::LatencyBuckets());
  m_.load_plan_seconds = r.AddHistogram(
      "cairn_load_plan_duration_seconds",
      "Successful PlanLoads: resolving the step, reading its manifest (or "
      "the cache) and planning the rank's reads.",
      Histogram::LatencyBuckets());
  m_.bytes_saved = r.AddCounter(
      "cairn_bytes_saved_total",
      "Bytes of committed checkpoints (their manifests' total_bytes).");
  m_.bytes_loaded = r.AddCounter(
      "cairn_bytes_loaded_total",
      "Bytes PlanLoad answers told ranks to read (read items' segments and "
      "bytes entries).");
  m_.saves_committed =
      r.AddCounter("cairn_saves_committed_total", "Saves committed.");
  m_.save_failures = r.AddCounterFamily(
      "cairn_save_failures_total",
      "Save attempts aborted (a rank's AbortSave, a missed deadline, a "
      "failed commit, a restarted rank, shutdown), by status code.",
      {"code"});
  metrics::Family<metrics::Counter>* hits = r.AddCounterFamily(
      "cairn_plan_cache_hits_total",
      "Plans answered from a cache: cache=\"save\" global save plans, "
      "cache=\"load\" PlanLoad answers.",
      {"cache"});
  metrics::Family<metrics::Counter>* misses = r.AddCounterFamily(
      "cairn_plan_cache_misses_total",
      "Plans built because no cache held them (cache=\"save\" or \"load\").",
      {"cache"});
  m_.save_plan_hits = hits->Get({"save"});
  m_.load_plan_hits = hits->Get({"load"});
  m_.save_plan_misses = misses->Get({"save"});
  m_.load_plan_misses = misses->Get({"load"});

  m_.load_indexes_built = r.AddCounter(
      "cairn_load_indexes_built_total",
      "Load indexes built: a committed checkpoint's manifest read back and "
      "indexed for PlanLoad (after its commit, or by a PlanLoad that found "
      "none in memory).");
  m_.load_indexes_prepared = r.AddCounter(
      "cairn_load_indexes_prepared_total",
      "Load indexes built after a commit (--prepare-loads), before any "
      "PlanLoad asked.");
  r.AddCallbackGauge(
      "cairn_load_index_bytes",
      "Bytes of the load indexes held in memory (bound: "
      "--load-index-cache-mib).",
      [this] { return static_cast<double>(manifests_.charge()); });
  r.AddCallbackGauge("cairn_saves_in_progress",
                     "Save attempts in progress (gathering ranks, writing "
                     "or committing).",
                     [this] {
                       absl::MutexLock lock(&mu_);
                       return static_cast<double>(sessions_.size());
                     });
  r.AddCallbackGauge(
      "cairn_loads_in_progress",
      "Load rounds in progress (ranks joining, or reading and reporting "
      "checksums).",
      [this] { return static_cast<double>(load_rounds_.stats().live_rounds); });
  r.AddCallbackGauge(
      "cairn_oldest_inflight_save_age_seconds",
      "Age of the oldest save attempt in progress (since its first "
      "BeginSave); 0 when none is.",
      [this] {
        absl::MutexLock lock(&mu_);
        absl::Time oldest = absl::InfiniteFuture();
        for (const auto& [key, s] : sessions_) {
          oldest = std::min(oldest, s->created());
        }
        if (oldest == absl::InfiniteFuture()) return 0.0;
        return absl::ToDoubleSeconds(absl::Now() - oldest);
      });
  // The catalog gauges scan the catalog at scrape time, each its own scan:
  // the catalog is small (bounded by retention; aborted records are pruned)
  // and a scrape comes every few seconds.
  struct JobStats {
    double committed = 0, bytes = 0, last_commit = 0;
    // Memory checkpoints: how many, how many cannot be restored now, and
    // the live copies of the newest one's least-copied rank (-1: none).
    double memory = 0, unrestorable = 0, newest_memory_copies = -1;
    int64_t newest_memory_step = -1;
  };
  auto scan = [this](size_t* entries) {
    std::map<std::string, JobStats> jobs;
    absl::StatusOr<std::vector<v1::CheckpointRecord>> all =
        catalog_->ListCheckpoints("", /*include_uncommitted=*/true);
    if (!all.ok()) return jobs;
    if (entries != nullptr) *entries = all->size();
    const absl::Time now = absl::Now();
    for (const v1::CheckpointRecord& c : *all) {
      if (c.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
      JobStats& j = jobs[c.job()];
      j.committed += 1;
      j.bytes += static_cast<double>(c.total_bytes());
      j.last_commit = std::max(j.last_commit, c.committed_unix_micros() / 1e6);
      if (c.tier() != v1::TIER_MEMORY) continue;
      const MemoryHoldings::Copies copies =
          holdings_.CopiesOf(c.job(), c.step(), c.world_size(), now);
      j.memory += 1;
      j.unrestorable += copies.ranks_without.empty() ? 0 : 1;
      if (c.step() > j.newest_memory_step) {
        j.newest_memory_step = c.step();
        j.newest_memory_copies = copies.fewest;
      }
    }
    return jobs;
  };
  r.AddCallbackGauge(
      "cairn_catalog_entries",
      "Checkpoint records in the catalog (every state: committed, writing, "
      "aborted, deleting).",
      [scan] {
        size_t entries = 0;
        scan(&entries);
        return static_cast<double>(entries);
      });
  // The label is cairn_job, not job: Prometheus sets `job` to the scrape
  // job's name (and would rename ours to exported_job).
  auto per_job = [scan](double JobStats::*field) {
    return [scan, field] {
      std::vector<Sample> out;
      for (const auto& [job, j] : scan(nullptr)) {
        out.push_back(Sample{{job}, j.*field});
      }
      return out;
    };
  };
  r.AddCallbackGaugeFamily(
      "cairn_committed_checkpoints",
      "Committed checkpoints in the catalog, by Cairn job.", {"cairn_job"},
      per_job(&JobStats::committed));
  r.AddCallbackGaugeFamily(
      "cairn_committed_bytes",
      "Bytes of the committed checkpoints in the catalog, by Cairn job.",
      {"cairn_job"}, per_job(&JobStats::bytes));
  r.AddCallbackGaugeFamily(
      "cairn_last_commit_timestamp_seconds",
      "Unix time of the newest committed checkpoint's commit, by Cairn job "
      "(for "
      "\"no commit for N minutes\" alerts: time() - this).",
      {"cairn_job"}, per_job(&JobStats::last_commit));
  r.AddCallbackGaugeFamily(
      "cairn_memory_checkpoints",
      "Committed memory checkpoints (held in agents' memory only), by Cairn "
      "job.",
      {"cairn_job"}, per_job(&JobStats::memory));
  r.AddCallbackGaugeFamily(
      "cairn_memory_checkpoints_unrestorable",
      "Memory checkpoints some rank of which no live agent holds, by Cairn "
      "job.",
      {"cairn_job"}, per_job(&JobStats::unrestorable));
  r.AddCallbackGaugeFamily(
      "cairn_memory_checkpoint_live_copies",
      "Live copies of the least-copied rank of the newest memory checkpoint, "
      "by Cairn job (-1: none; alert below replicas + 1).",
      {"cairn_job"}, per_job(&JobStats::newest_memory_copies));
  r.AddCallbackGauge(
      "cairn_agents_reporting",
      "cairn-agents whose holdings reports arrive (live within the holdings "
      "lease).",
      [this] { return static_cast<double>(holdings_.LiveNodes(absl::Now())); });
}

void Coordinator::RecordLoadPlanned(const EncodedLoadPlan& plan) {
  m_.bytes_loaded->Increment(static_cast<double>(plan.bytes_to_read));
}

}  // namespace cairn::coordinator
